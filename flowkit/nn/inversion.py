"""Solving autoregressive equations ``y_d = step(theta_d(y_<d))`` with a MADE.

MAF sampling, IAF density of outside points and ancestral sampling of Bernoulli/categorical
MADEs are all the same problem: find ``y`` such that, for every feature ``d``,

    y_d = step(made(y, context)[:, d, :], d)

where ``step`` is elementwise (an inverse transformer, a transformer, or a draw from a
distribution with pre-drawn noise). Because ``made(y)[:, d]`` depends only on the features
before ``d`` in the ordering, the features can be solved one at a time, in order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from flowkit.nn.made import MADE

Encode = Callable[[Tensor], Tensor]
"""``encode(y) -> made input``: maps values ``(N, D)`` to the MADE's input, e.g. one-hot
``(N, D, K)`` for categorical features. ``None`` means the identity."""

Step = Callable[[Tensor, Tensor], Tensor]
"""``step(params, index) -> values``: ``params`` ``(N, m, P)`` are the MADE outputs of the
features ``index`` ``(m,)``; returns their values ``(N, m)``."""


def solve_naive(
    made: MADE,
    step: Step,
    like: Tensor,
    context: Tensor | None = None,
    encode: Encode | None = None,
) -> Tensor:
    """Reference solver: one full MADE pass per feature, ``D`` passes in all.

    Starting from zeros, pass ``i`` evaluates the MADE on the current ``y`` and fills in the
    ``i``-th feature of the ordering, whose parameters depend only on features already filled
    in. After ``D`` passes ``y`` is exact. Differentiable (autograd follows the unrolled loop).

    Args:
        made: the conditioner.
        step: elementwise update, see :data:`Step`.
        like: tensor ``(N, D)`` giving the shape, dtype and device of ``y``.
        context: ``(N, C)`` or ``None``.
        encode: see :data:`Encode`.
    """
    y = torch.zeros_like(like)
    for index in made.order.split(1):
        params = made(y if encode is None else encode(y), context).index_select(1, index)
        y = y.index_copy(1, index, step(params, index))
    return y


def solve(
    made: MADE,
    step: Step,
    like: Tensor,
    context: Tensor | None = None,
    encode: Encode | None = None,
) -> Tensor:
    """Solve ``y_d = step(made(y)_d)`` for all ``d`` (see the module docstring); the entry
    point used by the flow layers and the discrete models. Arguments as :func:`solve_naive`."""
    return solve_naive(made, step, like, context, encode)
