"""``MAF`` and ``IAF``: stacks of MADE-conditioned autoregressive layers.

Both builders are registered with :func:`flowkit.checkpoint.register_model`: each returns a
:class:`flowkit.Flow` whose ``config`` records the call's arguments, so that
:func:`flowkit.save_model` / :func:`flowkit.load_model` can rebuild it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

from flowkit.checkpoint import register_model
from flowkit.checkpoint.registry import warn_on_build
from flowkit.distributions.conditional import ConditionalDiagonalGaussian
from flowkit.distributions.normal import DiagonalGaussian, StandardNormal
from flowkit.flows.flow import Flow
from flowkit.nn.activation import ActivationSpec, activation_class, activation_name
from flowkit.nn.embedding import build_embedding, embedded_features, embedding_config
from flowkit.nn.made import MADE
from flowkit.transforms.autoregressive import Direction, MaskedAutoregressive
from flowkit.transforms.base import Compose, Permutation, Transform
from flowkit.transforms.batch_norm import BatchNorm
from flowkit.transforms.bounded import Logit
from flowkit.transforms.elementwise import make_transformer
from flowkit.transforms.linear import LULinear
from flowkit.transforms.standardize import Standardize
from flowkit.validation import Mention, check_bool, check_int

PermutationSpec = Literal["reverse", "random", "none"] | Sequence[int] | Sequence[Sequence[int]]


def _permutations(
    permutation: PermutationSpec, features: int, layers: int, seed: int
) -> list[Permutation | None]:
    """The permutation after each layer but the last (``None``: no permutation there)."""
    if isinstance(permutation, str) and permutation in ("reverse", "random", "none"):
        if permutation == "none":
            return [None] * (layers - 1)
        if permutation == "reverse":
            return [Permutation.reverse(features) for _ in range(layers - 1)]
        return [Permutation.random(features, seed=seed + i) for i in range(layers - 1)]
    try:
        given = torch.as_tensor(permutation)
    except (TypeError, ValueError, RuntimeError):  # a string, ragged lists, not numbers
        given = torch.empty(0)
    # Only the shape is checked here; Permutation checks the values.
    if given.dim() == 1 and given.shape[0] == features:
        return [Permutation(given) for _ in range(layers - 1)]
    if given.shape == (layers - 1, features):
        return [Permutation(row) for row in given]
    raise ValueError(
        "'permutation' should be 'reverse', 'random', 'none', a permutation of "
        f"range({features}) (the same after every layer) or {layers - 1} of them (one after "
        f"each layer but the last), got {permutation!r}"
    )


def _autoregressive_flow(
    direction: Direction,
    *,
    features: int,
    layers: int,
    hidden_features: Sequence[int],
    context_features: int,
    transformer: Literal["affine", "spline"],
    transformer_kwargs: dict | None,
    permutation: PermutationSpec,
    lu_linear: bool,
    batch_norm: bool,
    residual: bool,
    activation: ActivationSpec,
    learnable_base: bool,
    conditional_base: bool,
    embedding: nn.Module | dict | None,
    standardize: bool | Standardization,
    bounds: tuple[Sequence[float], Sequence[float]] | None,
    seed: int,
    base_context: Literal["embedded", "raw"],
) -> Flow:
    """The stack both builders make, its layers in ``direction``; the arguments are those of
    :func:`MAF` and :func:`IAF` (passed by keyword), documented in :func:`MAF`."""
    # MADE checks hidden_features and residual; the rest is checked here.
    if torch.empty(0).device.type == "meta":
        raise RuntimeError(
            "flowkit flows compute their structure (orderings, masks, permutations) into buffers "
            "when they are built, which a 'meta' default device cannot hold (and to_empty() "
            "would not fill): build the flow on the CPU and move it with .to(device)"
        )
    features = check_int("features", features, 1)
    layers = check_int("layers", layers, 1)
    context_features = check_int("context_features", context_features, 0)
    seed = check_int("seed", seed, 0)
    batch_norm = check_bool("batch_norm", batch_norm)
    lu_linear = check_bool("lu_linear", lu_linear)
    learnable_base = check_bool("learnable_base", learnable_base)
    conditional_base = check_bool("conditional_base", conditional_base)
    standardize = _standardization(standardize)
    activation_cls = activation_class(activation)
    if transformer_kwargs is not None and not isinstance(transformer_kwargs, Mapping):
        raise TypeError(
            "'transformer_kwargs' should be a dict of the transformer's keyword arguments, "
            f"e.g. {{'bins': 8}}, got {transformer_kwargs!r}"
        )
    if learnable_base and conditional_base:
        raise ValueError(
            "'learnable_base' and 'conditional_base' are both True; pass one (a conditional "
            "base learns its mean and scale as functions of the context)"
        )
    if base_context == "raw" and not conditional_base:  # Flow checks the value itself
        raise ValueError("'base_context' is 'raw' but 'conditional_base' is False")
    if context_features == 0 and (embedding is not None or conditional_base):
        given = "'embedding' was given" if embedding is not None else "'conditional_base' is True"
        raise ValueError(f"{given} but 'context_features' is 0; pass the width of the context")
    if features == 1 and context_features == 0 and transformer == "affine" and bounds is None:
        warn_on_build(
            f"{'MAF' if direction == 'maf' else 'IAF'}(1) with ", Mention("transformer", "affine"),
            " is a Gaussian whatever its layers: a one-feature MADE has nothing to condition on, "
            "so each layer is one affine map; pass ", Mention("transformer", "spline"),
            " for a density of another shape",
            stacklevel=4,  # _autoregressive_flow, MAF, register_model's wrapper
        )
    # The context path: raw (N, C) -> Standardize -> embedding -> (N, H), read by every MADE
    # and by a conditional base (base_context="raw": the base reads the standardized (N, C)).
    standardize_context = None
    if standardize is not None and context_features:
        standardize_context = Standardize(context_features, robust=standardize == "robust")
    embedded = context_features
    if embedding is not None:
        embedding = build_embedding(embedding)
        embedded = embedded_features(embedding, context_features)
    permutations = _permutations(permutation, features, layers, seed)
    transforms: list[Transform] = []
    if bounds is not None:
        transforms.append(_bounds_transform(bounds, features))
    if standardize is not None:
        transforms.append(Standardize(
            features, covariance="full" if standardize == "full" else "diagonal",
            robust=standardize == "robust"))
    for i in range(layers):
        tau = make_transformer(transformer, **(transformer_kwargs or {}))
        made = MADE(
            features,
            hidden_features,
            params_per_feature=tau.params_per_feature,
            context_features=embedded,
            residual=residual,
            activation=activation_cls,
            seed=seed + i,
        )
        transforms.append(MaskedAutoregressive(made, tau, direction))
        if i == layers - 1:
            break
        if batch_norm:
            transforms.append(BatchNorm(features))
        if permutations[i] is not None:
            transforms.append(permutations[i])
        if lu_linear:
            transforms.append(LULinear(features))
    base: nn.Module
    if conditional_base:
        base = ConditionalDiagonalGaussian(
            features, context_features if base_context == "raw" else embedded
        )
    else:
        base = DiagonalGaussian(features) if learnable_base else StandardNormal(features)
    return Flow(
        Compose(transforms),
        base,
        standardize_context=standardize_context,
        embedding=embedding,
        context_features=context_features,
        base_context=base_context,
    )


def _bounds_transform(bounds: object, features: int) -> Logit:
    """The :class:`~flowkit.transforms.Logit` of the builders' ``bounds=(low, high)``, where an
    end given as ``None`` is open (``-inf`` for ``low``, ``inf`` for ``high``)."""
    expected = f"'bounds' should be a pair (low, high) of {features} values each"
    if not (isinstance(bounds, Sequence) and not isinstance(bounds, str) and len(bounds) == 2):
        raise ValueError(f"{expected}, got {bounds!r}")
    ends = []
    for end, side in zip(bounds, (-math.inf, math.inf), strict=True):
        if isinstance(end, Sequence) and not isinstance(end, str):
            end = [side if v is None else v for v in end]
        try:
            ends.append(torch.as_tensor(end, dtype=torch.float64))
        except (TypeError, ValueError, RuntimeError):  # ragged lists, not numbers
            raise ValueError(f"{expected}, got {bounds!r}") from None
    shapes = [tuple(end.shape) for end in ends]
    if shapes != [(features,), (features,)]:
        raise ValueError(f"{expected}, got shapes {shapes[0]} and {shapes[1]}")
    try:
        return Logit(*ends)  # checks the values
    except ValueError as e:
        raise ValueError(f"'bounds' = (low, high) was refused: {e}") from None


Standardization = Literal["diagonal", "full", "robust"]
"""The kinds of the builders' ``standardize`` (see :func:`MAF`)."""

#: What ``standardize=True`` builds (see :func:`MAF`).
DEFAULT_STANDARDIZATION: Standardization = "diagonal"


def _standardization(standardize: object) -> Standardization | None:
    """The kind of standardization the builders' ``standardize`` argument asks for (``None``:
    none)."""
    if standardize is True:
        return DEFAULT_STANDARDIZATION
    if standardize is False:
        return None
    if standardize in ("diagonal", "full", "robust"):
        return standardize  # type: ignore[return-value]
    raise ValueError(
        f"'standardize' should be True, False, 'diagonal', 'full' or 'robust', got "
        f"{standardize!r}"
    )


def _stored_standardize(standardize: object) -> object:
    """The config's form of ``standardize``: what it builds (``True`` stored as the kind it
    means now, so that a later change of the default does not change a saved model)."""
    kind = _standardization(standardize)
    return False if kind is None else kind


def _stored_embedding(embedding: nn.Module | dict | None) -> dict | None:
    """The JSON form of the ``embedding`` argument in a builder's config (see
    :func:`flowkit.nn.embedding.embedding_config`); a stored config stays as it is."""
    return embedding_config(embedding) if isinstance(embedding, nn.Module) else embedding


_REGISTRATION: dict[str, Any] = {
    "store": {
        "activation": activation_name,
        "embedding": _stored_embedding,
        "standardize": _stored_standardize,
    },
    # files saved before these arguments existed rebuild what they built then
    "added": {"standardize": False, "lu_linear": False, "bounds": None,
              "base_context": "embedded"},
    "version": 3,
}
"""How :func:`MAF` and :func:`IAF` are registered for save/load (with :func:`_upgrade`)."""


def _upgrade(kwargs: dict[str, Any], version: int) -> dict[str, Any]:
    """The arguments that rebuild a file of an older config version: version 1 (a spline's
    tails were the identity by default; version 2 made them linear) and versions 1-2 (which
    stored ``standardize=True`` for the diagonal standardization; version 3 stores the kind)."""
    if kwargs.get("standardize") is True:
        kwargs = {**kwargs, "standardize": "diagonal"}
    if version >= 2 or kwargs.get("transformer") != "spline":
        return kwargs
    return {**kwargs, "transformer_kwargs": {"tails": "identity",
                                             **(kwargs.get("transformer_kwargs") or {})}}


@register_model(upgrade=_upgrade, **_REGISTRATION)
def MAF(
    features: int,
    layers: int = 5,
    hidden_features: Sequence[int] = (64, 64),
    context_features: int = 0,
    transformer: Literal["affine", "spline"] = "affine",
    transformer_kwargs: dict | None = None,
    permutation: PermutationSpec = "reverse",
    lu_linear: bool = True,
    batch_norm: bool = False,
    residual: bool = False,
    activation: ActivationSpec = "relu",
    learnable_base: bool = False,
    conditional_base: bool = False,
    embedding: nn.Module | dict | None = None,
    standardize: bool | Standardization = True,
    bounds: tuple[Sequence[float], Sequence[float]] | None = None,
    seed: int = 0,
    base_context: Literal["embedded", "raw"] = "embedded",
) -> Flow:
    """Masked Autoregressive Flow (Papamakarios et al. 2017): density in one pass per
    layer, sampling in ``D`` sequential steps per layer.

    Args:
        features: ``D``.
        layers: number of autoregressive layers.
        hidden_features: hidden sizes of each layer's MADE.
        context_features: ``C``, the width of the conditioning vector as callers pass it (0:
            unconditional).
        transformer: ``"affine"`` or ``"spline"`` (rational-quadratic, Durkan et al. 2019).
            With one feature (``D = 1``, e.g. a regression ``p(y | x)`` of one target) every
            affine layer is an affine map of ``y``, so the whole affine flow is a Gaussian
            whose mean and scale depend on the context, however many layers it has: use the
            spline for any other shape.
        transformer_kwargs: e.g. ``{"bins": 8, "bound": 3.0}`` for the spline or
            ``{"log_scale_bound": 3.0}`` for the affine transformer.
        permutation: between layers: ``"reverse"``, ``"random"`` (seeded), ``"none"``, a
            permutation of ``range(D)`` (the same after every layer), or ``layers - 1`` of them
            (one after each layer but the last); see :class:`flowkit.transforms.Permutation`.
        lu_linear: after each permutation, a learned invertible linear map
            (:class:`flowkit.transforms.LULinear`, the identity at construction), which mixes
            the features between layers. On by default for :func:`MAF` (density estimation:
            on correlated data a MADE of 64 units cannot express the linear dependences that
            the map learns; on a correlated 32-D Gaussian the maps take 1.0 of the affine
            MAF's 1.55 nats per row of excess; ``docs/defaults.md``), off for :func:`IAF`
            (variational fits to 2-D energies were no better with it). Each map has ``2 D^2``
            parameters and costs ``O(D^2)`` per row.
        batch_norm: insert :class:`flowkit.transforms.BatchNorm` between layers.
        residual: residual masked blocks ``h <- h + W act(h)`` in each MADE (hidden layers
            of one size).
        activation: the MADEs' hidden nonlinearity, a :mod:`torch.nn` activation by name
            (``"relu"``, ``"elu"``, ``"gelu"``, ``"silu"``, ``"tanh"``, ...) or class
            (``nn.ELU``); the config stores its class name (see
            :func:`flowkit.nn.activation.activation_class`).
        learnable_base: learn the mean and scale of the Gaussian base.
        conditional_base: a Gaussian base whose mean and log-scale are a linear function of
            the (standardized, embedded) context,
            :class:`flowkit.distributions.ConditionalDiagonalGaussian`; it needs a context
            and excludes ``learnable_base``.
        embedding: a network ``(N, C) -> (N, H)`` applied to the (standardized) context before
            the layers and a conditional base read it, trained with the flow; each MADE then
            reads ``H`` features (``out_features`` of a :class:`flowkit.nn.MLPEmbedding`, else
            found by calling the network once). A :class:`flowkit.nn.MLPEmbedding` is saved
            and loaded with the flow; any other network is loaded with
            ``flowkit.load_model(path, embedding=...)`` (see :mod:`flowkit.nn.embedding`).
        standardize: put a :class:`flowkit.transforms.Standardize` before the layers, and one
            on the raw context (before the embedding), each set from the training data: by
            :func:`flowkit.fit` from its whole training set before the first step, otherwise
            by the first call in training mode (e.g. the first ``log_prob`` of your own
            training loop; see :mod:`flowkit.transforms.standardize`). The flow then does not
            depend on the units of the data or the context: fitted to ``a x + b`` it gives
            ``log p(a x + b) = log p(x) - sum(log|a|)``. Until set, each is the identity.
            ``"diagonal"`` standardizes each feature by its mean and standard deviation,
            ``"full"`` also divides out the correlations between the features (a Cholesky
            factor of their correlation, ``Standardize(D, covariance="full")``), ``"robust"``
            by its median and interquartile range (data with a few gross outliers, heavy
            tails: ``Standardize(D, robust=True)``, the context's too); ``True`` is
            ``DEFAULT_STANDARDIZATION`` (see ``docs/defaults.md``). The context's
            standardization is per feature in every case. ``False`` builds the flow of
            flowkit 0.1 (which files saved by it rebuild).
        bounds: ``(low, high)``, each ``D`` values: data that lie in that box (the parameters
            of a simulator under a uniform prior, fractions), or on half-lines where an end is
            ``-inf``/``inf`` or ``None`` (``([0.0, None], [None, None])``: a positive first
            column, a free second one). A :class:`flowkit.transforms.Logit` first maps each
            interval onto the real line (a logit on a box, the log of the distance to the end
            on a half-line), so the density is zero outside it, normalized inside, and samples
            stay inside (or on a finite edge, where they round onto it: see the Logit); the
            standardization, if any, then acts on the mapped values.
            ``None``: data anywhere.
        seed: seed of the MADE degrees and random permutations. The initial weights come from
            torch's global generator, as every torch module's: for a repeatable run call
            ``torch.manual_seed(s)`` before building the flow (``fit(seed=...)`` seeds the
            training, not the weights it is given).
        base_context: what a conditional base's head reads: ``"embedded"``, the embedded
            context, as the layers; or ``"raw"``, the (standardized) context before the
            embedding, so that the embedding feeds only the layers (the IAF posterior of
            Kingma et al. 2016: ``mu``, ``sigma`` and the layers' context are separate linear
            outputs of the encoder's last hidden layer; see ``docs/vae_tutorial.md``).

    Example:
        >>> import torch
        >>> flow = MAF(2, layers=3, hidden_features=(16, 16))
        >>> flow.log_prob(torch.randn(4, 2)).shape
        torch.Size([4])
    """
    return _autoregressive_flow(
        "maf",
        features=features,
        layers=layers,
        hidden_features=hidden_features,
        context_features=context_features,
        transformer=transformer,
        transformer_kwargs=transformer_kwargs,
        permutation=permutation,
        lu_linear=lu_linear,
        batch_norm=batch_norm,
        residual=residual,
        activation=activation,
        learnable_base=learnable_base,
        conditional_base=conditional_base,
        embedding=embedding,
        standardize=standardize,
        bounds=bounds,
        seed=seed,
        base_context=base_context,
    )


@register_model(upgrade=_upgrade, **_REGISTRATION)
def IAF(
    features: int,
    layers: int = 5,
    hidden_features: Sequence[int] = (64, 64),
    context_features: int = 0,
    transformer: Literal["affine", "spline"] = "affine",
    transformer_kwargs: dict | None = None,
    permutation: PermutationSpec = "reverse",
    lu_linear: bool = False,
    batch_norm: bool = False,
    residual: bool = False,
    activation: ActivationSpec = "relu",
    learnable_base: bool = False,
    conditional_base: bool = False,
    embedding: nn.Module | dict | None = None,
    standardize: bool | Standardization = True,
    bounds: tuple[Sequence[float], Sequence[float]] | None = None,
    seed: int = 0,
    base_context: Literal["embedded", "raw"] = "embedded",
) -> Flow:
    """Inverse Autoregressive Flow (Kingma et al. 2016): sampling and the density of its
    own samples in one pass per layer (:meth:`Flow.sample_and_log_prob`); the density of an
    outside point takes ``D`` sequential steps per layer. Arguments as :func:`MAF`, but
    ``lu_linear`` is off by default.

    Example:
        >>> import torch
        >>> flow = IAF(2, layers=3, hidden_features=(16, 16))
        >>> x, log_p = flow.sample_and_log_prob(4)
        >>> x.shape, log_p.shape
        (torch.Size([4, 2]), torch.Size([4]))
    """
    return _autoregressive_flow(
        "iaf",
        features=features,
        layers=layers,
        hidden_features=hidden_features,
        context_features=context_features,
        transformer=transformer,
        transformer_kwargs=transformer_kwargs,
        permutation=permutation,
        lu_linear=lu_linear,
        batch_norm=batch_norm,
        residual=residual,
        activation=activation,
        learnable_base=learnable_base,
        conditional_base=conditional_base,
        embedding=embedding,
        standardize=standardize,
        bounds=bounds,
        seed=seed,
        base_context=base_context,
    )
