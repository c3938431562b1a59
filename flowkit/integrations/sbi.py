r"""flowkit flows as density estimators of the ``sbi`` library (NPE and NLE).

``sbi`` trains a conditional density estimator on simulations :math:`(\theta_i, x_i)`: for
neural posterior estimation (NPE) of :math:`q(\theta \mid x)`, for neural likelihood
estimation (NLE) of :math:`q(x \mid \theta)`. Its trainers take a *builder*, a function of a
batch of parameters and a batch of data returning a ``ConditionalDensityEstimator``;
:func:`posterior_nn` and :func:`likelihood_nn` return such builders for a flowkit
:func:`flowkit.MAF` or :func:`flowkit.IAF`::

    from sbi.inference import NPE
    from flowkit.integrations.sbi import posterior_nn

    builder = posterior_nn("maf", transformer="spline", hidden_features=(64, 64))
    inference = NPE(prior, density_estimator=builder)
    estimator = inference.append_simulations(theta, x).train()
    samples = inference.build_posterior(estimator).sample((1000,), x=x_o)

**z-scoring.** The builder standardizes both sides with the mean and standard deviation of
the batch it is given (sbi passes its training split), per element, as sbi's own flows do with
``z_score_x="independent"``: the density's input as :math:`u = (\theta - m) / s`, with the
exact change of variables

.. math::

    \log q(\theta \mid x) = \log q_{\text{flow}}(u \mid \tilde x) - \sum_d \log s_d,

and the condition as :math:`\tilde x = (x - m_x) / s_x` before the flow (and its embedding
network, if any) reads it. Samples are mapped back, :math:`\theta = m + s\,u`.

**Shapes.** Inputs and conditions may have any event shape (``input_shape``,
``condition_shape``); the flow sees them flattened to ``D`` and ``C`` numbers per row. An
embedding network passed as ``embedding`` therefore receives ``(rows, C)``: a network for
structured data (images, time series) reshapes them itself.

This module needs the package ``sbi`` (``pip install "flowkit-made[sbi]"``); ``import
flowkit`` never imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn

try:
    from sbi.neural_nets.estimators import ConditionalDensityEstimator
except ImportError as e:  # pragma: no cover - exercised only without sbi
    raise ImportError(
        "flowkit.integrations.sbi needs the package 'sbi': pip install \"flowkit-made[sbi]\" "
        f"(or pip install sbi); importing it failed with: {e}"
    ) from e

from flowkit.flows import IAF, MAF, Flow
from flowkit.transforms import Standardize

__all__ = ["FlowkitEstimator", "likelihood_nn", "posterior_nn", "z_score"]

Model = Literal["maf", "iaf"]
_BUILDERS: dict[str, Callable[..., Flow]] = {"maf": MAF, "iaf": IAF}


def z_score(name: str, batch: Tensor, enabled: bool) -> tuple[Tensor, Tensor]:
    """Per-element ``(shift, scale)`` of a batch ``(N, *event_shape)``: its mean and standard
    deviation over the batch (or ``0`` and ``1`` when ``enabled`` is False), each of shape
    ``event_shape``.

    Raises:
        ValueError: fewer than two rows, non-finite values, or an element that is constant
            over the batch (its scale would be 0), naming ``name`` and the element.
    """
    if not isinstance(batch, Tensor) or batch.dim() < 2:
        raise ValueError(
            f"'{name}' should be a tensor of shape (N, ...) with N >= 2, got "
            f"{tuple(batch.shape) if isinstance(batch, Tensor) else type(batch).__name__}"
        )
    event = batch.shape[1:]
    if not enabled:
        return torch.zeros(event, dtype=batch.dtype), torch.ones(event, dtype=batch.dtype)
    if batch.shape[0] < 2:
        raise ValueError(f"z-scoring '{name}' needs at least 2 rows, got {batch.shape[0]}")
    if not torch.isfinite(batch).all():
        raise ValueError(f"'{name}' contains NaN or Inf values; sbi removes invalid "
                         "simulations before building the estimator, check your simulator")
    shift, scale = batch.mean(0), batch.std(0)
    if (scale == 0).any():
        where = tuple(int(i) for i in (scale == 0).nonzero()[0])
        raise ValueError(
            f"'{name}' is constant over the batch at element {where}, so it cannot be "
            "z-scored; pass z_score_theta=False / z_score_x=False for that side or drop the "
            "element"
        )
    return shift, scale


class FlowkitEstimator(ConditionalDensityEstimator):
    r"""A flowkit :class:`~flowkit.Flow` as sbi's ``ConditionalDensityEstimator``, with
    z-scoring of the input and the condition (module doc).

    Shapes (``S`` samples, ``B`` conditions; ``input_shape`` and ``condition_shape`` are the
    event shapes):

    * ``log_prob(input, condition)``: ``input`` ``(S, B, *input_shape)`` or
      ``(B, *input_shape)``, ``condition`` ``(B, *condition_shape)`` or
      ``(S, B, *condition_shape)``, batch sizes broadcast (either may be 1); returns ``(S, B)``.
    * ``loss(input, condition)``: ``(B, ...)`` each, returns ``-log_prob``, ``(B,)``.
    * ``sample(sample_shape, condition)``: ``condition`` ``(B, *condition_shape)``, returns
      ``(*sample_shape, B, *input_shape)``; ``sample_and_log_prob`` also returns the
      log-densities, ``(*sample_shape, B)``, from the same pass (one pass per layer for an
      IAF).

    Args:
        flow: a conditional flow over ``D = prod(input_shape)`` features whose
            ``context_features`` is ``prod(condition_shape)``.
        input_shape: event shape of the input.
        condition_shape: event shape of the condition.
        input_shift, input_scale: z-scoring of the input, shape ``input_shape`` (kept in a
            :class:`flowkit.transforms.Standardize`, ``input_standardize``).
        condition_shift, condition_scale: z-scoring of the condition, shape
            ``condition_shape`` (``condition_standardize``).
    """

    def __init__(
        self,
        flow: Flow,
        input_shape: torch.Size,
        condition_shape: torch.Size,
        input_shift: Tensor,
        input_scale: Tensor,
        condition_shift: Tensor,
        condition_scale: Tensor,
    ):
        super().__init__(flow, torch.Size(input_shape), torch.Size(condition_shape))
        features, context = math.prod(self.input_shape), math.prod(self.condition_shape)
        if flow.features != features or flow.context_features != context:
            raise ValueError(
                f"'flow' should have features={features} and context_features={context} "
                f"(input_shape {tuple(self.input_shape)}, condition_shape "
                f"{tuple(self.condition_shape)}), got features={flow.features} and "
                f"context_features={flow.context_features}"
            )
        self.input_standardize = Standardize(
            features, input_shift.reshape(features), input_scale.reshape(features)
        )
        self.condition_standardize = Standardize(
            context, condition_shift.reshape(context), condition_scale.reshape(context)
        )

    @property
    def embedding_net(self) -> nn.Module | None:
        """The flow's embedding network (``None`` if it has none)."""
        return getattr(self.net, "embedding", None)

    def _flat_condition(self, condition: Tensor) -> Tensor:
        """``(..., *condition_shape)`` -> z-scored ``(prod(...), C)``."""
        flat = condition.reshape(-1, self.condition_standardize.features)
        return self.condition_standardize(flat)[0]

    def log_prob(self, input: Tensor, condition: Tensor) -> Tensor:
        """``log q(input | condition)``, shape ``(S, B)`` (class doc)."""
        self._check_input_shape(input)
        self._check_condition_shape(condition)
        input, condition, batch = self._broadcast_and_align(input, condition)
        samples = input.shape[0]
        u, log_det = self.input_standardize(input.reshape(-1, self.input_standardize.features))
        log_q = self.net.log_prob(u, self._flat_condition(condition)) + log_det
        return log_q.reshape(samples, batch)

    def loss(self, input: Tensor, condition: Tensor) -> Tensor:
        """Negative log-density of a training batch, ``(B,)``."""
        return -self.log_prob(input.unsqueeze(0), condition)[0]

    def _sample_shapes(self, sample_shape: Any, condition: Tensor) -> tuple[torch.Size, int]:
        self._check_condition_shape(condition)
        if condition.dim() != len(self.condition_shape) + 1:
            raise ValueError(
                f"'condition' should have shape (B, {', '.join(map(str, self.condition_shape))})"
                f" to sample, got {tuple(condition.shape)}"
            )
        return torch.Size(sample_shape), condition.shape[0]

    def sample(self, sample_shape: Any, condition: Tensor) -> Tensor:
        """Samples ``(*sample_shape, B, *input_shape)`` for conditions ``(B, ...)``."""
        return self.sample_and_log_prob(sample_shape, condition, with_log_prob=False)[0]

    def sample_and_log_prob(
        self, sample_shape: Any, condition: Tensor, with_log_prob: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Samples ``(*sample_shape, B, *input_shape)`` and their log-densities
        ``(*sample_shape, B)`` from one pass of the flow (``None`` for the log-densities when
        ``with_log_prob`` is False)."""
        shape, batch = self._sample_shapes(sample_shape, condition)
        n = shape.numel()
        context = self._flat_condition(condition)
        if with_log_prob:
            u, log_q = self.net.sample_and_log_prob(n, context)  # (n, B, D), (n, B)
        else:
            with torch.no_grad():
                u = self.net.sample(n, context)
        theta, log_det = self.input_standardize.inverse(u.reshape(-1, u.shape[-1]))
        theta = theta.reshape(*shape, batch, *self.input_shape)
        if not with_log_prob:
            return theta, None
        return theta, (log_q.reshape(-1) - log_det).reshape(*shape, batch)


def _builder(
    model: Model,
    z_score_input: bool,
    z_score_condition: bool,
    embedding: nn.Module | None,
    flow_kwargs: dict[str, Any],
    swap: bool,
) -> Callable[[Tensor, Tensor], FlowkitEstimator]:
    if model not in _BUILDERS:
        raise ValueError(f"'model' should be one of {sorted(_BUILDERS)}, got {model!r}")
    for reserved in ("features", "context_features", "embedding"):
        if reserved in flow_kwargs:
            raise ValueError(
                f"'{reserved}' is set by the builder from the simulations; do not pass it "
                "(the embedding network goes in 'embedding')"
            )
    build_flow = _BUILDERS[model]
    names = ("x", "theta") if swap else ("theta", "x")

    def build(batch_theta: Tensor, batch_x: Tensor) -> FlowkitEstimator:
        inputs, conditions = (batch_x, batch_theta) if swap else (batch_theta, batch_x)
        input_shift, input_scale = z_score(names[0], inputs, z_score_input)
        condition_shift, condition_scale = z_score(names[1], conditions, z_score_condition)
        kwargs = dict(flow_kwargs)
        if embedding is not None:
            kwargs["embedding"] = embedding
        flow = build_flow(
            math.prod(inputs.shape[1:]),
            context_features=math.prod(conditions.shape[1:]),
            **kwargs,
        )
        return FlowkitEstimator(
            flow.to(inputs.dtype), inputs.shape[1:], conditions.shape[1:],
            input_shift, input_scale, condition_shift, condition_scale,
        )

    return build


def posterior_nn(
    model: Model = "maf",
    z_score_theta: bool = True,
    z_score_x: bool = True,
    embedding: nn.Module | None = None,
    **flow_kwargs: Any,
) -> Callable[[Tensor, Tensor], FlowkitEstimator]:
    r"""A builder of :math:`q(\theta \mid x)` for sbi's NPE (``NPE(prior,
    density_estimator=posterior_nn(...))``).

    Args:
        model: ``"maf"`` (:func:`flowkit.MAF`: density in one pass, sampling in ``D`` steps per
            layer) or ``"iaf"`` (:func:`flowkit.IAF`: the reverse).
        z_score_theta: standardize the parameters (with the exact log-determinant).
        z_score_x: standardize the data before the flow reads it.
        embedding: a network for the (z-scored, flattened) data, trained with the flow (see
            the ``embedding`` argument of :func:`flowkit.MAF`).
        **flow_kwargs: options of the flowkit builder, e.g. ``layers``, ``hidden_features``,
            ``transformer="spline"``, ``transformer_kwargs``, ``permutation``, ``seed``.

    Returns:
        ``build(batch_theta, batch_x) -> FlowkitEstimator``, called by sbi with its training
        simulations.

    Example:
        >>> import torch
        >>> build = posterior_nn("maf", layers=2, hidden_features=(16,))
        >>> estimator = build(torch.randn(100, 2), torch.randn(100, 3))
        >>> estimator.log_prob(torch.randn(7, 5, 2), torch.randn(5, 3)).shape
        torch.Size([7, 5])
        >>> estimator.sample((4,), torch.randn(5, 3)).shape
        torch.Size([4, 5, 2])
    """
    return _builder(model, z_score_theta, z_score_x, embedding, flow_kwargs, swap=False)


def likelihood_nn(
    model: Model = "maf",
    z_score_theta: bool = True,
    z_score_x: bool = True,
    embedding: nn.Module | None = None,
    **flow_kwargs: Any,
) -> Callable[[Tensor, Tensor], FlowkitEstimator]:
    r"""A builder of :math:`q(x \mid \theta)` for sbi's NLE (``NLE(prior,
    density_estimator=likelihood_nn(...))``); the embedding network, if any, reads
    :math:`\theta`. Arguments as :func:`posterior_nn`."""
    return _builder(model, z_score_x, z_score_theta, embedding, flow_kwargs, swap=True)
