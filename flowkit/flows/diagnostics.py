"""Checks of a trained flow that need no reference density.

:func:`spline_edge_shares`: how much of a sample reaches the edge of a spline layer's interval.
A rational-quadratic spline layer shapes ``[-B, B]`` and maps each tail linearly onto itself,
so mass beyond ``B`` cannot be moved inside, and a flow whose samples crowd at ``±B`` is held
there by the interval rather than by the target (typical of reverse KL, where no data sets the
flow's standardization and the interval is in the target's own units).
"""

from __future__ import annotations

from torch import Tensor

from flowkit.flows.flow import Flow
from flowkit.nn.modes import evaluating
from flowkit.transforms import MaskedAutoregressive, RationalQuadraticSpline


def spline_edge_shares(
    flow: Flow, x: Tensor, context: Tensor | None = None, edge: float = 1.0
) -> list[float]:
    """For each spline layer of ``flow``, in the order ``x`` meets them, the share of the rows of
    ``x`` ``(N, D)`` whose value entering that layer lies beyond ``edge * B`` in some coordinate
    (``[-B, B]`` the layer's interval); empty for a flow without spline layers. ``x`` goes
    through the transforms' public ``forward`` (``D`` steps per layer for an IAF) in evaluation
    mode, which changes nothing in the flow (an unset standardization stays unset).

    Example:
        >>> import torch, flowkit
        >>> flow = flowkit.MAF(2, layers=2, transformer="spline", standardize=False)
        >>> spline_edge_shares(flow, torch.tensor([[0.0, 0.0], [6.0, 0.0]]))
        [0.5, 0.5]
    """
    transforms = list(flow.transform.transforms)
    splines = [i for i, t in enumerate(transforms) if _is_spline(t)]
    if not splines:
        return []
    shares = []
    with evaluating(flow):
        h = None if context is None else flow.embed_context(context)
        for t in transforms[: splines[-1] + 1]:  # no further than the last spline layer
            if _is_spline(t):
                beyond = (x.abs() > edge * t.transformer.bound).any(dim=-1)
                shares.append(beyond.double().mean().item())
            x = t(x, h if getattr(t, "context_features", 0) else None)[0]
    return shares


def spline_layers(flow: Flow) -> list[MaskedAutoregressive]:
    """The autoregressive layers of ``flow`` whose transformer is a spline, in the order data
    meets them (empty for an affine flow)."""
    return [t for t in flow.transform.transforms if _is_spline(t)]


def _is_spline(t: object) -> bool:
    return isinstance(t, MaskedAutoregressive) and isinstance(
        t.transformer, RationalQuadraticSpline
    )
