r"""Block-staircase masked products: MADE's one-pass directions without the masked-out half.

With the units of every layer sorted by degree (:class:`flowkit.nn.layout.SortedLayout`), a
masked weight ``W \odot M`` is a staircase: the output units of degree ``k`` see a prefix of
the inputs. Cut the rows into blocks ``[r_0, r_1)``; block ``i`` needs only the first ``L_i``
inputs (those seen by its last, highest-degree row), so

.. math::

    y_{:, [r_0, r_1)} = x_{:, [0, L_i)} \, (W \odot M)_{[r_0, r_1), [0, L_i)}^\top + b_{[r_0, r_1)}

does the arithmetic of the nonzero part of the mask plus the staircase's edge inside the blocks
(about half of a dense product when degrees are spread evenly). The product is computed by
column chunks: the columns ``[L_{i-1}, L_i)`` are added into the rows from ``r_0`` of block
``i`` on, so that each input column is read once. The backward pass reads the same blocks:
the input gradient is computed by the same column chunks (each gradient column written once,
as the sum over the rows that read it), and the weight gradient is computed inside the blocks
only (autograd through slices would write full-size gradients). Sums are the dense product's,
added in another order: equal up to rounding, gradients included.

The number of blocks of each layer is chosen from its shape (more blocks cut closer to the
staircase but make smaller matrix products); block edges are aligned so that every product has
friendly sizes. Small MADEs, small batches and ``torch.compile`` use the dense masked product
(:attr:`flowkit.nn.MADE.product` chooses).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from itertools import accumulate, pairwise
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from flowkit.nn.layout import INPUTS, layout_key, run, sorted_layout, stages
from flowkit.nn.scratch import Scratch

if TYPE_CHECKING:
    from flowkit.nn.linear import MaskedLinear
    from flowkit.nn.made import MADE

Block = tuple[int, int, int]
"""``(r0, r1, L)``: rows ``[r0, r1)`` of a sorted weight read its first ``L`` columns."""

# Estimated time of a layer's products, per batch row, in multiply-adds. The product runs by
# column chunks (see _product): chunk i adds the columns [L_{i-1}, L_i) into the rows from r0_i
# on, each a product of its own:
#   (rows - r0_i + PACK) * (L_i - L_{i-1}) + WRITE * (rows - r0_i) + CALL
# PACK: reading the chunk's input columns into the product's working memory; WRITE: reading and
# writing the rows it adds into (every chunk passes over them again, so many narrow chunks cost
# more than their arithmetic: at D=64 the 64-input first layer was fastest with 2 chunks, not
# 8); CALL: a fixed cost per product (constants fitted to the times of the D=64, hidden 512
# layers for every number of blocks). CALL_TIME: the fixed cost of one product call (Python,
# dispatch, setup) in multiply-adds, which the automatic choice weighs against the batch's
# saving.
PACK, WRITE, CALL, CALL_TIME = 32, 16, 256, 1e6
# Under autograd, permuting a weight entry into sorted order (and its gradient back) costs
# about SORT multiply-adds: a handful of passes over memory.
SORT = 200
MAX_BLOCKS = 32


def blocks(prefix: list[int], width: int) -> tuple[list[Block], float, float]:
    """Row blocks of one sorted layer, chosen by the estimated time of their products.

    Args:
        prefix: per row (sorted by degree), how many of the ``width`` sorted inputs it sees
            (non-decreasing).
        width: the number of inputs.

    Returns:
        The blocks (covering all rows; block edges aligned to 16 rows or more, ``L`` rounded up
        to a multiple of 8), their estimated time and that of the dense product (see
        :data:`PACK`).
    """
    rows = len(prefix)
    dense = _cost([(0, rows, width)], rows)
    if rows == 0 or width == 0:
        return [(0, rows, width)], dense, dense
    align = 16 if rows < 512 else 32 if rows < 2048 else 64
    best, best_cost = [(0, rows, width)], dense
    for step in range(rows - rows % align or align, 0, -align):  # rows per block
        if math.ceil(rows / step) > MAX_BLOCKS:
            break
        edges = [*range(0, rows, step), rows]
        candidate = _merge([(a, b, _round_up(prefix[b - 1], 8, width)) for a, b in pairwise(edges)])
        cost = _cost(candidate, rows)
        if cost < best_cost:
            best, best_cost = candidate, cost
    return best, best_cost, dense


def _cost(plan: list[Block], rows: int) -> float:
    """The estimated time of ``plan``'s column chunks (see :data:`PACK`)."""
    return sum((rows - r0 + PACK) * (c1 - c0) + WRITE * (rows - r0) + CALL
               for r0, c0, c1 in _chunk_edges(plan))


def _chunk_edges(plan: list[Block]) -> Iterator[tuple[int, int, int]]:
    """The column chunks of ``plan``, ``(r0, c0, c1)``: block ``i`` adds the columns
    ``[L_{i-1}, L_i)``, which its rows (from ``r0`` on) and all later rows read."""
    done = 0
    for r0, _, n in plan:
        if n > done:
            yield r0, done, n
            done = n


def _round_up(n: int, multiple: int, limit: int) -> int:
    return min(limit, -(-n // multiple) * multiple)


def _merge(candidate: list[Block]) -> list[Block]:
    """Neighbouring blocks that read the same columns become one."""
    merged = [candidate[0]]
    for a, b, n in candidate[1:]:
        if n == merged[-1][2]:
            merged[-1] = (merged[-1][0], b, n)
        else:
            merged.append((a, b, n))
    return merged


class LayerPlan(NamedTuple):
    """One masked layer in sorted form: its row and column permutations and their inverses
    (``None`` where the units are stored sorted already) and its blocks."""

    rows: Tensor | None
    cols: Tensor | None
    inverse_rows: Tensor | None
    inverse_cols: Tensor | None
    blocks: list[Block]


class Plan(NamedTuple):
    """A MADE's active mask set in sorted form: per stage, one :class:`LayerPlan` per read."""

    reads: list[list[LayerPlan]]
    inputs: Tensor | None  # (D m + C,): the input columns in sorted order (None: in place)
    inverse_outputs: Tensor | None  # (D P,): where each output is in sorted order
    saving: float  # estimated multiply-adds per batch row saved against the dense products
    products: int  # block products per call (each costs about CALL_TIME multiply-adds)
    permuted: int  # weight entries that are permuted into sorted order (SORT each)


_plans: weakref.WeakKeyDictionary[MADE, dict[tuple[int, ...], Plan]] = (
    weakref.WeakKeyDictionary()
)


def plan(made: MADE) -> Plan:
    """The plan of ``made``'s active mask set, kept per mask set while its degrees stay the
    same (cycling mask sets with ``next_mask`` reuses them)."""
    key = layout_key(made)
    plans = _plans.get(made)
    if plans is None or any(k[1:] != key[1:] for k in plans):
        plans = _plans[made] = {}
    found = plans.get(key)
    if found is None:
        with torch.inference_mode(False):  # kept across calls: no inference tensors (autograd)
            found = plans[key] = _build_plan(made)
    return found


def _build_plan(made: MADE) -> Plan:
    """The plan of the active mask set (see :func:`plan`)."""
    layout = sorted_layout(made)
    context = made.context_features
    reads, dense, cost, products, permuted = [], 0.0, 0.0, 0, 0
    for s, stage in enumerate(stages(made)):
        rows = layout.stage_perm(s)
        counts = layout.stage_counts(s, made)
        # degree of each sorted row; outputs see degrees < theirs, hidden units <= theirs
        row_degrees = [k for k, c in enumerate(counts) for _ in range(c)]
        strict = not stage.activate
        layer_plans = []
        for _, source in stage.reads:
            cols = layout.source_perm(source, context)
            seen = [0, *accumulate(layout.source_counts(source, made))]  # seen[k]: degree < k
            prefix = [seen[d] if strict else seen[d + 1] for d in row_degrees]
            chosen, chosen_cost, dense_cost = blocks(prefix, cols.numel())
            dense += dense_cost - CALL
            cost += chosen_cost - CALL * len(chosen)
            products += len(chosen)
            r, c = _moved(rows), _moved(cols)
            if r is not None or c is not None:
                permuted += rows.numel() * cols.numel()
            layer_plans.append(LayerPlan(r, c, _inverse(r), _inverse(c), chosen))
        reads.append(layer_plans)
    return Plan(reads, _moved(layout.source_perm(INPUTS, context)),
                _inverse(_moved(layout.output_perm)), dense - cost, products, permuted)


def _moved(perm: Tensor) -> Tensor | None:
    """``perm``, or ``None`` if it is the identity (nothing to permute)."""
    return None if torch.equal(perm, torch.arange(len(perm), device=perm.device)) else perm


def _inverse(perm: Tensor | None) -> Tensor | None:
    return None if perm is None else torch.argsort(perm)


_weights: weakref.WeakKeyDictionary[MaskedLinear, tuple[LayerPlan, Tensor, list[Chunk]]] = (
    weakref.WeakKeyDictionary()
)
"""Per layer, the column chunks of the sorted masked weight of its active plan, kept while
``masked_weight()`` returns the same (cached) product: evaluation sorts the weights once."""


def cached_weights(layer: MaskedLinear) -> tuple[LayerPlan, Tensor, list[Chunk]] | None:
    """The layer's entry in the cache of sorted weight chunks (``_weights``): its plan, the
    product it was sorted from and the chunks; None if there is none."""
    return _weights.get(layer)


def applies(made: MADE, batch: int) -> bool:
    """Whether ``made``'s forward pass on ``batch`` rows uses the staircase (see
    :attr:`flowkit.nn.MADE.product`): in ``"auto"``, when the estimated time saved exceeds
    the fixed cost of the extra products."""
    if made.product == "dense" or torch.compiler.is_compiling():
        return False
    if made.product == "staircase":
        return True
    if made.output.weight.device.type != "cpu":  # launch-bound: measured slower on a GPU
        return False
    p = plan(made)
    overhead = CALL_TIME * p.products
    if torch.is_grad_enabled():  # the weights are permuted anew at every call
        overhead += SORT * p.permuted
    return batch * p.saving > overhead


def forward(made: MADE, x: Tensor) -> Tensor:
    """``made``'s outputs ``(N, D P)`` for inputs ``x`` ``(N, D m + C)`` (features, then
    context), computed in sorted form through the stages of :func:`flowkit.nn.layout.stages`."""
    p = plan(made)
    inputs = x if p.inputs is None else x.index_select(1, p.inputs)
    # Without autograd on the CPU the hidden stages write into memory this thread reuses
    # (alternating between two slots: a stage reads the one below and writes the other).
    scratch = Scratch.take("staircase") if Scratch.applies(x) else None
    last = len(p.reads) - 1

    def read(s: int, i: int, layer: MaskedLinear, v: Tensor) -> Tensor:
        out = None if scratch is None or s == last else (
            scratch.tensor(s % 2, v.shape[0], layer.out_features, v))
        return linear(v, layer, p.reads[s][i], out)

    out = run(made, inputs, read)
    if scratch is not None:
        scratch.release("staircase")
    return out if p.inverse_outputs is None else out.index_select(1, p.inverse_outputs)


def linear(x: Tensor, layer: MaskedLinear, lp: LayerPlan, out: Tensor | None = None) -> Tensor:
    r"""``x (W \odot M)^T + b`` in sorted form: ``x`` ``(N, in)`` has its columns in the order
    ``lp.cols``, the result ``(N, out)`` its columns in the order ``lp.rows``; without autograd
    written into ``out`` if given."""
    bias = layer.bias if layer.bias is None or lp.rows is None else (
        layer.bias.index_select(0, lp.rows))
    if torch.is_grad_enabled() and (layer.weight.requires_grad or x.requires_grad):
        return _StaircaseLinear.apply(x, layer.weight, layer.mask, bias, lp)
    product = layer.masked_weight()
    cached = _weights.get(layer)
    if cached is None or cached[0] is not lp or cached[1] is not product:
        cached = _weights[layer] = (lp, product, _chunks(_sorted(product, lp), lp.blocks))
    return _product(x, cached[2], bias, layer.out_features, out)


Chunk = tuple[int, int, int, Tensor]
"""``(r0, c0, c1, w)``: the columns ``[c0, c1)`` that the rows from ``r0`` on read, and their
weights ``w = W[r0:, c0:c1].t()``, ``(c1 - c0, out - r0)``."""


def _sorted(weight: Tensor, lp: LayerPlan) -> Tensor:
    """``weight`` with rows and columns in sorted order (itself if they are)."""
    if lp.rows is not None:
        weight = weight.index_select(0, lp.rows)
    return weight if lp.cols is None else weight.index_select(1, lp.cols)


def _chunks(weight: Tensor, plan: list[Block]) -> list[Chunk]:
    """The column chunks (:func:`_chunk_edges`) of a sorted weight."""
    return [(r0, c0, c1, weight[r0:, c0:c1].t()) for r0, c0, c1 in _chunk_edges(plan)]


def _product(x: Tensor, chunks: list[Chunk], bias: Tensor | None, width: int,
             out: Tensor | None = None) -> Tensor:
    """``x weight^T + bias`` ``(N, width)`` from the column chunks of the sorted masked weight
    (written into ``out`` if given): each input column is read once, each chunk adds into the
    rows that read it."""
    r0, c0, c1, w = chunks[0] if chunks else (width, 0, 0, None)
    if r0 == 0:  # the first chunk reaches every row: it writes them
        y = (torch.mm(x[:, c0:c1], w, out=out) if bias is None
             else torch.addmm(bias, x[:, c0:c1], w, out=out))
        chunks = chunks[1:]
    else:
        y = x.new_empty(x.shape[0], width) if out is None else out
        y.zero_() if bias is None else y.copy_(bias.expand(x.shape[0], width))
    for r0, c0, c1, w in chunks:
        y[:, r0:].addmm_(x[:, c0:c1], w)
    return y


class _StaircaseLinear(torch.autograd.Function):
    """:func:`linear` under autograd: the weight gradient is computed in its blocks only.

    Where the units are stored sorted (the default orderings), ``W * M`` is formed for the
    column chunks only (about half the weight; the rest is neither computed nor stored) and the
    weight gradient is written block by block, masked and zeroed where the blocks leave it, in
    one pass over its memory. The backward runs under the autocast state of the forward (off,
    in a flow: :func:`flowkit.Flow.log_prob` computes in the model's dtype), not under whatever
    ``torch.autocast`` region calls ``backward()``."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")  # the staircase runs on the CPU only
    def forward(ctx, x: Tensor, weight: Tensor, mask: Tensor, bias: Tensor | None,
                lp: LayerPlan) -> Tensor:
        if lp.rows is None and lp.cols is None:
            chunks = _masked_chunks(weight, mask, lp.blocks)
        else:
            chunks = _chunks(_sorted(weight * mask, lp), lp.blocks)
        ctx.save_for_backward(x, mask, *(w for *_, w in chunks))
        ctx.lp, ctx.edges = lp, [chunk[:3] for chunk in chunks]
        return _product(x, chunks, bias, weight.shape[0])

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, mask, *weights = ctx.saved_tensors
        lp: LayerPlan = ctx.lp
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            chunks = [(*edges, w) for edges, w in zip(ctx.edges, weights, strict=True)]
            grad_x = _grad_input(grad, chunks, x.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = _grad_weight(grad, x, mask, lp)
        if ctx.needs_input_grad[3]:
            grad_b = grad.sum(0)
        return grad_x, grad_w, None, grad_b, None


def _masked_chunks(weight: Tensor, mask: Tensor, plan: list[Block]) -> list[Chunk]:
    """:func:`_chunks` of ``weight * mask`` (stored sorted), each chunk a product of its own:
    the entries outside the chunks are not computed."""
    return [(r0, c0, c1, (weight[r0:, c0:c1] * mask[r0:, c0:c1]).t())
            for r0, c0, c1 in _chunk_edges(plan)]


def _grad_weight(grad: Tensor, x: Tensor, mask: Tensor, lp: LayerPlan) -> Tensor:
    """The gradient of ``W`` ``(out, in)``: ``grad^T x`` inside the blocks (rows
    ``[r0, r1)``, columns ``[0, L)``), times the mask; zero outside them."""
    if lp.rows is None and lp.cols is None:  # sorted in place: write it block by block
        grad_w = grad.new_empty(mask.shape)
        for r0, r1, n in lp.blocks:
            block = grad_w[r0:r1, :n]
            if n:
                torch.mm(grad[:, r0:r1].t(), x[:, :n], out=block).mul_(mask[r0:r1, :n])
            grad_w[r0:r1, n:].zero_()
        return grad_w
    grad_w = grad.new_zeros(mask.shape)
    for r0, r1, n in lp.blocks:
        if n:
            torch.mm(grad[:, r0:r1].t(), x[:, :n], out=grad_w[r0:r1, :n])
    if lp.inverse_rows is not None:
        grad_w = grad_w.index_select(0, lp.inverse_rows)
    if lp.inverse_cols is not None:
        grad_w = grad_w.index_select(1, lp.inverse_cols)
    return grad_w.mul_(mask)


def _grad_input(grad: Tensor, chunks: list[Chunk], width: int) -> Tensor:
    """``grad weight`` ``(N, width)`` by the forward's column chunks: the columns ``[c0, c1)``
    are the gradient of the rows from ``r0`` on, written once each (one product per chunk,
    summing over all the rows that read them; the rows before ``r0`` do not)."""
    grad_x = grad.new_empty(grad.shape[0], width)
    done = 0
    for r0, c0, c1, w in chunks:
        torch.mm(grad[:, r0:], w.t(), out=grad_x[:, c0:c1])
        done = c1
    grad_x[:, done:].zero_()  # columns that no row reads
    return grad_x
