"""``MAF`` and ``IAF``: stacks of MADE-conditioned autoregressive layers.

Both builders are registered with :func:`flowkit.checkpoint.register_model`: each returns a
:class:`flowkit.Flow` whose ``config`` records the call's arguments, so that
:func:`flowkit.save_model` / :func:`flowkit.load_model` can rebuild it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from flowkit.checkpoint import register_model
from flowkit.distributions.normal import DiagonalGaussian, StandardNormal
from flowkit.flows.flow import Flow
from flowkit.nn.made import MADE
from flowkit.transforms.autoregressive import BatchNorm, Direction, MaskedAutoregressive
from flowkit.transforms.base import Compose, Permutation, Transform
from flowkit.transforms.elementwise import Affine
from flowkit.transforms.spline import RationalQuadraticSpline
from flowkit.transforms.standardize import Standardize
from flowkit.validation import check_bool, check_int

PermutationSpec = Literal["reverse", "random", "none"] | Sequence[int] | Sequence[Sequence[int]]


_TRANSFORMERS: dict[str, type[Affine | RationalQuadraticSpline]] = {
    "affine": Affine,
    "spline": RationalQuadraticSpline,
}


def make_transformer(name: str, **kwargs: float) -> Affine | RationalQuadraticSpline:
    """An elementwise transformer by name: ``"affine"`` (:class:`Affine`) or ``"spline"``
    (:class:`flowkit.transforms.RationalQuadraticSpline`), with its keyword arguments.

    Raises:
        ValueError: an unknown ``name``.
        TypeError: ``kwargs`` that the transformer does not take (the error names
            ``transformer_kwargs``, the transformer and the arguments it takes).
    """
    if name not in _TRANSFORMERS:
        raise ValueError(f"'transformer' should be 'affine' or 'spline', got {name!r}")
    cls = _TRANSFORMERS[name]
    signature = inspect.signature(cls)
    try:
        signature.bind(**kwargs)
    except TypeError as e:
        raise TypeError(
            f"'transformer_kwargs' {kwargs} do not fit transformer={name!r} ({cls.__name__}, "
            f"which takes {', '.join(signature.parameters) or 'no arguments'}): {e}"
        ) from None
    return cls(**kwargs)


ActivationSpec = str | type[nn.Module]

# torch.nn.modules.activation classes that mix units (a MADE needs an elementwise map, or the
# autoregressive property is lost) or need constructor arguments.
_NOT_ELEMENTWISE = {"MultiheadAttention", "Softmax", "Softmax2d", "Softmin", "LogSoftmax", "GLU",
                    "Threshold"}


def activation_class(activation: ActivationSpec) -> type[nn.Module]:
    """A MADE's hidden nonlinearity from its name, any activation of :mod:`torch.nn` by its
    class name in any case (``"relu"``, ``"ELU"``, ``"gelu"``, ``"silu"``, ``"tanh"``,
    ``"leakyrelu"``), or that class itself (``nn.ELU``). Only :mod:`torch.nn`'s activations, so
    that a model's config can store the name and :func:`flowkit.load_model` can rebuild it.

    Raises:
        ValueError: anything else, with the names that are accepted.
    """
    names = {
        name.lower(): cls
        for name, cls in vars(nn.modules.activation).items()
        if isinstance(cls, type) and issubclass(cls, nn.Module)
        and cls.__module__ == nn.modules.activation.__name__ and name not in _NOT_ELEMENTWISE
    }
    if isinstance(activation, str) and activation.lower() in names:
        return names[activation.lower()]
    if isinstance(activation, type) and names.get(activation.__name__.lower()) is activation:
        return activation
    raise ValueError(
        "'activation' should be the name or class of a torch.nn activation (e.g. 'relu', "
        f"'elu', 'gelu', 'silu', 'tanh'; one of {sorted(names)}), got {activation!r}"
    )


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
    features: int,
    layers: int,
    hidden_features: Sequence[int],
    context_features: int,
    transformer: str,
    transformer_kwargs: dict | None,
    permutation: PermutationSpec,
    batch_norm: bool,
    residual: bool,
    activation: ActivationSpec,
    learnable_base: bool,
    standardize: bool,
    seed: int,
) -> Flow:
    # MADE checks hidden_features, context_features and residual; the rest is checked here.
    features = check_int("features", features, 1)
    layers = check_int("layers", layers, 1)
    seed = check_int("seed", seed, 0)
    batch_norm = check_bool("batch_norm", batch_norm)
    learnable_base = check_bool("learnable_base", learnable_base)
    activation_cls = activation_class(activation)
    standardize = check_bool("standardize", standardize)
    permutations = _permutations(permutation, features, layers, seed)
    transforms: list[Transform] = [Standardize(features)] if standardize else []
    for i in range(layers):
        tau = make_transformer(transformer, **(transformer_kwargs or {}))
        made = MADE(
            features,
            hidden_features,
            params_per_feature=tau.params_per_feature,
            context_features=context_features,
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
    base = DiagonalGaussian(features) if learnable_base else StandardNormal(features)
    standardize_context = None
    if standardize and context_features:
        standardize_context = Standardize(context_features)
    return Flow(Compose(transforms), base, standardize_context=standardize_context)


@register_model(
    store={"activation": lambda a: activation_class(a).__name__},
    added={"standardize": False},  # files saved before it rebuild the unstandardized flow
)
def MAF(
    features: int,
    layers: int = 5,
    hidden_features: Sequence[int] = (64, 64),
    context_features: int = 0,
    transformer: str = "affine",
    transformer_kwargs: dict | None = None,
    permutation: PermutationSpec = "reverse",
    batch_norm: bool = False,
    residual: bool = False,
    activation: ActivationSpec = "relu",
    learnable_base: bool = False,
    standardize: bool = True,
    seed: int = 0,
) -> Flow:
    """Masked Autoregressive Flow (Papamakarios et al. 2017): density in one pass per layer,
    sampling in ``D`` sequential steps per layer.

    Args:
        features: ``D``.
        layers: number of autoregressive layers.
        hidden_features: hidden sizes of each layer's MADE.
        context_features: width of the conditioning vector (0: unconditional).
        transformer: ``"affine"`` or ``"spline"`` (rational-quadratic, Durkan et al. 2019).
        transformer_kwargs: e.g. ``{"bins": 8, "bound": 3.0}`` for the spline or
            ``{"log_scale_bound": 3.0}`` for the affine transformer.
        permutation: between layers: ``"reverse"``, ``"random"`` (seeded), ``"none"``, a
            permutation of ``range(D)`` (the same after every layer), or ``layers - 1`` of them
            (one after each layer but the last); see :class:`flowkit.transforms.Permutation`.
        batch_norm: insert :class:`flowkit.transforms.BatchNorm` between layers.
        residual: residual masked blocks ``h <- h + W act(h)`` in each MADE (hidden layers
            of one size).
        activation: the MADEs' hidden nonlinearity, a :mod:`torch.nn` activation by name
            (``"relu"``, ``"elu"``, ``"gelu"``, ``"silu"``, ``"tanh"``, ...) or class
            (``nn.ELU``); the config stores its class name (see :func:`activation_class`).
        learnable_base: learn the mean and scale of the Gaussian base.
        standardize: put a :class:`flowkit.transforms.Standardize` before the layers, and one
            on the context, each set from the training data: by :func:`flowkit.fit` from its
            whole training set before the first step, otherwise by the first call in
            training mode (e.g. the first ``log_prob`` of your own training loop; see
            :mod:`flowkit.transforms.standardize`). The flow then does not depend on the units
            of the data or the context: fitted to ``a x + b`` it gives
            ``log p(a x + b) = log p(x) - sum(log|a|)``. Until set, each is the identity.
            ``False`` builds the flow of flowkit 0.1 (which files saved by it rebuild).
        seed: seed of the MADE degrees and random permutations.

    Example:
        >>> import torch
        >>> flow = MAF(2, layers=3, hidden_features=(16, 16))
        >>> flow.log_prob(torch.randn(4, 2)).shape
        torch.Size([4])
    """
    return _autoregressive_flow("maf", **locals())


@register_model(
    store={"activation": lambda a: activation_class(a).__name__},
    added={"standardize": False},  # files saved before it rebuild the unstandardized flow
)
def IAF(
    features: int,
    layers: int = 5,
    hidden_features: Sequence[int] = (64, 64),
    context_features: int = 0,
    transformer: str = "affine",
    transformer_kwargs: dict | None = None,
    permutation: PermutationSpec = "reverse",
    batch_norm: bool = False,
    residual: bool = False,
    activation: ActivationSpec = "relu",
    learnable_base: bool = False,
    standardize: bool = True,
    seed: int = 0,
) -> Flow:
    """Inverse Autoregressive Flow (Kingma et al. 2016): sampling and the density of its own
    samples in one pass per layer (:meth:`Flow.sample_and_log_prob`); the density of an
    outside point takes ``D`` sequential steps per layer. Arguments as :func:`MAF`.

    Example:
        >>> import torch
        >>> flow = IAF(2, layers=3, hidden_features=(16, 16))
        >>> x, log_p = flow.sample_and_log_prob(4)
        >>> x.shape, log_p.shape
        (torch.Size([4, 2]), torch.Size([4]))
    """
    return _autoregressive_flow("iaf", **locals())
