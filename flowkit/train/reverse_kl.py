r"""Reverse KL (variational inference): :func:`fit_reverse_kl`.

The flow is its own data source: each step it draws a batch with ``sample_and_log_prob``, and
the loss is the :class:`~flowkit.train.objectives.NegElbo` of those samples under the target.
The optimisation itself is the shared engine of :mod:`flowkit.train.loop`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..flows import Flow, spline_edge_shares, spline_layers
from ..validation import check_int
from .history import History
from .loop import RunPlan, Trainer
from .objectives import NegElbo, Objective, require_method
from .options import TrainOptions, Unpack, resolve
from .session import session
from .sources import ReverseKLSource, local_batch_size


def fit_reverse_kl(
    flow: nn.Module,
    target_log_density: Callable[[Tensor], Tensor],
    *,
    steps: int,
    batch_size: int = 256,
    **options: Unpack[TrainOptions],
) -> History:
    r"""Fit ``flow`` to an unnormalised density by reverse KL (variational inference).

    Maximises the evidence lower bound with reparameterised samples
    :math:`x_i = f_\theta^{-1}(z_i)` from ``flow.sample_and_log_prob``:

    .. math::
        \mathrm{ELBO}(\theta) = \mathbb{E}_{q_\theta}[\log \tilde p(x) - \log q_\theta(x)]
        = \log Z - \mathrm{KL}(q_\theta \,\|\, p) \le \log Z,

    where :math:`\tilde p = Z p`. The loss is :math:`-\mathrm{ELBO}` estimated on ``batch_size``
    samples; ``History.elbo`` gives the per-step estimates. An IAF is the natural choice (one
    pass for sampling and log-density); a MAF works but samples in ``D`` passes.

    Args:
        flow: unconditional model with ``sample_and_log_prob(n) -> (x, log_q)`` whose ``x`` is
            differentiable in the parameters.
        target_log_density: ``x: (N, D) -> log p~(x): (N,)``, differentiable in ``x`` (a target
            off the autograd graph is refused), finite on all of ``R^D`` (for a target on a box,
            give the flow ``bounds=``), accepting tensors on the training device. A spline
            flow's interval is in the target's units here (no data sets its standardization):
            a warning says when the samples crowd its edge (docs/training.md).
        steps: number of optimizer steps.
        batch_size: samples per step; under ``torchrun`` each process draws
            ``batch_size / world_size`` samples with its own seed.
        **options: the options shared with :func:`~flowkit.train.fit`, described in
            :class:`~flowkit.train.TrainOptions`.

    Returns:
        The :class:`~flowkit.train.History` (``objective="neg_elbo"``).

    Example:
        >>> import torch, flowkit
        >>> flow = flowkit.IAF(2, hidden_features=(16,), layers=2)
        >>> target = lambda x: -0.5 * ((x - 3.0) ** 2).sum(-1)  # N((3, 3), I), unnormalised
        >>> h = fit_reverse_kl(flow, target, steps=20, batch_size=64, seed=0, progress=False)
        >>> h.objective, len(h.elbo)
        ('neg_elbo', 20)
    """
    require_method(flow, "sample_and_log_prob", "fit_reverse_kl")
    o = resolve("fit_reverse_kl", options)
    if getattr(flow, "context_features", 0):
        raise ValueError(
            f"fit_reverse_kl fits unconditional flows; 'flow' has "
            f"context_features={flow.context_features}"
        )
    if not callable(target_log_density):
        raise TypeError("'target_log_density' should be a callable x -> log p~(x) of shape (N,)")
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    with session(flow, o["device"], o["seed"], o["checkpoint_dir"], o["resume"], "neg_elbo") as s:
        source = ReverseKLSource(batch_size, local_batch_size(batch_size, s.dist))
        objective = Objective(flow, NegElbo(target_log_density))
        trainer = Trainer(s, flow, objective, source, o, RunPlan(steps), None)
        history = trainer.run(lambda args: _check_target(flow, target_log_density))
    _warn_if_held_by_a_spline_interval(flow)
    return history


def _check_target(flow: nn.Module, target: Callable[[Tensor], Tensor]) -> None:
    """Before the first step: both log-densities have shape ``(N,)``, and the target's carries
    the gradient of its input (a target computed under ``no_grad``, on ``x.detach()`` or through
    numpy would train nothing, silently)."""
    x, log_q = flow.sample_and_log_prob(2)  # with gradients, as the steps draw them
    log_p = target(x)
    for name, t in (("'flow'.sample_and_log_prob", log_q), ("'target_log_density'", log_p)):
        if not isinstance(t, Tensor) or t.shape != (2,):
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} should return log-densities of shape (N,), got {got} for N=2")
    if not log_p.is_floating_point():
        raise TypeError(
            f"'target_log_density' should return floating log-densities, got dtype {log_p.dtype} "
            "(integer or bool values carry no gradient): compute them in the dtype of its input"
        )
    if x.requires_grad and not log_p.requires_grad:
        raise ValueError(
            "'target_log_density' returned log-densities that do not depend on its input through "
            "autograd (computed under torch.no_grad(), from x.detach() or x.numpy(), or not from "
            "x at all): reverse KL needs the gradient of log p~(x) with respect to x"
        )


EDGE, CROWDED = 0.9, 0.01
"""A spline flow fitted by reverse KL is warned about when more than ``CROWDED`` of its samples
enter some spline layer beyond ``EDGE`` times its interval's bound (see
:func:`flowkit.flows.spline_edge_shares`)."""


def _warn_if_held_by_a_spline_interval(flow: nn.Module) -> None:
    layers = spline_layers(flow) if isinstance(flow, Flow) else []
    if not layers:
        return
    device = next(flow.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
            torch.no_grad():  # the caller's random streams stay as the training left them
        x = flow.sample(1000)
    shares = spline_edge_shares(flow, x, edge=EDGE)
    if max(shares) > CROWDED:
        bounds = sorted({t.transformer.bound for t in layers})
        warnings.warn(
            f"{max(shares):.0%} of the flow's samples reach the edge of a spline layer's "
            f"interval (beyond {EDGE:g} of its bound {', '.join(f'{b:g}' for b in bounds)}), "
            "which the layer cannot move mass across: the fit may be held there rather than "
            "by the target. In reverse KL no data sets the flow's standardization, so the "
            "interval is in the target's own units: shift and scale the target towards the "
            "origin and unit scale, widen the interval (transformer_kwargs={'bound': ...}), or "
            "use the affine transformer",
            UserWarning, stacklevel=3,
        )
