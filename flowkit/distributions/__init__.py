"""Base distributions and the discrete MADE models."""

from flowkit.distributions.normal import DiagonalGaussian, StandardNormal

__all__ = ["DiagonalGaussian", "StandardNormal"]
