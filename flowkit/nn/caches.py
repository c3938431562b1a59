"""What a model keeps between calls that is derived from its weights.

Without autograd, MADE's layers and solver compute a few things once per set of weights and
reuse them: the masked product ``W * M`` of each :class:`flowkit.nn.MaskedLinear`, the column
chunks of the sorted masked weights (:mod:`flowkit.nn.staircase`) and the solver's program
with its sorted weights (:mod:`flowkit.nn.inversion_program`). Each cache replaces its object
when it is rebuilt, and drops it when a call with autograd, a weight update or
:meth:`flowkit.nn.MaskedLinear.clear_cache` makes it stale. Code that holds on to those tensors
beyond a call (a CUDA graph that reads them, :class:`flowkit.GraphedSampler`) compares
:func:`cached` before and after, and keeps the objects alive while it uses them.
"""

from __future__ import annotations

from torch import nn

from flowkit.nn.inversion_program import cached_program
from flowkit.nn.linear import MaskedLinear
from flowkit.nn.made import MADE
from flowkit.nn.staircase import cached_weights


def cached(model: nn.Module) -> tuple[object | None, ...]:
    """The cached objects of every masked layer and MADE in ``model``, in module order (None
    where nothing is cached): the same objects for as long as the caches are valid."""
    out: list[object | None] = []
    for m in model.modules():
        if isinstance(m, MaskedLinear):
            out += [m.cached(), cached_weights(m)]
        elif isinstance(m, MADE):
            out.append(cached_program(m))
    return tuple(out)
