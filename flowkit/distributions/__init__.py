"""Base distributions, the discrete MADE models, and the torch.distributions wrapper."""

from flowkit.distributions.discrete import BernoulliMADE, CategoricalMADE
from flowkit.distributions.flow_distribution import FlowDistribution
from flowkit.distributions.normal import DiagonalGaussian, StandardNormal

__all__ = [
    "BernoulliMADE",
    "CategoricalMADE",
    "DiagonalGaussian",
    "FlowDistribution",
    "StandardNormal",
]
