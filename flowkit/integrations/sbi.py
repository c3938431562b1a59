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
    estimator = inference.append_simulations(theta, x).train(clip_max_norm=None)
    samples = inference.build_posterior(estimator).sample((1000,), x=x_o)

``clip_max_norm=None``: sbi clips gradient norms to 5 by default, a threshold set for its own
networks; a flowkit flow's gradients are about four times larger, so the clip would cut every
step (docs/sbi.md, "sbi's gradient clipping").

**The spline's bin temperature.** With ``transformer="spline"`` the builders here divide the
spline's raw bin widths and heights by ``sqrt(H)``, ``H`` the MADEs' last hidden width (8 for
the default ``(64, 64)``), as sbi's NSF does, unless ``transformer_kwargs`` sets
``bin_temperature``: on six sbibm tasks it did better than the builders' ``T = 1`` on three
(by 0.013-0.032 in C2ST), as well on two, and worse on ``bernoulli_glm`` (by 0.023), docs/sbi.md,
"The spline's bin temperature"; pass ``transformer_kwargs={"bin_temperature": 1.0}`` for the
builders' spline.

**Standardization.** The flows are built with the builders' ``standardize=True`` (their
default; pass ``standardize=False`` to switch it off): a
:class:`flowkit.transforms.Standardize` on the density's input and one on the condition, set
here from the mean and standard deviation of the batch sbi gives the builder (its training
split), per element, as sbi's own flows do with ``z_score_x="independent"``. The input's
standardization enters with its exact log-determinant,

.. math::

    \log q(\theta \mid x) = \log q_{\text{flow}}(u \mid \tilde x) - \sum_d \log s_d,
    \qquad u = (\theta - m) / s,

and the condition is standardized, :math:`\tilde x = (x - m_x) / s_x`, before the flow's
embedding network (if any) and layers read it. An element that is constant over the batch is
only shifted (see :mod:`flowkit.transforms.standardize`). sbi's ``z_score_theta`` and
``z_score_x`` choose per side (:data:`Z_SCORES`): ``"independent"`` (the default, the above),
``"structured"`` (one mean and scale for all of a side's elements: give it to iid trials,
images and time series, whose elements share units, and always with a
permutation-invariant embedding, which per-element statistics would make see the trials'
order) or ``"none"``.

**Shapes.** Inputs and conditions may have any event shape (``input_shape``,
``condition_shape``); the flow sees them flattened to ``D`` and ``C`` numbers per row. An
embedding network passed as ``embedding`` therefore receives ``(rows, C)``: give a network for
structured data its shape back with :class:`torch.nn.Unflatten`, e.g.
``embedding=nn.Sequential(nn.Unflatten(1, (1, 16, 16)), cnn)`` for images, or
``nn.Unflatten(1, (trials, d))`` in front of sbi's ``PermutationInvariantEmbedding`` for iid
trials (with ``z_score_x="structured"``). A builder builds a new flow each time sbi calls it,
but the embedding network passed to it is the same object: build a new one for each training
run that should start afresh.

This module needs the package ``sbi`` (``pip install "flowkit-made[sbi]"``); ``import
flowkit`` never imports it.
"""

from __future__ import annotations

import inspect
import math
import warnings
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
from flowkit.transforms import Logit, SingleRowWarning, Standardize, set_from_data
from flowkit.validation import check_batch, check_batch_context, nonfinite_rows, reference

__all__ = ["FlowkitEstimator", "likelihood_nn", "posterior_nn"]

Model = Literal["maf", "iaf"]
_BUILDERS: dict[str, Callable[..., Flow]] = {"maf": MAF, "iaf": IAF}
_RESERVED = ("features", "context_features", "embedding")  # set by the builders here


class FlowkitEstimator(ConditionalDensityEstimator):
    r"""A flowkit :class:`~flowkit.Flow` as sbi's ``ConditionalDensityEstimator``.

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
            ``context_features`` is ``prod(condition_shape)`` (its own standardization, if
            any, set from data: see the module notes).
        input_shape: event shape of the input.
        condition_shape: event shape of the condition.
    """

    def __init__(self, flow: Flow, input_shape: torch.Size, condition_shape: torch.Size):
        super().__init__(flow, torch.Size(input_shape), torch.Size(condition_shape))
        features, context = math.prod(self.input_shape), math.prod(self.condition_shape)
        if flow.features != features or flow.context_features != context:
            raise ValueError(
                f"'flow' should have features={features} and context_features={context} "
                f"(input_shape {tuple(self.input_shape)}, condition_shape "
                f"{tuple(self.condition_shape)}), got features={flow.features} and "
                f"context_features={flow.context_features}"
            )

    @property
    def embedding_net(self) -> nn.Module:
        """The condition as the flow's layers read it, ``(B, *condition_shape) -> (B, H)``:
        flattened, standardized (if the flow standardizes its context) and embedded (if it has
        an embedding network; its parameters are the flow's). What sbi's diagnostics call
        (e.g. ``calc_misspecification_mmd(mode="embedding")``)."""
        return _ConditionEmbedding(self.net, self.condition_shape)

    def log_prob(self, input: Tensor, condition: Tensor) -> Tensor:
        """``log q(input | condition)``, shape ``(S, B)`` (class doc). The flow broadcasts the
        batch axes itself, so each distinct condition is standardized and embedded once."""
        self._check_input_shape(input)
        self._check_condition_shape(condition)
        input, condition = _flat(input, self.input_shape), _flat(condition, self.condition_shape)
        self._check_values(input, condition)
        log_q = self.net.log_prob(input, condition)
        return log_q if log_q.dim() == 2 else log_q.unsqueeze(0)

    def _check_values(self, input: Tensor | None, condition: Tensor) -> None:
        """dtype, device, NaN and batch-shape checks under sbi's names (the flow would call
        them 'x' and 'context'); ``input`` and ``condition`` flattened."""
        like = reference(self.net)
        check_batch_context(condition, self.net.context_features, like, name="condition")
        if input is not None:
            nonfinite_rows("input", check_batch("input", input, self.net.features, like))
            try:
                torch.broadcast_shapes(input.shape[:-1], condition.shape[:-1])
            except RuntimeError:
                raise ValueError(
                    f"'input' of batch shape {tuple(input.shape[:-1])} and 'condition' of batch "
                    f"shape {tuple(condition.shape[:-1])} do not broadcast (sizes should match "
                    "or be 1)"
                ) from None

    def loss(self, input: Tensor, condition: Tensor) -> Tensor:
        """Negative log-density of a training batch, ``(B,)``."""
        return -self.log_prob(input.unsqueeze(0), condition)[0]

    def _sample_shapes(self, sample_shape: Any, condition: Tensor) -> tuple[torch.Size, int]:
        self._check_condition_shape(condition)
        self._check_values(None, _flat(condition, self.condition_shape))
        if condition.dim() != len(self.condition_shape) + 1:
            raise ValueError(
                f"'condition' should have shape (B, {', '.join(map(str, self.condition_shape))})"
                f" to sample, got {tuple(condition.shape)}"
            )
        return torch.Size(sample_shape), condition.shape[0]

    def sample(self, sample_shape: Any, condition: Tensor) -> Tensor:
        """Samples ``(*sample_shape, B, *input_shape)`` for conditions ``(B, ...)`` (empty for
        an empty ``sample_shape``, as torch's distributions)."""
        shape, batch = self._sample_shapes(sample_shape, condition)
        if shape.numel() * batch == 0:
            return self._empty(*shape, batch, *self.input_shape)
        theta = self.net.sample(shape.numel(), condition.reshape(batch, -1))
        return theta.reshape(*shape, batch, *self.input_shape)

    def sample_and_log_prob(self, sample_shape: Any, condition: Tensor) -> tuple[Tensor, Tensor]:
        """Samples ``(*sample_shape, B, *input_shape)`` and their log-densities
        ``(*sample_shape, B)`` from one pass of the flow."""
        shape, batch = self._sample_shapes(sample_shape, condition)
        if shape.numel() * batch == 0:
            return self._empty(*shape, batch, *self.input_shape), self._empty(*shape, batch)
        theta, log_q = self.net.sample_and_log_prob(shape.numel(), condition.reshape(batch, -1))
        return theta.reshape(*shape, batch, *self.input_shape), log_q.reshape(*shape, batch)

    def _empty(self, *shape: int) -> Tensor:
        like = reference(self.net)
        return torch.empty(shape, dtype=like.dtype, device=like.device)


class _ConditionEmbedding(nn.Module):
    """:attr:`FlowkitEstimator.embedding_net`: conditions ``(B, *condition_shape)`` flattened and
    passed to :meth:`flowkit.Flow.embed_context`."""

    def __init__(self, flow: Flow, condition_shape: torch.Size):
        super().__init__()
        self.flow, self.condition_shape = flow, condition_shape

    def forward(self, condition: Tensor) -> Tensor:
        return self.flow.embed_context(_flat(condition, self.condition_shape))


def _flat(value: Tensor, event_shape: torch.Size) -> Tensor:
    """``(*batch, *event_shape)`` -> ``(*batch, prod(event_shape))``."""
    batch = value.shape[: value.dim() - len(event_shape)]
    return value.reshape(*batch, math.prod(event_shape))


def _builder(
    model: Model,
    embedding: nn.Module | None,
    flow_kwargs: dict[str, Any],
    swap: bool,
) -> Callable[[Tensor, Tensor], FlowkitEstimator]:
    if model not in _BUILDERS:
        raise ValueError(f"'model' should be one of {sorted(_BUILDERS)}, got {model!r}")
    for reserved in _RESERVED:
        if reserved in flow_kwargs:
            raise ValueError(
                f"'{reserved}' is set by the builder from the simulations; do not pass it "
                "(the embedding network goes in 'embedding')"
            )
    build_flow = _BUILDERS[model]
    flow_kwargs = dict(flow_kwargs)
    z_scores = _z_scores(flow_kwargs)  # takes the z_score_* options out of flow_kwargs
    _check_names(build_flow, flow_kwargs)
    flow_kwargs = _with_bin_temperature(build_flow, flow_kwargs)
    if flow_kwargs.get("bounds") is None:  # bounds need the data's width: checked by build()
        _check_values(build_flow, flow_kwargs)
    names = ("x", "theta") if swap else ("theta", "x")  # of the input, of the condition

    def build(batch_theta: Tensor, batch_x: Tensor) -> FlowkitEstimator:
        inputs, conditions = (batch_x, batch_theta) if swap else (batch_theta, batch_x)
        for name, value in zip(names, (inputs, conditions), strict=True):
            if bad := int((~torch.isfinite(value.reshape(len(value), -1))).any(-1).sum()):
                raise ValueError(
                    f"the simulations' {name} holds NaN or Inf values in {bad} of the "
                    f"{len(value)} rows of sbi's training split; leave sbi's "
                    "exclude_invalid_x=True (its default) or remove them"
                )
        if inputs.dtype != conditions.dtype:  # the flow is built in the input's dtype
            raise TypeError(
                f"the simulations' {names[0]} ({inputs.dtype}) and {names[1]} "
                f"({conditions.dtype}) should have one dtype, as sbi gives them (float32)")
        flow = build_flow(
            math.prod(inputs.shape[1:]),
            context_features=math.prod(conditions.shape[1:]),
            embedding=embedding,
            **flow_kwargs,
        ).to(inputs.dtype)
        rows = inputs.reshape(len(inputs), -1), conditions.reshape(len(conditions), -1)
        if flow_kwargs.get("bounds") is not None:  # checked by the flow's builder
            _check_inside(names[0], rows[0], flow, swap)
        # The flow's Standardize modules (if standardize=True) from the whole batch, each
        # side then as its z_score_* option asks. A split of one row is warned of here, in
        # sbi's terms (set_from_data's warning names its own argument).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SingleRowWarning)
            set_from_data(flow, [rows])
        per_element = [n for n in names if z_scores.get(f"z_score_{n}") in (None, "independent")]
        if len(inputs) == 1 and flow_kwargs.get("standardize", True) and per_element:
            warnings.warn(
                "sbi's training split holds a single simulation: the flow's per-element "
                f"standardization of {' and '.join(per_element)} takes its shift from it and "
                "a scale of 1 (one row has no spread); simulate more", stacklevel=2)
        data = next((t for t in flow.transform.transforms if isinstance(t, Standardize)), None)
        for name, module, values in zip(names, (data, flow.standardize_context), rows,
                                        strict=True):
            _z_score(z_scores.get(f"z_score_{name}", "independent"), module, values, flow)
        return FlowkitEstimator(flow, inputs.shape[1:], conditions.shape[1:])

    return build


def _with_bin_temperature(build_flow: Callable[..., Flow],
                          flow_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``flow_kwargs`` with a spline's ``bin_temperature`` set to ``sqrt(H)``, ``H`` the MADEs'
    last hidden width (the builder's default when not given), unless ``transformer_kwargs``
    sets it, as sbi's NSF divides its raw bin widths and heights (see the module's notes).
    Arguments the builder will refuse are passed on as given."""
    given = flow_kwargs.get("transformer_kwargs") or {}
    if (flow_kwargs.get("transformer") != "spline" or not isinstance(given, dict)
            or "bin_temperature" in given):
        return flow_kwargs
    hidden = flow_kwargs.get(
        "hidden_features", inspect.signature(build_flow).parameters["hidden_features"].default)
    try:
        width = int(hidden[-1])
    except (TypeError, ValueError, IndexError):
        return flow_kwargs
    if width < 1:
        return flow_kwargs
    return {**flow_kwargs, "transformer_kwargs": {**given, "bin_temperature": math.sqrt(width)}}


def _check_inside(name: str, values: Tensor, flow: Flow, likelihood: bool) -> None:
    """Refuse ``bounds=(low, high)`` that leave simulated rows outside (a density of zero there
    gives a NaN loss, which sbi reports without saying why): the flow's
    :class:`~flowkit.transforms.Logit` holds them as built (open ends infinite)."""
    box = next(m for m in flow.modules() if isinstance(m, Logit))
    outside = (~box.contains(values)).any(-1)
    if outside.any():
        row = int(outside.nonzero()[0])
        support = "the simulator's output" if likelihood else "the prior"
        raise ValueError(
            f"'bounds' should contain every simulated {name}: {int(outside.sum())} of "
            f"{len(values)} rows lie outside it (row {row}: {values[row].tolist()}); give the "
            f"bounds of the support of {support}"
        )


Z_SCORES = ("independent", "structured", "none")
"""sbi's ``z_score_theta`` / ``z_score_x``, as the builders here take them: each element by
its own mean and standard deviation over the training split (``"independent"``, sbi's default
and flowkit's standardization), all elements of a side by the mean and standard deviation of
all its values (``"structured"``: iid trials, pixels, a time series, whose elements share
units and whose order a permutation-invariant embedding must not see; sbi's scale is the mean
of the rows' standard deviations instead), or not at all (``"none"``, or ``None``)."""

# sbi's names of options that the flowkit builders name otherwise
_SBI_NAMES = {
    "embedding_net": "embedding=",
    "num_transforms": "layers=",
    "num_bins": "transformer_kwargs={'bins': ...}",
    "tail_bound": "transformer_kwargs={'bound': ...}",
    "num_blocks": "hidden_features=(H,) * blocks",
    "use_residual_blocks": "residual=",
    "dropout_probability": "no dropout option",
    "use_batch_norm": "batch_norm=",
}


def _z_scores(flow_kwargs: dict[str, Any]) -> dict[str, str]:
    """The ``z_score_theta`` / ``z_score_x`` options, taken out of ``flow_kwargs`` and checked
    (``None`` read as ``"none"``); any other ``z_score_*`` is refused. Sides that are not
    ``"none"`` need the builders' diagonal standardization, which they then adjust."""
    taken = {k: flow_kwargs.pop(k) for k in sorted(flow_kwargs) if k.startswith("z_score_")}
    for name, value in taken.items():
        if name not in ("z_score_theta", "z_score_x"):
            raise ValueError(f"{name!r} is not an option; sbi's z-scoring options are "
                             "'z_score_theta' and 'z_score_x'")
        if value is None:
            taken[name] = value = "none"
        if value not in Z_SCORES:
            raise ValueError(f"{name!r} should be one of {Z_SCORES} (or None), got {value!r}")
    standardize = flow_kwargs.get("standardize", True)
    if standardize not in (True, "diagonal") and any(v != "none" for v in taken.values()):
        raise ValueError(
            f"the z_score options {taken} adjust the builders' per-element standardization "
            f"(standardize=True, the default), not standardize={standardize!r}: pass only "
            "one of them"
        )
    return taken


def _z_score(mode: str, module: Standardize | None, values: Tensor, flow: Flow) -> None:
    """Set ``module`` (a side's standardization in ``flow``, set per element from ``values``
    ``(N, K)`` already) as ``mode`` asks (see :data:`Z_SCORES`)."""
    if module is None or mode == "independent":
        return
    k = values.shape[1]
    if mode == "none":
        module.set(torch.zeros(k), torch.ones(k))
        return
    layers = list(flow.transform.transforms)
    with torch.no_grad():  # the values as the module reads them: after a Logit of bounds=
        for t in layers[: layers.index(module)] if module in layers else []:
            values = t(values)[0]
    flat = values.detach().double().flatten()
    spread = float(flat.std()) if flat.numel() > 1 else 0.0
    module.set(torch.full((k,), float(flat.mean())),
               torch.full((k,), spread if spread > 0 else 1.0))


def _check_values(build_flow: Callable[..., Flow], flow_kwargs: dict[str, Any]) -> None:
    """Build a small flow with ``flow_kwargs`` once, so that a bad value (sbi's int
    ``hidden_features=50``) is refused when the builder is made rather than inside sbi's
    ``train()``; torch's random state and the warnings are left as they were."""
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_flow(2, context_features=2, **flow_kwargs)


def _check_names(build_flow: Callable[..., Flow], flow_kwargs: dict[str, Any]) -> None:
    """Refuse, when the builder is made rather than when sbi first calls it, options that
    ``build_flow`` does not take, naming flowkit's name for sbi's."""
    accepted = inspect.signature(build_flow).parameters
    if unknown := [k for k in flow_kwargs if k not in accepted]:
        hints = [f"{k!r} (flowkit: {_SBI_NAMES[k]})" for k in unknown if k in _SBI_NAMES]
        raise TypeError(
            f"{', '.join(map(repr, unknown))}: not options of flowkit.{build_flow.__name__}"
            + (f"; sbi's names: {', '.join(hints)}" if hints else "")
            + f"; its options: {', '.join(k for k in accepted if k not in _RESERVED)}"
        )


def posterior_nn(
    model: Model = "maf",
    embedding: nn.Module | None = None,
    **flow_kwargs: Any,
) -> Callable[[Tensor, Tensor], FlowkitEstimator]:
    r"""A builder of :math:`q(\theta \mid x)` for sbi's NPE (``NPE(prior,
    density_estimator=posterior_nn(...))``).

    Args:
        model: ``"maf"`` (:func:`flowkit.MAF`: density in one pass, sampling in ``D`` steps per
            layer) or ``"iaf"`` (:func:`flowkit.IAF`: the reverse).
        embedding: a network for the (standardized, flattened) data, trained with the flow
            (see the ``embedding`` argument of :func:`flowkit.MAF`).
        **flow_kwargs: options of the flowkit builder, e.g. ``layers``, ``hidden_features``,
            ``transformer="spline"`` (with ``bin_temperature=sqrt(H)`` unless
            ``transformer_kwargs`` gives one, see above), ``transformer_kwargs``, ``permutation``,
            ``conditional_base``, ``standardize``, ``seed`` (of the MADEs' degrees and the
            permutations, as the builders'; the initial weights come from torch's global
            generator, ``torch.manual_seed``); for a uniform prior on a box,
            ``bounds=(low, high)`` makes the posterior zero outside it (see
            :class:`flowkit.transforms.Logit`); and sbi's ``z_score_theta`` and
            ``z_score_x`` (:data:`Z_SCORES`). Options are checked here, and sbi's names of
            flowkit's options (``embedding_net``, ``num_transforms``, ``num_bins``) are
            named in the error.

    Returns:
        ``build(batch_theta, batch_x) -> FlowkitEstimator``, called by sbi with its training
        simulations (from which the flow's standardization is set).

    Example:
        >>> import torch
        >>> build = posterior_nn("maf", layers=2, hidden_features=(16,))
        >>> estimator = build(torch.randn(100, 2), torch.randn(100, 3))
        >>> estimator.log_prob(torch.randn(7, 5, 2), torch.randn(5, 3)).shape
        torch.Size([7, 5])
        >>> estimator.sample((4,), torch.randn(5, 3)).shape
        torch.Size([4, 5, 2])
    """
    return _builder(model, embedding, flow_kwargs, swap=False)


def likelihood_nn(
    model: Model = "maf",
    embedding: nn.Module | None = None,
    **flow_kwargs: Any,
) -> Callable[[Tensor, Tensor], FlowkitEstimator]:
    r"""A builder of :math:`q(x \mid \theta)` for sbi's NLE (``NLE(prior,
    density_estimator=likelihood_nn(...))``); the embedding network, if any, reads
    :math:`\theta`. Arguments as :func:`posterior_nn`."""
    return _builder(model, embedding, flow_kwargs, swap=True)
