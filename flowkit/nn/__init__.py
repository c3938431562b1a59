"""Masked layers, the MADE conditioner and context embedding networks.

Reading order. The MADE itself is three modules: :mod:`~flowkit.nn.masks` (degrees and masks,
pure functions: the whole autoregressive idea), :mod:`~flowkit.nn.linear` (the masked linear
layer) and :mod:`~flowkit.nn.made` (the network). Beside them, :mod:`~flowkit.nn.embedding` and
:mod:`~flowkit.nn.activation` (context networks, activations by name).

The rest is how a MADE is run fast, with the same results as the plain masked products:
:mod:`~flowkit.nn.layout` (the MADE's stages and its units sorted by degree, which every fast
path reads), :mod:`~flowkit.nn.staircase` (products that skip the masked-out half),
:mod:`~flowkit.nn.inversion` and :mod:`~flowkit.nn.inversion_program` (solving the
autoregressive direction in about one pass), :mod:`~flowkit.nn.scratch`,
:mod:`~flowkit.nn.caches` and :mod:`~flowkit.nn.optimizer_steps` (memory and caches kept between
calls, and how they learn that the weights changed).
"""

from flowkit.nn.caches import clear_caches
from flowkit.nn.embedding import MLPEmbedding
from flowkit.nn.linear import MaskedLinear
from flowkit.nn.made import MADE

__all__ = ["MADE", "MLPEmbedding", "MaskedLinear", "clear_caches"]
