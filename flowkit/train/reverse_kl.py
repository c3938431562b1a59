r"""Reverse KL (variational inference): :func:`fit_reverse_kl`.

The flow is its own data source: each step it draws a batch with ``sample_and_log_prob``, and
the loss is the :class:`~flowkit.train.objectives.NegElbo` of those samples under the target.
The optimisation itself is the shared engine of :mod:`flowkit.train.loop`.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from ..flows import Flow, spline_edge_shares, spline_layers
from ..transforms import BatchNorm
from ..validation import check_batch_context, check_int, reference
from .arrays import as_tensor
from .history import History
from .loop import RunPlan, Trainer
from .objectives import NegElbo, Objective, require_method
from .options import TrainOptions, Unpack, resolve
from .session import session
from .sources import ReverseKLSource, local_batch_size


def fit_reverse_kl(
    flow: nn.Module,
    target_log_density: Callable[..., Tensor],
    *,
    steps: int,
    batch_size: int = 256,
    context: Tensor | Callable[[int, torch.Generator], Tensor] | None = None,
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

    **Amortized inference**: with ``context``, a conditional flow ``q(x | c)`` is fitted to a
    family of targets ``p~(x | c)`` at once (a posterior for every observation ``c``): each step
    draws ``batch_size`` contexts and one sample at each, and maximises the mean of
    :math:`\log \tilde p(x_i \mid c_i) - \log q(x_i \mid c_i)`; ``History.elbo`` is that mean
    (``E_c[log Z(c)] - E_c[KL]``). The flow's context standardization is set from the first
    step's contexts.

    Args:
        flow: model with ``sample_and_log_prob(n) -> (x, log_q)`` (with ``context``,
            ``sample_and_log_prob(None, c)``, one sample per row of ``c``) whose ``x`` is
            differentiable in the parameters.
        target_log_density: ``x: (N, D) -> log p~(x): (N,)`` (with ``context``,
            ``(x, c) -> log p~(x | c)``, ``c`` ``(N, C)``), differentiable in ``x`` (a target
            off the autograd graph is refused), finite on all of ``R^D`` (for a target on a box,
            give the flow ``bounds=``), accepting tensors on the training device. A spline
            flow's interval is in the target's units here (no data sets its standardization):
            a warning says when the samples crowd its edge (docs/training.md).
        steps: number of optimizer steps.
        batch_size: samples per step; under ``torchrun`` each process draws
            ``batch_size / world_size`` samples with its own seed.
        context: for a flow with ``context_features = C > 0`` (required there, refused
            otherwise): the contexts to fit at, a tensor ``(M, C)`` whose rows each step draws
            uniformly with replacement, or a function ``context(n, generator) -> (n, C)``
            drawing fresh ones from the ``torch.Generator`` it is given (seeded by ``seed``, on
            the training device: ``torch.randn(n, C, generator=g, device=g.device)``). Numpy
            arrays and other floating dtypes are cast to the flow's, as ``fit`` casts data.
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
    context_features = getattr(flow, "context_features", 0)
    if context_features and context is None:
        raise ValueError(
            f"'flow' has context_features={context_features}: pass 'context', the contexts to "
            "fit it at (a tensor (M, C) or a function context(n, generator) -> (n, C))"
        )
    if context is not None and not context_features:
        raise ValueError("'context' was given but 'flow' has context_features=0")
    if not callable(target_log_density):
        what = "(x, c) -> log p~(x | c)" if context is not None else "x -> log p~(x)"
        raise TypeError(f"'target_log_density' should be a callable {what} of shape (N,)")
    _check_arity(target_log_density, context is not None)
    if any(isinstance(m, BatchNorm) for m in flow.modules()):
        warnings.warn(
            "'flow' has batch-norm layers, whose statistics move only when data pass through "
            "them (log_prob in training mode); reverse KL only samples, so they stay at their "
            "initial values and each layer is a learned elementwise affine map, not a batch "
            "norm. Build the flow without batch_norm for reverse KL", UserWarning, stacklevel=2)
    steps = check_int("steps", steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    with session(flow, o["device"], o["seed"], o["checkpoint_dir"], o["resume"], "neg_elbo") as s:
        like = reference(flow)
        if isinstance(context, Tensor | np.ndarray):  # on the device, in the flow's dtype
            context = check_batch_context(as_tensor("context", context, s.device, like.dtype),
                                          context_features, like)
            if context is None or context.dim() != 2 or len(context) == 0:
                raise ValueError(f"'context' should be a tensor (M, {context_features}) of "
                                 f"M >= 1 contexts, got shape {tuple(context.shape)}")
        elif context is not None and not callable(context):
            raise TypeError("'context' should be a tensor (M, C) or a function "
                            f"context(n, generator) -> (n, C), got {type(context).__name__}")
        source = ReverseKLSource(batch_size, local_batch_size(batch_size, s.dist), context,
                                 context_features, s.seed, s.dist, like)
        objective = Objective(flow, NegElbo(target_log_density))
        trainer = Trainer(s, flow, objective, source, o, RunPlan(steps), None)
        history = trainer.run(lambda args: _check_target(flow, target_log_density, *args[1:]))
    contexts = None
    if context is not None:  # where the fitted flow is looked at for the spline's edge
        contexts = source.draw(1000, torch.Generator(like.device).manual_seed(s.seed + 1))
        contexts = contexts.to(reference(flow).device)  # where the session left the flow
    _warn_if_held_by_a_spline_interval(flow, contexts)
    return history


def _check_arity(target: Callable[..., Tensor], amortized: bool) -> None:
    """Refuse a target that cannot be called as ``target(x, c)`` (amortized) or ``target(x)``."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # no signature to read (a builtin): let the call decide
        return
    try:
        signature.bind(*(None,) * (2 if amortized else 1))
    except TypeError:
        call, other = ("target_log_density(x, c)", "without 'context'") if amortized else (
            "target_log_density(x)", "with 'context'")
        raise TypeError(
            f"'target_log_density' is called as {call}, but its signature is {signature} "
            f"(the other form is for fitting {other})"
        ) from None


def _check_target(
    flow: nn.Module, target: Callable[..., Tensor], context: Tensor | None = None
) -> None:
    """Before the first step (``context``: that step's contexts): both log-densities have shape
    ``(N,)``, and the target's carries the gradient of its input (a target computed under
    ``no_grad``, on ``x.detach()`` or through numpy would train nothing, silently)."""
    if context is None:
        n = 2
        x, log_q = flow.sample_and_log_prob(n)  # with gradients, as the steps draw them
        log_p = target(x)
    else:
        n = len(context[:2])  # a step of batch_size=1 draws one
        x, log_q = flow.sample_and_log_prob(None, context[:n])
        log_p = target(x, context[:n])
    for name, t in (("'flow'.sample_and_log_prob", log_q), ("'target_log_density'", log_p)):
        if not isinstance(t, Tensor) or t.shape != (n,):
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} should return log-densities of shape (N,), got {got} for "
                             f"N={n}")
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


def _warn_if_held_by_a_spline_interval(flow: nn.Module, contexts: Tensor | None) -> None:
    layers = spline_layers(flow) if isinstance(flow, Flow) else []
    if not layers:
        return
    device = next(flow.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
            torch.no_grad():  # the caller's random streams stay as the training left them
        x = flow.sample(1000) if contexts is None else flow.sample(None, contexts)
    shares = spline_edge_shares(flow, x, edge=EDGE, context=contexts)
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
