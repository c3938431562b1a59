r"""``Logit``: the open box ``(low, high)`` onto the real line, feature by feature.

A flow's density is positive on all of :math:`\mathbb{R}^D`. Data that live in a box (the
parameters of a simulator under a uniform prior, fractions, bounded measurements) leave it to
spread mass outside the box, and a density that must drop to zero at an edge is hard to learn
near it. Put first in a flow, ``Logit`` maps the box onto :math:`\mathbb{R}^D`,

.. math::

    z_d = \log(x_d - l_d) - \log(h_d - x_d), \qquad
    \log\left|\det \frac{\partial z}{\partial x}\right|
      = \sum_d \log(h_d - l_d) - \log(x_d - l_d) - \log(h_d - x_d),

so that the flow's density is zero outside the box and still normalized inside it. The inverse
is :math:`x_d = l_d + (h_d - l_d)\,\sigma(z_d)`. A point outside the box has log-density
``-inf``: ``forward`` gives it ``z = 0`` and ``log_det = -inf``. A point on an edge (a sample of
a uniform prior can be exactly its lower bound) is scored as if one rounding step
(``eps * (h - l)``) inside it.
:func:`flowkit.MAF` and :func:`flowkit.IAF` put one first with ``bounds=(low, high)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from flowkit.checkpoint import InvalidBuffer, register_check
from flowkit.transforms.base import Transform


class Logit(Transform):
    r"""``z = log(x - low) - log(high - x)`` per feature (see the module notes).

    Args:
        low: ``(D,)`` finite lower bounds.
        high: ``(D,)`` finite upper bounds, each above its ``low`` also after rounding to
            torch's default dtype, which the buffers take (as every module's parameters do):
            bounds that differ only beyond float32's precision need
            ``torch.set_default_dtype(torch.float64)`` before the flow is built.

    Buffers: ``low`` and ``high`` ``(D,)``.

    Example:
        >>> import torch
        >>> t = Logit([0.0, -1.0], [1.0, 1.0])
        >>> z, log_det = t(torch.tensor([[0.5, 0.0], [2.0, 0.0]]))
        >>> z.tolist(), [round(v, 4) for v in log_det.tolist()]  # log 8; outside the box
        ([[0.0, 0.0], [0.0, 0.0]], [2.0794, -inf])
    """

    def __init__(self, low: Tensor | Sequence[float], high: Tensor | Sequence[float]):
        super().__init__()
        low_, high_ = _checked_bounds(low, high, torch.get_default_dtype())
        self.features = low_.numel()
        self.register_buffer("low", low_)
        self.register_buffer("high", high_)

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        width = self.high - self.low
        above, below = x - self.low, self.high - x
        inside = (above >= 0) & (below >= 0)
        # A point on an edge (a uniform prior's sample can be exactly its lower bound) is taken
        # one rounding step inside: distances below eps * width are raised to it, which moves
        # no more mass than the rounding of x itself.
        floor = torch.finfo(x.dtype).eps * width
        half = width / 2  # stands in for the distances outside the box
        above = torch.where(inside, above.clamp_min(floor), half)
        below = torch.where(inside, below.clamp_min(floor), half)
        log_above, log_below = torch.log(above), torch.log(below)
        log_det = (torch.log(width) - log_above - log_below).sum(-1)
        log_det = log_det.masked_fill(~inside.all(-1), -math.inf)
        return log_above - log_below, log_det

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        width = self.high - self.low
        x = self.low + width * torch.sigmoid(z)
        log_det = (torch.log(width) + torch.nn.functional.logsigmoid(z)
                   + torch.nn.functional.logsigmoid(-z)).sum(-1)
        return x, log_det

    def extra_repr(self) -> str:
        return f"low={self.low.tolist()}, high={self.high.tolist()}"


def _checked_bounds(
    low: Tensor | Sequence[float], high: Tensor | Sequence[float], dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """``low`` and ``high`` as CPU tensors ``(D,)`` of ``dtype``, finite, ``low < high`` (as
    given, and after rounding to ``dtype``)."""
    values = {}
    for name, value in (("low", low), ("high", high)):
        given = torch.as_tensor(value, dtype=torch.float64, device="cpu")
        if given.dim() != 1 or given.numel() == 0:
            raise ValueError(f"'{name}' should have shape (D,) with D >= 1, got "
                             f"{tuple(given.shape)}")
        if not torch.isfinite(given).all():
            raise ValueError(f"'{name}' should be finite, got {given.tolist()}")
        values[name] = given
    if values["low"].shape != values["high"].shape:
        raise ValueError(f"'low' and 'high' should have the same shape, got "
                         f"{tuple(values['low'].shape)} and {tuple(values['high'].shape)}")
    bad = (values["low"] >= values["high"]).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"'high' should be above 'low' in every feature, got low "
                         f"{values['low'].tolist()} and high {values['high'].tolist()} (features "
                         f"{bad})")
    low_, high_ = values["low"].to(dtype), values["high"].to(dtype)
    bad = (low_ >= high_).nonzero().flatten().tolist()
    if bad:
        raise ValueError(
            f"'low' and 'high' are equal in {dtype} at features {bad} (low "
            f"{values['low'][bad].tolist()}, high {values['high'][bad].tolist()}): the box is "
            "narrower than that dtype resolves there; build the flow after "
            "torch.set_default_dtype(torch.float64), or shift and scale the data first")
    return low_, high_


@register_check(Logit)
def _check_stored_bounds(module: Logit) -> None:
    """Refuse stored bounds that no :class:`Logit` has: finite, ``low < high``."""
    if not (torch.isfinite(module.low).all() and torch.isfinite(module.high).all()):
        raise InvalidBuffer("low", "finite bounds")
    if not (module.low < module.high).all():
        raise InvalidBuffer("high", "bounds above 'low'")
