"""Base distributions and the discrete MADE models."""

from flowkit.distributions.conditional import ConditionalDiagonalGaussian
from flowkit.distributions.discrete import BernoulliMADE, CategoricalMADE
from flowkit.distributions.normal import DiagonalGaussian, StandardNormal

__all__ = [
    "BernoulliMADE",
    "CategoricalMADE",
    "ConditionalDiagonalGaussian",
    "DiagonalGaussian",
    "StandardNormal",
]
