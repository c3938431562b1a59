"""Every transform: exact log-determinants, inverses, and gradients (float64)."""

import math
import pickle

import pytest
import torch

import flowkit
from flowkit import MADE, MAF
from flowkit.testing import check_transform, jacobian
from flowkit.transforms import (
    Affine,
    BatchNorm,
    Compose,
    Inverse,
    Logit,
    LULinear,
    MaskedAffineAutoregressive,
    MaskedAutoregressive,
    Permutation,
    Standardize,
    TorchBijection,
    Transform,
)
from flowkit.transforms.elementwise import make_transformer

D, C = 4, 3


def perturbed(layer):
    with torch.no_grad():  # leave the identity: random, non-trivial parameters
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return layer


def autoregressive(direction, transformer, context=0, **made_kwargs):
    tau = make_transformer(transformer)
    made = MADE(D, (24, 24), tau.params_per_feature, context_features=context, **made_kwargs)
    return perturbed(MaskedAutoregressive(made, tau, direction))


def autoregressive_form(direction, context=0):
    """The affine transformer with the shift outside the scale (``form="scale-shift"``)."""
    tau = make_transformer("affine", form="scale-shift")
    made = MADE(D, (24, 24), 2, context_features=context, order="random", seed=3)
    return perturbed(MaskedAutoregressive(made, tau, direction))


def masked_affine(direction):
    made = MADE(D, (24, 24), 2, context_features=C, order="random", seed=2)
    return perturbed(MaskedAffineAutoregressive(made, direction, log_scale_bound=2.0))


def batch_norm():
    bn = BatchNorm(D)
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.log_gamma.normal_(0, 0.3)
        bn.beta.normal_()
    return bn.eval()


TRANSFORMS = {
    "maf-affine": lambda: autoregressive("maf", "affine"),
    "iaf-affine": lambda: autoregressive("iaf", "affine"),
    "maf-spline": lambda: autoregressive("maf", "spline"),
    "iaf-spline": lambda: autoregressive("iaf", "spline"),
    "maf-affine-random-order": lambda: autoregressive("maf", "affine", order="random", seed=4),
    "maf-affine-scale-shift": lambda: autoregressive_form("maf"),
    "iaf-affine-scale-shift-context": lambda: autoregressive_form("iaf", context=C),
    "iaf-spline-residual": lambda: autoregressive("iaf", "spline", residual=True, seed=1),
    "maf-affine-context": lambda: autoregressive("maf", "affine", context=C),
    "iaf-spline-context": lambda: autoregressive("iaf", "spline", context=C),
    "masked-affine-maf": lambda: masked_affine("maf"),
    "masked-affine-iaf": lambda: masked_affine("iaf"),
    "batch-norm": batch_norm,
    "permutation-reverse": lambda: Permutation.reverse(D),
    "permutation-random": lambda: Permutation.random(D, seed=1),
    "lu-linear": lambda: perturbed(LULinear(D)),
    "logit": lambda: Logit(-12.0 - torch.rand(D), 10.0 + torch.rand(D)),  # holds 2 * randn
    # each kind of interval: a box, half-lines above and below, the whole line
    "logit-half-lines": lambda: Logit(
        torch.tensor([-12.0, -11.0, -math.inf, -math.inf, -13.0])[:D],
        torch.tensor([10.0, math.inf, 11.0, math.inf, math.inf])[:D],
    ),
    "standardize": lambda: Standardize(D, shift=torch.randn(D), scale=torch.rand(D) + 0.1),
    "standardize-from-data": lambda: Standardize.from_data(torch.randn(50, D) * 30.0 + 7.0),
    "standardize-full": lambda: Standardize.from_data(
        torch.randn(50, D) @ torch.randn(D, D) * 30.0 + 7.0, covariance="full"
    ),
    "inverse": lambda: Inverse(autoregressive("maf", "affine")),
    "compose": lambda: Compose(
        [Standardize(D, shift=torch.randn(D), scale=torch.rand(D) + 0.1),
         autoregressive("maf", "spline", context=C), batch_norm(), Permutation.reverse(D),
         perturbed(LULinear(D)), autoregressive("iaf", "affine", context=C)]
    ),
}


def make(name):
    torch.manual_seed(0)
    return TRANSFORMS[name]().double()


def inputs(transform, n=6):
    x = 2 * torch.randn(n, D, dtype=torch.float64)
    c = torch.randn(n, C, dtype=torch.float64) if transform.context_features else None
    return x, c


@pytest.mark.parametrize("name", TRANSFORMS)
def test_inverse_round_trip_and_log_dets_cancel(name):
    t = make(name)
    x, c = inputs(t)
    z, log_det = t(x, c)
    x2, log_det_inv = t.inverse(z, c)
    assert z.shape == x.shape and log_det.shape == (x.shape[0],)
    assert torch.allclose(x2, x, atol=1e-10, rtol=0)
    assert torch.allclose(log_det + log_det_inv, torch.zeros_like(log_det), atol=1e-10)


@pytest.mark.parametrize("name", TRANSFORMS)
def test_log_det_matches_autograd_jacobian(name):
    t = make(name)
    x, c = inputs(t, n=4)
    for i in range(x.shape[0]):
        ci = None if c is None else c[i : i + 1]
        jac = jacobian(lambda row, ci=ci: t(row[None], ci)[0][0], x[i : i + 1])[0]
        _, expected = torch.linalg.slogdet(jac)
        _, log_det = t(x[i : i + 1], ci)
        assert torch.allclose(log_det[0], expected, atol=1e-10), (log_det, expected)
        jac_inv = jacobian(lambda row, ci=ci: t.inverse(row[None], ci)[0][0], x[i : i + 1])[0]
        _, expected_inv = torch.linalg.slogdet(jac_inv)
        assert torch.allclose(t.inverse(x[i : i + 1], ci)[1][0], expected_inv, atol=1e-10)


@pytest.mark.parametrize(
    "name",
    [n for n in TRANSFORMS if n.split("-")[0] not in ("permutation", "standardize", "logit")],
)
def test_gradients_reach_every_parameter(name):
    t = make(name)
    x, c = inputs(t)
    z, log_det = t(x, c)
    (z.square().sum() + log_det.sum()).backward()
    for pname, p in t.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("transformer", ["affine", "spline"])
@pytest.mark.parametrize("direction", ["maf", "iaf"])
def test_identity_at_initialisation(direction, transformer):
    tau = make_transformer(transformer)
    layer = MaskedAutoregressive(MADE(D, (8,), tau.params_per_feature), tau, direction)
    x = torch.randn(5, D)
    z, log_det = layer(x)
    assert torch.allclose(z, x, atol=1e-6) and torch.allclose(log_det, torch.zeros(5), atol=1e-6)


def test_affine_log_scale_is_smoothly_bounded():
    tau = make_transformer("affine", log_scale_bound=2.0)
    raw = torch.linspace(-100, 100, 11, requires_grad=True)
    params = torch.stack([torch.zeros(11), raw], -1)
    _, log_dz = tau.forward(torch.zeros(11), params)
    assert (log_dz.abs() <= 2.0).all()
    log_dz.sum().backward()
    assert torch.isfinite(raw.grad).all()


def test_affine_forms_place_the_shift_inside_or_outside_the_scale():
    x = torch.tensor([2.0, -1.0])
    params = torch.tensor([[0.5, math.log(2.0)], [-1.0, 0.0]])  # (shift, raw log-scale)
    bound = make_transformer("affine").log_scale_bound
    s = bound * torch.tanh(params[:, 1] / bound)
    z, log_dz = make_transformer("affine").forward(x, params)
    torch.testing.assert_close(z, (x - params[:, 0]) * torch.exp(-s))
    z2, log_dz2 = make_transformer("affine", form="scale-shift").forward(x, params)
    torch.testing.assert_close(z2, x * torch.exp(-s) - params[:, 0])
    assert torch.equal(log_dz, -s) and torch.equal(log_dz2, -s)
    with pytest.raises(ValueError, match="'form' should be 'location-scale' or 'scale-shift'"):
        make_transformer("affine", form="shift-scale")
    old = make_transformer("affine")
    del old.__dict__["form"]  # as pickled before the option existed: the form of then
    torch.testing.assert_close(pickle.loads(pickle.dumps(old)).forward(x, params)[0], z)


def test_batch_norm_training_mode_uses_batch_statistics():
    bn = BatchNorm(D)
    x = 3 + 2 * torch.randn(500, D)
    z, log_det = bn(x)
    assert torch.allclose(z.mean(0), torch.zeros(D), atol=1e-5)
    assert torch.allclose(z.std(0, unbiased=False), torch.ones(D), atol=1e-3)
    assert torch.allclose(bn.running_mean, 0.1 * x.mean(0))
    assert torch.allclose(log_det, -0.5 * torch.log(x.var(0, unbiased=False) + bn.eps).sum())
    with pytest.raises(ValueError, match=r"needs at least 2 rows, got a batch of shape "
                       r"\(1, 4\): evaluate single rows in eval mode \(model.eval\(\)\)"):
        bn(x[:1])


def test_batch_norm_inverse_uses_the_running_averages_in_both_modes():
    """Documented behaviour: in training mode forward (batch statistics) and inverse (running
    averages) are different bijections; in eval mode they are exact inverses."""
    bn = BatchNorm(D).double()
    x = 3 + 2 * torch.randn(64, D, dtype=torch.float64)
    z, log_det = bn(x)
    x_back, log_det_inv = bn.inverse(z)
    assert not torch.allclose(x_back, x, atol=1e-3)
    assert not torch.allclose(log_det, -log_det_inv, atol=1e-3)
    expected = bn.eval().inverse(z)  # the running averages did not move since forward
    torch.testing.assert_close(bn.train().inverse(z), expected)
    bn.eval()
    z, log_det = bn(x)
    x_back, log_det_inv = bn.inverse(z)
    torch.testing.assert_close(x_back, x)
    torch.testing.assert_close(log_det + log_det_inv, torch.zeros(64, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(features=0), "'features' should be >= 1, got 0"),
        (dict(features=2.5), "'features' should be an integer >= 1, got 2.5"),
        (dict(features=D, momentum=1.5), r"'momentum' should be in \[0, 1\]"),
        (dict(features=D, momentum=-0.1), "'momentum'"),
        (dict(features=D, eps=0.0), "'eps' should be positive"),
        (dict(features=D, eps=float("nan")), "'eps'"),
    ],
)
def test_batch_norm_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BatchNorm(**kwargs)


def test_compose_needs_one_context_width():
    with pytest.raises(ValueError, match="'transforms' should agree on context_features"):
        Compose([autoregressive("maf", "affine", context=2), autoregressive("maf", "affine",
                                                                            context=3)])


def test_compose_needs_one_width_and_reports_it():
    assert Compose([Permutation.reverse(3), Inverse(BatchNorm(3))]).features == 3
    assert Compose([]).features is None
    with pytest.raises(ValueError, match=r"'transforms' should agree on features .*\[3, 4\]"):
        Compose([Permutation.reverse(3), autoregressive("maf", "affine")])


@pytest.mark.parametrize("name", TRANSFORMS)
def test_wrong_width_names_the_argument(name):
    """Every transform called directly checks its input's width in both directions, naming
    'x' or 'z' (a permutation used to return a silently truncated tensor, BatchNorm to fail
    inside torch, an IAF's forward to name the solver's internal argument 'like')."""
    t = make(name)
    _, c = inputs(t)
    for method, arg in zip((t, t.inverse), ("x", "z"), strict=True):
        match = rf"'{arg}' should have shape \(N, {D}\), got \(6, 5\)"
        with pytest.raises(ValueError, match=match):
            method(torch.randn(6, D + 1, dtype=torch.float64), c)


@pytest.mark.parametrize("direction", ["maf", "iaf"])
def test_autoregressive_layer_checks_dtype_in_both_directions(direction):
    """The layer checks the dtype of its input in both directions, naming the argument of the
    method called ('x' of forward, 'z' of inverse; the MADE inside trusts the layer)."""
    layer = autoregressive(direction, "affine")
    for method, arg in ((layer, "x"), (layer.inverse, "z")):
        with pytest.raises(TypeError, match=rf"'{arg}' should have dtype torch.float32"):
            method(torch.randn(3, D, dtype=torch.float64))


@pytest.mark.parametrize("direction", ["maf", "iaf"])
def test_masked_affine_autoregressive_is_the_affine_layer(direction):
    made = MADE(D, (16,), 2, order="random", seed=1)
    reference = perturbed(MaskedAutoregressive(made, Affine(log_scale_bound=2.0), direction))
    layer = MaskedAffineAutoregressive(made, direction, log_scale_bound=2.0, identity_init=False)
    assert isinstance(layer, MaskedAutoregressive)
    assert layer.extra_repr() == reference.extra_repr()
    x = torch.randn(5, D)
    torch.testing.assert_close(layer(x), reference(x))
    torch.testing.assert_close(layer.inverse(x), reference.inverse(x))
    with pytest.raises(ValueError, match="'made' gives 3 parameters per feature"):
        MaskedAffineAutoregressive(MADE(D, (8,), 3))
    with pytest.raises(ValueError, match="'identity_init' should be True or False"):
        MaskedAffineAutoregressive(MADE(D, (8,), 2), identity_init="no")


def test_lu_linear_is_the_identity_at_construction_and_its_factors_make_its_weight():
    t = LULinear(D).double()
    x = torch.randn(5, D, dtype=torch.float64)
    z, log_det = t(x)
    assert torch.equal(z, x) and torch.equal(log_det, torch.zeros(5, dtype=torch.float64))
    perturbed(t)
    lower, upper = t.factors()
    assert torch.equal(lower.diagonal(), torch.ones(D, dtype=torch.float64))
    assert torch.equal(lower.triu(1), torch.zeros(D, D, dtype=torch.float64))
    assert torch.equal(upper.tril(-1), torch.zeros(D, D, dtype=torch.float64))
    assert torch.allclose(t(x)[0], x @ (lower @ upper).T + t.bias, atol=1e-12)
    # the unread entries (on and beyond each factor's diagonal) get no gradient
    t(x)[0].square().sum().backward()
    assert torch.equal(t.lower.grad.triu(), torch.zeros(D, D, dtype=torch.float64))
    assert torch.equal(t.upper.grad.tril(), torch.zeros(D, D, dtype=torch.float64))


@pytest.mark.parametrize("rows", [1, D - 1, D, 3 * D])
def test_lu_linear_computes_x_w_the_same_way_below_and_above_d_rows(rows):
    """Fewer rows than features take two triangular products instead of forming W (review 28:
    at D = 784 one row took 28x the rest of a MAF's log_prob); both give x W^T + b and invert."""
    t = perturbed(LULinear(D).double())
    x = torch.randn(rows, D, dtype=torch.float64)
    z, log_det = t(x)
    torch.testing.assert_close(z, x @ t.weight().T + t.bias, rtol=0, atol=1e-12)
    torch.testing.assert_close(t.inverse(z)[0], x, rtol=0, atol=1e-10)
    assert torch.equal(log_det, t.log_diagonal.sum().expand(rows))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lu_linear_inverts_in_half_precision(dtype):
    """The triangular solves have no float16/bfloat16 CPU kernels; the inverse runs them in
    float32 (review 28: a default MAF in half precision could no longer sample)."""
    t = perturbed(LULinear(D).double())
    x = torch.randn(6, D, dtype=torch.float64)
    z = t(x)[0]
    half = t.to(dtype)
    back, log_det = half.inverse(z.to(dtype))
    assert back.dtype == dtype and log_det.dtype == dtype
    torch.testing.assert_close(back.double(), x, rtol=0, atol=0.1)


def test_logit_scores_points_outside_the_box_minus_infinity_and_edges_just_inside():
    t = Logit([0.0, -1.0], [1.0, 3.0]).double()
    x = torch.tensor([[0.5, 1.0], [1.5, 1.0], [0.5, -1.0001], [0.0, 3.0]], dtype=torch.float64)
    z, log_det = t(x)
    assert torch.isfinite(log_det[[0, 3]]).all() and (log_det[1:3] == -math.inf).all()
    assert torch.isfinite(z).all() and torch.equal(z[1:3], torch.zeros(2, 2, dtype=torch.float64))
    # the edge point is scored one rounding step inside: the float spacing at that end, the
    # smallest normal number at an end of 0
    info = torch.finfo(torch.float64)
    spacing = 3.0 - torch.nextafter(torch.tensor(3.0, dtype=torch.float64),
                                    torch.tensor(0.0, dtype=torch.float64)).item()
    expected = torch.tensor([math.log(info.tiny), math.log(4.0) - math.log(spacing)],
                            dtype=torch.float64)
    assert torch.allclose(z[3], expected, rtol=1e-12, atol=0)
    # review 46: eps * width was the step, which moved a float32 point at 1e-10 on (0, 1) to
    # 1.2e-7 (log-det 15.9 instead of 23.0); such points are scored where they are
    near = torch.tensor([[1e-10], [1e-30], [1 - 2**-20]])
    z, log_det = Logit([0.0], [1.0])(near)
    exact = -(near.double().log() + (1 - near.double()).log()).squeeze(1)
    torch.testing.assert_close(log_det.double(), exact, rtol=1e-5, atol=0)
    torch.testing.assert_close(Logit([0.0], [1.0]).inverse(z)[0], near, rtol=1e-5, atol=0)
    # review 47: on (1000, 1001) in float32 a point one spacing inside was floored to about two
    # (eps * |end|); it is scored where it is, and the edge point as one spacing inside
    box = Logit([1000.0], [1001.0])
    inner = torch.nextafter(torch.tensor([[1000.0]]), torch.tensor([[2000.0]]))
    exact = math.log(1.0) - math.log(inner.double().item() - 1000.0) - math.log(
        1001.0 - inner.double().item())
    assert box(inner)[1].item() == pytest.approx(exact, rel=1e-5)
    assert box(torch.tensor([[1000.0]]))[1].item() == pytest.approx(exact, rel=1e-5)
    x = x[:1].clone().requires_grad_()
    t(x)[1].sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize(
    "low, high, match",
    [([0.0], [0.0], "'high' should be above 'low' in every feature"),
     ([0.0, 1.0], [1.0], "'low' and 'high' should have the same shape"),
     ([[0.0]], [[1.0]], r"'low' should have shape \(D,\)"),
     ([0.0], [-math.inf], "'high' should be finite or inf"),
     ([math.inf], [1.0], "'low' should be finite or -inf"),
     ([0.0], [math.nan], "'high' should be finite or inf"),
     # distinct as given, equal in the default dtype the buffers take (a NaN density before)
     ([1e9], [1e9 + 1], "'low' and 'high' are equal in torch.float32 at features \\[0\\]"),
     ([0.0, 0.0], [1.0, 1e-46], "equal in torch.float32 at features \\[1\\]"),
     ([-3e38, 0.0], [3e38, 1.0], r"width high - low overflows torch.float32 at features \[0\]")],
)
def test_logit_bad_bounds(low, high, match):
    with pytest.raises(ValueError, match=match):
        Logit(low, high)


def test_logit_on_half_lines_is_the_log_and_samples_stay_inside():
    """``bounds`` with an infinite end: the log of the distance to the finite end, so that a
    positive column is a log-normal under a standard normal base (review 22: a positive-only
    income could not be expressed, 'low' should be finite)."""
    t = Logit([0.0, -math.inf, -math.inf], [math.inf, 2.0, math.inf]).double()
    x = torch.tensor([[1.5, 1.0, -3.0], [0.0, 2.0, 7.0], [-0.1, 1.0, 0.0], [1.0, 2.5, 0.0]],
                     dtype=torch.float64)
    z, log_det = t(x)
    assert torch.allclose(z[0], torch.tensor([math.log(1.5), -math.log(1.0), -3.0],
                                             dtype=torch.float64))
    assert torch.isfinite(log_det[:2]).all() and (log_det[2:] == -math.inf).all()
    tiny = torch.finfo(torch.float64).tiny  # an end at 0: one rounding step is the smallest normal
    eps = torch.finfo(torch.float64).eps  # the spacing of the numbers just below 2
    assert torch.allclose(z[1, :2], torch.tensor([math.log(tiny), -math.log(eps)],
                                                 dtype=torch.float64))
    samples, _ = t.inverse(30 * torch.randn(1000, 3, dtype=torch.float64))
    assert (samples[:, 0] > 0).all() and (samples[:, 1] <= 2.0).all()  # 2 - e^-z rounds to 2
    # a log-normal density: normalized on (0, inf)
    grid = torch.linspace(-30.0, 30.0, 200001, dtype=torch.float64)
    positive = Logit([0.0], [math.inf]).double()
    _, log_det = positive(grid.exp()[:, None])
    log_p = -0.5 * grid.square() - 0.5 * math.log(2 * math.pi) + log_det  # density of x = e^g
    total = torch.trapezoid((log_p + grid).exp(), grid)  # dx = e^g dg
    assert abs(total.item() - 1.0) < 1e-8
    x = torch.tensor([[0.5, 1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    (t(x)[0].sum() + t(x)[1].sum()).backward()
    assert torch.isfinite(x.grad).all()


def test_logit_takes_the_default_dtype():
    """Bounds that float32 cannot tell apart are kept in a float64 default dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        t = Logit([1e9], [1e9 + 1])
    finally:
        torch.set_default_dtype(previous)
    assert t.high.dtype == torch.float64 and (t.high - t.low).item() == 1.0
    z, log_det = t(torch.tensor([[1e9 + 0.5]], dtype=torch.float64))
    assert z.item() == 0.0 and log_det.item() == pytest.approx(math.log(4.0))


def test_lu_linear_bad_features():
    with pytest.raises(ValueError, match="'features'"):
        LULinear(0)


def test_batch_norm_state_is_in_buffers():
    assert {"running_mean", "running_var"} <= set(BatchNorm(D).state_dict())


def test_permutation_state_and_errors():
    p = Permutation([2, 0, 1])
    assert p(torch.tensor([[10.0, 11.0, 12.0]]))[0].tolist() == [[12.0, 10.0, 11.0]]
    assert "permutation" in p.state_dict()
    assert torch.equal(Permutation.random(5, seed=3).permutation,
                       Permutation.random(5, seed=3).permutation)
    with pytest.raises(ValueError, match="'permutation'"):
        Permutation([0, 0, 1])
    with pytest.raises(ValueError, match=r"'permutation' should be a permutation of range\(2\)"):
        Permutation([1.7, 0.2])  # used to be truncated to [1, 0]
    given = torch.tensor([1, 0])
    q = Permutation(given)
    given[0] = 0
    assert q.permutation.tolist() == [1, 0]  # copied, not shared
    for bad in (2.5, True, 0):
        with pytest.raises(ValueError, match="'features' should be (an integer )?>= 1"):
            Permutation.reverse(bad)
    with pytest.raises(ValueError, match="'seed' should be an integer >= 0"):
        Permutation.random(3, seed=0.5)


def test_mismatched_transformer_is_an_error():
    with pytest.raises(ValueError, match="parameters per feature"):
        MaskedAutoregressive(MADE(D, (8,), 3), make_transformer("affine"))
    with pytest.raises(ValueError, match="'direction'"):
        MaskedAutoregressive(MADE(D, (8,), 2), make_transformer("affine"), "sideways")
    with pytest.raises(ValueError, match="'transformer'"):
        make_transformer("planar")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("name", TRANSFORMS)
def test_cuda_computes_what_the_cpu_computes(name):
    """Every transform on a GPU, float64: the same outputs, log-determinants and inverses as on
    the CPU (LULinear's triangular solves and Logit's edges included)."""
    t = make(name)
    x, c = inputs(t, n=33)  # above D rows: LULinear forms W; one row below takes the products
    gpu = make(name).cuda()
    for rows in (slice(None), slice(0, 1)):
        ci = None if c is None else c[rows]
        z, log_det = t(x[rows], ci)
        z_gpu, log_det_gpu = gpu(x[rows].cuda(), None if ci is None else ci.cuda())
        torch.testing.assert_close(z_gpu.cpu(), z, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(log_det_gpu.cpu(), log_det, rtol=1e-10, atol=1e-10)
        back, _ = gpu.inverse(z_gpu, None if ci is None else ci.cuda())
        torch.testing.assert_close(back.cpu(), x[rows], rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_default_maf_samples_and_scores_in_half_precision(device, dtype):
    """A default MAF (LU-linear maps, standardization) cast to half precision."""
    flow = MAF(5, hidden_features=(32,), seed=0)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.05 * torch.randn_like(p))
    flow = flow.to(device).eval().to(dtype)
    x = flow.sample(64)
    assert x.dtype == dtype and x.device.type == device and torch.isfinite(x).all()
    log_p = flow.log_prob(x)
    assert log_p.dtype == dtype and torch.isfinite(log_p).all()


# ------------------------------------------------------------- transforms of one's own


class _Scale(Transform):
    """z = 2 x; ``summed`` returns the log-determinant summed over the batch (a mistake)."""

    def __init__(self, summed=False, bare=False):
        super().__init__()
        self.summed, self.bare = summed, bare

    def _forward(self, x, context):
        log_det = x.new_full((x.shape[0],), x.shape[1] * math.log(2.0))
        if self.bare:
            return 2 * x
        return 2 * x, log_det.sum() if self.summed else log_det

    def _inverse(self, z, context):
        return z / 2, z.new_full((z.shape[0],), -z.shape[1] * math.log(2.0))


def test_what_a_transform_of_ones_own_returns_is_checked_and_the_transform_named():
    """Review 45: a log-determinant summed over the batch was broadcast to every row (5.5 nats
    off at N = 5), and a bare z of two rows was unpacked as the pair (z, log_det)."""
    from flowkit import Flow, StandardNormal

    x = torch.randn(5, 2)
    good = Flow([_Scale(), Permutation([1, 0])], StandardNormal(2))  # a list: their Compose
    assert isinstance(good.transform, Compose)
    expected = StandardNormal(2).log_prob(2 * x) + 2 * math.log(2)
    torch.testing.assert_close(good.log_prob(x), expected)
    summed = r"a pair: Tensor of shape \(5, 2\), Tensor of shape \(\)"
    for bad, got in ((_Scale(summed=True), summed),
                     (_Scale(bare=True), r"one tensor of shape \(5, 2\)")):
        flow = Flow([bad], StandardNormal(2))
        with pytest.raises(ValueError, match=r"_Scale._forward should return \(y, log_det\), y of "
                           r"its input's shape \(5, 2\) and log_det of shape \(5,\).*got " + got):
            flow.log_prob(x)
    two = Flow(_Scale(bare=True), StandardNormal(2))  # not in a Compose: the flow checks it
    with pytest.raises(ValueError, match="one tensor of shape"):
        two.log_prob(torch.randn(2, 2))
    with pytest.raises(TypeError, match=r"a list, or flowkit.transforms.Compose\(\[t1, t2\]\)"):
        Flow(torch.nn.Linear(2, 2), StandardNormal(2))


def test_a_transform_written_as_nflows_writes_them_is_told_where_its_code_goes():
    class NflowsStyle(Transform):
        def forward(self, x, context=None):
            return 2 * x, x.new_zeros(x.shape[0])

    from flowkit import Flow, StandardNormal

    with pytest.raises(NotImplementedError, match=r"NflowsStyle overrides forward\(\), but "
                       r"flowkit calls _forward.*rename NflowsStyle.forward to _forward"):
        Flow([NflowsStyle()], StandardNormal(2)).log_prob(torch.randn(3, 2))
    with pytest.raises(NotImplementedError, match=r"_Plain should implement _inverse"):
        type("_Plain", (Transform,), {})().inverse(torch.randn(3, 2))


def test_check_transform_passes_flowkits_layers_and_names_what_a_wrong_one_gets_wrong():
    from flowkit.testing import check_autoregressive, check_transform

    torch.manual_seed(0)
    flow = MAF(3, layers=2, hidden_features=(8,), context_features=2, transformer="spline")
    for p in flow.parameters():
        torch.nn.init.normal_(p, std=0.3)
    check_transform(flow.transform, torch.randn(4, 3), torch.randn(4, 2))
    check_transform(Inverse(flow.transform), torch.randn(4, 3), torch.randn(4, 2))

    class WrongInverse(_Scale):
        def _inverse(self, z, context):
            return z / 3, z.new_full((z.shape[0],), -z.shape[1] * math.log(3.0))

    class WrongLogDet(_Scale):
        def _forward(self, x, context):
            return 2 * x, x.new_full((x.shape[0],), math.log(2.0))

        def _inverse(self, z, context):
            return z / 2, z.new_full((z.shape[0],), -math.log(2.0))

    for t, match in ((WrongInverse(), r"inverse\(forward\(x\)\) differs from x"),
                     (WrongLogDet(), r"log_det of row 0 is 0.69314.*autograd's log\|det dz/dx\| "
                                     r"is 1.3862"),
                     (_Scale(summed=True), r"forward should return \(y, log_det\)")):
        with pytest.raises(AssertionError, match=match):
            check_transform(t, torch.randn(3, 2))
    with pytest.raises(TypeError, match=r"has no 'order': pass order=.*check_transform"):
        check_autoregressive(flow.transform.transforms[-1])


def test_a_log_scale_bound_above_twenty_is_warned_of():
    """Review 46: at 100 a float32 layer's output was inf with a finite log-determinant."""
    from flowkit.checkpoint import BuildWarning

    with pytest.warns(BuildWarning, match=r"'log_scale_bound' is 100, above 20"):
        Affine(100.0)


@pytest.mark.parametrize("maps", ["to_noise", "to_data"])
@pytest.mark.parametrize("kind", ["elementwise", "composed", "vector"])
def test_torch_bijection_is_exact_in_both_directions(kind, maps):
    """A torch.distributions bijection inside flowkit, read as the caller says (zuko's
    to_noise, torch's TransformedDistribution to_data): round trip, opposite log-determinants,
    log_det against autograd's Jacobian, elementwise log-determinants summed once."""
    from torch.distributions import transforms as T

    t = {"elementwise": T.AffineTransform(0.5, torch.tensor([2.0, 0.5, 3.0], dtype=torch.float64)),
         "composed": T.ComposeTransform([T.AffineTransform(0.2, 1.5), T.SigmoidTransform()]),
         "vector": T.IndependentTransform(T.AffineTransform(1.0, 3.0), 1)}[kind]
    bijection = TorchBijection(t, maps=maps)
    x = torch.rand(6, 3, dtype=torch.float64) * 0.8 + 0.1  # inside the sigmoid's range
    if kind == "composed" and maps == "to_noise":
        x = torch.randn(6, 3, dtype=torch.float64)
    check_transform(bijection, x)
    noise_to_data = t if maps == "to_data" else t.inv
    z, log_det = bijection(x)
    torch.testing.assert_close(noise_to_data(z), x)
    expected = t.log_abs_det_jacobian(x, t(x)) if maps == "to_noise" else -t.log_abs_det_jacobian(
        z, x)
    if kind != "vector":
        expected = expected.expand_as(x).sum(-1)
    torch.testing.assert_close(log_det, expected)


def test_torch_bijection_runs_zukos_flow_and_refuses_what_it_cannot_read():
    zuko = pytest.importorskip("zuko")
    theirs = zuko.flows.MAF(3, transforms=2, hidden_features=(16,))
    ours = flowkit.Flow([TorchBijection(theirs.transform(), maps="to_noise")],
                        flowkit.StandardNormal(3))
    x = torch.randn(7, 3)
    torch.testing.assert_close(ours.log_prob(x), theirs().log_prob(x), rtol=0, atol=1e-5)
    conditional = zuko.flows.MAF(3, context=2, transforms=1, hidden_features=(16,))
    unfed = flowkit.Flow([TorchBijection(conditional.transform, maps="to_noise")],
                         flowkit.StandardNormal(3))
    with pytest.raises(RuntimeError, match=r"has no context: .*lambda: zuko_flow.transform\(c\)"):
        unfed.log_prob(x)
    with pytest.raises(TypeError, match="'transform' should be a torch.distributions.Transform"):
        TorchBijection(3.0, maps="to_noise")
    with pytest.raises(TypeError, match="calling it failed: .*missing 1 required positional"):
        TorchBijection(torch.nn.Linear(3, 3), maps="to_noise")
    with pytest.raises(TypeError, match="should build a torch.distributions.Transform, got "
                                        "Tensor"):
        TorchBijection(lambda: torch.zeros(3), maps="to_noise")
    from torch.distributions import transforms as T
    any_width = TorchBijection(T.AffineTransform(1.0, 2.0), maps="to_data")
    with pytest.raises(TypeError, match=r"'x' should be a torch.Tensor of shape \(N, D\), got "
                                        "list"):
        any_width([[1.0, 2.0]])
    with pytest.raises(ValueError, match=r"'x' should have shape \(N, D\), got \(3,\)"):
        any_width(torch.zeros(3))
    with pytest.raises(TypeError, match=r"goes in as flowkit.transforms.TorchBijection"):
        flowkit.Flow(T.ExpTransform(), flowkit.StandardNormal(2))
    with pytest.raises(ValueError, match="should be a bijection"):
        TorchBijection(T.AbsTransform(), maps="to_noise")
    with pytest.raises(ValueError, match="'maps' should be 'to_noise'"):
        TorchBijection(T.ExpTransform(), maps="forward")
    with pytest.raises(ValueError, match="event_dim 2 -> 2"):
        TorchBijection(T.IndependentTransform(T.ExpTransform(), 2), maps="to_noise")


def test_torch_bijection_gives_points_outside_its_range_no_density():
    """Data outside (-1, 1) under a tanh read to_data have log-density -inf (as with Logit),
    not NaN; inside, the density integrates to 1 on a grid."""
    from torch.distributions import TanhTransform

    flow = flowkit.Flow([TorchBijection(TanhTransform(), maps="to_data")],
                        flowkit.StandardNormal(2)).double()
    log_p = flow.log_prob(torch.tensor([[0.5, 0.2], [1.5, 0.1], [0.9, -1.0]],
                                       dtype=torch.float64))
    assert torch.isfinite(log_p[0]) and log_p[1:].tolist() == [-math.inf, -math.inf]
    g = torch.linspace(-1, 1, 802, dtype=torch.float64)[1:-1]
    grid = torch.cartesian_prod(g, g)
    mass = flow.log_prob(grid).exp().sum() * (g[1] - g[0]) ** 2
    assert abs(mass.item() - 1) < 2e-3


def test_torch_bijection_built_by_a_module_trains_and_refuses_noise_the_wrong_way():
    """A T built once keeps its values (review 53); a module that builds it at every use
    makes its parameters the flow's, trained by fit. Noise outside T's noise side means
    'maps' the wrong way round; data outside T's data side give no NaN gradient."""
    from torch.distributions import (
        AffineTransform,
        ComposeTransform,
        SigmoidTransform,
        TanhTransform,
    )

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.log_scale = torch.nn.Parameter(torch.zeros(2))

        def forward(self):
            return ComposeTransform([AffineTransform(0.0, self.log_scale.exp()), TanhTransform()])

    builder = Scaled()
    flow = flowkit.Flow([TorchBijection(builder, maps="to_data")], flowkit.StandardNormal(2))
    assert [name for name, _ in flow.named_parameters()] == [
        "transform.transforms.0.build.log_scale"]
    log_p = flow.log_prob(torch.tensor([[0.5, 0.2], [1.5, 0.1]]))
    assert torch.isfinite(log_p[0]) and log_p[1] == -math.inf
    log_p[:1].sum().backward()
    assert torch.isfinite(builder.log_scale.grad).all()
    x = torch.tanh(torch.randn(500, 2) * 0.3)
    flowkit.fit(flow, x, steps=150, lr=0.05, valid=None, progress=False, seed=0)
    torch.testing.assert_close(builder.log_scale.exp().detach(), torch.full((2,), 0.3),
                               rtol=0.15, atol=0)
    wrong = flowkit.Flow([TorchBijection(SigmoidTransform(), maps="to_noise")],
                         flowkit.StandardNormal(2))
    with pytest.raises(ValueError, match="is it maps='to_data'"):
        wrong.sample(4)
