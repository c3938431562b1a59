"""Checks of a trained flow that need no reference density.

:func:`spline_edge_shares`: how much of a sample reaches the edge of a spline layer's interval.
A rational-quadratic spline layer shapes ``[-B, B]`` and maps each tail linearly onto itself,
so mass beyond ``B`` cannot be moved inside, and a flow whose samples crowd at ``±B`` is held
there by the interval rather than by the target (typical of reverse KL, where no data sets the
flow's standardization and the interval is in the target's own units).

:func:`importance_sampling`: the flow as the proposal of an unnormalised target (variational
inference): the estimate of ``log Z``, the ELBO and the effective sample size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from flowkit.flows.flow import Flow
from flowkit.nn.modes import evaluating
from flowkit.transforms import MaskedAutoregressive, RationalQuadraticSpline
from flowkit.validation import check_batch_context, check_n, reference


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


class ImportanceEstimate(NamedTuple):
    r"""What :func:`importance_sampling` returns, from the log-weights
    :math:`\log w_i = \log \tilde p(x_i) - \log q(x_i)` of ``n`` samples ``x_i ~ q``."""

    #: :math:`\log \frac1n \sum_i w_i`, an estimate of :math:`\log Z` (consistent; its
    #: expectation is at most :math:`\log Z`, by Jensen's inequality).
    log_z: Tensor
    #: :math:`\frac1n \sum_i \log w_i = \log Z - \mathrm{KL}(q \| p)`, estimated.
    elbo: Tensor
    #: Kish's effective sample size over ``n``, :math:`(\sum w)^2 / (n \sum w^2)` in
    #: ``(0, 1]``: 1 when ``q = p``, near ``1/n`` when one sample carries the weight. It does
    #: not see modes of ``p`` that ``q`` misses (mass ``q`` never samples).
    ess: Tensor
    #: ``(n,)`` (``(n, *batch)`` with a context), for diagnostics of your own.
    log_weights: Tensor


def importance_sampling(
    flow: Flow,
    target_log_density: Callable[..., Tensor],
    n: int = 10_000,
    context: Tensor | None = None,
) -> ImportanceEstimate:
    """Score ``flow`` as the proposal of an unnormalised density: ``n`` samples drawn in
    evaluation mode without gradients (the flow is left as it was), weighted by the target.

    Args:
        flow: the proposal ``q``.
        target_log_density: ``x (n, D) -> log p~(x) (n,)``; with ``context``,
            ``(x, c) -> log p~(x | c)`` on the flattened samples ``(n * B, D)`` and their
            contexts ``(n * B, C)``.
        n: samples (per context row).
        context: ``(C,)`` or ``(B, C)`` for a conditional flow: the estimates are then per
            context row, shape ``(B,)`` (``()`` for ``(C,)``).

    Returns:
        An :class:`ImportanceEstimate`: ``log_z``, ``elbo`` and ``ess`` are 0-dim tensors (per
        context row with a ``(B, C)`` context).

    Example:
        >>> import torch, flowkit
        >>> flow = flowkit.IAF(2, layers=1, hidden_features=(8,))  # the identity: q = N(0, I)
        >>> est = importance_sampling(flow, lambda x: -0.5 * x.square().sum(-1), n=1000)
        >>> round(est.log_z.item(), 4), round(est.ess.item(), 4)  # log(2 pi), exact weights
        (1.8379, 1.0)
    """
    n = check_n(n)
    like = reference(flow)
    context = check_batch_context(context, flow.context_features, like)
    with evaluating(flow):
        x, log_q = flow.sample_and_log_prob(n, context)
        rows = x.reshape(-1, x.shape[-1])
        if context is None:
            log_p = target_log_density(rows)
        else:
            c = context.expand(*x.shape[:-1], context.shape[-1])
            log_p = target_log_density(rows, c.reshape(-1, c.shape[-1]))
    if not isinstance(log_p, Tensor) or log_p.shape != (len(rows),):
        got = tuple(log_p.shape) if isinstance(log_p, Tensor) else type(log_p).__name__
        raise ValueError("'target_log_density' should return one log-density per sample, "
                         f"shape ({len(rows)},), got {got}")
    log_w = (log_p.reshape(log_q.shape) - log_q).double()
    log_z = torch.logsumexp(log_w, 0) - math.log(n)
    ess = torch.exp(2 * torch.logsumexp(log_w, 0) - torch.logsumexp(2 * log_w, 0)) / n
    return ImportanceEstimate(log_z, log_w.mean(0), ess, log_w)
