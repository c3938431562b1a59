"""``MAF`` and ``IAF``: stacks of MADE-conditioned autoregressive layers.

Each builder returns a :class:`flowkit.Flow` whose ``config`` records the arguments, so that
:func:`flowkit.save_model` / :func:`flowkit.load_model` can rebuild it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Literal

from flowkit.checkpoint import model_config
from flowkit.distributions.normal import DiagonalGaussian, StandardNormal
from flowkit.flows.flow import Flow
from flowkit.nn.made import MADE
from flowkit.transforms.autoregressive import BatchNorm, Direction, MaskedAutoregressive
from flowkit.transforms.base import Compose, Permutation, Transform
from flowkit.transforms.elementwise import Affine
from flowkit.transforms.spline import RationalQuadraticSpline

PermutationSpec = Literal["reverse", "random", "none"]


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
    learnable_base: bool,
    seed: int,
) -> Flow:
    if layers < 1:
        raise ValueError(f"'layers' should be >= 1, got {layers}")
    if permutation not in ("reverse", "random", "none"):
        raise ValueError(
            f"'permutation' should be 'reverse', 'random' or 'none', got {permutation!r}"
        )
    transforms: list[Transform] = []
    for i in range(layers):
        tau = make_transformer(transformer, **(transformer_kwargs or {}))
        made = MADE(
            features,
            hidden_features,
            params_per_feature=tau.params_per_feature,
            context_features=context_features,
            residual=residual,
            seed=seed + i,
        )
        transforms.append(MaskedAutoregressive(made, tau, direction))
        if i == layers - 1:
            break
        if batch_norm:
            transforms.append(BatchNorm(features))
        if permutation == "reverse":
            transforms.append(Permutation.reverse(features))
        elif permutation == "random":
            transforms.append(Permutation.random(features, seed=seed + i))
    base = DiagonalGaussian(features) if learnable_base else StandardNormal(features)
    return Flow(Compose(transforms), base)


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
    learnable_base: bool = False,
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
        permutation: between layers: ``"reverse"``, ``"random"`` (seeded) or ``"none"``.
        batch_norm: insert :class:`flowkit.transforms.BatchNorm` between layers.
        residual: residual masked blocks in each MADE.
        learnable_base: learn the mean and scale of the Gaussian base.
        seed: seed of the MADE degrees and random permutations.

    Example:
        >>> import torch
        >>> flow = MAF(2, layers=3, hidden_features=(16, 16))
        >>> flow.log_prob(torch.randn(4, 2)).shape
        torch.Size([4])
    """
    kwargs = dict(locals())
    flow = _autoregressive_flow("maf", **kwargs)
    flow.config = model_config("MAF", **kwargs)
    return flow


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
    learnable_base: bool = False,
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
    kwargs = dict(locals())
    flow = _autoregressive_flow("iaf", **kwargs)
    flow.config = model_config("IAF", **kwargs)
    return flow
