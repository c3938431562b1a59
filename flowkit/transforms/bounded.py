r"""``Logit``: each feature's interval ``(low, high)`` onto the real line.

A flow's density is positive on all of :math:`\mathbb{R}^D`. Data that live in a box (the
parameters of a simulator under a uniform prior, fractions, bounded measurements) or on a
half-line (incomes, concentrations, waiting times) leave it to spread mass outside, and a density
that must drop to zero at an edge is hard to learn near it. Put first in a flow, ``Logit`` maps
each feature's interval onto :math:`\mathbb{R}`: on a bounded one,

.. math::

    z_d = \log(x_d - l_d) - \log(h_d - x_d), \qquad
    \log\left|\frac{\partial z_d}{\partial x_d}\right|
      = \log(h_d - l_d) - \log(x_d - l_d) - \log(h_d - x_d),

with inverse :math:`x_d = l_d + (h_d - l_d)\,\sigma(z_d)`; on a half-line, the logarithm of the
distance to its end, :math:`z_d = \log(x_d - l_d)` (``high = inf``) or :math:`z_d = -\log(h_d -
x_d)` (``low = -inf``), with log-derivative :math:`-\log(x_d - l_d)` or :math:`-\log(h_d -
x_d)`; where both bounds are infinite, the identity. The log-determinant is the sum over the
features, so the flow's density is zero outside the intervals and still normalized inside. A
point outside has log-density ``-inf``: ``forward`` gives it ``z = 0`` and ``log_det = -inf``. A
point on a finite edge (a sample of a uniform prior can be exactly its lower bound) is scored as
if one rounding step inside it: the float spacing at that end (the distance to the next
number inside), or the smallest normal number where that end is 0.
:func:`flowkit.MAF` and :func:`flowkit.IAF` put one first with ``bounds=(low, high)``.

Samples that round onto an edge. The inverse of a ``z`` far out (about ``|z| > 16`` on the unit
interval in float32, ``> 36`` in float64) is within one rounding step of an edge and is
returned on it. Its log-density from ``sample_and_log_prob`` (and from a flow distribution's
cached ``log_prob`` of its own sample) is that of the unrounded point, while ``log_prob`` of the
returned value scores the edge one rounding step inside: where the density changes fast near
the edge the two differ, by tens of nats in float32 flows with perturbed weights.
A model whose mass reaches that close to an edge needs float64 (``model.double()``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.distributions import constraints

from flowkit.checkpoint import InvalidBuffer, register_check
from flowkit.transforms.base import Transform


class Logit(Transform):
    r"""Each feature's interval ``(low, high)`` onto the real line (see the module notes):
    ``z = log(x - low) - log(high - x)`` where both bounds are finite, the log of the distance
    to the finite one on a half-line, the identity where both are infinite.

    Args:
        low: ``(D,)`` lower bounds, finite or ``-inf``.
        high: ``(D,)`` upper bounds, finite or ``inf``, each above its ``low`` also after
            rounding to torch's default dtype, which the buffers take (as every module's
            parameters do): bounds that differ only beyond float32's precision need
            ``torch.set_default_dtype(torch.float64)`` before the flow is built.

    Buffers: ``low`` and ``high`` ``(D,)``, infinite at open ends (listed in
    ``infinite_buffers``, which the training loop's check of finite weights reads).

    Example:
        >>> import torch
        >>> t = Logit([0.0, -1.0], [1.0, 1.0])
        >>> z, log_det = t(torch.tensor([[0.5, 0.0], [2.0, 0.0]]))
        >>> z.tolist(), [round(v, 4) for v in log_det.tolist()]  # log 8; outside the box
        ([[0.0, 0.0], [0.0, 0.0]], [2.0794, -inf])
        >>> positive = Logit([0.0], [float("inf")])  # z = log x
        >>> positive(torch.tensor([[1.0], [2.0]]))[0].flatten().tolist()
        [0.0, 0.6931471824645996]
    """

    infinite_buffers = ("low", "high")

    def __init__(self, low: Tensor | Sequence[float], high: Tensor | Sequence[float]):
        super().__init__()
        low_, high_ = _checked_bounds(low, high, torch.get_default_dtype())
        self.features = low_.numel()
        self.register_buffer("low", low_)
        self.register_buffer("high", high_)

    @property
    def data_support(self) -> constraints.Constraint:
        """The box ``[low, high]`` (``R^D`` if every end is open), as :meth:`contains` reads it:
        in torch's terms where they say it (a lower or an upper end on every feature: a
        ``greater_than_eq`` or ``less_than``, which ``torch.distributions.biject_to`` maps onto;
        torch has no closed upper half-line, so a point at ``high`` is outside ``less_than``
        though its log-density is finite; otherwise an ``interval`` with infinite ends)."""
        has_low, has_high = torch.isfinite(self.low), torch.isfinite(self.high)
        if not (has_low.any() or has_high.any()):
            return constraints.real_vector
        if has_low.all() and not has_high.any():
            return constraints.independent(constraints.greater_than_eq(self.low), 1)
        if has_high.all() and not has_low.any():
            return constraints.independent(constraints.less_than(self.high), 1)
        return constraints.independent(constraints.interval(self.low, self.high), 1)

    def contains(self, x: Tensor) -> Tensor:
        """Whether each value of ``x`` ``(..., D)`` lies in its feature's closed interval
        ``[low, high]`` (the bounds in ``x``'s dtype): a bool tensor of ``x``'s shape. A row
        with a value outside has log-density ``-inf``."""
        return (x >= self.low.to(x.dtype)) & (x <= self.high.to(x.dtype))

    def _ends(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Which ends are finite (``(D,)`` bools), the bounds with their infinite ends replaced
        by 0, and the widths of the bounded intervals (1 elsewhere): finite stand-ins, so that
        no branch that ``where`` discards computes an infinity (whose gradient, times 0, would
        be NaN)."""
        has_low, has_high = torch.isfinite(self.low), torch.isfinite(self.high)
        low = torch.where(has_low, self.low, 0.0)
        high = torch.where(has_high, self.high, 0.0)
        width = torch.where(has_low & has_high, high - low, 1.0)
        return has_low, has_high, low, high, width

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        has_low, has_high, low, high, width = self._ends()
        inside = self.contains(x)
        # A point on an edge (a uniform prior's sample can be exactly its lower bound) is taken
        # one rounding step inside: distances below that step are raised to it, which moves
        # no more mass than the rounding of x itself. Outside (and at an infinite end) the
        # distances are stood in for by the width, whose values are then discarded.
        # The step is the float spacing at that end (eps * width on (0, 1) moved a
        # point at 1e-10 to 1.2e-7 in float32, 7 nats off), the smallest normal number at 0.
        tiny = torch.finfo(x.dtype).tiny
        low_x, high_x = low.to(x.dtype), high.to(x.dtype)
        floor_low = (torch.nextafter(low_x, torch.full_like(low_x, math.inf)) - low_x)
        floor_high = (high_x - torch.nextafter(high_x, torch.full_like(high_x, -math.inf)))
        floor_low, floor_high = floor_low.clamp_min(tiny), floor_high.clamp_min(tiny)
        bounded = has_low & has_high
        above = torch.where(inside & has_low, (x - low).clamp_min(floor_low), width)
        below = torch.where(inside & has_high, (high - x).clamp_min(floor_high), width)
        log_above, log_below = torch.log(above), torch.log(below)
        z = torch.where(
            bounded, log_above - log_below,
            torch.where(has_low, log_above, torch.where(has_high, -log_below, x)),
        )
        log_det = torch.where(has_low & has_high, torch.log(width), 0.0)
        log_det = log_det - torch.where(has_low, log_above, 0.0) - torch.where(
            has_high, log_below, 0.0)
        z = torch.where(inside, z, 0.0)
        log_det = log_det.sum(-1).masked_fill(~inside.all(-1), -math.inf)
        return z, log_det

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        has_low, has_high, low, high, width = self._ends()
        bounded = has_low & has_high
        logistic = low + width * torch.sigmoid(z)
        log_logistic = (torch.log(width) + torch.nn.functional.logsigmoid(z)
                        + torch.nn.functional.logsigmoid(-z))
        # exp of the side that is used only (an unused exp(z) may overflow to inf)
        up = torch.exp(torch.where(has_low & ~has_high, z, 0.0))
        down = torch.exp(torch.where(has_high & ~has_low, -z, 0.0))
        x = torch.where(
            bounded, logistic,
            torch.where(has_low, low + up, torch.where(has_high, high - down, z)),
        )
        log_det = torch.where(
            bounded, log_logistic,
            torch.where(has_low, z, torch.where(has_high, -z, 0.0)),
        )
        return x, log_det.sum(-1)

    def extra_repr(self) -> str:
        return f"low={self.low.tolist()}, high={self.high.tolist()}"


def _checked_bounds(
    low: Tensor | Sequence[float], high: Tensor | Sequence[float], dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """``low`` and ``high`` as CPU tensors ``(D,)`` of ``dtype``, not NaN, ``low`` below
    ``inf`` and ``high`` above ``-inf``, ``low < high`` (as given, and after rounding to
    ``dtype``)."""
    values = {}
    for name, value in (("low", low), ("high", high)):
        given = torch.as_tensor(value, dtype=torch.float64, device="cpu")
        if given.dim() != 1 or given.numel() == 0:
            raise ValueError(f"'{name}' should have shape (D,) with D >= 1, got "
                             f"{tuple(given.shape)}")
        wrong = float("inf") if name == "low" else -float("inf")
        if given.isnan().any() or (given == wrong).any():
            end = "finite or -inf" if name == "low" else "finite or inf"
            raise ValueError(f"'{name}' should be {end}, got {given.tolist()}")
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
    bounded = torch.isfinite(low_) & torch.isfinite(high_)
    bad = (bounded & ~torch.isfinite(high_ - low_)).nonzero().flatten().tolist()
    if bad:  # otherwise every point's density is NaN
        raise ValueError(
            f"the width high - low overflows {dtype} at features {bad} (low "
            f"{values['low'][bad].tolist()}, high {values['high'][bad].tolist()}): give those "
            "features an open end (None) or narrower bounds")
    return low_, high_


@register_check(Logit)
def _check_stored_bounds(module: Logit) -> None:
    """Refuse stored bounds that no :class:`Logit` has: ``low`` finite or ``-inf``, ``high``
    finite or ``inf``, ``low < high``."""
    if module.low.isnan().any() or (module.low == math.inf).any():
        raise InvalidBuffer("low", "bounds that are finite or -inf")
    if module.high.isnan().any() or (module.high == -math.inf).any():
        raise InvalidBuffer("high", "bounds that are finite or inf")
    if not (module.low < module.high).all():
        raise InvalidBuffer("high", "bounds above 'low'")
