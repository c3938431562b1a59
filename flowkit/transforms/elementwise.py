"""Elementwise monotonic maps ("transformers" in the terminology of Papamakarios et al. 2021).

An autoregressive layer is a conditioner (a MADE producing ``P`` parameters per feature) plus
a transformer ``tau(x_d; theta_d)`` that is monotonic in ``x_d``. Transformers are plain objects
with no weights of their own: every parameter comes from the conditioner, as a tensor of shape
``(..., D, P)`` whose last axis holds the ``P = params_per_feature`` raw (unconstrained) values.

Contract (:class:`Transformer`, met by :class:`Affine` and
:class:`flowkit.transforms.RationalQuadraticSpline`; :func:`make_transformer` builds one by name):

* ``forward(x, params) -> (z, log|dz/dx|)``, elementwise, both ``(..., D)``;
* ``inverse(z, params) -> (x, log|dx/dz|)``;
* raw parameters equal to zero give the identity map, so a conditioner whose output layer
  starts at zero makes the whole layer the identity at initialisation.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from flowkit.checkpoint.registry import warn_on_build
from flowkit.transforms.spline import RationalQuadraticSpline
from flowkit.validation import check_float


class Transformer(Protocol):
    """Elementwise monotonic map with parameters from a conditioner, ``(..., D, P)``."""

    params_per_feature: int

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]: ...

    def inverse(self, z: Tensor, params: Tensor) -> tuple[Tensor, Tensor]: ...


MAX_LOG_SCALE_BOUND = 20.0
"""The largest ``log_scale_bound`` of :class:`Affine` without a
:class:`~flowkit.checkpoint.BuildWarning`: a layer then scales by at most
``e^20``, about 5e8 (at 100 a float32 layer's output was inf with a finite
log-determinant, at 1000 its inverse NaN)."""


class Affine:
    r"""``z = (x - shift) * exp(-log_scale)`` (or ``x * exp(-log_scale) - shift``) with a
    smoothly bounded log-scale.

    The conditioner's two raw outputs per feature are ``(shift, a)``. The log-scale is
    ``log_scale = bound * tanh(a / bound)``: equal to ``a`` near zero, smooth everywhere, and
    confined to ``(-bound, bound)`` so a single layer can never scale by more than ``e^bound``.
    A hard clamp would also bound it but has zero gradient outside the interval and a kink at its
    edges; ``tanh`` keeps gradients alive and finite.

    ``form``: where the shift goes in the ``forward`` (data-to-noise) direction.

    * ``"location-scale"`` (default): ``z = (x - shift) * exp(-log_scale)``, ``inverse``
      ``x = z * exp(log_scale) + shift``: the parameterisation of the MAF paper (Papamakarios
      et al. 2017, eq. 4 and 5) and, read in the sampling direction, of the IAF paper.
    * ``"scale-shift"``: ``z = x * exp(-log_scale) - shift``, ``inverse``
      ``x = (z + shift) * exp(log_scale)``: the shift is not scaled in the forward direction,
      as in zuko's and nflows' affine MAFs.

    Either way ``forward``'s ``log|dz/dx| = -log_scale`` and ``inverse``'s is ``log_scale``.
    """

    params_per_feature = 2
    form: str = "location-scale"  # also what instances pickled before the option read

    def __init__(
        self,
        log_scale_bound: float = 3.0,
        form: Literal["location-scale", "scale-shift"] = "location-scale",
    ):
        self.log_scale_bound = check_float("log_scale_bound", log_scale_bound, 0, exclusive=True)
        if self.log_scale_bound > MAX_LOG_SCALE_BOUND:  # a warning: files saved with it load
            warn_on_build(
                f"'log_scale_bound' is {self.log_scale_bound:g}, above {MAX_LOG_SCALE_BOUND:g}: "
                "a layer may then scale by more than float32 holds (inf outputs with finite "
                "log-determinants)", stacklevel=2)
        if form not in ("location-scale", "scale-shift"):
            raise ValueError(f"'form' should be 'location-scale' or 'scale-shift', got {form!r}")
        self.form = form

    def _unpack(self, params: Tensor) -> tuple[Tensor, Tensor]:
        shift, raw = params.unbind(-1)
        bound = self.log_scale_bound
        return shift, bound * torch.tanh(raw / bound)

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        shift, log_scale = self._unpack(params)
        if self.form == "scale-shift":
            return x * torch.exp(-log_scale) - shift, -log_scale
        return (x - shift) * torch.exp(-log_scale), -log_scale

    def inverse(self, z: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        shift, log_scale = self._unpack(params)
        if self.form == "scale-shift":
            return (z + shift) * torch.exp(log_scale), log_scale
        return z * torch.exp(log_scale) + shift, log_scale

    def __repr__(self) -> str:
        form = "" if self.form == "location-scale" else f", form={self.form!r}"
        return f"Affine(log_scale_bound={self.log_scale_bound}{form})"


_TRANSFORMERS: dict[str, type[Transformer]] = {
    "affine": Affine,
    "spline": RationalQuadraticSpline,
}


def make_transformer(name: str, **kwargs: Any) -> Transformer:
    """An elementwise transformer by name: ``"affine"`` (:class:`Affine`) or ``"spline"``
    (:class:`flowkit.transforms.RationalQuadraticSpline`), with its keyword arguments.

    Raises:
        ValueError: an unknown ``name``.
        TypeError: ``kwargs`` that the transformer does not take (the error names
            ``transformer_kwargs``, the transformer and the arguments it takes).
    """
    if not isinstance(name, str) or name not in _TRANSFORMERS:
        raise ValueError(f"'transformer' should be 'affine' or 'spline', got {name!r}")
    cls = _TRANSFORMERS[name]
    signature = inspect.signature(cls)
    try:
        signature.bind(**kwargs)
    except TypeError as e:
        raise TypeError(
            f"'transformer_kwargs' {kwargs} do not fit transformer={name!r} ({cls.__name__}, "
            f"which takes {', '.join(signature.parameters) or 'no arguments'}): {e}"
        ) from None
    return cls(**kwargs)
