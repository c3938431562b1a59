"""Math checks for the rational-quadratic spline transformer (float64 unless stated)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flowkit.transforms.spline import MAX_TAIL_SLOPE, RationalQuadraticSpline

FAST = settings(max_examples=15, deadline=None)


def random_params(
    spline: RationalQuadraticSpline,
    shape: tuple[int, ...],
    seed: int,
    scale: float = 1.0,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    size = (*shape, spline.params_per_feature)
    return scale * torch.randn(size, generator=generator, dtype=dtype)


def probe_points(spline: RationalQuadraticSpline, params: torch.Tensor, seed: int) -> torch.Tensor:
    """``(N, D)`` inputs for shared ``(D, P)`` params: random points inside and outside the
    bound, every x knot (including ``-B`` and ``B``) and points just outside the bound."""
    bound = spline.bound
    generator = torch.Generator().manual_seed(seed)
    features = params.shape[0]
    uniform = torch.rand(64, features, generator=generator, dtype=params.dtype)
    x_knots, _, _ = spline.knots(params)
    edges = torch.tensor(
        [-2 * bound, -bound * (1 + 1e-9), bound * (1 + 1e-9), 2 * bound], dtype=params.dtype
    )
    return torch.cat([(3 * uniform - 1.5) * bound, x_knots.T, edges[:, None].expand(-1, features)])


@st.composite
def cases(draw, max_scale: float = 2.0):
    """A spline, shared params ``(D, P)`` and probe points ``(N, D)``."""
    spline = RationalQuadraticSpline(
        bins=draw(st.integers(2, 12)),
        bound=draw(st.sampled_from([0.5, 1.0, 3.0, 5.0])),
        tails=draw(st.sampled_from(["identity", "linear"])),
        bin_temperature=draw(st.sampled_from([1.0, 8.0])),
    )
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.floats(0.1, max_scale))
    params = random_params(spline, (draw(st.integers(1, 3)),), seed, scale)
    return spline, params, probe_points(spline, params, seed + 1)


@FAST
@given(cases())
def test_round_trip_and_log_dets_cancel(case):
    spline, params, x = case
    z, log_det = spline.forward(x, params)
    x_back, log_det_inverse = spline.inverse(z, params)
    # x is recovered as well as z determines it: the error, in units of eps * B / (dz/dx) (an
    # absolute tolerance fails where a bin is steep and dz/dx small: x then moves by more than
    # z's rounding, 1.6e-10 on one drawn spline)
    eps = torch.finfo(torch.float64).eps
    assert ((x_back - x).abs() * log_det.exp()).max() < 64 * eps * spline.bound
    torch.testing.assert_close(log_det_inverse, -log_det, atol=1e-8, rtol=0)
    z_back, _ = spline.forward(spline.inverse(x, params)[0], params)
    torch.testing.assert_close(z_back, x, atol=1e-10, rtol=0)


@FAST
@given(cases())
def test_log_det_matches_autograd(case):
    spline, params, x = case
    x = x.clone().requires_grad_()
    z, log_det = spline.forward(x, params)
    (derivative,) = torch.autograd.grad(z.sum(), x)
    torch.testing.assert_close(log_det, derivative.log(), atol=1e-10, rtol=1e-10)

    z = z.detach().requires_grad_()
    x_back, log_det_inverse = spline.inverse(z, params)
    (derivative,) = torch.autograd.grad(x_back.sum(), z)
    torch.testing.assert_close(log_det_inverse, derivative.log(), atol=1e-8, rtol=1e-8)


@FAST
@given(cases())
def test_interpolates_knots_with_their_derivatives(case):
    spline, params, _ = case
    x_knots, y_knots, derivatives = spline.knots(params)
    ends = torch.tensor([-spline.bound, spline.bound], dtype=torch.float64)
    assert torch.equal(x_knots[:, [0, -1]], ends.expand(len(params), 2))
    assert torch.equal(y_knots[:, [0, -1]], ends.expand(len(params), 2))
    if spline.tails == "identity":
        ones = torch.ones(len(params), 2, dtype=torch.float64)
        assert torch.equal(derivatives[:, [0, -1]], ones)
    assert (x_knots.diff() > 0).all() and (y_knots.diff() > 0).all() and (derivatives > 0).all()
    z, log_det = spline.forward(x_knots.T, params)
    torch.testing.assert_close(z, y_knots.T, atol=1e-12, rtol=0)
    torch.testing.assert_close(log_det, derivatives.T.log(), atol=1e-10, rtol=0)


@FAST
@given(cases())
def test_continuous_at_the_knots_and_the_bound(case):
    """Approaching every knot (and +-B, where the tails start) from either side gives the
    knot's value and derivative: the bins and the tails join with C^1 continuity."""
    spline, params, _ = case
    x_knots, y_knots, derivatives = spline.knots(params)
    for towards in (-math.inf, math.inf):
        near = torch.nextafter(x_knots.T, torch.tensor(towards, dtype=torch.float64))
        z, log_det = spline.forward(near, params)
        torch.testing.assert_close(z, y_knots.T, atol=1e-10, rtol=0)
        torch.testing.assert_close(log_det, derivatives.T.log(), atol=1e-6, rtol=0)


@FAST
@given(cases(max_scale=5.0))
def test_strictly_monotonic(case):
    spline, params, _ = case
    grid = torch.linspace(-1.5 * spline.bound, 1.5 * spline.bound, 2001, dtype=torch.float64)
    grid = grid[:, None].expand(-1, len(params))
    z, log_det = spline.forward(grid, params)
    assert (z.diff(dim=0) > 0).all()
    assert log_det.isfinite().all()
    x, _ = spline.inverse(grid, params)
    assert (x.diff(dim=0) > 0).all()


@FAST
@given(
    bins=st.integers(2, 12),
    bound=st.floats(0.1, 10.0),
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
)
def test_zero_params_are_the_identity(bins, bound, shape):
    spline = RationalQuadraticSpline(bins=bins, bound=bound)
    params = torch.zeros(*shape, spline.params_per_feature, dtype=torch.float64)
    x_knots, y_knots, derivatives = spline.knots(params)
    uniform = torch.linspace(-bound, bound, bins + 1, dtype=torch.float64).expand_as(x_knots)
    torch.testing.assert_close(x_knots, uniform, atol=1e-14 * bound, rtol=0)
    assert torch.equal(y_knots, x_knots)
    torch.testing.assert_close(derivatives, torch.ones_like(derivatives), atol=1e-15, rtol=0)

    generator = torch.Generator().manual_seed(bins)
    x = 2 * bound * torch.randn(shape, generator=generator, dtype=torch.float64)
    for direction in (spline.forward, spline.inverse):
        z, log_det = direction(x, params)
        torch.testing.assert_close(z, x, atol=1e-14 * bound, rtol=0)
        torch.testing.assert_close(log_det, torch.zeros_like(x), atol=1e-14, rtol=0)


def test_linear_outside_the_bound():
    """Linear tails: the line through (+-B, +-B) with the boundary knot's derivative."""
    spline = RationalQuadraticSpline(bins=6, bound=2.0, tails="linear")
    params = random_params(spline, (50, 3), seed=0, scale=3.0)
    _, _, derivatives = spline.knots(params)
    low, high = derivatives[..., 0], derivatives[..., -1]
    assert not torch.allclose(low, torch.ones_like(low))  # learned, not fixed to 1
    huge = spline.knots(100 * params)[2][..., [0, -1]]  # a tail stretches by at most the bound
    assert huge.max() <= MAX_TAIL_SLOPE and huge.min() >= spline.min_derivative
    above, below = torch.full((50, 3), 7.0, dtype=torch.float64), torch.full((50, 3), -3.0,
                                                                             dtype=torch.float64)
    for x, slope, edge in ((above, high, 2.0), (below, low, -2.0)):
        z, log_det = spline.forward(x, params)
        torch.testing.assert_close(z, edge + slope * (x - edge), atol=1e-12, rtol=0)
        torch.testing.assert_close(log_det, slope.log(), atol=1e-12, rtol=0)
        back, log_det_inverse = spline.inverse(z, params)
        torch.testing.assert_close(back, x, atol=1e-12, rtol=0)
        torch.testing.assert_close(log_det_inverse, -slope.log(), atol=1e-12, rtol=0)


def test_identity_outside_the_bound():
    spline = RationalQuadraticSpline(bins=6, bound=2.0, tails="identity")
    params = random_params(spline, (100, 3), seed=0, scale=3.0)
    generator = torch.Generator().manual_seed(1)
    magnitude = 2.0 + 5.0 * (1 - torch.rand(100, 3, generator=generator, dtype=torch.float64))
    magnitude[0] = math.nextafter(2.0, math.inf)  # the first float past the bound
    sign = torch.randint(0, 2, (100, 3), generator=generator, dtype=torch.float64) * 2 - 1
    x = sign * magnitude
    for direction in (spline.forward, spline.inverse):
        z, log_det = direction(x, params)
        assert torch.equal(z, x)
        assert torch.equal(log_det, torch.zeros_like(x))


def test_gradients_are_finite_everywhere():
    spline = RationalQuadraticSpline(bins=5, bound=1.0)
    raw = random_params(spline, (3,), seed=2, scale=10.0).requires_grad_()
    # Huge inputs would overflow the spline formulas if they were not clamped first.
    huge = torch.tensor([[-1e200], [1e200]], dtype=torch.float64).expand(-1, 3)
    x = torch.cat([probe_points(spline, raw.detach(), seed=3), huge]).requires_grad_()
    z, log_det = spline.forward(x, raw)
    x_back, log_det_inverse = spline.inverse(x, raw)
    loss = (z + log_det).sum() + (x_back + log_det_inverse).sum()
    grad_params, grad_x = torch.autograd.grad(loss, (raw, x))
    assert grad_params.isfinite().all() and grad_x.isfinite().all()

    # With identity tails, params used only by points outside the bound get exactly zero
    # gradient.
    spline = RationalQuadraticSpline(bins=5, bound=1.0, tails="identity")
    far = torch.full((7, 3), 5.0, dtype=torch.float64, requires_grad=True)
    params = random_params(spline, (7, 3), seed=4, scale=10.0).requires_grad_()
    for direction in (spline.forward, spline.inverse):
        out, log_det = direction(far, params)
        (grad_params,) = torch.autograd.grad((out + log_det).sum(), params)
        assert torch.equal(grad_params, torch.zeros_like(grad_params))


@pytest.mark.parametrize("tails", ["identity", "linear"])
@pytest.mark.parametrize("bins", [2, 3, 16])
def test_float32_gradients_are_finite_for_thin_bins_and_flat_knots(bins, tails):
    """In float32 the inverse's discriminant, ``(h delta_{k+1})^2`` at the top of a bin, rounds
    to 0 for a thin bin with a small derivative; its square root's infinite gradient, times the
    0 that the tail's ``where`` passes to the spline branch of a point outside, gave NaN
    parameter gradients (2026-11-26, tenth session: 6 of 320 gradients, 2 bins, raw params of
    scale 3)."""
    spline = RationalQuadraticSpline(bins=bins, bound=3.0, tails=tails)
    params = random_params(spline, (256, 5), seed=11, scale=4.0).float().requires_grad_()
    generator = torch.Generator().manual_seed(12)
    x = (4 * torch.randn(256, 5, generator=generator)).requires_grad_()
    for direction in (spline.forward, spline.inverse):
        out, log_det = direction(x, params)
        grads = torch.autograd.grad((0.3 * out + log_det).sum(), (params, x))
        assert all(g.isfinite().all() for g in grads)


def test_bin_values_are_those_of_the_knots():
    """The forward and inverse gather their bin's knots and derivatives without forming every
    knot; the values are those of :meth:`knots` at the bin that holds each value."""
    for tails in ("identity", "linear"):
        spline = RationalQuadraticSpline(bins=6, bound=2.0, tails=tails)
        params = random_params(spline, (40, 3), seed=13, scale=3.0)
        x_knots, y_knots, derivatives = spline.knots(params)
        value = 2.2 * (2 * torch.rand(40, 3, dtype=torch.float64) - 1)
        value[0] = x_knots[0, :, 3]  # exactly on a knot: the bin to its right
        for along_y, knots in ((False, x_knots), (True, y_knots)):
            clamped = value.clamp(-2.0, 2.0)
            index = (knots[..., 1:-1] <= clamped[..., None]).sum(-1, keepdim=True)
            expected = [t.gather(-1, index + o).squeeze(-1) for t, o in
                        ((x_knots, 0), (x_knots, 1), (y_knots, 0), (y_knots, 1),
                         (derivatives, 0), (derivatives, 1))]
            x_k, w, y_k, h, d_k, d_k1 = spline._bin(clamped, params, along_y)
            torch.testing.assert_close(x_k, expected[0], rtol=0, atol=1e-15)
            torch.testing.assert_close(w, expected[1] - expected[0], rtol=0, atol=1e-15)
            torch.testing.assert_close(y_k, expected[2], rtol=0, atol=1e-15)
            torch.testing.assert_close(h, expected[3] - expected[2], rtol=0, atol=1e-15)
            torch.testing.assert_close(d_k, expected[4], rtol=0, atol=1e-15)
            torch.testing.assert_close(d_k1, expected[5], rtol=0, atol=1e-15)


def test_inverse_is_accurate_for_extreme_params():
    """Steep and flat bins: the root formula must not cancel (the paper's form alone loses
    about three digits here), so ``x`` is recovered as well as ``z`` determines it."""
    spline = RationalQuadraticSpline(bins=8, bound=3.0)
    params = random_params(spline, (2000, 4), seed=9, scale=10.0)
    generator = torch.Generator().manual_seed(10)
    x = 3 * (2 * torch.rand(2000, 4, generator=generator, dtype=torch.float64) - 1)
    z, log_det = spline.forward(x, params)
    x_back, _ = spline.inverse(z, params)
    eps = torch.finfo(torch.float64).eps
    assert ((x_back - x).abs() * log_det.exp()).max() < 64 * eps * spline.bound


@pytest.mark.parametrize("tails", ["identity", "linear"])
@pytest.mark.parametrize("seed", range(3))
def test_pushforward_density_integrates_to_one(seed, tails):
    """``x = inverse(z)`` with ``z ~ N(0, 1)`` has density ``N(forward(x)) |dz/dx|``."""
    spline = RationalQuadraticSpline(bins=8, bound=3.0, tails=tails)
    params = random_params(spline, (1,), seed=seed, scale=1.5)
    # wide enough for tails with slopes down to about 0.2 (softplus of the raw derivatives)
    x = torch.linspace(-60.0, 60.0, 240001, dtype=torch.float64)[:, None]
    z, log_det = spline.forward(x, params)
    log_density = -0.5 * z**2 - 0.5 * math.log(2 * math.pi) + log_det
    total = torch.trapezoid(log_density.exp().squeeze(1), x.squeeze(1))
    assert abs(total.item() - 1.0) < 1e-5


def test_float32_round_trip_is_close_to_round_off():
    spline = RationalQuadraticSpline(bins=8, bound=3.0)
    params = random_params(spline, (2000, 4), seed=5, dtype=torch.float32)
    generator = torch.Generator().manual_seed(6)
    x = 4 * torch.randn(2000, 4, generator=generator)
    z, log_det = spline.forward(x, params)
    x_back, log_det_inverse = spline.inverse(z, params)
    assert z.dtype == log_det.dtype == x_back.dtype == log_det_inverse.dtype == torch.float32
    eps = torch.finfo(torch.float32).eps
    # x is recovered as well as z determines it: the error, in units of eps * B / (dz/dx).
    assert ((x_back - x).abs() * log_det.exp()).max() < 32 * eps * spline.bound
    z_back, _ = spline.forward(x_back, params)
    assert (z_back - z).abs().max() < 32 * eps * spline.bound
    torch.testing.assert_close(log_det_inverse, -log_det, atol=1e-2, rtol=0)


@FAST
@given(
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    features=st.integers(1, 3),
    bins=st.integers(2, 6),
)
def test_shapes_and_broadcasting(batch, features, bins):
    spline = RationalQuadraticSpline(bins=bins, bound=2.0)
    shape = (*batch, features)
    params = random_params(spline, shape, seed=7)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    for direction in (spline.forward, spline.inverse):
        out, log_det = direction(x, params)
        assert out.shape == log_det.shape == shape
        # Params shared over the batch broadcast like an explicit copy.
        shared = params.reshape(-1, features, spline.params_per_feature)[0]
        out, log_det = direction(x, shared)
        expected = direction(x, shared.expand(*shape, -1))
        assert torch.equal(out, expected[0]) and torch.equal(log_det, expected[1])


def test_creates_no_tensor_on_another_device():
    """On the ``meta`` device any tensor made on the CPU inside would raise."""
    spline = RationalQuadraticSpline()
    params = torch.empty(4, 3, spline.params_per_feature, device="meta")
    x = torch.empty(4, 3, device="meta")
    for direction in (spline.forward, spline.inverse):
        out, log_det = direction(x, params)
        assert out.device.type == log_det.device.type == "meta"


def test_repr_shows_every_option():
    spline = RationalQuadraticSpline(bins=5, bound=2.5, min_derivative=1e-2, tails="linear")
    assert spline.params_per_feature == 16
    assert RationalQuadraticSpline(bins=5, tails="identity").params_per_feature == 14
    assert repr(spline) == (
        "RationalQuadraticSpline(bins=5, bound=2.5, min_bin_width=0.001, "
        "min_bin_height=0.001, min_derivative=0.01, tails='linear')"
    )
    assert repr(RationalQuadraticSpline(bins=5, bin_temperature=8)).endswith(
        "tails='linear', bin_temperature=8.0)")


@pytest.mark.parametrize("tails", ["identity", "linear"])
def test_bin_temperature_divides_the_raw_widths_and_heights(tails):
    """T only rescales the raw bin widths and heights: the map of (w, h, d) at temperature T is
    that of (w / T, h / T, d) at 1; the derivatives are not rescaled."""
    hot = RationalQuadraticSpline(bins=6, bound=3.0, tails=tails, bin_temperature=8.0)
    cold = RationalQuadraticSpline(bins=6, bound=3.0, tails=tails)
    params = random_params(hot, (4,), seed=0, scale=5.0)
    cooled = params.clone()
    cooled[..., :12] /= 8.0
    x = probe_points(hot, params, seed=1)
    for direction in ("forward", "inverse"):
        out, log_det = getattr(hot, direction)(x, params)
        expected, expected_log_det = getattr(cold, direction)(x, cooled)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(log_det, expected_log_det, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bins": 1}, "'bins' should be >= 2, got 1"),
        ({"bins": "8"}, "'bins' should be an integer >= 2"),
        ({"bins": 2.5}, "'bins' should be an integer >= 2"),
        ({"bound": 0.0}, "'bound' should be positive"),
        ({"bins": 10, "min_bin_width": 0.1}, r"'min_bin_width' should be in \(0, 1 / bins\)"),
        ({"min_bin_height": 0.0}, r"'min_bin_height' should be in \(0, 1 / bins\)"),
        ({"min_derivative": 1.0}, r"'min_derivative' should be in \(0, 1\)"),
        ({"tails": "gaussian"}, "'tails' should be 'linear' or 'identity', got 'gaussian'"),
        ({"bin_temperature": 0.0}, "'bin_temperature' should be positive"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RationalQuadraticSpline(**kwargs)


def test_wrong_number_of_params():
    spline = RationalQuadraticSpline(bins=4, tails="identity")
    message = r"'params' should have 11 values .*bins=4, tails='identity'"
    with pytest.raises(ValueError, match=message):
        spline.forward(torch.zeros(2, 3), torch.zeros(2, 3, 12))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_computed_in_float32(dtype):
    """bfloat16 cannot resolve the smallest bins near the interval's ends (0.01 against its
    spacing of 0.03 at 5): the spline runs in float32 and returns the caller's dtype."""
    torch.manual_seed(0)
    spline = RationalQuadraticSpline()
    params = 3.0 * torch.randn(4000, 2, spline.params_per_feature)
    x = 3.0 * torch.randn(4000, 2)
    z32, log_det32 = spline.forward(x, params)
    z, log_det = spline.forward(x.to(dtype), params.to(dtype))
    assert z.dtype == log_det.dtype == dtype
    assert torch.isfinite(log_det).all()
    reference = spline.forward(x.to(dtype).float(), params.to(dtype).float())
    torch.testing.assert_close(log_det.float(), reference[1].to(dtype).float())
    back, _ = spline.inverse(z, params.to(dtype))
    assert back.dtype == dtype and torch.isfinite(back).all()
    assert z32.dtype == log_det32.dtype == torch.float32


def test_bins_narrower_than_float32_resolves_are_warned_of_and_files_with_them_load(tmp_path):
    """Review 46: min_bin_width = min_bin_height = 1e-7 gave NaN log-densities of float32
    splines; a BuildWarning when built, none when a file saved with them is loaded."""
    import warnings

    import flowkit
    from flowkit.checkpoint import BuildWarning

    with pytest.warns(BuildWarning, match=r"'min_bin_width' is 1e-07, below 1e-06"):
        flow = flowkit.MAF(2, layers=1, transformer="spline",
                           transformer_kwargs={"min_bin_width": 1e-7})
    flowkit.save_model(flow, tmp_path / "narrow.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flowkit.load_model(tmp_path / "narrow.pt")
