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
scored afresh, so its log-density carries gradients). Build a new ``FlowDistribution`` after
changing the flow's parameters, as with any torch distribution.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints

if TYPE_CHECKING:
    from flowkit.flows.flow import Flow

_Shape = torch.Size | tuple[int, ...] | list[int]


class FlowDistribution(Distribution):
    r"""A flow ``p(x | c)`` as a torch distribution with event shape ``(D,)``.

    Args:
        flow: a :class:`flowkit.Flow` (anything with ``features``, ``context_features``,
            ``log_prob(x, context)`` and ``sample_and_log_prob(n, context)``).
        context: ``(*batch_shape, C)`` tensor, one conditioning vector per batch element, or
            None for an unconditional flow (``batch_shape = ()``).
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
    support = constraints.real_vector

    def __init__(
        self, flow: Flow, context: Tensor | None = None, validate_args: bool | None = None
    ):
        if flow.context_features == 0:
            if context is not None:
                raise ValueError("'context' was given but the flow has context_features=0")
            batch_shape = torch.Size()
        else:
            if not isinstance(context, Tensor) or context.dim() < 1:
                raise ValueError(
                    f"'context' should be a tensor of shape (..., {flow.context_features}), "
                    f"got {context if context is None else tuple(context.shape)}"
                )
            if context.shape[-1] != flow.context_features:
                raise ValueError(
                    f"'context' should have shape (..., {flow.context_features}), "
                    f"got {tuple(context.shape)}"
                )
            batch_shape = context.shape[:-1]
        self.flow = flow
        self.context = context
        self._cache: tuple[Tensor, Tensor] | None = None
        super().__init__(batch_shape, torch.Size([flow.features]), validate_args)

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
        batch_shape = torch.Size(batch_shape)
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
        sample_shape = torch.Size(sample_shape)
        shape = sample_shape + self.batch_shape
        n, b = math.prod(sample_shape), math.prod(self.batch_shape)
        if n * b == 0:
            ref = self.flow._reference()
            x = torch.empty(*shape, *self.event_shape, dtype=ref.dtype, device=ref.device)
            return x, x.new_empty(shape)
        if self.context is None:
            x, log_p = self.flow.sample_and_log_prob(n * b)
        else:
            rows = self.context.reshape(b, self.context.shape[-1])
            x, log_p = self.flow.sample_and_log_prob(n, rows)
        return x.reshape(*shape, *self.event_shape), log_p.reshape(shape)

    def rsample(self, sample_shape: _Shape = ()) -> Tensor:
        """Reparameterized samples, ``(*sample_shape, *batch_shape, D)``. With gradients enabled,
        the sample and its log-density are kept for :meth:`log_prob` (see the module notes)."""
        x, log_p = self.rsample_and_log_prob(sample_shape)
        self._cache = (x, log_p) if torch.is_grad_enabled() else None
        return x

    def log_prob(self, value: Tensor) -> Tensor:
        """``log p(value | context)`` for ``value`` of shape ``(..., *batch_shape, D)``
        (broadcasting as in torch); returns the broadcast shape without the last axis."""
        if self._cache is not None and value is self._cache[0]:
            log_p = self._cache[1]
            return log_p if torch.is_grad_enabled() else log_p.detach()
        if self._validate_args:
            self._validate_sample(value)
        features = self.event_shape[0]
        if not isinstance(value, Tensor) or value.dim() < 1 or value.shape[-1] != features:
            raise ValueError(
                f"'value' should have shape (..., {features}), got "
                f"{tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__}"
            )
        try:  # checked here too: torch.compile turns validate_args off for every distribution
            shape = torch.broadcast_shapes(value.shape[:-1], self.batch_shape)
        except RuntimeError:
            raise ValueError(
                f"'value' of shape {tuple(value.shape)} is not broadcastable to "
                f"(..., *batch_shape, {features}) with batch_shape={tuple(self.batch_shape)}"
            ) from None
        if math.prod(shape) == 0:
            return value.new_empty(shape)
        if self.context is None:  # i.i.d. over the batch: score each distinct value once
            log_p = self.flow.log_prob(value.reshape(-1, features))
            return log_p.reshape(value.shape[:-1]).expand(shape)
        context_features = self.context.shape[-1]
        x = value.expand(*shape, features).reshape(-1, features)
        context = self.context.expand(*shape, context_features).reshape(-1, context_features)
        return self.flow.log_prob(x, context).reshape(shape)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(features={self.flow.features}, "
            f"context_features={self.flow.context_features}, "
            f"batch_shape={tuple(self.batch_shape)})"
        )
