"""Masked layers and the MADE conditioner."""

from flowkit.nn.linear import MaskedLinear
from flowkit.nn.made import MADE

__all__ = ["MADE", "MaskedLinear"]
