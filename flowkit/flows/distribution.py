r"""A :class:`flowkit.Flow` as a :class:`torch.distributions.Distribution`.

:class:`FlowDistribution` lets code written against ``torch.distributions`` (a VAE's posterior,
an RL policy, :class:`~torch.distributions.Independent`,
:class:`~torch.distributions.TransformedDistribution`) use a flow, conditional or not:

* ``event_shape`` is ``(D,)``, ``batch_shape`` is ``context.shape[:-1]`` (``()`` without a
  context, or whatever :meth:`~FlowDistribution.expand` asked for);
* ``log_prob(value)`` takes ``value`` of shape ``(*sample_shape, *batch_shape, D)`` (or anything
  that broadcasts against ``(*batch_shape, D)``) and returns the broadcast shape without the
  last axis;
* ``rsample(sample_shape)`` returns ``(*sample_shape, *batch_shape, D)``, differentiable in the
  flow's parameters and in the context.

Every call flattens the batch and calls the flow once: there is no Python loop over contexts.

Cached log-density of a sample. :meth:`~FlowDistribution.rsample` draws its samples with
:meth:`flowkit.Flow.sample_and_log_prob`, which gets ``log p(x)`` from the same inverse pass
at no extra cost, and keeps the pair. ``log_prob`` called on *that very tensor* (the same Python
object) returns the kept value instead of running the flow forward. For an IAF, whose forward
pass takes ``D`` sequential steps, this is what makes ``TransformedDistribution(...,
[TanhTransform(cache_size=1)])`` cheap in SAC-style code: the tanh transform hands back the
pre-squash tensor it cached, and the flow hands back its log-density. Only samples drawn with
gradients enabled are kept (a sample drawn by :meth:`sample` or under ``torch.no_grad()`` is
scored afresh, so its log-density carries gradients), and only while the tensor is not written
in place (``x.mul_(2)``, ``x[0] = 1`` bump its version; a write through ``x.data`` does not and
is not seen), and while the flow's parameters and buffers stay as they were: any ``torch.optim``
step, an in-place write, or a write through ``.data`` that changes the entry of each parameter
compared (a Polyak update moves them all) drops the kept value. A copy (``copy.deepcopy``, pickle)
leaves it out; a distribution whose context comes out of a network (not a leaf tensor) cannot be
deep-copied, as with torch's own distributions. With batch-norm
layers in training mode, the kept value is that of the sampling pass, which uses the running
averages, where ``log_prob`` of another tensor uses the batch's statistics (see
:meth:`flowkit.Flow.sample_and_log_prob`): compare densities in eval mode.

Values outside the support. A value with an infinite coordinate (an action clipped to +-1 and
mapped back through ``atanh``, say) has log-density ``-inf``, as in torch's distributions; a
NaN is a ValueError naming ``value``. ``support`` is the flow's (:attr:`flowkit.Flow.support`:
a box for a flow built with ``bounds``), and a value outside it has log-density ``-inf``
whether or not ``validate_args`` is on.

What has no closed form. A flow's entropy, mean, variance and KL divergences are integrals
without a closed form; they are Monte-Carlo estimates here, each with its sample count as an
argument (:meth:`~FlowDistribution.entropy`, :meth:`~FlowDistribution.sample_mean`,
:meth:`~FlowDistribution.sample_variance`, :func:`monte_carlo_kl`), reparameterized so they can
be optimized. The ``mean``, ``variance`` and ``stddev`` properties of torch's API cannot take a
sample count: they raise a ``NotImplementedError`` that names the estimators. ``cdf`` and
``icdf`` are not defined for a distribution over ``R^D`` in torch's elementwise sense and raise
``NotImplementedError`` saying so. :func:`torch.distributions.kl_divergence` with a
``FlowDistribution`` on either side returns :func:`monte_carlo_kl` with
:data:`KL_SAMPLES` samples.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints, register_kl

from flowkit.nn.optimizer_steps import total_steps
from flowkit.validation import (
    check_batch,
    check_batch_context,
    check_n,
    check_not_empty,
    check_torch_shape,
    nonfinite_rows,
    reference,
)

if TYPE_CHECKING:
    from flowkit.flows.flow import Flow

_Shape = torch.Size | tuple[int, ...] | list[int]

KL_SAMPLES = 1000
"""Samples of the Monte-Carlo KL estimate that :func:`torch.distributions.kl_divergence`
returns for a :class:`FlowDistribution` (:func:`monte_carlo_kl` takes the count)."""


class FlowDistribution(Distribution):
    r"""A flow ``p(x | c)`` as a torch distribution with event shape ``(D,)``; what
    ``flow(context)`` returns.

    Args:
        flow: a :class:`flowkit.Flow`.
        context: ``(*batch_shape, C)`` tensor, one conditioning vector per batch element, or
            None for an unconditional flow (``batch_shape = ()``). Checked here (dtype, device,
            finite), once for every later call.
        validate_args: as for every :class:`torch.distributions.Distribution`.

    Example:
        >>> import torch, flowkit
        >>> flow = flowkit.MAF(2, layers=2, hidden_features=(8,), context_features=3)
        >>> d = FlowDistribution(flow, torch.randn(5, 3))
        >>> d.batch_shape, d.event_shape
        (torch.Size([5]), torch.Size([2]))
        >>> x = d.rsample((4,))
        >>> x.shape, d.log_prob(x).shape
        (torch.Size([4, 5, 2]), torch.Size([4, 5]))
    """

    has_rsample = True

    def __init__(
        self, flow: Flow, context: Tensor | None = None, validate_args: bool | None = None
    ):
        from flowkit.flows.flow import Flow  # (flow.py imports this module)

        if not isinstance(flow, Flow):
            raise TypeError(f"'flow' should be a flowkit.Flow, got {type(flow).__name__}")
        context = check_batch_context(context, flow.context_features, reference(flow))
        batch_shape = torch.Size() if context is None else context.shape[:-1]
        if context is not None:
            check_not_empty("context", context, batch_shape)
        self.flow = flow
        self.context = context
        self._cache: tuple[Tensor, Tensor, int, _State] | None = None
        super().__init__(batch_shape, torch.Size([flow.features]), validate_args)

    def __getstate__(self) -> dict:
        """Without the kept sample (see the module notes): a copy (``copy.deepcopy``, pickle)
        scores its values afresh; the kept tensors belong to a graph, which torch cannot copy."""
        return {**self.__dict__, "_cache": None}

    @property
    def support(self) -> constraints.Constraint:
        """Where the density is positive: the data side of the flow's first transform where it
        says (a :class:`flowkit.transforms.Logit` of ``bounds``, a
        :class:`flowkit.transforms.TorchBijection` whose map's data side is an interval), else
        ``R^D``. ``log_prob`` is ``-inf`` outside it, whether or not ``validate_args`` is on
        (flowkit's own checks of ``value``, shape and NaN, run either way)."""
        return self.flow.support

    @property
    def transform(self) -> None:
        raise AttributeError(
            "a FlowDistribution has no 'transform' (zuko's flow(c).transform): map values into "
            "the base's space with d.to_base(value), or use the flow's layers, d.flow.transform"
        )

    @property
    def base(self) -> None:
        raise AttributeError(
            "a FlowDistribution has no 'base' (zuko's flow(c).base): the base distribution is "
            "d.flow.base"
        )

    @property
    def arg_constraints(self) -> dict[str, constraints.Constraint]:
        """``context`` is a real vector per batch element (no constraint without one)."""
        return {} if self.context is None else {"context": constraints.real_vector}

    def expand(
        self, batch_shape: _Shape, _instance: FlowDistribution | None = None
    ) -> FlowDistribution:
        """The same flow over a larger batch: the context is broadcast (without a copy) to
        ``(*batch_shape, C)``; an unconditional flow becomes ``batch_shape`` i.i.d. copies."""
        new = self._get_checked_instance(FlowDistribution, _instance)
        batch_shape = check_torch_shape("batch_shape", batch_shape)
        try:
            expandable = torch.broadcast_shapes(batch_shape, self.batch_shape) == batch_shape
        except RuntimeError:
            expandable = False
        if not expandable:
            raise ValueError(
                f"'batch_shape' {tuple(batch_shape)} cannot be expanded from this "
                f"distribution's batch_shape {tuple(self.batch_shape)}: sizes must match where "
                "the batch has more than one element"
            )
        new.flow = self.flow
        new.context = None
        if self.context is not None:
            new.context = self.context.expand(*batch_shape, self.context.shape[-1])
        new._cache = None
        super(FlowDistribution, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample_and_log_prob(self, sample_shape: _Shape = ()) -> tuple[Tensor, Tensor]:
        """Reparameterized samples ``(*sample_shape, *batch_shape, D)`` and their exact
        log-density ``(*sample_shape, *batch_shape)`` from one inverse pass of the flow (one MADE
        pass per layer for an IAF)."""
        sample_shape = check_torch_shape("sample_shape", sample_shape)
        # Flow's internal protocol (see its class notes): the context was checked in __init__
        if self.context is None:
            # i.i.d. copies: one flat batch of prod(sample_shape + batch_shape) draws
            x, log_p = self.flow._sample_batch(sample_shape + self.batch_shape, None, True)
        else:
            x, log_p = self.flow._sample_batch(sample_shape, self.context, True)
        assert log_p is not None
        return x, log_p

    def to_base(self, value: Tensor) -> tuple[Tensor, Tensor]:
        """``value`` ``(..., *batch_shape, D)`` mapped into the base's space with this
        distribution's context, and ``log|det|`` of the map: :meth:`flowkit.Flow.to_base`
        (zuko's ``flow(c).transform(value)``)."""
        return self.flow._to_base_checked(value, self.context, "value")

    def rsample(self, sample_shape: _Shape = ()) -> Tensor:
        """Reparameterized samples, ``(*sample_shape, *batch_shape, D)``. With gradients enabled,
        the sample and its log-density are kept for :meth:`log_prob` (see the module notes)."""
        x, log_p = self.rsample_and_log_prob(sample_shape)
        self._cache = ((x, log_p, x._version, _state_version(self.flow))
                       if torch.is_grad_enabled() else None)
        return x

    def log_prob(self, value: Tensor) -> Tensor:
        """``log p(value | context)`` for ``value`` of shape ``(..., *batch_shape, D)``
        (broadcasting as in torch); returns the broadcast shape without the last axis.
        ``-inf`` where ``value`` has an infinite coordinate; NaN is an error."""
        if self._cache is not None and value is self._cache[0] and (
            value._version == self._cache[2]  # not written in place since (x.mul_(2), x[0] = 1)
            and _same_state(_state_version(self.flow), self._cache[3])  # nor the flow
        ):
            log_p = self._cache[1].clone()  # a tensor of its own, as every call returns
            return log_p if torch.is_grad_enabled() else log_p.detach()
        features = self.event_shape[0]
        value = check_batch("value", value, features, reference(self.flow))
        try:  # checked here too: torch.compile turns validate_args off for every distribution
            shape = torch.broadcast_shapes(value.shape[:-1], self.batch_shape)
        except RuntimeError:
            raise ValueError(
                f"'value' of shape {tuple(value.shape)} is not broadcastable to "
                f"(..., *batch_shape, {features}) with batch_shape={tuple(self.batch_shape)}"
            ) from None
        if math.prod(shape) == 0:
            return value.new_empty(shape)
        outside = nonfinite_rows("value", value)
        return self.flow._log_prob_batch(value, self.context, shape, outside)

    # ------------------------------------------------------- what has no closed form

    def entropy(self, n: int = 1000) -> Tensor:
        r"""Monte-Carlo estimate of the entropy, ``batch_shape``:
        :math:`H \approx -\frac1n \sum_i \log p(x_i)`, :math:`x_i \sim p` (one inverse pass
        for all ``n``; reparameterized, so it can be maximized). Its standard error is about
        ``std(log p(x)) / sqrt(n)``."""
        return -self.rsample_and_log_prob((check_n(n),))[1].mean(0)

    def sample_mean(self, n: int = 1000) -> Tensor:
        """Monte-Carlo estimate of the mean, ``(*batch_shape, D)``: the mean of ``n``
        reparameterized samples."""
        return self.rsample((check_n(n),)).mean(0)

    def sample_variance(self, n: int = 1000) -> Tensor:
        """Monte-Carlo estimate of the variance of each coordinate, ``(*batch_shape, D)``: the
        unbiased variance of ``n >= 2`` reparameterized samples."""
        if check_n(n) < 2:
            raise ValueError(f"'n' should be at least 2 for a variance, got {n}")
        return self.rsample((n,)).var(0)

    @property
    def mean(self) -> Tensor:
        raise NotImplementedError(
            "a flow's mean has no closed form; estimate it with sample_mean(n) (n samples)"
        )

    @property
    def variance(self) -> Tensor:
        raise NotImplementedError(
            "a flow's variance has no closed form; estimate it with sample_variance(n) "
            "(n samples)"
        )

    @property
    def mode(self) -> Tensor:
        raise NotImplementedError(
            "a flow's mode has no closed form, and the image of the base distribution's mode is "
            "not it (the Jacobian moves the mode); search for it from samples: of "
            "x = d.sample((n,)), the one of highest d.log_prob(x) along the first axis, refined "
            "by gradient ascent on d.log_prob. The image of the base's mode (a deterministic "
            "action) is d.flow.sample_from_noise(zeros(D), d.context)"
        )

    def cdf(self, value: Tensor) -> Tensor:
        raise NotImplementedError(
            "FlowDistribution has no cdf: torch's cdf is elementwise, and a flow over R^D has "
            "only a joint CDF without closed form; estimate P(X <= value) as "
            "(d.sample((n,)) <= value).all(-1).float().mean(0)"
        )

    def icdf(self, value: Tensor) -> Tensor:
        raise NotImplementedError(
            "FlowDistribution has no icdf: a distribution over R^D has no inverse CDF in "
            "torch's elementwise sense; draw samples with sample() or rsample()"
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(features={self.flow.features}, "
            f"context_features={self.flow.context_features}, "
            f"batch_shape={tuple(self.batch_shape)})"
        )


_State = tuple[int, int, Tensor | None]


def _state_version(flow: Flow) -> _State:
    """What changes when the parameters or buffers of ``flow`` may have changed: the count of
    ``torch.optim`` steps (fused kernels do not bump version counters), the sum of their
    version counters (in-place writes: a standardization set, ``p.mul_(0.9)``) and one entry
    of each parameter and floating buffer (writes through ``.data``, which bump no counter: the
    usual Polyak update ``target.data.copy_(...)``, ``vector_to_parameters``; a write through
    ``.data`` of other entries only is not seen)."""
    params = [t for t in (*flow.parameters(), *flow.buffers())
              if t.numel() and t.is_floating_point()]
    entries = (torch.stack([p.detach().reshape(-1)[p.numel() // 2] for p in params])
               if params else None)
    return (total_steps(), sum(t._version for t in (*flow.parameters(), *flow.buffers())),
            entries)


def _same_state(now: _State, then: _State) -> bool:
    """Whether two :func:`_state_version` of one flow are the same state."""
    return now[:2] == then[:2] and (now[2] is None or torch.equal(now[2], then[2]))


def monte_carlo_kl(p: Distribution, q: Distribution, n: int = KL_SAMPLES) -> Tensor:
    r"""Monte-Carlo estimate of :math:`KL(p \| q) = E_p[\log p(x) - \log q(x)]` from ``n``
    samples of ``p``, shape: the broadcast batch shape of ``p`` and ``q``.

    One of them is a :class:`FlowDistribution`, the other any distribution with ``log_prob``
    and the same event shape. Samples of a flow come with their log-density from the same pass
    (no second pass) and are reparameterized, so the estimate is differentiable in the flow's
    parameters (and in ``p``'s, when ``p`` has ``rsample``). Unbiased; its standard error is
    about ``std(log p(x) - log q(x)) / sqrt(n)``.

    Example:
        >>> import torch, flowkit
        >>> from torch.distributions import Independent, Normal
        >>> flow = flowkit.MAF(2, layers=2, hidden_features=(8,))
        >>> q = Independent(Normal(torch.zeros(2), torch.ones(2)), 1)
        >>> monte_carlo_kl(flow(), q, n=100).abs().item() < 1e-5  # it starts as the identity
        True
    """
    n = check_n(n)
    if p.event_shape != q.event_shape:
        raise ValueError(
            f"'p' and 'q' should have the same event shape, got {tuple(p.event_shape)} and "
            f"{tuple(q.event_shape)} (wrap a distribution over single coordinates in "
            "torch.distributions.Independent(..., 1))"
        )
    try:
        shape = torch.broadcast_shapes(p.batch_shape, q.batch_shape)
    except RuntimeError as e:
        raise ValueError(
            f"the batch shapes of 'p' {tuple(p.batch_shape)} and 'q' {tuple(q.batch_shape)} "
            "do not broadcast"
        ) from e
    if p.batch_shape != shape:  # draw a sample for every batch member of the result
        p = p.expand(shape)
    if isinstance(p, FlowDistribution):
        x, log_p = p.rsample_and_log_prob((n,))
    else:
        x = p.rsample((n,)) if p.has_rsample else p.sample((n,))
        log_p = p.log_prob(x)
    return (log_p - q.log_prob(x)).mean(0)


@register_kl(FlowDistribution, FlowDistribution)
@register_kl(FlowDistribution, Distribution)
@register_kl(Distribution, FlowDistribution)
def _kl_flow(p: Distribution, q: Distribution) -> Tensor:
    """:func:`torch.distributions.kl_divergence` for flows: :func:`monte_carlo_kl` with
    :data:`KL_SAMPLES` samples."""
    return monte_carlo_kl(p, q, KL_SAMPLES)
