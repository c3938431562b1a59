"""Tests of flowkit.data.toy: sampling contract, and the exact densities and entropies."""

from __future__ import annotations

import math

import pytest
import torch

from flowkit.data import toy
from flowkit.data.toy import (
    TOY_BOX,
    TOY_DATASETS,
    box_grid,
    has_exact_density,
    sample_toy,
    toy_entropy,
    toy_log_prob,
)

EXACT = [name for name in TOY_DATASETS if has_exact_density(name)]


def test_exact_density_registry():
    assert set(EXACT) == {"8gaussians", "checkerboard", "circles", "rings"}


# ----------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("name", TOY_DATASETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shape_dtype_device(name, dtype):
    x = sample_toy(name, 257, seed=0, dtype=dtype)
    assert x.shape == (257, 2)
    assert x.dtype == dtype
    assert x.device.type == "cpu"
    assert torch.isfinite(x).all()


@pytest.mark.parametrize("name", TOY_DATASETS)
def test_single_sample(name):
    x = sample_toy(name, 1, seed=0)
    assert x.shape == (1, 2) and torch.isfinite(x).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_checkerboard_stays_on_its_support_when_uniforms_round_up(monkeypatch, dtype):
    # The largest uniform below 1: corner + 2u rounds to the square's far edge in float32.
    top = 1.0 - torch.finfo(dtype).eps / 2

    def uniform(draw, n):
        return torch.full((n,), top, dtype=draw.dtype, device=draw.device)

    monkeypatch.setattr(toy._Draw, "uniform", uniform)
    x = sample_toy("checkerboard", 1000, seed=0, dtype=dtype)
    assert torch.isfinite(toy_log_prob("checkerboard", x)).all()
    assert (x < 4.0).all()


@pytest.mark.parametrize("name", TOY_DATASETS)
def test_scaled_to_box(name):
    x = sample_toy(name, 20_000, seed=1)
    xmin, xmax, ymin, ymax = TOY_BOX
    inside = (x[:, 0] >= xmin) & (x[:, 0] <= xmax) & (x[:, 1] >= ymin) & (x[:, 1] <= ymax)
    assert inside.float().mean() > 0.999
    assert x.abs().max() > 2.5  # uses the box, not a corner of it


@pytest.mark.parametrize("name", TOY_DATASETS)
def test_seeding(name):
    a = sample_toy(name, 100, seed=3)
    assert torch.equal(a, sample_toy(name, 100, seed=3))
    assert not torch.equal(a, sample_toy(name, 100, seed=4))
    assert torch.equal(a, sample_toy(name, 100, generator=torch.Generator().manual_seed(3)))


def test_generator_advances():
    g = torch.Generator().manual_seed(0)
    first = sample_toy("moons", 50, generator=g)
    assert not torch.equal(first, sample_toy("moons", 50, generator=g))


def test_global_generator():
    torch.manual_seed(5)
    a = sample_toy("rings", 10)
    torch.manual_seed(5)
    assert torch.equal(a, sample_toy("rings", 10))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", TOY_DATASETS)
def test_cuda(name):
    x = sample_toy(name, 64, seed=0, device="cuda")
    assert x.device.type == "cuda"
    assert torch.equal(x, sample_toy(name, 64, seed=0, device="cuda"))
    g = torch.Generator(device="cuda").manual_seed(0)
    assert torch.equal(x, sample_toy(name, 64, generator=g))  # device taken from the generator
    if has_exact_density(name):
        assert toy_log_prob(name, x).device.type == "cuda"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", TOY_DATASETS)
def test_cuda_without_host_sync(name):
    # A training loop draws a batch per step: no copy from the host (which synchronises).
    g = torch.Generator(device="cuda").manual_seed(0)
    sample_toy(name, 8, generator=g)  # warm-up: lazy CUDA initialisation may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        x = sample_toy(name, 64, generator=g)
        if has_exact_density(name):
            toy_log_prob(name, x)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "spiral", "n": 5}, "moons, circles, 8gaussians"),
        ({"name": "moons", "n": 0}, "'n' should be >= 1, got 0"),
        ({"name": "moons", "n": -3}, "'n' should be >= 1, got -3"),
        ({"name": "moons", "n": 2.0}, "'n' should be an integer >= 1, got 2.0"),
        ({"name": "moons", "n": 5, "dtype": torch.int64}, "floating torch.dtype"),
        ({"name": "moons", "n": 5, "dtype": "float32"}, "'dtype' should be a floating"),
        ({"name": "moons", "n": 5, "seed": 1.5}, "'seed' should be an integer >= 0, got 1.5"),
        ({"name": "moons", "n": 5, "seed": -1}, "'seed' should be >= 0, got -1"),
        ({"name": "moons", "n": 5, "device": "meta"}, "'device' is 'meta'"),
        ({"name": "moons", "n": 5, "seed": 0, "generator": torch.Generator()}, "at most one"),
    ],
)
def test_sample_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sample_toy(**kwargs)


def test_density_errors():
    with pytest.raises(ValueError, match="no exact density for 'moons'; available for 8gaussians"):
        toy_log_prob("moons", torch.zeros(3, 2))
    with pytest.raises(ValueError, match="no exact density"):
        toy_entropy("pinwheel")
    with pytest.raises(ValueError, match="'name' should be one of"):
        has_exact_density("nope")
    with pytest.raises(ValueError, match=r"'x' should have shape \(N, 2\), got \(3, 3\)"):
        toy_log_prob("8gaussians", torch.zeros(3, 3))
    with pytest.raises(TypeError, match=r"'x' should be a torch.Tensor of shape \(N, 2\), got "
                       "list"):
        toy_log_prob("8gaussians", [[0.0, 1.0]])
    with pytest.raises(ValueError, match="'x' should have a floating dtype, got torch.int64"):
        toy_log_prob("checkerboard", torch.zeros(3, 2, dtype=torch.int64))


# ----------------------------------------------------------------------------- exact densities


def test_box_grid():
    points, area = box_grid((0.0, 2.0, -1.0, 1.0), 4)
    assert points.shape == (16, 2) and area == pytest.approx(0.25)
    assert points[:4, 0].tolist() == [0.25, 0.75, 1.25, 1.75]  # x varies fastest
    assert points[::4, 1].tolist() == [-0.75, -0.25, 0.25, 0.75]
    with pytest.raises(ValueError, match="'box'"):
        box_grid((1.0, 0.0, 0.0, 1.0), 4)
    for resolution in (0, 2.5):
        with pytest.raises(ValueError, match="'resolution' should be"):
            box_grid((0.0, 1.0, 0.0, 1.0), resolution)


@pytest.mark.parametrize("name", EXACT)
def test_log_prob_integrates_to_one(name):
    # Cells of 0.02, so cell edges fall on the checkerboard's square edges.
    points, area = box_grid((-6.0, 6.0, -6.0, 6.0), 600)
    mass = toy_log_prob(name, points).exp().sum() * area
    assert mass.item() == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("name", EXACT)
def test_histogram_matches_density(name):
    # 16 x 16 bins of side 0.5 on [-4, 4]^2 (aligned with the checkerboard squares); each bin's
    # probability by a 16 x 16 midpoint rule inside it. Every bin count within 5 binomial
    # standard deviations (+1 so that empty bins must hold no sample at all).
    n, bins, sub = 100_000, 16, 16
    x = sample_toy(name, n, seed=0, dtype=torch.float64)
    idx = torch.floor((x + 4.0) / 0.5).long()
    keep = ((idx >= 0) & (idx < bins)).all(dim=1)
    counts = torch.bincount(idx[keep, 1] * bins + idx[keep, 0], minlength=bins * bins)
    points, area = box_grid(TOY_BOX, bins * sub)
    density = toy_log_prob(name, points).exp().view(bins, sub, bins, sub)
    probs = density.sum(dim=(1, 3)).reshape(-1) * area
    z = (counts - n * probs).abs() / torch.sqrt(n * probs * (1 - probs) + 1.0)
    assert z.max() < 5.0


@pytest.mark.parametrize("name", EXACT)
def test_entropy_matches_samples(name):
    n = 100_000
    log_p = toy_log_prob(name, sample_toy(name, n, seed=2, dtype=torch.float64))
    stderr = log_p.std().item() / math.sqrt(n)
    assert -log_p.mean().item() == pytest.approx(toy_entropy(name), abs=4 * stderr + 1e-12)


@pytest.mark.parametrize("name", ["8gaussians", "circles", "rings"])
def test_entropy_quadrature_converged(name):
    assert toy_entropy(name, 300) == pytest.approx(toy_entropy(name), abs=1e-8)


def test_entropy_values():
    assert toy_entropy("checkerboard") == pytest.approx(math.log(32.0), abs=1e-12)
    # Eight Gaussians 6 std apart barely overlap: just below log 8 + log(2 pi e sigma^2).
    bound = math.log(8) + 1 + math.log(2 * math.pi * 0.125)
    assert bound - 0.01 < toy_entropy("8gaussians") < bound
