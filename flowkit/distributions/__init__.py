"""Base distributions, the discrete MADE models, and the torch.distributions wrapper."""

from flowkit.distributions.conditional import ConditionalDiagonalGaussian
from flowkit.distributions.discrete import BernoulliMADE, CategoricalMADE
from flowkit.distributions.flow_distribution import KL_SAMPLES, FlowDistribution, monte_carlo_kl
from flowkit.distributions.normal import DiagonalGaussian, StandardNormal

__all__ = [
    "BernoulliMADE",
    "CategoricalMADE",
    "ConditionalDiagonalGaussian",
    "DiagonalGaussian",
    "FlowDistribution",
    "KL_SAMPLES",
    "StandardNormal",
    "monte_carlo_kl",
]
