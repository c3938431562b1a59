"""Tests of flowkit.data.energy: the formulas of Rezende & Mohamed (2015), Table 1, and log Z."""

from __future__ import annotations

import math

import pytest
import torch

from flowkit.data.energy import (
    ENERGIES,
    ENERGY_BOXES,
    energy_log_density,
    energy_log_normalizer,
)
from flowkit.data.toy import box_grid


def _paper_u(name: str, z: torch.Tensor) -> torch.Tensor:
    """Table 1 transcribed literally (naive log(exp + exp)), to check the implementation."""
    z1, z2 = z[:, 0], z[:, 1]
    w1 = torch.sin(2 * math.pi * z1 / 4)
    w2 = 3 * torch.exp(-0.5 * ((z1 - 1) / 0.6) ** 2)
    w3 = 3 / (1 + torch.exp(-(z1 - 1) / 0.3))
    if name == "U1":
        return 0.5 * ((torch.sqrt(z1**2 + z2**2) - 2) / 0.4) ** 2 - torch.log(
            torch.exp(-0.5 * ((z1 - 2) / 0.6) ** 2) + torch.exp(-0.5 * ((z1 + 2) / 0.6) ** 2)
        )
    if name == "U2":
        return 0.5 * ((z2 - w1) / 0.4) ** 2
    if name == "U3":
        return -torch.log(
            torch.exp(-0.5 * ((z2 - w1) / 0.35) ** 2)
            + torch.exp(-0.5 * ((z2 - w1 + w2) / 0.35) ** 2)
        )
    return -torch.log(
        torch.exp(-0.5 * ((z2 - w1) / 0.4) ** 2) + torch.exp(-0.5 * ((z2 - w1 + w3) / 0.35) ** 2)
    )


@pytest.mark.parametrize("name", ENERGIES)
def test_matches_paper(name):
    z = torch.rand(1000, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    z = 8 * z - 4
    torch.testing.assert_close(energy_log_density(name, z), -_paper_u(name, z))


@pytest.mark.parametrize("name", ENERGIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shape_dtype_finite_grad(name, dtype):
    z = torch.tensor([[0.0, 0.0], [1.0, -2.0], [60.0, -80.0]], dtype=dtype, requires_grad=True)
    log_p = energy_log_density(name, z)
    assert log_p.shape == (3,) and log_p.dtype == dtype
    assert torch.isfinite(log_p).all()  # far from the modes too (logaddexp, not log(exp + exp))
    (grad,) = torch.autograd.grad(log_p.sum(), z)
    assert torch.isfinite(grad).all()


def test_known_values():
    assert energy_log_density("U2", torch.tensor([[1.0, 1.0]])).item() == pytest.approx(0.0)
    # On U1's ring at a mode, U1 = -log(1 + exp(-0.5 * (4 / 0.6)^2)).
    expected = math.log1p(math.exp(-0.5 * (4 / 0.6) ** 2))
    assert energy_log_density("U1", torch.tensor([[2.0, 0.0]])).item() == pytest.approx(expected)


def test_errors():
    with pytest.raises(ValueError, match="'name' should be one of U1, U2, U3, U4; got 'U5'"):
        energy_log_density("U5", torch.zeros(2, 2))
    with pytest.raises(ValueError, match="'name' should be one of"):
        energy_log_normalizer("u1")
    with pytest.raises(ValueError, match=r"'z' should have shape \(N, 2\), got \(2,\)"):
        energy_log_density("U1", torch.zeros(2))
    with pytest.raises(ValueError, match="'z' should have a floating dtype, got torch.int64"):
        energy_log_density("U2", torch.zeros(2, 2, dtype=torch.int64))


@pytest.mark.parametrize("name", ENERGIES)
def test_log_normalizer_converged(name):
    assert energy_log_normalizer(name, 500) == pytest.approx(energy_log_normalizer(name), abs=1e-3)


@pytest.mark.parametrize("name", ENERGIES)
def test_box_covers_the_mass(name):
    # Edges where the box does not truncate the target (all of U1's; the z2 edges of U2-U4):
    # the density there is negligible, and widening the box there leaves log Z unchanged.
    xmin, xmax, ymin, ymax = ENERGY_BOXES[name]
    points, _ = box_grid(ENERGY_BOXES[name], 400)
    log_p = energy_log_density(name, points).view(400, 400)  # rows: z2, columns: z1
    edges = [log_p[0], log_p[-1]] + ([log_p[:, 0], log_p[:, -1]] if name == "U1" else [])
    assert max(edge.max().item() for edge in edges) < log_p.max().item() + math.log(1e-6)

    pad = 2.0
    wider = (xmin - pad, xmax + pad) if name == "U1" else (xmin, xmax)
    points, area = box_grid((*wider, ymin - pad, ymax + pad), 1000)
    log_z = torch.logsumexp(energy_log_density(name, points), 0).item() + math.log(area)
    assert log_z == pytest.approx(energy_log_normalizer(name), abs=1e-6)


def test_log_normalizer_u2_closed_form():
    # Each z1 slice of exp(-U2) is a whole Gaussian bump in z2: Z = 8 * 0.4 * sqrt(2 pi).
    assert energy_log_normalizer("U2") == pytest.approx(math.log(8 * 0.4 * math.sqrt(2 * math.pi)))


def test_log_normalizer_cached():
    energy_log_normalizer("U3")
    hits = energy_log_normalizer.cache_info().hits
    energy_log_normalizer("U3")
    assert energy_log_normalizer.cache_info().hits == hits + 1
