"""Bijections ``x -> z`` with log-determinants (data to noise is ``forward``)."""

from flowkit.transforms.autoregressive import MaskedAffineAutoregressive, MaskedAutoregressive
from flowkit.transforms.base import Compose, Inverse, Permutation, Transform
from flowkit.transforms.batch_norm import BatchNorm
from flowkit.transforms.bounded import Logit
from flowkit.transforms.elementwise import Affine, Transformer
from flowkit.transforms.linear import LULinear
from flowkit.transforms.spline import RationalQuadraticSpline
from flowkit.transforms.standardize import SingleRowWarning, Standardize, set_from_data
from flowkit.transforms.torch_bijection import TorchBijection

__all__ = [
    "Affine",
    "BatchNorm",
    "Compose",
    "Inverse",
    "LULinear",
    "Logit",
    "MaskedAffineAutoregressive",
    "MaskedAutoregressive",
    "Permutation",
    "RationalQuadraticSpline",
    "SingleRowWarning",
    "Standardize",
    "TorchBijection",
    "Transform",
    "Transformer",
    "set_from_data",
]
