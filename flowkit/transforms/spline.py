r"""Monotonic rational-quadratic spline transformer with identity or linear tails.

References:
    Durkan, Bekasov, Murray and Papamakarios, "Neural Spline Flows", NeurIPS 2019 (the
    rational-quadratic transform, its derivative and its inverse).
    Gregory and Delbourgo, "Piecewise rational quadratic interpolation to monotonic data",
    IMA Journal of Numerical Analysis 1982.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from flowkit.checkpoint.registry import warn_on_build
from flowkit.transforms.base import float32_if_half
from flowkit.validation import check_float, check_int

MAX_TAIL_SLOPE = 1.1
"""Upper bound of the slopes of linear tails: a tail compresses data as much as it needs to
(down to ``min_derivative``) but stretches them by at most this factor per layer, so a test
point far outside the training data is not pushed further out by every layer (unbounded slopes
sent single rows of breast cancer to NLLs of 10^4; ``docs/defaults.md``)."""

MIN_BIN_FRACTION = 1e-6
"""The smallest ``min_bin_width`` and ``min_bin_height`` (fractions of the interval's length)
a spline takes without a :class:`~flowkit.checkpoint.BuildWarning`: with 1e-7, float32 splines
gave NaN log-densities for some rows."""


def _in_float32(
    spline: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], value: Tensor, params: Tensor
) -> tuple[Tensor, Tensor]:
    """``spline(value, params)``, computed in float32 when either is float16 or bfloat16 and
    returned in that dtype. The smallest bins (``min_bin_width * 2B``, 0.01 by default) are
    below bfloat16's spacing near the interval's ends (0.03 at 5): knots computed there round
    onto each other, and a bin of zero height gives ``log|dz/dx| = -inf``."""
    dtype = torch.promote_types(value.dtype, params.dtype)
    if float32_if_half(dtype) == dtype:
        return spline(value, params)
    out, log_det = spline(value.float(), params.float())
    return out.to(dtype), log_det.to(dtype)


class RationalQuadraticSpline:
    r"""Elementwise monotonic rational-quadratic (RQ) spline on ``[-B, B]``, linear or the
    identity outside.

    Same contract as :class:`flowkit.transforms.elementwise.Affine`: ``forward(x, params)``
    returns ``(z, log|dz/dx|)`` and ``inverse(z, params)`` returns ``(x, log|dx/dz|)``, all of
    shape ``(..., D)``, with ``params`` of shape ``(..., D, P)`` (leading shapes broadcast) and
    ``P = params_per_feature``: ``3K + 1`` with linear tails, ``3K - 1`` with identity tails.

    **Parameters.** The last axis of ``params`` holds, in this order, ``K`` raw widths
    :math:`\tilde w`, ``K`` raw heights :math:`\tilde h` and the raw derivatives
    :math:`\tilde\delta` at the ``K + 1`` knots (linear tails) or at the ``K - 1`` interior
    knots (identity tails). They become

    .. math::

        w_k = 2B \left(w_\min + (1 - K w_\min)\,\mathrm{softmax}(\tilde w / T)_k\right), \qquad
        x^{(k)} = -B + \textstyle\sum_{j<k} w_j \quad (k = 0, \dots, K),

    likewise heights :math:`h_k` and knots :math:`y^{(k)}` (``min_bin_width`` and
    ``min_bin_height`` are fractions of the interval's length ``2B``; :math:`T` is
    ``bin_temperature``), and

    .. math::

        \delta_k = \delta_\min + \mathrm{softplus}(\tilde\delta_k + c), \quad
        c = \log\left(e^{1 - \delta_\min} - 1\right)

    at the interior knots; at the two boundary knots, with linear tails,
    :math:`\delta = \delta_\min + (M - \delta_\min)\,\sigma(\tilde\delta + c')` with
    :math:`M` = ``MAX_TAIL_SLOPE`` (1.1) and :math:`c'` such that a raw 0 gives 1 (with identity
    tails :math:`\delta_0 = \delta_K = 1`). So raw zeros give uniform bins,
    :math:`s_k = h_k / w_k = 1` and :math:`\delta_k = 1`: the identity map.

    **Forward.** For :math:`x` in bin :math:`k`, with :math:`\xi = (x - x^{(k)}) / w_k \in
    [0, 1]` and :math:`s_k = h_k / w_k`,

    .. math::

        z = y^{(k)} + \frac{h_k \left(s_k \xi^2 + \delta_k \xi (1 - \xi)\right)}
            {s_k + (\delta_{k+1} + \delta_k - 2 s_k)\, \xi (1 - \xi)}, \qquad
        \frac{dz}{dx} = \frac{s_k^2 \left(\delta_{k+1} \xi^2 + 2 s_k \xi (1 - \xi)
            + \delta_k (1 - \xi)^2\right)}
            {\left(s_k + (\delta_{k+1} + \delta_k - 2 s_k)\, \xi (1 - \xi)\right)^2}.

    **Inverse.** For :math:`z` in bin :math:`k` (found on the :math:`y` knots), :math:`\xi` is
    the root in :math:`[0, 1]` of :math:`a \xi^2 + b \xi + c = 0` with

    .. math::

        a = h_k (s_k - \delta_k) + (z - y^{(k)}) \theta, \quad
        b = h_k \delta_k - (z - y^{(k)}) \theta, \quad
        c = -s_k (z - y^{(k)}), \quad \theta = \delta_{k+1} + \delta_k - 2 s_k,

    computed without cancellation: :math:`\xi = 2c / (-b - \sqrt{b^2 - 4ac})` when
    :math:`b \ge 0` (the paper's form) and :math:`\xi = (-b + \sqrt{b^2 - 4ac}) /
    (2a)` when :math:`b < 0` (then :math:`a > 0`). Then :math:`x = x^{(k)} + \xi w_k` and
    :math:`\log|dx/dz| = -\log|dz/dx|` evaluated at :math:`x`.

    **Tails.** Outside :math:`[-B, B]` the map continues the spline with the derivative it has
    at the boundary: :math:`z = B + \delta_K (x - B)` above, :math:`z = -B + \delta_0 (x + B)`
    below, with log-derivative :math:`\log\delta_K` or :math:`\log\delta_0`, so the map is
    continuously differentiable everywhere. Linear tails learn :math:`\delta_0, \delta_K`, so
    they can compress data far out (heavy tails) and stretch them a little (at most by
    ``MAX_TAIL_SLOPE``, 1.1); identity tails fix them to 1. The spline is evaluated on clamped
    inputs and then discarded outside, so neither value nor gradient of the unused branch can be
    NaN or infinite.

    Args:
        bins: number of bins ``K`` (at least 2). The defaults, 16 bins on ``[-5, 5]`` with
            linear tails, were chosen on the defaults benchmark (``docs/defaults.md``): behind
            the builders' standardization few data fall outside the interval, and those that do
            are still shaped (stretched or compressed) by the tails.
        bound: half-width ``B`` of the interval on which the spline acts.
        min_bin_width: smallest bin width as a fraction of ``2B``; ``bins * min_bin_width < 1``
            (below :data:`MIN_BIN_FRACTION`, a :class:`~flowkit.checkpoint.BuildWarning`).
        min_bin_height: smallest bin height as a fraction of ``2B``; likewise.
        min_derivative: smallest knot derivative, in ``(0, 1)``.
        tails: ``"linear"`` (default: learned slopes outside ``[-B, B]``, at most
            ``MAX_TAIL_SLOPE`` (1.1)) or ``"identity"``.
        bin_temperature: ``T``, positive: the raw widths and heights are divided by it before
            their softmax. It changes no density that raw values can express, only how fast
            training moves the bins: a conditioner's output layer that sums ``H`` hidden units
            moves its outputs about ``sqrt(H)`` times as far per optimizer step as one unit
            does, and nflows' (and sbi's) splines divide by ``sqrt(H)``. ``T = 8`` (the
            square root of the builders' hidden width) was measured against the default 1:
            much better with ten features or more and a few hundred rows, worse on small data
            sets and sharp 2-D densities (docs/defaults.md, "The spline's bin temperature").

    Example:
        >>> spline = RationalQuadraticSpline(bins=4, bound=2.0)
        >>> params = torch.zeros(5, 3, spline.params_per_feature)
        >>> x = torch.linspace(-3.0, 3.0, 15).reshape(5, 3)
        >>> z, log_det = spline.forward(x, params)
        >>> torch.allclose(z, x, atol=1e-6), bool(log_det.abs().max() < 1e-6)
        (True, True)
    """

    bin_temperature: float = 1.0  # also what instances pickled before the option read

    def __init__(
        self,
        bins: int = 16,
        bound: float = 5.0,
        min_bin_width: float = 1e-3,
        min_bin_height: float = 1e-3,
        min_derivative: float = 1e-3,
        tails: str = "linear",
        bin_temperature: float = 1.0,
    ):
        bins = check_int("bins", bins, 2)
        bound = check_float("bound", bound, 0, exclusive=True)
        for name, value in (("min_bin_width", min_bin_width), ("min_bin_height", min_bin_height)):
            if not 0 < check_float(name, value) * bins < 1:
                raise ValueError(
                    f"'{name}' should be in (0, 1 / bins) = (0, {1 / bins:g}), got {value}"
                )
            if value < MIN_BIN_FRACTION:  # a warning: files saved with it still load
                warn_on_build(
                    f"'{name}' is {value:g}, below {MIN_BIN_FRACTION:g} of the interval: bins "
                    "that narrow are below float32's resolution and gave NaN log-densities "
                    "for some rows; use float64 (model.double()) or a larger value",
                    stacklevel=2)
        check_float("min_derivative", min_derivative, 0, 1, exclusive=True)
        bin_temperature = check_float("bin_temperature", bin_temperature, 0, exclusive=True)
        if tails not in ("linear", "identity"):
            raise ValueError(f"'tails' should be 'linear' or 'identity', got {tails!r}")
        self.bins = bins
        self.bound = float(bound)
        self.min_bin_width = float(min_bin_width)
        self.min_bin_height = float(min_bin_height)
        self.min_derivative = float(min_derivative)
        self.tails = tails
        self.bin_temperature = float(bin_temperature)
        self.params_per_feature = 3 * self.bins + (1 if tails == "linear" else -1)
        # softplus(c) = 1 - min_derivative, so a raw derivative of 0 gives derivative 1.
        self._derivative_shift = math.log(math.expm1(1.0 - self.min_derivative))
        # sigmoid(c) = (1 - min_derivative) / (MAX_TAIL_SLOPE - min_derivative): raw 0 gives 1
        share = (1.0 - self.min_derivative) / (MAX_TAIL_SLOPE - self.min_derivative)
        self._tail_shift = math.log(share / (1.0 - share))

    def knots(self, params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Knot abscissas, ordinates and derivatives, each of shape ``(..., D, K + 1)``.

        ``params``: ``(..., D, P)`` raw values. The first and last abscissas and ordinates
        are exactly ``-B`` and ``B``; with identity tails the first and last derivatives are
        exactly 1.
        """
        raw_widths, raw_heights, raw_derivatives = self._raw(params)
        x_knots = self._cumulative_knots(raw_widths, self.min_bin_width)
        y_knots = self._cumulative_knots(raw_heights, self.min_bin_height)
        if self.tails == "identity":
            return x_knots, y_knots, F.pad(self._interior(raw_derivatives), (1, 1), value=1.0)
        low, high = self._edge(raw_derivatives[..., :1]), self._edge(raw_derivatives[..., -1:])
        interior = self._interior(raw_derivatives[..., 1:-1])
        return x_knots, y_knots, torch.cat([low, interior, high], dim=-1)

    def _raw(self, params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``params`` ``(..., D, P)`` checked and split into the raw widths, heights and
        derivatives."""
        if params.shape[-1] != self.params_per_feature:
            raise ValueError(
                f"'params' should have {self.params_per_feature} values in its last axis "
                f"(bins={self.bins}, tails={self.tails!r}), got shape {tuple(params.shape)}"
            )
        k = self.bins
        widths, heights, derivatives = params.split([k, k, self.params_per_feature - 2 * k], -1)
        if self.bin_temperature != 1.0:
            widths, heights = widths / self.bin_temperature, heights / self.bin_temperature
        return widths, heights, derivatives

    def _interior(self, raw: Tensor) -> Tensor:
        """Interior knot derivatives from their raw values (1 at raw 0)."""
        return self.min_derivative + F.softplus(raw + self._derivative_shift)

    def _edge(self, raw: Tensor) -> Tensor:
        """Boundary knot derivatives (linear tails' slopes) from their raw values: in
        ``(min_derivative, MAX_TAIL_SLOPE)``, 1 at raw 0."""
        return self.min_derivative + (MAX_TAIL_SLOPE - self.min_derivative) * torch.sigmoid(
            raw + self._tail_shift
        )

    def _cumulative_knots(self, raw: Tensor, min_fraction: float) -> Tensor:
        inner = self._inner_knots(raw, min_fraction)
        return F.pad(F.pad(inner, (1, 0), value=-self.bound), (0, 1), value=self.bound)

    def _bin(self, value: Tensor, params: Tensor, along_y: bool) -> tuple[Tensor, ...]:
        """Locate ``value`` (clamped to ``[-B, B]``) among the x (or y) knots and gather the
        bin's ``x_k, w_k, y_k, h_k, delta_k, delta_{k+1}``, each of the shape of ``value``.

        The same values as :meth:`knots` gives at the bin, computed with fewer passes over
        ``(..., D, K)`` tensors: the interior knots are searched and gathered as they come from
        the cumulative sums (the boundaries ``-B`` and ``B`` filled in where the bin is the
        first or the last), and only the two derivatives of the bin are formed from their raw
        values."""
        k = self.bins
        raw_widths, raw_heights, raw_derivatives = self._raw(params)
        x_inner = self._inner_knots(raw_widths, self.min_bin_width)
        y_inner = self._inner_knots(raw_heights, self.min_bin_height)
        # Number of interior knots <= value: the bin index in [0, K - 1]; a value on a knot
        # starts the bin to its right.
        index = torch.searchsorted(
            y_inner if along_y else x_inner, value[..., None].contiguous(), right=True
        )
        first, last = index == 0, index == k - 1

        def knot_pair(inner: Tensor) -> tuple[Tensor, Tensor]:
            """The knots at the bin's left and right edge."""
            left = inner.gather(-1, (index - 1).clamp_min(0)).squeeze(-1)
            right = inner.gather(-1, index.clamp_max(k - 2)).squeeze(-1)
            return (torch.where(first.squeeze(-1), -self.bound, left),
                    torch.where(last.squeeze(-1), self.bound, right))

        x_k, x_k1 = knot_pair(x_inner)
        y_k, y_k1 = knot_pair(y_inner)
        d_k, d_k1 = self._bin_derivatives(raw_derivatives, index, first, last)
        return x_k, x_k1 - x_k, y_k, y_k1 - y_k, d_k, d_k1

    def _inner_knots(self, raw: Tensor, min_fraction: float) -> Tensor:
        """The ``K - 1`` interior knots, ``(..., D, K - 1)``, of :meth:`_cumulative_knots`."""
        fractions = min_fraction + (1.0 - self.bins * min_fraction) * torch.softmax(raw, dim=-1)
        return 2.0 * self.bound * torch.cumsum(fractions[..., :-1], dim=-1) - self.bound

    def _bin_derivatives(
        self, raw: Tensor, index: Tensor, first: Tensor, last: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The derivatives at the left and right knot of bin ``index`` (``(..., D, 1)``), as
        :meth:`knots` computes them, from the raw derivatives of those knots only."""
        if self.tails == "identity":  # raw values at the K - 1 interior knots only
            left = self._interior(raw.gather(-1, (index - 1).clamp_min(0)))
            right = self._interior(raw.gather(-1, index.clamp_max(self.bins - 2)))
            one = torch.ones((), dtype=left.dtype, device=left.device)
            left, right = torch.where(first, one, left), torch.where(last, one, right)
        else:  # raw values at all K + 1 knots
            pair = raw.gather(-1, torch.cat([index, index + 1], dim=-1))
            interior, edge = self._interior(pair), self._edge(pair)
            left = torch.where(first, edge[..., :1], interior[..., :1])
            right = torch.where(last, edge[..., 1:], interior[..., 1:])
        return left.squeeze(-1), right.squeeze(-1)

    @staticmethod
    def _log_derivative(
        xi: Tensor, slope: Tensor, d_k: Tensor, d_k1: Tensor, denominator: Tensor
    ) -> Tensor:
        """``log dz/dx`` inside a bin (see the class docstring)."""
        numerator = d_k1 * xi**2 + 2.0 * slope * xi * (1.0 - xi) + d_k * (1.0 - xi) ** 2
        return 2.0 * torch.log(slope) + torch.log(numerator) - 2.0 * torch.log(denominator)

    def _broadcast(self, value: Tensor, params: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        shape = torch.broadcast_shapes(value.shape, params.shape[:-1])
        value = value.expand(shape)
        inside = (value >= -self.bound) & (value <= self.bound)
        return value, params.expand(*shape, params.shape[-1]), inside

    def forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        """Data to noise. ``x``: ``(..., D)``, ``params``: ``(..., D, P)``. Returns ``z``
        and ``log|dz/dx|``, both ``(..., D)``. In float16 and bfloat16 the spline is computed
        in float32 (see :func:`_in_float32`)."""
        return _in_float32(self._forward, x, params)

    def inverse(self, z: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        """Noise to data. ``z``: ``(..., D)``, ``params``: ``(..., D, P)``. Returns ``x``
        and ``log|dx/dz|``, both ``(..., D)``; float16 and bfloat16 as in :meth:`forward`."""
        return _in_float32(self._inverse, z, params)

    def _forward(self, x: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        x, params, inside = self._broadcast(x, params)
        clamped = x.clamp(-self.bound, self.bound)
        x_k, w, y_k, h, d_k, d_k1 = self._bin(clamped, params, along_y=False)
        slope = h / w
        xi = (clamped - x_k) / w
        xi_1m_xi = xi * (1.0 - xi)
        denominator = slope + (d_k1 + d_k - 2.0 * slope) * xi_1m_xi
        z = y_k + h * (slope * xi**2 + d_k * xi_1m_xi) / denominator
        log_det = self._log_derivative(xi, slope, d_k, d_k1, denominator)
        z_out, log_det_out = self._tail(x, clamped, d_k, d_k1, inverse=False)
        return torch.where(inside, z, z_out), torch.where(inside, log_det, log_det_out)

    def _inverse(self, z: Tensor, params: Tensor) -> tuple[Tensor, Tensor]:
        z, params, inside = self._broadcast(z, params)
        clamped = z.clamp(-self.bound, self.bound)
        x_k, w, y_k, h, d_k, d_k1 = self._bin(clamped, params, along_y=True)
        slope = h / w
        offset = clamped - y_k
        theta = d_k1 + d_k - 2.0 * slope
        b = h * d_k - offset * theta
        a = h * slope - b  # = h (s_k - delta_k) + (z - y_k) theta
        c = -slope * offset
        # The discriminant is (h delta_{k+1})^2 at the top of a bin, which rounds to 0 or below
        # in float32 for a thin bin with a small derivative: clamped to the smallest normal
        # number, its square root's gradient stays finite (the unused branch of a tail point
        # is clamped to the boundary, and an infinite gradient times 0 is NaN).
        root = torch.sqrt((b**2 - 4.0 * a * c).clamp_min(torch.finfo(b.dtype).tiny))
        # One division by the selected denominator, which is never zero: -b - root < 0 when
        # b >= 0 (b = h delta_k > 0 where c = 0), and 2a = 2 (h s_k - b) > 0 when b < 0.
        b_nonnegative = b >= 0
        xi = torch.where(b_nonnegative, 2.0 * c, root - b) / torch.where(
            b_nonnegative, -b - root, 2.0 * a
        )
        x = x_k + xi * w
        denominator = slope + theta * xi * (1.0 - xi)
        log_det = -self._log_derivative(xi, slope, d_k, d_k1, denominator)
        x_out, log_det_out = self._tail(z, clamped, d_k, d_k1, inverse=True)
        return torch.where(inside, x, x_out), torch.where(inside, log_det, log_det_out)

    def _tail(
        self, value: Tensor, clamped: Tensor, d_k: Tensor, d_k1: Tensor, inverse: bool
    ) -> tuple[Tensor, Tensor]:
        """The map and its log-derivative outside ``[-B, B]`` (``clamped`` is the boundary
        passed, where the bin gathered is the first or the last): the identity, or the line
        through the boundary with the slope of the spline there."""
        if self.tails == "identity":
            return value, torch.zeros_like(value)
        edge = torch.where(value > 0, d_k1, d_k)  # delta_K above, delta_0 below
        if inverse:
            return clamped + (value - clamped) / edge, -torch.log(edge)
        return clamped + edge * (value - clamped), torch.log(edge)

    def __repr__(self) -> str:
        return (
            f"RationalQuadraticSpline(bins={self.bins}, bound={self.bound}, "
            f"min_bin_width={self.min_bin_width}, min_bin_height={self.min_bin_height}, "
            f"min_derivative={self.min_derivative}, tails={self.tails!r}"
            + (f", bin_temperature={self.bin_temperature}" if self.bin_temperature != 1.0 else "")
            + ")"
        )
