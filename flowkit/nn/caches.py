"""What a model keeps between calls that is derived from its weights.

Without autograd, MADE's layers and solver compute a few things once per set of weights and
reuse them: the masked product ``W * M`` of each :class:`flowkit.nn.MaskedLinear`, the column
chunks of the sorted masked weights (:mod:`flowkit.nn.staircase`) and the solver's program
with its sorted weights (:mod:`flowkit.nn.inversion_program`). Each cache replaces its object
when it is rebuilt, and drops it when a call with autograd, a weight update or
:func:`clear_caches` makes it stale. Code that holds on to those tensors
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


def clear_caches(model: nn.Module) -> None:
    """Forget every product cached from the weights of ``model``'s masked layers, and with them
    the sorted weights and solver programs made from those products (rebuilt on the next call).

    Needed only after writing a few entries through ``weight.data`` (a finite-difference probe
    of one weight, a partial re-initialisation): such writes bump no version counter, and each
    cached product is checked against only :data:`flowkit.nn.linear.FINGERPRINT` entries of its
    weight (enough for updates that move the weights as a whole: optimizers, EMAs,
    ``load_state_dict``).

    Example:
        >>> import torch, flowkit
        >>> made = flowkit.MADE(3, (8,), params_per_feature=2).eval()
        >>> torch.nn.init.normal_(made.output.weight)  # doctest: +ELLIPSIS
        Parameter containing:...
        >>> x = torch.ones(4, 3)
        >>> with torch.no_grad():
        ...     before = made(x)
        ...     row, column = made.hidden[0].mask.nonzero()[0].tolist()
        ...     made.hidden[0].weight.data[row, column] += 5.0  # no version counter sees it
        ...     flowkit.nn.clear_caches(made)
        ...     bool((made(x) != before).any())
        True
    """
    for m in model.modules():
        if isinstance(m, MaskedLinear):
            m.clear_cache()
