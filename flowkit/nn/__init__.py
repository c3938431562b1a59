"""Masked layers and the MADE conditioner."""

from flowkit.nn.made import MADE, MaskedLinear

__all__ = ["MADE", "MaskedLinear"]
