r"""The four 2-D energy functions of Rezende & Mohamed (2015), Table 1.

Unnormalised target densities :math:`\tilde p(z) = e^{-U(z)}` for fitting a flow by reverse KL,
with :math:`z = (z_1, z_2)` and

.. math::
    w_1(z) &= \sin(2\pi z_1 / 4), \quad
    w_2(z) = 3 \exp\big(-\tfrac12 ((z_1 - 1)/0.6)^2\big), \quad
    w_3(z) = 3\,\sigma\big((z_1 - 1)/0.3\big), \\
    U_1(z) &= \tfrac12 \big((\|z\| - 2)/0.4\big)^2
        - \log\big(e^{-\frac12 ((z_1 - 2)/0.6)^2} + e^{-\frac12 ((z_1 + 2)/0.6)^2}\big), \\
    U_2(z) &= \tfrac12 \big((z_2 - w_1)/0.4\big)^2, \\
    U_3(z) &= -\log\big(e^{-\frac12 ((z_2 - w_1)/0.35)^2}
        + e^{-\frac12 ((z_2 - w_1 + w_2)/0.35)^2}\big), \\
    U_4(z) &= -\log\big(e^{-\frac12 ((z_2 - w_1)/0.4)^2}
        + e^{-\frac12 ((z_2 - w_1 + w_3)/0.35)^2}\big),

where :math:`\sigma` is the logistic sigmoid. The ``-log(e^a + e^b)`` terms are computed as
``-logaddexp(a, b)``, finite everywhere.

Support. :math:`U_1` decays in every direction, so :math:`\int_{\mathbb R^2} e^{-U_1}` is
finite. :math:`U_2, U_3, U_4` do not depend on :math:`z_1` except through bounded periodic or
saturating terms, so :math:`e^{-U}` has infinite mass over :math:`\mathbb R^2`; like the paper's
figures, we take their target to be :math:`e^{-U}` restricted to :math:`z_1 \in [-4, 4]`.
:data:`ENERGY_BOXES` holds one box per energy: the paper's ``[-4, 4]^2`` except that
:math:`U_4`'s box reaches down to :math:`z_2 = -6`, because its lower branch is centred at
:math:`w_1 - w_3 \approx -4` near :math:`z_1 = 3`. Along every edge where the density is not
truncated, :math:`e^{-U}` is below :math:`10^{-6}` times its peak (checked in the tests).
:func:`energy_log_normalizer` integrates over that box. For :math:`U_2`--:math:`U_4` a flow's
samples outside the box are outside the target's support, so
:math:`E_q[\log q + U] + \log Z` is the reverse KL only for flows that stay inside the box.

References:
    Rezende & Mohamed, "Variational Inference with Normalizing Flows", ICML 2015.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch
from torch import Tensor

from flowkit.data.toy import Box, box_grid, check_points

ENERGIES: tuple[str, ...] = ("U1", "U2", "U3", "U4")
ENERGY_BOXES: dict[str, Box] = {
    "U1": (-4.0, 4.0, -4.0, 4.0),
    "U2": (-4.0, 4.0, -4.0, 4.0),
    "U3": (-4.0, 4.0, -4.0, 4.0),
    "U4": (-4.0, 4.0, -6.0, 4.0),
}
"""Per energy, ``(z1min, z1max, z2min, z2max)``: the support used for ``log Z`` and a plotting
box (matplotlib ``extent`` order)."""


def _w1(z1: Tensor) -> Tensor:
    return torch.sin(0.5 * math.pi * z1)


def _w2(z1: Tensor) -> Tensor:
    return 3.0 * torch.exp(-0.5 * ((z1 - 1.0) / 0.6).square())


def _w3(z1: Tensor) -> Tensor:
    return 3.0 * torch.sigmoid((z1 - 1.0) / 0.3)


def _gauss(u: Tensor, scale: float) -> Tensor:
    """``-(u / scale)^2 / 2``, the log of an unnormalised Gaussian bump."""
    return -0.5 * (u / scale).square()


def _log_p1(z: Tensor) -> Tensor:
    # vector_norm's gradient at the origin (the ring's cone tip) is 0, hypot's is NaN.
    ring = _gauss(torch.linalg.vector_norm(z, dim=1) - 2.0, 0.4)
    z1 = z[:, 0]
    return ring + torch.logaddexp(_gauss(z1 - 2.0, 0.6), _gauss(z1 + 2.0, 0.6))


def _log_p2(z: Tensor) -> Tensor:
    return _gauss(z[:, 1] - _w1(z[:, 0]), 0.4)


def _log_p3(z: Tensor) -> Tensor:
    u = z[:, 1] - _w1(z[:, 0])
    return torch.logaddexp(_gauss(u, 0.35), _gauss(u + _w2(z[:, 0]), 0.35))


def _log_p4(z: Tensor) -> Tensor:
    u = z[:, 1] - _w1(z[:, 0])
    return torch.logaddexp(_gauss(u, 0.4), _gauss(u + _w3(z[:, 0]), 0.35))


_LOG_DENSITIES: dict[str, Callable[[Tensor], Tensor]] = {
    "U1": _log_p1,
    "U2": _log_p2,
    "U3": _log_p3,
    "U4": _log_p4,
}


def _check_name(name: str) -> None:
    if name not in ENERGIES:
        raise ValueError(f"'name' should be one of {', '.join(ENERGIES)}; got {name!r}")


def energy_log_density(name: str, z: Tensor) -> Tensor:
    r"""Unnormalised log-density :math:`\log \tilde p(z) = -U(z)` (formulas in the module doc).

    Args:
        name: one of :data:`ENERGIES`.
        z: points of shape ``(n, 2)``, any floating dtype and device; differentiable.

    Returns:
        ``-U(z)`` of shape ``(n,)``.

    Example:
        >>> energy_log_density("U2", torch.zeros(1, 2))
        tensor([-0.])
    """
    _check_name(name)
    return _LOG_DENSITIES[name](check_points("z", z))


@lru_cache
def energy_log_normalizer(name: str, resolution: int = 1000) -> float:
    r""":math:`\log Z = \log \int_B e^{-U(z)} dz` over the energy's box :math:`B`
    (:data:`ENERGY_BOXES`), cached.

    Midpoint rule in float64 on a ``resolution x resolution`` grid of cells over the box
    (default: cells of 0.008 x 0.008, or 0.008 x 0.01 for U4), summed with ``logsumexp``. Where
    the box truncates the density (z1 edges of U2--U4) the rule's error is at worst
    :math:`O(h^2)`; there the z1-marginals are nearly flat, and resolutions 250 to 2000 agree
    to 1e-10. ``tests/test_data_energy.py`` checks that 500 and 1000 agree to 1e-3.
    """
    _check_name(name)
    points, area = box_grid(ENERGY_BOXES[name], resolution)
    log_p = _LOG_DENSITIES[name](points)
    return float(torch.logsumexp(log_p, dim=0)) + math.log(area)


WALL = 0.1
"""Length scale of :func:`walled_log_density`'s wall (the default of ``flowkit energy``)."""


def walled_log_density(name: str, z: Tensor, wall: float = WALL) -> Tensor:
    r"""The energy as a target on all of :math:`\mathbb R^2`, for reverse-KL fits (whose
    samples may leave the box, outside the box-truncated target's support):
    :math:`-U(z) - \tfrac12 \sum_i (d_i / \text{wall})^2`, where :math:`d_i \ge 0` is how far
    :math:`z_i` lies outside the energy's box (0 inside); :func:`walled_log_normalizer` is its
    :math:`\log Z`.

    Args:
        name: one of :data:`flowkit.data.ENERGIES`.
        z: ``(N, 2)`` on any device; differentiable.
        wall: length scale of the wall.

    Returns:
        ``(N,)`` unnormalised log-densities.
    """
    xmin, xmax, ymin, ymax = ENERGY_BOXES[name]
    dx = (xmin - z[:, 0]).clamp_min(0.0) + (z[:, 0] - xmax).clamp_min(0.0)
    dy = (ymin - z[:, 1]).clamp_min(0.0) + (z[:, 1] - ymax).clamp_min(0.0)
    return energy_log_density(name, z) - 0.5 * (dx.square() + dy.square()) / wall**2


@lru_cache
def walled_log_normalizer(name: str, wall: float = WALL, resolution: int = 600) -> float:
    r""":math:`\log \int_{\mathbb R^2} e^{\text{walled\_log\_density}(z)} dz`, by the midpoint
    rule in float64 on the box widened by ``8 wall`` on each side (beyond it the wall factor is
    below :math:`e^{-32}`)."""
    xmin, xmax, ymin, ymax = ENERGY_BOXES[name]
    m = 8.0 * wall
    points, area = box_grid((xmin - m, xmax + m, ymin - m, ymax + m), resolution)
    return float(torch.logsumexp(walled_log_density(name, points, wall), dim=0)) + math.log(area)
