r"""The program of the one-pass solver: a MADE's weights cut into the blocks each step uses.

:func:`flowkit.nn.inversion.solve` runs a MADE one degree at a time (see that module's docstring
for the math). Before it starts, :func:`build_program` sorts the masked weights of the active
mask set by degree (:func:`flowkit.nn.layout.sorted_layout`) and cuts them into blocks
(:class:`Block`): the units of one degree of one stage, which become final together, with the
weight slices that compute them (*pulls*), and into the *flushes* that send whole windows of
finished units on at once. The solver then runs the blocks and flushes in order; it makes no
decision of its own.

**Windows.** Each connection (a source layer, or the inputs, read by a stage) cuts the degrees
into windows of ``w`` consecutive degrees. A unit of degree ``k`` sums the units below that it
sees; those of the windows before ``k``'s were added to it in one product each, when their
window ended (a flush: every unit not yet computed sees all of a finished window), and a block
pulls only the units of its own window. ``w = 1`` is the NADE recurrence (every new block sent
on at once), a window of all degrees pulls whole prefixes; the weights are the same and each is
used once either way. Small windows stream the layer above once per window, large ones the
layer below once per degree: :func:`build_program` takes, per connection, the window that moves
the least data (by its estimate ``traffic``), once per mask set.

A program depends on the MADE's weights and active masks, not on the batch: without autograd it
is kept between calls for as long as those stay the same tensors.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from itertools import accumulate
from typing import NamedTuple

import numpy as np
from torch import Tensor

from flowkit.nn.layout import INPUTS, SortedLayout, Stage, stages
from flowkit.nn.made import MADE

Pull = tuple[int, int, int, Tensor]
"""``(source, start, end, weight)``: add ``weight`` times the units ``start:end`` of source
``-1`` (the inputs, in the ordering) or ``l >= 0`` (hidden layer ``l``, sorted by degree)."""

class Flush(NamedTuple):
    """Add ``weight`` times the units ``start:end`` of ``source`` to the units of stage
    ``target`` from ``first`` on. The first flush into a stage writes them instead (``write``),
    bias included, unless the stage's pre-activations are initialized
    (:attr:`Program.initialized`)."""

    source: int
    start: int
    end: int
    target: int
    first: int
    write: bool
    weight: Tensor


Push = tuple[int, int, Tensor]
"""``(target, start, weight)``: one-hot inputs, the rows of ``weight`` ``(K, units)`` to add
to the units of stage ``target`` from ``start`` on, picked by the class of a feature."""

CALL_COST = 16
"""What one product costs beyond the data it moves, in rows of the batch (a call's overhead is
about the time it takes to stream 16 rows of 1024 floats on the CPUs the solver was timed on;
the choice of windows does not depend on the batch size)."""


class Block(NamedTuple):
    """The units of one degree of one stage (hidden layers, then the output), which become
    final together: computed from ``pulls`` added to what flushes gathered for them."""

    stage: int
    pulls: list[Pull]
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
    input_starts: list[int]  # the first input (sorted, no context) of degree k = 0..D+1
    initialized: set[int]  # stages whose pre-activations are kept whole from the start
    flushed_from: list[int]  # per stage, the first unit that a flush adds to (or all units)
    sources: list[tuple[int, int]]  # (layer, width) of the hidden layers read
    hidden: list[list[Block]]  # per degree k < D, the hidden units of degree k
    output: list[Block]  # per position k = 1..D, the outputs of the k-th feature
    flushes: list[list[Flush]]  # per position k = 1..D, run before its outputs
    inputs: list[list[Push]]  # one-hot inputs, per position k = 1..D-1


_programs: weakref.WeakKeyDictionary[MADE, Program] = weakref.WeakKeyDictionary()
_windows: weakref.WeakKeyDictionary[MADE, dict[tuple, list[int]]] = weakref.WeakKeyDictionary()


def cached_program(made: MADE) -> Program | None:
    """The program kept for ``made`` by :func:`build_program`, or None if there is none."""
    return _programs.get(made)


def choose_window(traffic: Callable[[int], int], features: int) -> int:
    """The window of a connection: of ``1, 2, 4, ...`` and ``features + 1`` (all degrees), the
    one of least ``traffic(window)``."""
    sizes = {1 << i for i in range(features.bit_length())} | {features + 1}
    return min(sorted(sizes), key=traffic)


def build_program(made: MADE, layout: SortedLayout, one_hot: bool) -> Program:
    """The program of ``made``'s active mask set. Without autograd it is kept while the masked
    weights (cached by :meth:`flowkit.MaskedLinear.masked_weight`) stay the same tensors; under
    autograd it is rebuilt on every call, from the weights the gradient flows to.

    Each connection gets the window (see the module docstring) that moves the least data. The
    inputs are one such connection, unless they are one-hot: then each feature adds one weight
    row per unit it reaches (NADE), picked by its class.
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
    input_starts = [0] + [(k - 1) * m for k in range(1, features + 2)]
    width = features * m

    # Weights with rows (units) and columns (their inputs) sorted by degree: the context's
    # columns apart (the context reaches every unit), (source, target, weight).
    context: list[Tensor | None] = [None] * (last + 1)
    links: list[tuple[int, int, Tensor]] = []
    for (target, source, _), w in zip(reads, products, strict=True):
        w = w.index_select(0, layout.stage_perm(target))
        if source != INPUTS:
            links.append((source, target, w.index_select(1, layout.hidden_perms[source])))
            continue
        if made.context_features:
            c = w[:, width:]
            context[target] = c if context[target] is None else context[target] + c
        links.append((INPUTS, target, w[:, :width].index_select(1, layout.input_perm)))

    def source_starts(source: int) -> list[int]:
        return input_starts if source == INPUTS else starts[source]

    def computed(t: int) -> list[int]:
        """The degrees at which units of stage ``t`` are computed."""
        return [k for k in range(features + 1) if counts[t][k] and (t == last or k < features)]

    def seen(source: int, target: int, k: int) -> int:
        """Units of ``source`` that the units of degree ``k`` of ``target`` see."""
        return source_starts(source)[k if target == last else k + 1]

    def traffic(source: int, target: int, window: int) -> int:
        """Rows of the batch that a connection's products move with ``window``, plus
        :data:`CALL_COST` per product: a pull reads its columns twice (the matrix product
        packs them) and writes its rows; a flush reads its columns and reads and writes the
        rows it adds to. Rows, not bytes: the estimate does not depend on the batch."""
        s, to = np.array(source_starts(source)), np.array(starts[target])
        k = np.array(computed(target), dtype=np.int64)
        pulled = s[k + (target != last)] - s[k // window * window]
        rows = to[k + 1] - to[k]
        cost = np.where(pulled > 0, 2 * pulled + rows + CALL_COST, 0).sum()
        a = np.arange(window, features + 1, window)
        chunk, rest = s[a] - s[a - window], to[-1] - to[a]
        cost += np.where((chunk > 0) & (rest > 0), chunk + 2 * rest + CALL_COST, 0).sum()
        return int(cost)

    # They depend on the degrees only: chosen once per mask set, also under autograd (a few
    # sets are kept, for cycling through them; a change of degrees starts afresh).
    chosen = _windows.setdefault(made, {})
    windows = chosen.get(key)
    if windows is None:
        windows = [features + 1 if source == INPUTS and one_hot else
                   choose_window(functools.partial(traffic, source, target), features)
                   for source, target, _ in links]
        if len(chosen) >= 2 * made.num_masks:
            chosen.clear()
        chosen[key] = windows

    blocks: list[list[Block]] = [[] for _ in range(features + 1)]
    for t in range(last + 1):
        stage = description[t]
        for k in computed(t):
            start, end = starts[t][k], starts[t][k + 1]
            pulls: list[Pull] = []
            for (source, target, w), window in zip(links, windows, strict=True):
                if target != t or (source == INPUTS and one_hot):
                    continue
                lo, hi = source_starts(source)[k // window * window], seen(source, t, k)
                if hi > lo:
                    pulls.append((source, lo, hi, w[start:end, lo:hi]))
            blocks[k].append(Block(t, pulls, stage.residual, stage.activate))
    output = [b[-1] for b in blocks[1:]]
    hidden = [[b for b in bs if b.stage < last] for bs in blocks[:features]]

    flushes: list[list[Flush]] = [[] for _ in range(features)]
    for (source, target, w), window in zip(links, windows, strict=True):
        s = source_starts(source)
        for a in range(window, features + 1, window):
            lo, hi, first = s[a - window], s[a], starts[target][a]
            if hi > lo and first < starts[target][-1]:
                flushes[a - 1].append(Flush(source, lo, hi, target, first, False, w[first:, lo:hi]))

    inputs_pushed: list[list[Push]] = [[] for _ in range(features)]
    if one_hot:
        for source, t, w in links:
            if source != INPUTS:
                continue
            rows = w.t().contiguous().split(m)  # per feature, (K, out)
            for k in range(1, features):
                first = starts[t][k + (t == last)]
                if first < w.shape[0]:
                    inputs_pushed[k - 1].append((t, first, rows[k - 1][:, first:]))
    # Stages that one-hot inputs add to from the first step keep their pre-activations for
    # the whole batch from the start. Elsewhere the units before a stage's first flush read
    # their bias (and context) alone, and that flush writes the units from there on, bias
    # included, where the later ones add.
    initialized = {p[0] for ps in inputs_pushed for p in ps}
    flushed_from = [0 if t in initialized else starts[t][-1] for t in range(last + 1)]
    for fs in flushes:  # in the order they run
        for j, f in enumerate(fs):
            if f.first < flushed_from[f.target]:
                flushed_from[f.target] = f.first
                fs[j] = f._replace(write=True)
    sources = [(s, starts[s][-1]) for s in sorted({s for s, _, _ in links if s != INPUTS})]
    program = Program(
        key, description, products, context, starts, input_starts, initialized, flushed_from,
        sources, hidden, output, flushes, inputs_pushed,
    )
    if not any(p.requires_grad for p in products):
        _programs[made] = program
    return program
