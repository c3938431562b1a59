r"""Sampled 2-D toy datasets of the flow literature, with exact densities where they are known.

Eight datasets, each scaled to lie roughly in ``[-4, 4]^2`` (:data:`TOY_BOX`). The shapes and
constants follow the generators popularised by FFJORD (Grathwohl et al. 2019), rewritten in
torch so that samples are drawn directly on the requested device: a training loop that draws a
fresh batch each step never goes through the host.

Four datasets have a density in closed form, so a demo can report the exact
``KL(data || model) = E_data[-log q(x)] - H(data)`` from a model's test NLL:

* ``8gaussians``: :math:`p(x) = \frac18 \sum_k \mathcal N(x; \mu_k, \sigma^2 I)`, with the
  centres :math:`\mu_k = R (\cos \frac{k\pi}{4}, \sin \frac{k\pi}{4})`, :math:`R = 2\sqrt2`,
  :math:`\sigma = \sqrt2 / 4`;
* ``checkerboard``: uniform over the 8 dark squares (side 2) of a 4 x 4 board on
  ``[-4, 4)^2``, so :math:`p = 1/32` there and :math:`H = \log 32`;
* ``circles`` and ``rings``: uniform angle on circles of radii :math:`r_k`, plus isotropic
  Gaussian noise. Integrating the angle out gives the "ring" density

  .. math:: p_r(x) = \frac{1}{2\pi\sigma^2}
            \exp\Big(-\frac{\rho^2 + r^2}{2\sigma^2}\Big) I_0\Big(\frac{\rho r}{\sigma^2}\Big),
            \qquad \rho = \|x\|,

  with :math:`I_0` the modified Bessel function of the first kind.

References:
    Grathwohl et al., "FFJORD: Free-form Continuous Dynamics for Scalable Reversible
    Generative Models", ICLR 2019.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from flowkit.validation import check_int, check_width, nonfinite_rows

Box = tuple[float, float, float, float]
"""``(xmin, xmax, ymin, ymax)``, the order of matplotlib's ``extent``."""

TOY_DATASETS: tuple[str, ...] = (
    "moons",
    "circles",
    "8gaussians",
    "pinwheel",
    "2spirals",
    "checkerboard",
    "rings",
    "swissroll",
)
TOY_BOX: Box = (-4.0, 4.0, -4.0, 4.0)
"""A plotting box that holds (almost) all the mass of every toy dataset."""

# Quadrature box for the entropies: every density is below exp(-40) times its peak on its edge.
_QUADRATURE_BOX: Box = (-6.0, 6.0, -6.0, 6.0)

# 8gaussians: FFJORD's centres at radius 4 and std 0.5, divided by 1.414 (here sqrt(2)).
_GAUSS_RADIUS = 2.0 * math.sqrt(2.0)
_GAUSS_STD = math.sqrt(2.0) / 4.0
# Ring mixtures: (radii, noise std), each ring with the same weight.
_RINGS: dict[str, tuple[tuple[float, ...], float]] = {
    "circles": ((3.0, 1.5), 0.24),
    "rings": ((0.75, 1.5, 2.25, 3.0), 0.08),
}


@dataclass(frozen=True)
class _Draw:
    """Draws random tensors with one generator, device and dtype."""

    generator: torch.Generator | None
    device: torch.device
    dtype: torch.dtype

    def uniform(self, n: int) -> Tensor:
        """``(n,)`` samples of U[0, 1)."""
        return torch.rand(n, generator=self.generator, device=self.device, dtype=self.dtype)

    def normal(self, *shape: int) -> Tensor:
        """Standard normal samples of the given shape."""
        return torch.randn(shape, generator=self.generator, device=self.device, dtype=self.dtype)

    def integers(self, high: int, n: int) -> Tensor:
        """``(n,)`` integers uniform in ``{0, ..., high - 1}``, in ``dtype``."""
        k = torch.randint(high, (n,), generator=self.generator, device=self.device)
        return k.to(self.dtype)


def _polar(radius: Tensor, angle: Tensor) -> Tensor:
    return torch.stack((radius * torch.cos(angle), radius * torch.sin(angle)), dim=-1)


def _constants(values: tuple[float, ...], like: Tensor) -> Tensor:
    """``(len(values),)`` tensor of ``values`` with ``like``'s dtype and device, filled on the
    device: ``torch.tensor(values, device=...)`` copies from the host, which on CUDA waits for
    the device to finish its queued work."""
    return torch.stack([like.new_full((), value) for value in values])


def _moons(n: int, d: _Draw) -> Tensor:
    # sklearn's make_moons(noise=0.1), then FFJORD's 2 x + (-1, -0.2).
    t = math.pi * d.uniform(n)
    lower = d.integers(2, n) > 0
    cos, sin = torch.cos(t), torch.sin(t)
    x = torch.stack((torch.where(lower, 1.0 - cos, cos), torch.where(lower, 0.5 - sin, sin)), -1)
    x = x + 0.1 * d.normal(n, 2)
    return torch.stack((2.0 * x[:, 0] - 1.0, 2.0 * x[:, 1] - 0.2), dim=-1)


def _ring_mixture(name: str) -> Callable[[int, _Draw], Tensor]:
    radii, std = _RINGS[name]

    def sample(n: int, d: _Draw) -> Tensor:
        which = d.integers(len(radii), n)
        radius = _constants(radii, which)[which.long()]
        return _polar(radius, 2.0 * math.pi * d.uniform(n)) + std * d.normal(n, 2)

    return sample


def _eight_gaussians(n: int, d: _Draw) -> Tensor:
    angle = d.integers(8, n) * (math.pi / 4.0)
    return _polar(torch.full_like(angle, _GAUSS_RADIUS), angle) + _GAUSS_STD * d.normal(n, 2)


def _pinwheel(n: int, d: _Draw) -> Tensor:
    # Five arms: radial N(1, 0.3^2), tangential N(0, 0.1^2), rotated by an angle that grows
    # with the radial coordinate (rate 0.25), then scaled by 2; FFJORD's orientation.
    r = 1.0 + 0.3 * d.normal(n)
    t = 0.1 * d.normal(n)
    angle = d.integers(5, n) * (2.0 * math.pi / 5.0) + 0.25 * torch.exp(r)
    cos, sin = torch.cos(angle), torch.sin(angle)
    return 2.0 * torch.stack((r * cos + t * sin, t * cos - r * sin), dim=-1)


def _two_spirals(n: int, d: _Draw) -> Tensor:
    s = torch.sqrt(d.uniform(n)) * (3.0 * math.pi)  # angle along the spiral, up to 540 degrees
    x = torch.stack((-torch.cos(s) * s, torch.sin(s) * s), dim=-1)
    x = x + 0.5 * d.uniform(2 * n).view(n, 2)
    sign = 2.0 * d.integers(2, n) - 1.0  # which of the two spirals
    return sign[:, None] * x / 3.0 + 0.1 * d.normal(n, 2)


def _checkerboard(n: int, d: _Draw) -> Tensor:
    # Dark squares: cells (i, j) of side 2 with i + j even, for i, j in {-2, -1, 0, 1}.
    col = d.integers(4, n) - 2.0
    row = 2.0 * d.integers(2, n) - 2.0 + torch.remainder(col, 2.0)
    corner = 2.0 * torch.stack((col, row), dim=-1)
    x = corner + 2.0 * d.uniform(2 * n).view(n, 2)
    # corner + 2u rounds up to the square's far edge (off the support) when u is within
    # rounding of 1, e.g. for u = 1 - 2^-24 in float32: keep it on the near side.
    return torch.minimum(x, torch.nextafter(corner + 2.0, corner))


def _swissroll(n: int, d: _Draw) -> Tensor:
    # sklearn's make_swiss_roll(noise=1.0) projected on its (x, z) plane, divided by 5.
    t = 1.5 * math.pi * (1.0 + 2.0 * d.uniform(n))
    return _polar(t, t) / 5.0 + 0.2 * d.normal(n, 2)


_SAMPLERS: dict[str, Callable[[int, _Draw], Tensor]] = {
    "moons": _moons,
    "circles": _ring_mixture("circles"),
    "8gaussians": _eight_gaussians,
    "pinwheel": _pinwheel,
    "2spirals": _two_spirals,
    "checkerboard": _checkerboard,
    "rings": _ring_mixture("rings"),
    "swissroll": _swissroll,
}


def _check_name(name: str) -> None:
    if name not in TOY_DATASETS:
        raise ValueError(f"'name' should be one of {', '.join(TOY_DATASETS)}; got {name!r}")


def sample_toy(
    name: str,
    n: int,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Draw ``n`` samples of a toy dataset, directly on ``device``.

    Args:
        name: one of :data:`TOY_DATASETS`.
        n: number of samples, positive.
        seed: seeds a fresh generator on ``device``; the same seed gives the same samples on
            the same kind of device (CPU and CUDA streams differ).
        generator: a generator to draw from instead (its state advances). At most one of
            ``seed`` and ``generator``; with neither, torch's global generator is used.
        device: where the samples are made; defaults to the generator's device, else the CPU.
        dtype: a floating dtype.

    Returns:
        Samples of shape ``(n, 2)``.

    Example:
        >>> sample_toy("8gaussians", 5, seed=0).shape
        torch.Size([5, 2])
    """
    _check_name(name)
    n = check_int("n", n, 1)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"'dtype' should be a floating torch.dtype, got {dtype!r}")
    if seed is not None:
        seed = check_int("seed", seed, 0)  # as every seed of flowkit's
    if seed is not None and generator is not None:
        raise ValueError("pass at most one of 'seed' and 'generator'")
    if device is None:
        device = generator.device if generator is not None else torch.device("cpu")
    device = torch.device(device)
    if device.type == "meta":
        raise ValueError("'device' is 'meta', which holds no values: samples need a real device")
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    if generator is not None and generator.device.type != device.type:
        raise ValueError(f"'generator' is on {generator.device} but 'device' is {device}")
    return _SAMPLERS[name](n, _Draw(generator, device, dtype))


# ----------------------------------------------------------------------------- exact densities


def _eight_gaussians_log_prob(x: Tensor) -> Tensor:
    angle = torch.arange(8, dtype=x.dtype, device=x.device) * (math.pi / 4.0)
    centres = _polar(torch.full_like(angle, _GAUSS_RADIUS), angle)  # (8, 2)
    sq = (x[:, None, :] - centres).square().sum(-1)  # (n, 8)
    var = _GAUSS_STD**2
    return torch.logsumexp(-sq / (2 * var), dim=1) - math.log(8 * 2 * math.pi * var)


def _checkerboard_log_prob(x: Tensor) -> Tensor:
    cell = torch.floor(x / 2.0)
    inside = ((x >= -4.0) & (x < 4.0)).all(dim=1) & (torch.remainder(cell.sum(1), 2.0) == 0)
    return x.new_full(inside.shape, -math.log(32.0)).masked_fill(~inside, -math.inf)


def _ring_log_prob(name: str) -> Callable[[Tensor], Tensor]:
    radii, std = _RINGS[name]
    var = std**2

    def log_prob(x: Tensor) -> Tensor:
        r = _constants(radii, x)
        rho = torch.linalg.vector_norm(x, dim=1, keepdim=True)  # (n, 1)
        # exp(-(rho^2 + r^2) / 2v) I0(rho r / v) = exp(-(rho - r)^2 / 2v) i0e(rho r / v)
        log_ring = -(rho - r).square() / (2 * var) + torch.log(torch.special.i0e(rho * r / var))
        return torch.logsumexp(log_ring, dim=1) - math.log(len(radii) * 2 * math.pi * var)

    return log_prob


_LOG_PROBS: dict[str, Callable[[Tensor], Tensor]] = {
    "8gaussians": _eight_gaussians_log_prob,
    "checkerboard": _checkerboard_log_prob,
    "circles": _ring_log_prob("circles"),
    "rings": _ring_log_prob("rings"),
}


def has_exact_density(name: str) -> bool:
    """Whether :func:`toy_log_prob` and :func:`toy_entropy` support ``name``."""
    _check_name(name)
    return name in _LOG_PROBS


def _check_exact(name: str) -> None:
    if not has_exact_density(name):
        raise ValueError(
            f"no exact density for {name!r}; available for {', '.join(sorted(_LOG_PROBS))}"
        )


def toy_log_prob(name: str, x: Tensor) -> Tensor:
    """Exact log-density of a toy dataset (see the module docstring for the formulas).

    Args:
        name: a dataset with :func:`has_exact_density`.
        x: points of shape ``(n, 2)``, any floating dtype and device.

    Returns:
        ``log p(x)`` of shape ``(n,)``; ``-inf`` off the support (checkerboard).
    """
    _check_exact(name)
    x = check_points("x", x)
    nonfinite_rows("x", x)  # NaN is an error; an infinite point is off the support
    return _LOG_PROBS[name](x)


def check_points(name: str, value: object) -> Tensor:
    """Check that argument ``name`` holds points of the plane: a tensor of shape ``(N, 2)``
    (:func:`~flowkit.validation.check_width`), floating."""
    value = check_width(name, value, 2)
    if not value.dtype.is_floating_point:
        raise ValueError(f"'{name}' should have a floating dtype, got {value.dtype}")
    return value


def box_grid(
    box: Box,
    resolution: int,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> tuple[Tensor, float]:
    """Midpoints of a ``resolution x resolution`` grid of cells over ``box``.

    With ``values = f(points)`` of shape ``(resolution**2,)``, ``values.sum() * area`` is the
    midpoint rule for the integral of ``f`` over the box, and
    ``values.view(resolution, resolution)`` is an image with ``y`` along the rows, ready for
    ``imshow(..., origin="lower", extent=box)``.

    Returns:
        ``points`` of shape ``(resolution**2, 2)`` with ``x`` varying fastest, and the area of
        one cell.
    """
    xmin, xmax, ymin, ymax = box
    if not (xmin < xmax and ymin < ymax):
        raise ValueError(f"'box' should be (xmin, xmax, ymin, ymax) with min < max, got {box}")
    resolution = check_int("resolution", resolution, 1)
    hx, hy = (xmax - xmin) / resolution, (ymax - ymin) / resolution
    steps = torch.arange(resolution, dtype=dtype, device=device) + 0.5
    ys, xs = torch.meshgrid(ymin + hy * steps, xmin + hx * steps, indexing="ij")
    return torch.stack((xs.reshape(-1), ys.reshape(-1)), dim=1), hx * hy


@lru_cache
def toy_entropy(name: str, resolution: int = 600) -> float:
    r"""Differential entropy :math:`H = -\int p \log p` in nats, of a dataset with an exact
    density.

    ``checkerboard`` is closed form, :math:`\log 32`. The others have no closed form: they use
    the midpoint rule in float64 on a ``resolution x resolution`` grid over ``[-6, 6]^2``. Their
    densities are smooth and below :math:`e^{-40}` times their peak at the edge of that box, so
    the rule converges exponentially fast in ``resolution``; at the default (cells of 0.02,
    against noise scales of 0.08 and more) it is exact to float64 rounding, which
    ``tests/test_data_toy.py`` checks by comparing with half the resolution.
    """
    _check_exact(name)
    if name == "checkerboard":
        return math.log(32.0)
    points, area = box_grid(_QUADRATURE_BOX, resolution)
    log_p = _LOG_PROBS[name](points)
    return float(-(log_p.exp() * log_p).sum() * area)
