r"""Solving autoregressive equations ``y_d = step(theta_d(y_<d))`` with a MADE.

MAF sampling, IAF density of outside points and ancestral sampling of Bernoulli/categorical
MADEs are all the same problem: find ``y`` such that, for every feature ``d``,

    y_d = step(made(y, context)[:, d, :], d)

where ``step`` is elementwise (an inverse transformer, a transformer, or a draw from a
distribution with pre-drawn noise). Because ``made(y)[:, d]`` depends only on the features
before ``d`` in the ordering, the features can be solved one at a time, in order.

:func:`solve_naive` does that with one full MADE pass per feature, ``D`` passes in all.
:func:`solve` does the arithmetic of *one* pass. A hidden unit of degree ``k`` depends only on
the first ``k`` features of the ordering, so once those are known it is final and never
changes. With the units of every layer sorted by degree (a permutation that leaves the function
unchanged), the units that become final when feature ``k`` is known are a block ``[k]`` of
rows, and the units below that they see are a prefix ``[<=k]``. Step ``k`` computes each such
block once, layer by layer:

.. math::

    h^{(l)}_{[k]} = \operatorname{act}\big(a^{(l)}_{[k]} + W^{(l)}_{[k], [w \le \cdot \le k]}\,
        h^{(l-1)}_{[w \le \cdot \le k]}\big),
    \qquad
    a^{(l)}_{[\ge w']} \mathrel{+}= W^{(l)}_{[\ge w'], [w, w')}\, h^{(l-1)}_{[w, w')},

where ``[w, w')`` is the window of degrees that holds ``k``: a block pulls the units of its own
window, and when a window ends its units are added to the pre-activations ``a`` of every unit
not yet computed in one product (a *flush*). Then come the ``P`` outputs of the ``k``-th
feature, then the feature. Each weight entry is used once in all, as in one forward pass,
spread over ``D`` steps of a handful of tensor operations. The windows of each connection (one
degree is the NADE recurrence, all degrees pull whole prefixes) are chosen once per mask set by
:mod:`flowkit.nn.inversion_program`, which also cuts the weights into the blocks each step
multiplies; this module runs the steps.

References:
    Germain et al., "MADE: Masked Autoencoder for Distribution Estimation", ICML 2015.
    Larochelle and Murray, "The Neural Autoregressive Distribution Estimator", AISTATS 2011
    (the one-pass-per-sample recurrence for a single hidden layer).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import nullcontext
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.graph import saved_tensors_hooks

from flowkit.nn.inversion_program import build_program
from flowkit.nn.layout import sorted_layout
from flowkit.nn.made import MADE
from flowkit.nn.scratch import Scratch
from flowkit.validation import check_context, check_width

Encode = Callable[[Tensor], Tensor]
"""``encode(y) -> made input``: maps values ``(N, D)`` to the MADE's input, e.g. one-hot
``(N, D, K)`` for categorical features. ``None`` means the identity. It must act feature by
feature (the inputs of feature ``d`` depend on ``y_d`` only): :func:`solve` calls it on one
column ``(N, 1)`` at a time."""

Step = Callable[[Tensor, Tensor], Tensor]
"""``step(params, index) -> values``: ``params`` ``(N, m, P)`` are the MADE outputs of the
features ``index`` ``(m,)``; returns their values ``(N, m)``. :func:`solve` passes ``m = 1``
and a ``params`` that may be non-contiguous and that becomes part of the returned parameters:
do not write to it (keeping it is safe: it is never the solver's reused memory)."""


class OneHot:
    """``encode`` for categorical features: class indices ``(N, D)`` to one-hot ``(N, D, K)``.

    :func:`solve` recognises it and adds one weight row per feature instead of multiplying by a
    one-hot vector (the NADE update), so sampling costs nothing per class.

    Args:
        classes: ``K``.
        dtype: dtype of the one-hot vectors (the MADE's).
    """

    def __init__(self, classes: int, dtype: torch.dtype = torch.float32):
        self.classes = classes
        self.dtype = dtype

    def __call__(self, y: Tensor) -> Tensor:
        return F.one_hot(y.long(), self.classes).to(self.dtype)

    def __repr__(self) -> str:
        return f"OneHot(classes={self.classes}, dtype={self.dtype})"


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
    _check_arguments(made, like, context)
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
    """Solve ``y_d = step(made(y)_d)`` for all ``d`` at the cost of about one MADE pass.

    The entry point used by the flow layers and the discrete models; same arguments and same
    result as :func:`solve_naive` (equal up to floating-point rounding: the sums are the same,
    added in another order), see the module docstring for how. Differentiable: under autograd
    the gradients are those of :func:`solve_naive`.

    Example:
        >>> made = MADE(3, (8,), params_per_feature=1, order="random", seed=1)
        >>> u = torch.rand(4, 3)
        >>> step = lambda params, index: (u[:, index] < params[..., 0].sigmoid()).float()
        >>> torch.equal(solve(made, step, u), solve_naive(made, step, u))
        True
    """
    return solve_with_params(made, step, like, context, encode)[0]


def solve_naive_with_params(
    made: MADE,
    step: Step,
    like: Tensor,
    context: Tensor | None = None,
    encode: Encode | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference for :func:`solve_with_params`: :func:`solve_naive`, then one more MADE pass
    for ``made(y, context)``."""
    y = solve_naive(made, step, like, context, encode)
    return y, made(y if encode is None else encode(y), context)


def solve_with_params(
    made: MADE,
    step: Step,
    like: Tensor,
    context: Tensor | None = None,
    encode: Encode | None = None,
    *,
    check: bool = True,
) -> tuple[Tensor, Tensor]:
    """:func:`solve`, also returning ``made(y, context)`` ``(N, D, P)`` at no extra cost (the
    outputs are computed on the way), e.g. for the log-determinant of a flow layer.

    A MADE whose :attr:`~flowkit.nn.MADE.solver` is ``"naive"`` is solved by
    :func:`solve_naive_with_params` instead (a reference for tests and benchmarks).

    ``check=False`` skips the check of ``like`` and ``context``: for callers whose own public
    methods checked them (the flow layers, checked by a :class:`flowkit.Flow` or the layer)."""
    if check:
        _check_arguments(made, like, context)
    return _solve_with_params(made, step, like, context, encode)


def _without_autocast(solver: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``solver(made, step, like, ...)`` with ``torch.autocast`` off on ``like``'s device:
    its products accumulate in place into buffers of the model's dtype, which must not meet
    operands autocast has cast to another (the results are in the model's dtype anyway)."""

    @functools.wraps(solver)
    def run(made: MADE, step: Step, like: Tensor, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(like.device.type, enabled=False):
            return solver(made, step, like, *args, **kwargs)

    return run


@_without_autocast
def _solve_with_params(
    made: MADE, step: Step, like: Tensor, context: Tensor | None, encode: Encode | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`solve_with_params` on checked arguments."""
    if made.solver == "naive" or _inside_torch_func():
        return solve_naive_with_params(made, step, like, context, encode)
    made.refuse_hooks()
    layout = sorted_layout(made)
    one_hot = isinstance(encode, OneHot)
    program = build_program(made, layout, one_hot)
    n, features, m = like.shape[0], made.features, made.inputs_per_feature
    tracked = torch.is_grad_enabled()
    # Under autograd the state below is written in place after slices of it were saved for
    # the backward pass. No write touches a saved slice (a unit is written once, before
    # anything reads it), which autograd cannot know, so our own operations save tensors
    # through identity hooks, which skip its version check. The user's step runs outside.
    hooks = saved_tensors_hooks(_identity, _identity) if tracked else nullcontext()
    view = _Views(tracked)

    # The state is kept units x batch, so that a block of units is a block of rows and every
    # product is (units x units) @ (units x batch), the shape BLAS does fast. The inputs
    # too: the user's step gives a column (batch x 1), written as one contiguous row. Every
    # unit is written before anything reads it: the buffers need no initial value. Without
    # autograd on the CPU they are memory this thread reuses between calls (fresh memory
    # costs its page faults at every call).
    last = len(program.stages) - 1  # the output stage
    scratch = Scratch.take("solver") if Scratch.applies(like) else None

    def buffer(slot: object, width: int, like: Tensor) -> Tensor:
        if scratch is None:
            return like.new_empty(width, n)
        return scratch.tensor(slot, width, n, like)

    # base[stage]: the bias plus the context's contribution (the context reaches every unit):
    # a column, or the whole batch with a context. acc[stage]: the pre-activations of the
    # units that flushes add to (from program.flushed_from on, the first flush writing them),
    # or of all units if the program initializes them; None if there are none. Under
    # autograd acc starts at the base and every flush adds (out= is not differentiable).
    # buf[source]: the values that pulls and flushes read.
    base, acc, writes = [], [], []
    for t, stage in enumerate(program.stages):
        a = sum(layer.bias for layer, _ in stage.reads if layer.bias is not None)
        a = a.index_select(0, layout.stage_perm(t))[:, None]
        units = a.shape[0]
        kept = program.flushed_from[t] < units
        if context is not None and program.context[t] is not None:
            out = buffer(("acc", t), units, a) if kept and not tracked else None
            a = torch.addmm(a, program.context[t], context.t(), out=out)
        base.append(a)
        if not kept:
            acc.append(None)
        elif a.shape[1] == n:  # with a context: the whole batch already
            acc.append(a)
        elif tracked or t in program.initialized:
            acc.append(buffer(("acc", t), units, a).copy_(a.expand(-1, n)))
        else:
            acc.append(buffer(("acc", t), units, a))
        writes.append(not tracked and acc[t] is not None and acc[t] is not a
                      and t not in program.initialized)

    def pre_activations(t: int, k: int, pulled: bool) -> Tensor:
        """The block of units of degree ``k`` of stage ``t`` before its pulls, if it has any
        (``pulled``); else the whole batch's."""
        if program.starts[t][k] >= program.flushed_from[t]:
            return view.block(acc[t], program.starts[t], k)
        pre = view.block(base[t], program.starts[t], k)
        return pre if pulled else pre.expand(-1, n)

    buf = {s: buffer(s, w, base[-1]) for s, w in program.sources}
    if not one_hot:
        buf[-1] = buffer(-1, features * m, base[-1])

    # Without autograd a ReLU writes the hidden values into their buffer (torch.relu is
    # clamp_min(h, 0)), one operation instead of two at every step.
    relu_in_place = not tracked and type(made.activation) is nn.ReLU

    def hidden_units(k: int) -> None:
        h = None
        for block in program.hidden[k]:
            pre = pre_activations(block.stage, k, bool(block.pulls))
            for source, start, end, weight in block.pulls:
                pre = torch.addmm(pre, weight, buf[source][start:end])
            h = pre + h if block.residual else pre
            kept = (view.block(buf[block.stage], program.starts[block.stage], k)
                    if block.stage in buf else None)
            if kept is not None and block.activate and relu_in_place:
                value = torch.clamp_min(h, 0, out=kept)  # ReLU, written where it is kept
            else:
                value = made.activation(h) if block.activate else h
                if kept is not None:
                    kept.copy_(value)

    values, params = [], []
    with hooks:
        hidden_units(0)
    for k in range(1, features + 1):
        with hooks:
            for source, start, end, target, first, write, weight in program.flushes[k - 1]:
                values_below = buf[source][start:end]
                if write and writes[target]:
                    torch.addmm(base[target][first:], weight, values_below,
                                out=acc[target][first:])
                else:
                    acc[target][first:].addmm_(weight, values_below)
            block = program.output[k - 1]
            p = pre_activations(last, k, bool(block.pulls))
            for source, start, end, weight in block.pulls:
                p = torch.addmm(p, weight, buf[source][start:end])
            # the step may keep what it is given: never the solver's memory
            p = (p if block.pulls else p.clone()).t().unsqueeze(1)
        y = step(p, layout.index[k - 1])
        values.append(y)
        params.append(p)
        if k == features:
            break
        x = None if one_hot else (y if encode is None else encode(y).reshape(n, m))
        with hooks:
            if one_hot:
                classes = y.reshape(-1).long()
                for target, start, weight in program.inputs[k - 1]:
                    rows = weight.index_select(0, classes).t()
                    acc[target][start:].add_(rows)
            else:
                view.block(buf[-1], program.input_starts, k).copy_(x.t())
            hidden_units(k)
    y = torch.cat(values, dim=1).index_select(1, layout.position)
    params = torch.cat(params, dim=1).index_select(1, layout.position)
    if scratch is not None:
        scratch.release("solver")
    return y, params


def _inside_torch_func() -> bool:
    """Whether a ``torch.func`` transform (``grad``, ``vjp``, ``jacrev``, ``vmap``) is running.
    The fast solver saves tensors through ``saved_tensors_hooks``, which ``torch.func`` refuses;
    the reference solver, the same arithmetic without them, runs there instead."""
    stack = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    return stack is not None and stack() is not None


def _check_arguments(made: MADE, like: Tensor, context: Tensor | None) -> None:
    """``like`` should be ``(N, D)`` and ``context`` ``(N, C)``, or ``None`` when ``C = 0``."""
    check_width("like", like, made.features)
    check_context(context, made.context_features, like.shape[:1], None)


def _identity(t: Tensor) -> Tensor:
    return t


class _Views:
    """The blocks of the solver's state: the rows of one degree of a stage. Without autograd a
    tensor's blocks are made once per call (one ``split``) and reused; under autograd each is
    made anew at every use, since autograd forbids writing through a view made before an
    in-place write to its base (and through ``split``'s views at all). Other slices are used
    once each and made where they are used."""

    def __init__(self, tracked: bool):
        self.cache: dict[int, tuple[Tensor, ...]] | None = None if tracked else {}

    def block(self, t: Tensor, starts: list[int], k: int) -> Tensor:
        """``t[starts[k]:starts[k + 1]]`` (rows); ``starts`` spans all of ``t``."""
        if self.cache is None:
            return t.narrow(0, starts[k], starts[k + 1] - starts[k])
        blocks = self.cache.get(id(t))
        if blocks is None:
            sizes = [b - a for a, b in pairwise(starts)]
            blocks = self.cache[id(t)] = t.split(sizes)
        return blocks[k]
