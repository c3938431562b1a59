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
block once, layer by layer, either by *pulling* from the layer below or, NADE-style, by having
each new block *push* its contribution into the pre-activations above (``a`` accumulates):

.. math::

    h^{(l)}_{[k]} = \operatorname{act}\big(b_{[k]} + W^{(l)}_{[k], [\le k]}\,
        h^{(l-1)}_{[\le k]}\big)
    \quad\text{or}\quad
    a^{(l+1)}_{[\ge k]} \mathrel{+}= W^{(l+1)}_{[\ge k], [k]}\, h^{(l)}_{[k]},

then the ``P`` outputs of the ``k``-th feature, then the feature. Each weight entry is used
once in all, as in one forward pass, spread over ``D`` steps of a handful of tensor operations.

References:
    Germain et al., "MADE: Masked Autoencoder for Distribution Estimation", ICML 2015.
    Larochelle and Murray, "The Neural Autoregressive Distribution Estimator", AISTATS 2011
    (the one-pass-per-sample recurrence for a single hidden layer).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextlib import nullcontext
from itertools import accumulate, pairwise
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.graph import saved_tensors_hooks

from flowkit.nn import masks
from flowkit.nn.made import MADE
from flowkit.validation import check_context

Encode = Callable[[Tensor], Tensor]
"""``encode(y) -> made input``: maps values ``(N, D)`` to the MADE's input, e.g. one-hot
``(N, D, K)`` for categorical features. ``None`` means the identity. It must act feature by
feature (the inputs of feature ``d`` depend on ``y_d`` only): :func:`solve` calls it on one
column ``(N, 1)`` at a time."""

Step = Callable[[Tensor, Tensor], Tensor]
"""``step(params, index) -> values``: ``params`` ``(N, m, P)`` are the MADE outputs of the
features ``index`` ``(m,)``; returns their values ``(N, m)``. :func:`solve` passes ``m = 1``
and, without autograd, ``params`` may be a non-contiguous view of its working memory: do not
write to it."""


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
) -> tuple[Tensor, Tensor]:
    """:func:`solve`, also returning ``made(y, context)`` ``(N, D, P)`` at no extra cost (the
    outputs are computed on the way), e.g. for the log-determinant of a flow layer.

    A MADE whose :attr:`~flowkit.nn.MADE.solver` is ``"naive"`` is solved by
    :func:`solve_naive_with_params` instead (a reference for tests and benchmarks)."""
    _check_arguments(made, like, context)
    return _solve_with_params(made, step, like, context, encode)


def _solve_with_params(
    made: MADE, step: Step, like: Tensor, context: Tensor | None, encode: Encode | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`solve_with_params` on arguments its caller checked (the flow layers, which a
    :class:`flowkit.Flow` or the layer's own public methods checked)."""
    if made.solver == "naive":
        return solve_naive_with_params(made, step, like, context, encode)
    layout = _layout(made)
    one_hot = isinstance(encode, OneHot)
    program = _program(made, layout, one_hot)
    n, features, m = like.shape[0], made.features, made.inputs_per_feature
    tracked = torch.is_grad_enabled()
    # Under autograd the state below is written in place after slices of it were saved for
    # the backward pass. No write touches a saved slice (a unit is written once, before
    # anything reads it), which autograd cannot know, so our own operations save tensors
    # through identity hooks, which skip its version check. The user's step runs outside.
    hooks = saved_tensors_hooks(_identity, _identity) if tracked else nullcontext()
    view = _Views(tracked)

    # acc[stage]: pre-activations, started at the bias plus the context's contribution (the
    # context reaches every unit), summed into by pushes; buf[source]: values pulled from.
    # Units x batch, so that a block of units is a block of rows and every product is
    # (units x units) @ (units x batch), the shape BLAS does fast. The inputs are stored
    # batch x units, as the user's step writes them, and read through a transposed view.
    last = len(layout.hidden_counts)  # the output stage
    perms = [*layout.hidden_perms, layout.output_perm]
    acc = []
    for stage, layer in enumerate([*made.hidden, made.output]):
        a = layer.bias.index_select(0, perms[stage])[:, None]
        if context is not None and program.context[stage] is not None:
            a = torch.addmm(a, program.context[stage], context.t())
        acc.append(a.expand(-1, n).contiguous() if stage in program.accumulated else a)
    # Every unit is written before anything reads it: the buffers need no initial value.
    buf = {s: acc[-1].new_empty(w, n) for s, w in program.sources}
    if not one_hot:
        inputs = acc[-1].new_empty(n, features * m)
        buf[-1] = inputs.t()
    input_starts = list(range(0, features * m + 1, m))

    def hidden_units(k: int) -> None:
        h = None
        for block in program.hidden[k]:
            pre = view.block(acc[block.stage], program.starts[block.stage], k)
            for source, length, weight in block.pulls:
                pre = torch.addmm(pre, weight, view.rows(buf[source], length))
            h = pre + h if made.residual and block.stage > 0 else pre
            value = made.activation(h)
            if block.stage in buf:
                view.block(buf[block.stage], program.starts[block.stage], k).copy_(value)
            for target, start, weight in block.pushes:
                view.rows(acc[target], start, after=True).addmm_(weight, value)

    values, params = [], []
    with hooks:
        hidden_units(0)
    for k in range(1, features + 1):
        with hooks:
            block = program.output[k - 1]
            p = view.block(acc[last], program.starts[last], k)
            for source, length, weight in block.pulls:
                p = torch.addmm(p, weight, view.rows(buf[source], length))
            p = (p.clone() if tracked and not block.pulls else p).t().unsqueeze(1)
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
                    view.rows(acc[target], start, after=True).add_(rows)
            else:
                view.block(inputs, input_starts, k - 1, dim=1).copy_(x)
            hidden_units(k)
    y = torch.cat(values, dim=1).index_select(1, layout.position)
    return y, torch.cat(params, dim=1).index_select(1, layout.position)


def _check_arguments(made: MADE, like: Tensor, context: Tensor | None) -> None:
    """``like`` should be ``(N, D)`` and ``context`` ``(N, C)``, or ``None`` when ``C = 0``."""
    if like.dim() != 2 or like.shape[1] != made.features:
        raise ValueError(
            f"'like' should have shape (N, made.features) = (N, {made.features}), got "
            f"{tuple(like.shape)}"
        )
    check_context(context, made.context_features, like.shape[:1], None)


def _identity(t: Tensor) -> Tensor:
    return t


class _Views:
    """Slices of the solver's state. Without autograd each is made once per call (the blocks
    of a tensor by one ``split``) and reused; under autograd each is made anew at every use,
    since autograd forbids writing through a view made before an in-place write to its base
    (and through ``split``'s views at all)."""

    def __init__(self, tracked: bool):
        self.cache: dict[tuple, Any] | None = None if tracked else {}

    def block(self, t: Tensor, starts: list[int], k: int, dim: int = 0) -> Tensor:
        """``t[starts[k]:starts[k + 1]]`` along ``dim``; ``starts`` spans all of ``t``."""
        if self.cache is None:
            return t.narrow(dim, starts[k], starts[k + 1] - starts[k])
        blocks = self.cache.get((id(t), dim))
        if blocks is None:
            sizes = [b - a for a, b in pairwise(starts)]
            blocks = self.cache[id(t), dim] = t.split(sizes, dim)
        return blocks[k]

    def rows(self, t: Tensor, index: int, after: bool = False) -> Tensor:
        """``t[index:]`` if ``after`` else ``t[:index]``."""
        if self.cache is None:
            return t[index:] if after else t[:index]
        key = (id(t), index, after)
        v = self.cache.get(key)
        if v is None:
            v = self.cache[key] = t[index:] if after else t[:index]
        return v


class _Layout(NamedTuple):
    """The active mask set of a MADE with its units sorted by degree. Index tensors live on the
    MADE's device; counts are Python ints (read once, not per step)."""

    key: tuple[int, ...]
    input_perm: Tensor  # (D m,): input columns, feature by feature in the ordering
    output_perm: Tensor  # (D P,): output rows, likewise
    position: Tensor  # (D,): position of each feature in the ordering
    index: tuple[Tensor, ...]  # (1,) each: the feature at each position, as step gets it
    hidden_perms: list[Tensor]  # per hidden layer, its units sorted by degree
    hidden_counts: list[list[int]]  # per hidden layer, units of degree 0..D-1, then >= D


_layouts: weakref.WeakKeyDictionary[MADE, _Layout] = weakref.WeakKeyDictionary()


def _layout(made: MADE) -> _Layout:
    """The sorted layout of ``made``'s active mask set, cached until the set or its degrees
    change (``set_mask``, ``load_state_dict``, ``.to()``)."""
    key = (
        made.mask_set_index,
        made.orders.data_ptr(),
        made.orders._version,
        made.hidden_degree_sets.data_ptr(),
        made.hidden_degree_sets._version,
    )
    layout = _layouts.get(made)
    if layout is not None and layout.key == key:
        return layout
    features, order = made.features, made.order
    degrees = made.degrees()[1:]
    layout = _Layout(
        key=key,
        input_perm=_expand(order, made.inputs_per_feature),
        output_perm=_expand(order, made.params_per_feature),
        position=masks.input_degrees(order) - 1,
        index=order.split(1),
        hidden_perms=[torch.argsort(d, stable=True) for d in degrees],
        hidden_counts=[
            torch.bincount(d.clamp_max(features), minlength=features + 1).tolist()
            for d in degrees
        ],
    )
    _layouts[made] = layout
    return layout


def _expand(order: Tensor, width: int) -> Tensor:
    """Indices of ``width`` consecutive units per feature, feature by feature in ``order``."""
    return (order[:, None] * width + torch.arange(width, device=order.device)).flatten()


Pull = tuple[int, int, Tensor]
"""``(source, length, weight)``: add ``weight`` times the first ``length`` units of source
``-1`` (the inputs, in the ordering) or ``l >= 0`` (hidden layer ``l``, sorted by degree)."""

Push = tuple[int, int, Tensor]
"""``(target, start, weight)``: add ``weight`` times the block's values to the units of stage
``target`` from ``start`` on."""


class _Block(NamedTuple):
    """The units of one degree of one stage (hidden layers, then the output), which become
    final together: computed from ``pulls`` and sent on by ``pushes``."""

    stage: int
    pulls: list[Pull]
    pushes: list[Push]


class _Program(NamedTuple):
    """The weights of the active mask set, sorted by degree and cut into the blocks that each
    step multiplies (the rows of a block and the columns it reads are contiguous)."""

    key: tuple
    products: list[Tensor]  # the masked weights it was built from
    context: list[Tensor | None]  # per stage, (out, C) weights of the context
    starts: list[list[int]]  # per stage, its first unit of degree k = 0..D+1
    accumulated: set[int]  # stages that receive pushes (the others start at a bias column)
    sources: list[tuple[int, int]]  # (layer, width) of the hidden layers that pulls read
    hidden: list[list[_Block]]  # per degree k < D, the hidden units of degree k
    output: list[_Block]  # per position k = 1..D, the outputs of the k-th feature
    inputs: list[list[Push]]  # one-hot inputs, per position k = 1..D-1: weights (K, out - start)


_programs: weakref.WeakKeyDictionary[MADE, _Program] = weakref.WeakKeyDictionary()


def _program(made: MADE, layout: _Layout, one_hot: bool) -> _Program:
    """The program of ``made``'s active mask set. Without autograd it is kept while the masked
    weights (cached by :meth:`MaskedLinear.masked_weight`) stay the same tensors; under
    autograd it is rebuilt on every call, from the weights the gradient flows to.

    Each connection from a hidden layer either *pulls* (a block of units reads the prefix of
    the layer below that it sees) or *pushes* (a new block adds its contribution to the units
    above that see it), whichever moves less data: pulling reads about half the layer below at
    every step of the layer above, pushing reads and writes about half the layer above at every
    step of the layer below. Inputs are pulled, or pushed one weight row per feature (NADE)
    when they are one-hot.
    """
    layers = [*made.hidden, made.output, *([] if made.direct is None else [made.direct])]
    products = [layer.masked_weight() for layer in layers]
    key = (layout.key, one_hot)
    cached = _programs.get(made)
    if cached is not None and cached.key == key and all(
        a is b for a, b in zip(products, cached.products, strict=True)
    ):
        return cached

    features, m, per = made.features, made.inputs_per_feature, made.params_per_feature
    stages = len(made.hidden)  # the output is stage `stages`
    counts = [*layout.hidden_counts, [0] + [per] * features]  # the output's degrees are 1..D
    starts = [[0, *accumulate(c)] for c in counts]
    perms = [*layout.hidden_perms, layout.output_perm, layout.output_perm]
    inputs = features * m

    # Weights with rows (units) and columns (their inputs) sorted by degree. The inputs are
    # read by the first stage and by the direct connection to the output.
    ordered = [w.index_select(0, perm) for w, perm in zip(products, perms, strict=False)]
    readers = [0] + ([] if made.direct is None else [stages])
    context: list[Tensor | None] = [None] * (stages + 1)
    from_inputs = []
    for stage, w in zip(readers, [ordered[0], *ordered[stages + 1 :]], strict=True):
        if made.context_features:
            c = w[:, inputs:]
            context[stage] = c if context[stage] is None else context[stage] + c
        from_inputs.append((stage, w[:, :inputs].index_select(1, layout.input_perm)))
    ordered = [from_inputs[0][1]] + [
        w.index_select(1, perm) for w, perm in zip(ordered[1 : stages + 1], perms, strict=False)
    ]

    def seen(stage: int, k: int) -> int:
        """Units of `stage` that units of degree k of the stage above see."""
        return starts[stage][k + 1] if stage + 1 < stages else starts[stage][k]

    pushing = set()
    for source in range(stages):
        target, width = source + 1, sum(counts[source + 1])
        active = [k for k in range(features) if counts[source][k]]
        pull_cost = sum(seen(source, k) for k in range(features + 1) if counts[target][k])
        push_cost = sum(2 * (width - starts[target][k + (target == stages)]) for k in active)
        if push_cost < pull_cost:
            pushing.add(source)

    blocks: list[list[_Block]] = [[] for _ in range(features + 1)]
    for stage, count in enumerate(counts):
        for k in range(features + 1):
            if not count[k] or (stage < stages and k == features):
                continue  # units of degree >= D feed no output
            start, end = starts[stage][k], starts[stage][k + 1]
            pulls: list[Pull] = []
            if not one_hot:
                length = (k if stage < stages else k - 1) * m  # inputs of degree <= k or < k
                pulls += [(-1, length, w[start:end, :length])
                          for r, w in from_inputs if r == stage]
            if stage and stage - 1 not in pushing:
                length = seen(stage - 1, k)
                w = ordered[stage][start:end, :length]
                pulls.insert(0, (stage - 1, length, w))
            pushes: list[Push] = []
            if stage in pushing:
                first = starts[stage + 1][k + (stage + 1 == stages)]  # the units above that see k
                if first < sum(counts[stage + 1]):
                    w = ordered[stage + 1][first:, start:end]
                    pushes.append((stage + 1, first, w))
            blocks[k].append(_Block(stage, pulls, pushes))
    output = [b[-1] for b in blocks[1:]]
    hidden = [[b for b in bs if b.stage < stages] for bs in blocks[:features]]

    inputs_pushed: list[list[Push]] = [[] for _ in range(features)]
    if one_hot:
        for stage, w in from_inputs:
            rows = w.t().contiguous().split(m)  # per feature, (K, out)
            for k in range(1, features):
                first = starts[stage][k + (stage == stages)]
                if first < w.shape[0]:
                    inputs_pushed[k - 1].append((stage, first, rows[k - 1][:, first:]))
    sources = [(s, made.hidden_features[s]) for s in range(stages) if s not in pushing]
    accumulated = {s + 1 for s in pushing} | (set(readers) if one_hot else set())
    program = _Program(
        key, products, context, starts, accumulated, sources, hidden, output,
        inputs_pushed,
    )
    if not any(p.requires_grad for p in products):
        _programs[made] = program
    return program
