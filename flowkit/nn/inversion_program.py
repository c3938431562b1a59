r"""The program of the one-pass solver: a MADE's weights cut into the blocks each step uses.

:func:`flowkit.nn.inversion.solve` runs a MADE one degree at a time (see that module's docstring
for the math). Before it starts, :func:`build_program` sorts the masked weights of the active
mask set by degree (:func:`flowkit.nn.layout.sorted_layout`) and cuts them into blocks
(:class:`Block`): the units of one degree of one stage, which become final together, with the
weight slices that compute them (*pulls*) and the ones that send them on (*pushes*). The solver
then runs the blocks in order; it makes no decision of its own.

A program depends on the MADE's weights and active masks, not on the batch: without autograd it
is kept between calls for as long as those stay the same tensors.
"""

from __future__ import annotations

import weakref
from itertools import accumulate
from typing import NamedTuple

from torch import Tensor

from flowkit.nn.layout import INPUTS, SortedLayout, Stage, stages
from flowkit.nn.made import MADE

Pull = tuple[int, int, Tensor]
"""``(source, length, weight)``: add ``weight`` times the first ``length`` units of source
``-1`` (the inputs, in the ordering) or ``l >= 0`` (hidden layer ``l``, sorted by degree)."""

Push = tuple[int, int, Tensor]
"""``(target, start, weight)``: add ``weight`` times the block's values to the units of stage
``target`` from ``start`` on."""


class Block(NamedTuple):
    """The units of one degree of one stage (hidden layers, then the output), which become
    final together: computed from ``pulls`` and sent on by ``pushes``."""

    stage: int
    pulls: list[Pull]
    pushes: list[Push]
    residual: bool  # adds the sum of the same units of the stage below
    activate: bool  # passes act(sum) on


class Program(NamedTuple):
    """The weights of the active mask set, sorted by degree and cut into the blocks that each
    step multiplies (the rows of a block and the columns it reads are contiguous)."""

    key: tuple
    stages: list[Stage]  # the MADE's description it follows
    products: list[Tensor]  # the masked weights of its reads, in order
    context: list[Tensor | None]  # per stage, (out, C) weights of the context
    starts: list[list[int]]  # per stage, its first unit of degree k = 0..D+1
    accumulated: set[int]  # stages that receive pushes (the others start at a bias column)
    sources: list[tuple[int, int]]  # (layer, width) of the hidden layers that pulls read
    hidden: list[list[Block]]  # per degree k < D, the hidden units of degree k
    output: list[Block]  # per position k = 1..D, the outputs of the k-th feature
    inputs: list[list[Push]]  # one-hot inputs, per position k = 1..D-1: weights (K, out - start)


_programs: weakref.WeakKeyDictionary[MADE, Program] = weakref.WeakKeyDictionary()


def cached_program(made: MADE) -> Program | None:
    """The program kept for ``made`` by :func:`build_program`, or None if there is none."""
    return _programs.get(made)


def build_program(made: MADE, layout: SortedLayout, one_hot: bool) -> Program:
    """The program of ``made``'s active mask set. Without autograd it is kept while the masked
    weights (cached by :meth:`flowkit.MaskedLinear.masked_weight`) stay the same tensors; under
    autograd it is rebuilt on every call, from the weights the gradient flows to.

    Each connection from a hidden layer either *pulls* (a block of units reads the prefix of
    the layer below that it sees) or *pushes* (a new block adds its contribution to the units
    above that see it), whichever moves less data: pulling reads about half the layer below at
    every step of the layer above, pushing reads and writes about half the layer above at every
    step of the layer below. Inputs are pulled, or pushed one weight row per feature (NADE)
    when they are one-hot.
    """
    description = stages(made)
    reads = [(t, source, layer) for t, stage in enumerate(description)
             for layer, source in stage.reads]
    products = [layer.masked_weight() for _, _, layer in reads]
    key = (layout.key, one_hot)
    cached = _programs.get(made)
    if cached is not None and cached.key == key and all(
        a is b for a, b in zip(products, cached.products, strict=True)
    ):
        return cached

    features, m = made.features, made.inputs_per_feature
    last = len(description) - 1  # the output stage
    counts = [layout.stage_counts(t, made) for t in range(last + 1)]  # outputs: degrees 1..D
    starts = [[0, *accumulate(c)] for c in counts]
    inputs = features * m

    # Weights with rows (units) and columns (their inputs) sorted by degree: reads of the
    # inputs (their context columns apart: the context reaches every unit) and links between
    # stages, (source, target, weight).
    context: list[Tensor | None] = [None] * (last + 1)
    from_inputs: list[tuple[int, Tensor]] = []
    links: list[tuple[int, int, Tensor]] = []
    for (target, source, _), w in zip(reads, products, strict=True):
        w = w.index_select(0, layout.stage_perm(target))
        if source != INPUTS:
            links.append((source, target, w.index_select(1, layout.hidden_perms[source])))
            continue
        if made.context_features:
            c = w[:, inputs:]
            context[target] = c if context[target] is None else context[target] + c
        from_inputs.append((target, w[:, :inputs].index_select(1, layout.input_perm)))

    def seen(source: int, target: int, k: int) -> int:
        """Units of `source` that units of degree k of `target` see."""
        return starts[source][k if target == last else k + 1]

    def first(target: int, k: int) -> int:
        """The first unit of `target` that sees the units of degree k below."""
        return starts[target][k + (target == last)]

    pushing = set()  # the links that push
    for i, (source, target, _) in enumerate(links):
        active = [k for k in range(features) if counts[source][k]]
        pull_cost = sum(seen(source, target, k) for k in range(features + 1) if counts[target][k])
        push_cost = sum(2 * (starts[target][-1] - first(target, k)) for k in active)
        if push_cost < pull_cost:
            pushing.add(i)

    blocks: list[list[Block]] = [[] for _ in range(features + 1)]
    for t, count in enumerate(counts):
        stage = description[t]
        for k in range(features + 1):
            if not count[k] or (t < last and k == features):
                continue  # units of degree >= D feed no output
            start, end = starts[t][k], starts[t][k + 1]
            pulls: list[Pull] = []
            if not one_hot:
                length = (k if t < last else k - 1) * m  # inputs of degree <= k or < k
                pulls += [(INPUTS, length, w[start:end, :length])
                          for r, w in from_inputs if r == t]
            pushes: list[Push] = []
            for i, (source, target, w) in enumerate(links):
                if target == t and i not in pushing:
                    length = seen(source, t, k)
                    pulls.insert(0, (source, length, w[start:end, :length]))
                if source == t and i in pushing and first(target, k) < starts[target][-1]:
                    pushes.append((target, first(target, k), w[first(target, k):, start:end]))
            blocks[k].append(Block(t, pulls, pushes, stage.residual, stage.activate))
    output = [b[-1] for b in blocks[1:]]
    hidden = [[b for b in bs if b.stage < last] for bs in blocks[:features]]

    inputs_pushed: list[list[Push]] = [[] for _ in range(features)]
    if one_hot:
        for t, w in from_inputs:
            rows = w.t().contiguous().split(m)  # per feature, (K, out)
            for k in range(1, features):
                if first(t, k) < w.shape[0]:
                    inputs_pushed[k - 1].append((t, first(t, k), rows[k - 1][:, first(t, k):]))
    pulled = {source for i, (source, _, _) in enumerate(links) if i not in pushing}
    sources = [(s, starts[s][-1]) for s in sorted(pulled)]
    accumulated = {links[i][1] for i in pushing}
    if one_hot:
        accumulated |= {t for t, _ in from_inputs}
    program = Program(
        key, description, products, context, starts, accumulated, sources, hidden, output,
        inputs_pushed,
    )
    if not any(p.requires_grad for p in products):
        _programs[made] = program
    return program
