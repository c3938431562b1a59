"""Masked layers, the MADE conditioner and context embedding networks."""

from flowkit.nn.embedding import MLPEmbedding
from flowkit.nn.linear import MaskedLinear
from flowkit.nn.made import MADE

__all__ = ["MADE", "MLPEmbedding", "MaskedLinear"]
