r"""MADE's own description of its computation, and of its active mask set sorted by degree.

Every way of running a MADE reads these two descriptions instead of knowing MADE's features
itself: the dense forward pass (:meth:`flowkit.nn.MADE.forward`), the block-staircase forward
pass (:mod:`flowkit.nn.staircase`) and the one-pass solver (:mod:`flowkit.nn.inversion`); the
two forward passes evaluate the stages with the same :func:`run`. A new MADE feature (a
connection, a residual rule) is written here once and all three follow.

**Stages.** A MADE is a list of stages (the hidden layers, then the output). Stage ``s`` sums
the masked linear maps it reads and, if it is residual, the sum ``h_{s-1}`` of the stage below;
a hidden stage then passes on ``act(h_s)``:

.. math::

    h_s = [\text{residual}]\, h_{s-1} + \sum_{(W, r) \in \text{reads}_s} W v_r, \qquad
    v_s = \operatorname{act}(h_s) \text{ (hidden) or } h_s \text{ (output)},

with ``v_{-1}`` the inputs (features, then context).

**Sorted layout.** Permuting the units of every layer leaves the function unchanged. Sorted by
degree, with the inputs taken feature by feature in the ordering and the context first (degree
0), every mask is a staircase: the units of degree ``k`` see a prefix of the layer below (its
units of degree ``<= k``, or ``< k`` for outputs). :class:`SortedLayout` holds those
permutations and the number of units of each degree.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn

from flowkit.nn import masks

if TYPE_CHECKING:
    from flowkit.nn.linear import MaskedLinear
    from flowkit.nn.made import MADE

INPUTS = -1
"""The source index of the inputs (features, then context) in :attr:`Stage.reads`."""


class Stage(NamedTuple):
    """One stage of a MADE (see the module docstring)."""

    reads: tuple[tuple[MaskedLinear, int], ...]  # (layer, source): INPUTS or a hidden stage
    residual: bool  # h_s = h_{s-1} + sum of the reads
    activate: bool  # passes act(h_s) on (hidden stages); the output stage passes h_s


def stages(made: MADE) -> list[Stage]:
    """The stages of ``made``: its hidden layers in order, then its output (``len(hidden) + 1``
    stages; the last one reads the direct connection too)."""
    result = []
    source = INPUTS
    for i, layer in enumerate(made.hidden):
        result.append(Stage(((layer, source),), made.residual and i > 0, True))
        source = i
    reads = ((made.output, source),)
    if made.direct is not None:
        reads += ((made.direct, INPUTS),)
    result.append(Stage(reads, False, False))
    return result


def run(
    made: MADE, inputs: Tensor, read: Callable[[int, int, MaskedLinear, Tensor], Tensor]
) -> Tensor:
    """Evaluate ``made``'s stages on ``inputs`` ``(..., D m + C)`` and return the output stage
    ``h`` ``(..., D P)``. ``read(s, i, layer, v)`` computes the ``i``-th read of stage ``s``, the
    masked linear map ``layer`` (bias included), on the source values ``v``; the column orders
    are whatever ``read`` uses (natural for the dense products, sorted for the staircase).

    Every read returns a tensor that nothing else holds (fresh, or scratch memory that the
    staircase reuses between calls for the hidden stages), so the reads are summed and a
    ReLU (the default activation) is applied in place when no residual stage needs the
    pre-activation: each stage then allocates one output instead of three, which matters for
    large layers (fresh memory is the cost of an elementwise pass). Autograd allows both: a
    linear map's backward does not read its output, and ReLU's reads the activated values.
    """
    in_place = not made.residual and type(made.activation) is nn.ReLU
    values, h = {INPUTS: inputs}, inputs
    for s, stage in enumerate(stages(made)):
        pre = None
        for i, (layer, source) in enumerate(stage.reads):
            y = read(s, i, layer, values[source])
            pre = y if pre is None else pre.add_(y)
        h = h + pre if stage.residual else pre
        if stage.activate:
            values[s] = torch.relu_(h) if in_place else made.activation(h)
    return h


class SortedLayout(NamedTuple):
    """The active mask set of a MADE with its units sorted by degree. Index tensors live on the
    MADE's device; counts are Python ints (read once, not per call)."""

    key: tuple[int, ...]
    input_perm: Tensor  # (D m,): input columns, feature by feature in the ordering
    output_perm: Tensor  # (D P,): output rows, likewise
    position: Tensor  # (D,): position of each feature in the ordering
    index: tuple[Tensor, ...]  # (1,) each: the feature at each position
    hidden_perms: list[Tensor]  # per hidden layer, its units sorted by degree
    hidden_counts: list[list[int]]  # per hidden layer, units of degree 0..D-1, then >= D

    def source_perm(self, source: int, context_features: int) -> Tensor:
        """Columns of a layer reading ``source``, in sorted order: for the inputs the context
        first (degree 0), then the features in the ordering."""
        if source != INPUTS:
            return self.hidden_perms[source]
        if not context_features:
            return self.input_perm
        width = self.input_perm.numel()
        context = torch.arange(width, width + context_features, device=self.input_perm.device)
        return torch.cat([context, self.input_perm])

    def source_counts(self, source: int, made: MADE) -> list[int]:
        """Units of ``source`` of degree ``0..D`` (sorted inputs: context, then ``m`` per
        feature)."""
        if source != INPUTS:
            return self.hidden_counts[source]
        return [made.context_features] + [made.inputs_per_feature] * made.features

    def stage_counts(self, stage: int, made: MADE) -> list[int]:
        """Units of ``stage`` of degree ``0..D`` (outputs: ``P`` of each degree ``1..D``)."""
        if stage < len(self.hidden_counts):
            return self.hidden_counts[stage]
        return [0] + [made.params_per_feature] * made.features

    def stage_perm(self, stage: int) -> Tensor:
        """Rows of ``stage`` (its units) in sorted order."""
        if stage < len(self.hidden_perms):
            return self.hidden_perms[stage]
        return self.output_perm


_layouts: weakref.WeakKeyDictionary[MADE, SortedLayout] = weakref.WeakKeyDictionary()


def layout_key(made: MADE) -> tuple[int, ...]:
    """What identifies the active mask set's degrees: changes with ``set_mask``,
    ``load_state_dict`` and ``.to()``."""
    return (
        made.mask_set_index,
        made.orders.data_ptr(),
        made.orders._version,
        made.hidden_degree_sets.data_ptr(),
        made.hidden_degree_sets._version,
    )


def sorted_layout(made: MADE) -> SortedLayout:
    """The sorted layout of ``made``'s active mask set, cached until the set or its degrees
    change."""
    key = layout_key(made)
    layout = _layouts.get(made)
    if layout is not None and layout.key == key:
        return layout
    with torch.inference_mode(False):  # kept across calls: no inference tensors (autograd)
        layout = _build(made, key)
    _layouts[made] = layout
    return layout


def _build(made: MADE, key: tuple[int, ...]) -> SortedLayout:
    """The layout of the active mask set (see :func:`sorted_layout`)."""
    features, order = made.features, made.order
    degrees = made.degrees()[1:]
    return SortedLayout(
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


def _expand(order: Tensor, width: int) -> Tensor:
    """Indices of ``width`` consecutive units per feature, feature by feature in ``order``."""
    return (order[:, None] * width + torch.arange(width, device=order.device)).flatten()
