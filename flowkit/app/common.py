"""Small helpers shared by the experiments: a mean with its standard error, a plain MLP, the
refusal to replace an earlier run."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from torch import Tensor, nn

__all__ = ["mean_se", "mlp", "refuse_to_replace"]


def mean_se(values: Tensor) -> tuple[float, float]:
    r"""Mean of ``values`` and its standard error :math:`s / \sqrt n`.

    ``s`` is the sample standard deviation (``n - 1`` in the denominator), computed in float64.

    Args:
        values: ``(n,)`` per-example scores, e.g. NLLs or ELBOs (any shape: all elements count).

    Returns:
        ``(mean, standard error)`` as floats; the standard error is NaN when ``n < 2``.

    Example:
        >>> import torch
        >>> mean_se(torch.tensor([1.0, 2.0, 3.0, 4.0]))  # s = sqrt(5/3)
        (2.5, 0.6454972243679028)
    """
    values = values.detach().double()
    n = values.numel()
    se = values.std().item() / math.sqrt(n) if n > 1 else math.nan
    return values.mean().item(), se


def mlp(sizes: Sequence[int], activation: Callable[[], nn.Module]) -> nn.Sequential:
    """Linear layers ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` with a fresh ``activation()``
    after each but the last.

    Args:
        sizes: layer widths, input first; at least two.
        activation: a module factory, e.g. ``nn.ReLU`` or ``nn.ELU``.

    Example:
        >>> mlp([3, 8, 2], nn.ELU)
        Sequential(
          (0): Linear(in_features=3, out_features=8, bias=True)
          (1): ELU(alpha=1.0)
          (2): Linear(in_features=8, out_features=2, bias=True)
        )
    """
    if len(sizes) < 2:
        raise ValueError(f"'sizes' should have at least 2 widths, got {list(sizes)}")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        if i > 0:
            layers.append(activation())
        layers.append(nn.Linear(a, b))
    return nn.Sequential(*layers)


def refuse_to_replace(checkpoint: Path, resume: bool) -> None:
    """Fail if ``checkpoint`` exists and the command was not asked to ``--resume`` it: a fresh
    run never replaces an earlier one."""
    if checkpoint.exists() and not resume:
        raise ValueError(
            f"'{checkpoint}' exists: pass --resume to continue that run, or pick another --out"
        )
