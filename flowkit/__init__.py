"""flowkit: normalizing flows and autoregressive density models built on MADE.

Direction convention: a transform's ``forward`` maps data to noise and returns
``log|det dz/dx|``; ``inverse`` maps noise to data. See ``docs/concepts.md``.
"""

from flowkit.checkpoint import CheckpointError, load_model, save_model
from flowkit.distributions import (
    BernoulliMADE,
    CategoricalMADE,
    ConditionalDiagonalGaussian,
    DiagonalGaussian,
    StandardNormal,
)
from flowkit.flows import IAF, MAF, Flow, FlowDistribution
from flowkit.graphed import GraphedSampler
from flowkit.nn import MADE, MaskedLinear, MLPEmbedding
from flowkit.train import History, fit, fit_reverse_kl

__version__ = "0.1.0"

__all__ = [
    "BernoulliMADE",
    "CategoricalMADE",
    "CheckpointError",
    "ConditionalDiagonalGaussian",
    "DiagonalGaussian",
    "Flow",
    "FlowDistribution",
    "GraphedSampler",
    "History",
    "IAF",
    "MADE",
    "MAF",
    "MLPEmbedding",
    "MaskedLinear",
    "StandardNormal",
    "fit",
    "fit_reverse_kl",
    "load_model",
    "save_model",
]
