"""Counting ``torch.optim`` steps.

An optimizer updates its parameters in place, but the fused kernels (``Adam(fused=True)``,
which :func:`flowkit.fit` uses) do not bump the tensors' version counters, so a version
counter alone cannot tell whether a weight changed. A hook on every ``torch.optim`` step
counts the steps instead: per watched weight (the masked layers' caches,
:class:`flowkit.nn.MaskedLinear`) and in all (:class:`flowkit.transforms.Standardize`, which
asks whether any training happened since it drew samples).
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

_per_weight: dict[int, int] = {}
"""Per watched weight (by ``id``; the entry goes when the weight is freed), the number of
``torch.optim`` steps whose parameters included it."""
_total = 0
_hook: RemovableHandle | None = None


def _count(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
    global _total
    _total += 1
    for group in optimizer.param_groups:
        for p in group["params"]:
            key = id(p)
            if key in _per_weight:
                _per_weight[key] += 1


def _watch() -> None:
    global _hook
    if _hook is None:
        _hook = register_optimizer_step_post_hook(_count)


def steps_of(weight: Tensor) -> int:
    """Number of ``torch.optim`` steps that updated ``weight`` since it was first watched
    (its first call here)."""
    _watch()
    key = id(weight)
    count = _per_weight.get(key)
    if count is None:
        count = _per_weight[key] = 0
        weakref.finalize(weight, _per_weight.pop, key, None)
    return count


def total_steps() -> int:
    """Number of ``torch.optim`` steps of any optimizer since the first call of this module's
    functions: compare two calls to learn whether any optimizer stepped between them."""
    _watch()
    return _total
