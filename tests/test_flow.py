"""Flow: normalized densities, sampling shapes, conditional use, and bad input."""

import inspect
import math
import re
import warnings
from collections import Counter

import numpy as np
import pytest
import torch

import flowkit
from flowkit import IAF, MADE, MAF, Flow
from flowkit.nn.inversion import solve_with_params
from flowkit.transforms import Compose, Permutation, autoregressive
from flowkit.transforms.standardize import set_from_data

BUILDERS = {"MAF": MAF, "IAF": IAF}


def grid_integral(flow, half_width=6.0, points=241):
    """Trapezoidal integral of exp(log_prob) over [-w, w]^2 (float64)."""
    axis = torch.linspace(-half_width, half_width, points, dtype=torch.float64)
    xx, yy = torch.meshgrid(axis, axis, indexing="ij")
    with torch.no_grad():
        density = flow.log_prob(torch.stack([xx.flatten(), yy.flatten()], -1)).exp()
    density = density.reshape(points, points)
    return torch.trapezoid(torch.trapezoid(density, axis), axis).item()


def two_moons(n, generator):
    t = torch.rand(n, generator=generator, dtype=torch.float64) * torch.pi
    side = torch.randint(0, 2, (n,), generator=generator)
    x = torch.stack([torch.cos(t), torch.sin(t)], -1)
    x = torch.where(side[:, None] == 1, torch.tensor([1.0, 0.5], dtype=torch.float64) - x, x)
    return x + 0.1 * torch.randn(n, 2, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("transformer", ["affine", "spline"])
@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_density_integrates_to_one_before_and_after_training(builder, transformer):
    flow = BUILDERS[builder](2, layers=3, hidden_features=(16, 16), transformer=transformer,
                             seed=1).double()
    generator = torch.Generator().manual_seed(0)
    # set the standardization from data (else the grid's first training-mode call would set it
    # from the grid points, whose spread puts mass outside the box)
    set_from_data(flow, [(two_moons(1000, generator),)])
    untrained = grid_integral(flow)
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-2)
    for _ in range(30):
        x = two_moons(128, generator)
        loss = -flow.log_prob(x).mean()  # an IAF scores outside points through its solver
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trained = grid_integral(flow, points=481)  # sharper after training: a finer grid
    assert abs(untrained - 1) < 1e-3, untrained
    assert abs(trained - 1) < 1e-3, trained
    assert loss.item() < 2.5  # it did learn something (standard normal NLL here is ~2.4+)


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_sample_and_log_prob_agree_with_log_prob(builder):
    flow = BUILDERS[builder](3, layers=2, hidden_features=(16,), transformer="spline").double()
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x, log_p = flow.sample_and_log_prob(10)
    assert x.shape == (10, 3) and log_p.shape == (10,)
    assert torch.allclose(flow.log_prob(x), log_p, atol=1e-10)


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_conditional_shapes_and_no_loop_broadcast(builder):
    flow = BUILDERS[builder](2, layers=2, hidden_features=(16,), context_features=3)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.2 * torch.randn_like(p))
    flow.eval()  # the calls below would otherwise set the standardizations from what they see
    single, many = torch.randn(3), torch.randn(5, 3)
    assert flow.sample(4, single).shape == (4, 2)
    assert flow.sample(context=many).shape == (5, 2)
    assert flow.sample(4, many).shape == (4, 5, 2)
    x, log_p = flow.sample_and_log_prob(4, many)
    assert x.shape == (4, 5, 2) and log_p.shape == (4, 5)
    # each block of samples was drawn with its own context
    expected = flow.log_prob(x.reshape(20, 2), many.repeat(4, 1)).reshape(4, 5)
    assert torch.allclose(expected, log_p, atol=1e-4)
    # one context shared by all rows equals that context repeated
    y = torch.randn(6, 2)
    assert torch.allclose(flow.log_prob(y, single), flow.log_prob(y, single.expand(6, 3)))
    # the context changes the density
    assert not torch.allclose(flow.log_prob(y, single), flow.log_prob(y, single + 1))


def test_rsample_is_differentiable_and_sample_is_not():
    flow = MAF(2, layers=2, hidden_features=(8,))
    x = flow.rsample(16)
    x.square().sum().backward()
    grads = [p.grad for p in flow.parameters()]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    assert not flow.sample(4).requires_grad


def test_batch_norm_flow_trains_and_is_exact_in_eval():
    flow = MAF(2, layers=3, hidden_features=(16,), batch_norm=True).double()
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        loss = -flow.log_prob(two_moons(128, generator)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    flow.eval()
    assert abs(grid_integral(flow) - 1) < 1e-3
    x, log_p = flow.sample_and_log_prob(8)
    assert torch.allclose(flow.log_prob(x), log_p, atol=1e-8)


def test_batch_norm_sample_and_log_prob_scores_the_inverse_it_applied():
    """BatchNorm's inverse always uses the running averages: in both modes the flow samples
    from the eval-mode model and sample_and_log_prob returns the eval-mode density, which is
    log_prob in eval mode. In training mode log_prob uses the batch's statistics, another
    bijection, and disagrees."""
    flow = MAF(2, layers=3, hidden_features=(16,), batch_norm=True).double()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
        for _ in range(5):  # training-mode passes move the running averages
            flow.log_prob(3 * two_moons(256, generator) + 1)
    samples = {}
    for training in (True, False):
        flow.train(training)
        torch.manual_seed(1)
        samples[training] = flow.sample_and_log_prob(64)
    (x, log_p), (x_eval, log_p_eval) = samples[True], samples[False]
    assert torch.equal(x, x_eval) and torch.equal(log_p, log_p_eval)
    torch.testing.assert_close(flow.log_prob(x), log_p)  # eval mode
    flow.train()
    assert (flow.log_prob(x) - log_p).abs().max() > 1e-2


def test_random_permutation_and_learnable_base():
    flow = MAF(4, layers=3, hidden_features=(8,), permutation="random", learnable_base=True)
    assert isinstance(flow.base, flowkit.DiagonalGaussian)
    flow.log_prob(torch.randn(3, 4)).sum().backward()
    assert flow.base.loc.grad is not None


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_lu_linear_maps_follow_each_permutation_and_keep_the_density_exact(builder):
    flow = BUILDERS[builder](2, layers=3, hidden_features=(16,), transformer="spline",
                             lu_linear=True, seed=2).double()
    kinds = [type(t).__name__ for t in flow.transform.transforms]
    assert kinds == ["Standardize", "MaskedAutoregressive", "Permutation", "LULinear",
                     "MaskedAutoregressive", "Permutation", "LULinear", "MaskedAutoregressive"]
    with torch.no_grad():  # away from the identity the LU maps start at
        for p in flow.parameters():
            p.add_(0.2 * torch.randn_like(p))
    flow.eval()
    assert abs(grid_integral(flow, points=301) - 1) < 1e-3
    x, log_p = flow.sample_and_log_prob(10)
    assert torch.allclose(flow.log_prob(x), log_p, atol=1e-10)


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_bounds_make_a_density_on_the_box(builder, tmp_path):
    """bounds=(low, high): normalized over the box, zero outside it, samples inside it."""
    low, high = [-1.0, 0.5], [2.0, 1.5]
    flow = BUILDERS[builder](2, layers=2, hidden_features=(16,), transformer="spline",
                             bounds=(low, high), seed=3).double()
    assert type(flow.transform.transforms[0]).__name__ == "Logit"
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.2 * torch.randn_like(p))
    flow.eval()
    ax = [torch.linspace(lo, hi, 801, dtype=torch.float64)[1:-1]
          for lo, hi in zip(low, high, strict=True)]
    xx, yy = torch.meshgrid(*ax, indexing="ij")
    with torch.no_grad():
        density = flow.log_prob(torch.stack([xx.flatten(), yy.flatten()], -1)).exp()
    integral = torch.trapezoid(torch.trapezoid(density.reshape(xx.shape), ax[1]), ax[0]).item()
    assert abs(integral - 1) < 1e-3, integral  # 201 points were too coarse for some weights
    x, log_p = flow.sample_and_log_prob(500)
    assert ((x > torch.tensor(low)) & (x < torch.tensor(high))).all()
    assert torch.allclose(flow.log_prob(x), log_p, atol=1e-9)
    outside = torch.tensor([[2.5, 1.0], [0.0, 0.4]], dtype=torch.float64)
    assert (flow.log_prob(outside) == -math.inf).all()
    flowkit.save_model(flow, tmp_path / "flow.pt")
    loaded = flowkit.load_model(tmp_path / "flow.pt")
    assert loaded.config["kwargs"]["bounds"] == [low, high]
    assert torch.equal(loaded.log_prob(x), flow.log_prob(x))


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_bounds_with_open_ends_keep_samples_on_their_half_lines(builder, tmp_path):
    """An end given as None or +-inf is open: a positive column, one below 2, a free one.
    Fitting (whose check of finite weights allows the open ends), sampling, scoring, saving
    and loading all work (review 22: 'low' should be finite, naming an argument never passed)."""
    rng = torch.Generator().manual_seed(0)
    x = torch.stack([torch.randn(600, generator=rng).exp() * 1e4,
                     2.0 - torch.rand(600, generator=rng) ** 2,
                     torch.randn(600, generator=rng)], -1)
    flow = BUILDERS[builder](3, layers=2, hidden_features=(16,), transformer="spline",
                             bounds=([0.0, None, -math.inf], [None, 2.0, None]))
    flowkit.fit(flow, x, steps=30, progress=False, seed=0)
    samples = flow.sample(2000)
    assert (samples[:, 0] >= 0).all() and (samples[:, 1] <= 2.0).all()
    assert samples[:, 2].min() < -1 < 1 < samples[:, 2].max()
    outside = torch.tensor([[-1.0, 1.0, 0.0], [1.0, 2.5, 0.0]])
    assert (flow.log_prob(outside) == -math.inf).all()
    assert torch.isfinite(flow.log_prob(x)).all()
    flowkit.save_model(flow, tmp_path / "f.pt")
    loaded = flowkit.load_model(tmp_path / "f.pt")
    assert torch.equal(loaded.log_prob(x[:5]), flow.log_prob(x[:5]))
    with pytest.raises(ValueError, match=r"'bounds' = \(low, high\) was refused: 'high' should "
                                         r"be above 'low' in every feature"):
        BUILDERS[builder](2, bounds=([0.0, None], [-1.0, None]))
    with pytest.raises(ValueError, match=r"'bounds' = \(low, high\) was refused: 'low' should "
                                         r"be finite or -inf, got \[inf\]"):
        BUILDERS[builder](1, bounds=([math.inf], [None]), transformer="spline")


def test_fit_names_training_rows_outside_the_bounds():
    """Array rows are all scored before training (review 19: a row was found only at the step
    whose batch held it); a DataLoader's at that step."""
    from torch.utils.data import DataLoader, TensorDataset

    flow = MAF(2, layers=1, hidden_features=(8,), bounds=([0.0, 0.0], [1.0, 1.0]))
    x = torch.rand(256, 2)
    x[200, 1] = 1.5
    for valid in (None, 0.25):  # rows numbered as passed, also when some are held out
        with pytest.raises(flowkit.validation.ArgumentError, match=r"^'data' holds 1 row\(s\) "
                           r"\(row 200\) that the model gives log-density -inf: points outside "
                           "its support"):
            flowkit.fit(flow, x, valid=valid, steps=5, progress=False, device="cpu")
    assert not flow.transform.transforms[1].is_initialized  # refused before anything was set
    with pytest.raises(flowkit.validation.ArgumentError, match=r"^'valid' holds 2 row\(s\) "
                       r"\(rows 3, 200\) that the model gives log-density -inf"):
        flowkit.fit(flow, torch.rand(64, 2), valid=torch.cat([x[:3], -x[3:4], x[4:]]), steps=5,
                    progress=False, device="cpu")
    with pytest.raises(flowkit.train.NonFiniteLossError, match=r"the batch of step 9 from 'data' "
                       r"holds 1 row\(s\) that the model gives log-density -inf"):
        flowkit.fit(flow, DataLoader(TensorDataset(x), batch_size=25), steps=10,
                    progress=False, device="cpu")


def test_seeded_sampling_is_reproducible():
    flow = MAF(2, layers=2, hidden_features=(8,))
    torch.manual_seed(5)
    a = flow.sample(10)
    torch.manual_seed(5)
    assert torch.equal(a, flow.sample(10))


def _count_work(flow: flowkit.Flow, monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts of the MADEs' work: full passes (``_forward`` calls: the flow layers call the
    unchecked pass), autoregressive solves, and solver steps (calls of the step function, one
    per feature solved)."""
    counts = Counter()
    made_forward = MADE._forward

    def counted_forward(made, *args, **kwargs):
        counts["passes"] += 1
        return made_forward(made, *args, **kwargs)

    monkeypatch.setattr(MADE, "_forward", counted_forward)

    def counted_solve(made, step, *args, **kwargs):
        counts["solves"] += 1

        def counted_step(params, index):
            counts["steps"] += 1
            assert index.numel() == 1
            return step(params, index)

        return solve_with_params(made, counted_step, *args, **kwargs)

    monkeypatch.setattr(autoregressive, "solve_with_params", counted_solve)
    return counts


@pytest.mark.parametrize("transformer", ["affine", "spline"])
@pytest.mark.parametrize(
    "builder, method, sequential",
    [
        ("MAF", "log_prob", False),
        ("MAF", "sample", True),
        ("MAF", "sample_and_log_prob", True),
        ("IAF", "log_prob", True),
        ("IAF", "sample", False),
        ("IAF", "sample_and_log_prob", False),
    ],
)
def test_work_per_layer(builder, method, sequential, transformer, monkeypatch):
    """The cheap direction is one MADE pass per layer and no solve; the sequential one is one
    solve of exactly D steps per layer (the solver returns the parameters of the log-det too)
    and no full MADE pass at all."""
    features, layers, context = 4, 3, torch.randn(5, 2)
    flow = BUILDERS[builder](features, layers=layers, hidden_features=(16, 16),
                             context_features=2, transformer=transformer)
    counts = _count_work(flow, monkeypatch)
    if method == "log_prob":
        flow.log_prob(torch.randn(5, features), context)
    else:
        getattr(flow, method)(3, context)
    expected = (
        {"solves": layers, "steps": layers * features} if sequential else {"passes": layers}
    )
    assert counts == Counter(expected)


# ---------------------------------------------------------------------------- bad input


@pytest.fixture
def conditional():
    return MAF(2, layers=1, hidden_features=(8,), context_features=3)


@pytest.mark.parametrize(
    "x, context, error, match",
    [
        (torch.randn(4, 3), torch.randn(4, 3), ValueError, r"'x' should have shape \(\.\.\., 2\)"),
        (torch.tensor(1.0), torch.randn(3), ValueError, r"shape \(\.\.\., 2\), got \(\)"),
        (torch.randn(0, 2), torch.randn(0, 3), ValueError, "'x' is an empty batch"),
        (torch.ones(4, 2, dtype=torch.long), torch.randn(4, 3), TypeError, "'x' should have dtype"),
        (torch.randn(4, 2).double(), torch.randn(4, 3), TypeError, "'x' should have dtype"),
        (torch.tensor([[0.0, float("nan")]]), torch.randn(1, 3), ValueError, "'x' contains NaN"),
        (torch.randn(4, 2), None, ValueError, "'context' is required"),
        (torch.randn(4, 2), torch.randn(4, 5), ValueError, r"shape \(\.\.\., 3\), got \(4, 5\)"),
        (torch.randn(4, 2), torch.randn(3, 3), ValueError, r"'x' of shape \(4, 2\) and 'context'"),
        (torch.randn(4, 2), torch.randn(4, 3, 1), ValueError, "'context' should have shape"),
        (torch.randn(4, 2), torch.randn(2), ValueError, r"shape \(\.\.\., 3\), got \(2,\)"),
        (torch.randn(4, 2), torch.randn(0, 3), ValueError, r"'context' of shape \(0, 3\)"),
        (torch.randn(4, 2), torch.randn(4, 3).double(), TypeError, "'context' should have dtype"),
        (torch.randn(4, 2), torch.ones(3, dtype=torch.long), TypeError, "'context' should have dt"),
        (torch.randn(1, 2), torch.tensor([[0.0, float("nan"), 0.0]]), ValueError, "'context' cont"),
        (torch.randn(4, 2), torch.tensor([0.0, float("inf"), 0.0]), ValueError, "'context' cont"),
        ([[0.0, 1.0]], torch.randn(1, 3), TypeError, "'x' should be a torch.Tensor"),
    ],
)
def test_bad_input_names_the_argument(conditional, x, context, error, match):
    with pytest.raises(error, match=match):
        conditional.log_prob(x, context)


BAD_SAMPLE_CONTEXTS = {
    "wrong-width-rows": (torch.randn(5, 2), ValueError, r"\(\.\.\., 3\), got \(5, 2\)$"),
    "wrong-width-single": (torch.randn(2), ValueError, r"\(\.\.\., 3\), got \(2,\)$"),
    "wrong-width-3d": (torch.randn(2, 2, 4), ValueError, r"\(\.\.\., 3\), got \(2, 2, 4\)$"),
    "scalar": (torch.tensor(1.0), ValueError, r"\(\.\.\., 3\), got \(\)$"),
    "empty": (torch.randn(0, 3), ValueError, r"'context' is an empty batch: shape \(0, 3\)"),
    "float64": (torch.randn(5, 3).double(), TypeError, "'context' should have dtype torch.float32"),
    "long": (torch.ones(3, dtype=torch.long), TypeError, "'context' should have dtype"),
    "nan": (torch.tensor([[0.0, float("nan"), 0.0]]), ValueError, "'context' contains NaN"),
    "inf": (torch.tensor([0.0, float("inf"), 0.0]), ValueError, "'context' contains NaN"),
}


@pytest.mark.parametrize("n", [None, 3])
@pytest.mark.parametrize("method", ["sample", "rsample", "sample_and_log_prob"])
@pytest.mark.parametrize("case", BAD_SAMPLE_CONTEXTS)
def test_bad_sample_context_is_reported_as_given(conditional, method, n, case):
    """The user's context is checked before it is expanded to n rows per context: errors show
    the shape that was passed, and an empty context is an error, not a failed reshape."""
    context, error, match = BAD_SAMPLE_CONTEXTS[case]
    with pytest.raises(error, match=match):
        getattr(conditional, method)(n, context)


def test_extra_context_is_an_error():
    with pytest.raises(ValueError, match="context_features=0"):
        MAF(2, layers=1).log_prob(torch.randn(3, 2), torch.randn(3, 1))


def test_bad_sample_arguments(conditional):
    with pytest.raises(ValueError, match="'n'"):
        MAF(2, layers=1).sample()
    with pytest.raises(ValueError, match="'n'"):
        MAF(2, layers=1).sample(0)
    with pytest.raises(ValueError, match="'context' is required"):
        conditional.sample(3)
    with pytest.raises(ValueError, match="'context' should have shape"):
        conditional.sample(context=torch.randn(2, 2, 4))
    # a context passed by position (nflows' sample(num_samples, context) has it second): named
    # as the tensor it is, not as a missing context
    for method in (conditional.sample, conditional.rsample, conditional.sample_and_log_prob):
        with pytest.raises(ValueError, match=r"'n' should be an integer number of samples, got "
                           r"a tensor of shape \(4, 3\); pass a context by keyword"):
            method(torch.randn(4, 3))


@pytest.mark.parametrize(("n", "problem"), [(2.5, "an integer"), (2.0, "an integer"),
                                          (True, "an integer"), ("3", "an integer"),
                                          (torch.tensor(3), "an integer"), (0, "a positive"),
                                          (-1, "a positive")])
def test_sample_count_must_be_a_positive_integer(conditional, n, problem):
    """Checked by flowkit.validation.check_n, with the message of the discrete models (a float
    used to reach torch and fail with a TypeError that did not name 'n'); the message says what
    is wrong (2.0 is positive but not an integer)."""
    expected = rf"'n' should be {problem} number of samples, got "
    with pytest.raises(ValueError, match=expected):
        MAF(2, layers=1).sample(n)
    with pytest.raises(ValueError, match=expected):
        conditional.sample(n, torch.randn(2, 3))
    with pytest.raises(ValueError, match=expected):
        IAF(2, layers=1).sample_and_log_prob(n)


def test_numpy_sample_count_is_accepted():
    assert MAF(2, layers=1).sample(np.int64(3)).shape == (3, 2)


@pytest.mark.parametrize("method", ["sample", "rsample", "sample_and_log_prob", "log_prob"])
def test_context_that_is_not_a_tensor_is_a_type_error(conditional, method):
    context = [0.0, 1.0, 2.0]
    args = (torch.randn(2, 2), context) if method == "log_prob" else (2, context)
    with pytest.raises(TypeError, match=r"'context' should be a torch.Tensor .*got list"):
        getattr(conditional, method)(*args)


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(layers=0), "'layers' should be >= 1, got 0"),
        (dict(layers=2.5), "'layers' should be an integer >= 1, got 2.5"),
        (dict(layers=True), "'layers' should be an integer >= 1, got True"),
        (dict(features=2.5), "'features' should be an integer >= 1, got 2.5"),
        (dict(features="2"), "'features' should be an integer >= 1, got '2'"),
        (dict(features=True), "'features' should be an integer >= 1, got True"),
        (dict(features=0), "'features' should be >= 1, got 0"),
        (dict(context_features=1.5), "'context_features' should be an integer >= 0, got 1.5"),
        (dict(context_features=-1), "'context_features' should be >= 0, got -1"),
        (dict(hidden_features=(8.5,)), r"'hidden_features\[0\]' should be an integer >= 1"),
        (dict(hidden_features=(8, 0)), r"'hidden_features\[1\]' should be >= 1, got 0"),
        (dict(hidden_features=64), "'hidden_features' should be a sequence of layer sizes"),
        (dict(seed=1.5), "'seed' should be an integer >= 0, got 1.5"),
        (dict(batch_norm="yes"), "'batch_norm' should be True or False, got 'yes'"),
        (dict(residual=1), "'residual' should be True or False, got 1"),
        (dict(lu_linear="lu"), "'lu_linear' should be True or False, got 'lu'"),
        (dict(bounds=[0.0, 1.0]), r"'bounds' should be a pair \(low, high\) of 2 values"),
        (dict(bounds=([0.0], [1.0])), r"'bounds' should be a pair \(low, high\) of 2 values"),
        (dict(bounds=([0.0, 1.0], [1.0, 1.0])), "'high' should be above 'low'"),
        (dict(learnable_base="no"), "'learnable_base' should be True or False, got 'no'"),
        (dict(permutation="shuffle"), "'permutation' should be 'reverse', 'random', 'none', a "),
        (dict(permutation=[0, 1, 2]), r"'permutation' should be .* of range\(2\)"),
        (dict(permutation=[[0, 1]] * 3), r"or 4 of them .*got \[\[0, 1\], \[0, 1\], \[0, 1\]\]"),
        (dict(permutation=[[0, 1], [1]]), "'permutation' should be 'reverse'"),
        (dict(permutation=None), "'permutation' should be 'reverse'"),
        (dict(permutation=[0, 0]), r"'permutation' should be a permutation of range\(2\) \(ints\)"),
        (dict(permutation=[1.0, 0.0]), r"'permutation' should be a permutation of range\(2\)"),
        (dict(transformer="planar"), "'transformer'"),
    ],
)
def test_bad_builder_arguments(builder, kwargs, match):
    """Each bad hyper-parameter is a ValueError naming it (they used to reach torch, fail with
    a message about empty()'s 'size', or be silently truncated or accepted)."""
    kwargs = {"features": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        BUILDERS[builder](**kwargs)


def test_numpy_integers_are_accepted_as_sizes():
    flow = MAF(np.int64(2), layers=np.int64(2), hidden_features=[np.int64(8)])
    assert flow.sample(3).shape == (3, 2)
    assert flow.transform.transforms[1].made.hidden_features == (8,)  # 0: the Standardize


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_given_permutations(builder, tmp_path):
    """One permutation for every gap between layers, or one per gap; saved in the config."""
    layers, per_gap = 3, [[2, 0, 1], [1, 2, 0]]
    for permutation, expected in [([2, 0, 1], [[2, 0, 1]] * 2), (per_gap, per_gap),
                                  (torch.tensor(per_gap), per_gap)]:
        flow = BUILDERS[builder](3, layers=layers, hidden_features=(8,),
                                 permutation=permutation)
        perms = [t for t in flow.transform.transforms if isinstance(t, Permutation)]
        assert [p.permutation.tolist() for p in perms] == expected
    flowkit.save_model(flow, tmp_path / "flow.pt")
    loaded = flowkit.load_model(tmp_path / "flow.pt")
    assert [p.permutation.tolist() for p in loaded.transform.transforms
            if isinstance(p, Permutation)] == per_gap
    x = torch.randn(4, 3)
    torch.testing.assert_close(loaded.log_prob(x), flow.eval().log_prob(x))


def test_transform_and_base_widths_must_agree():
    transform = MAF(3, layers=2, hidden_features=(8,)).transform
    with pytest.raises(ValueError, match="'transform' acts on 3 features but 'base' has 2"):
        flowkit.Flow(transform, flowkit.StandardNormal(2))
    # a transform of no fixed width fits any base
    flow = flowkit.Flow(Compose([]), flowkit.StandardNormal(2))
    assert flow.log_prob(torch.randn(3, 2)).shape == (3,)


@pytest.mark.parametrize(
    "builder, transformer, kwargs, takes",
    [
        (MAF, "affine", {"bins": 8}, "log_scale_bound"),
        (IAF, "spline", {"bins": 8, "log_scale_bound": 2.0}, "bins, bound, min_bin_width"),
    ],
)
def test_transformer_kwargs_that_do_not_fit_name_the_argument(builder, transformer, kwargs, takes):
    with pytest.raises(TypeError, match=rf"'transformer_kwargs' .* do not fit "
                       rf"transformer='{transformer}' .*which takes {takes}.*unexpected keyword"):
        builder(2, layers=1, transformer=transformer, transformer_kwargs=kwargs)


def test_validation_of_values_can_be_switched_off():
    flow = MAF(2, layers=1).eval()  # (in training mode a NaN batch cannot set Standardize)
    with flowkit.validation.validate_values(False):
        assert torch.isnan(flow.log_prob(torch.tensor([[float("nan"), 0.0]]))).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_round_trip():
    flow = MAF(2, layers=2, hidden_features=(8,), context_features=1).to("cuda")
    x = flow.sample(5, torch.zeros(1, device="cuda"))
    assert x.device.type == "cuda"
    assert flow.log_prob(x, torch.zeros(5, 1, device="cuda")).device.type == "cuda"
    with pytest.raises(ValueError, match="is on cpu but the model is on cuda"):
        flow.log_prob(x.cpu(), torch.zeros(5, 1, device="cuda"))


def test_device_mismatch_names_the_argument():
    flow = MAF(2, layers=1)
    with pytest.raises(ValueError, match="'x' is on meta but the model is on cpu"):
        flow.log_prob(torch.empty(3, 2, device="meta"))


def test_maf_and_iaf_share_one_typed_signature():
    """Both builders have the same explicit, typed, defaulted arguments (written out in each,
    for readers and type checkers; this keeps the two the same) but for the default of
    lu_linear (each chosen by measurement, docs/defaults.md), and a wrong argument is named as
    the caller wrote it."""
    signature = inspect.signature(MAF)
    iaf = inspect.signature(IAF)
    lu = signature.parameters["lu_linear"]
    assert lu.default is True and iaf.parameters["lu_linear"] == lu.replace(default=False)
    assert signature.replace(parameters=[
        p for p in signature.parameters.values() if p.name != "lu_linear"]) == iaf.replace(
        parameters=[p for p in iaf.parameters.values() if p.name != "lu_linear"])
    assert list(signature.parameters) == list(iaf.parameters)
    assert list(signature.parameters)[:2] == ["features", "layers"]
    assert "direction" not in signature.parameters
    assert signature.parameters["standardize"].default is True
    assert signature.parameters["conditional_base"].annotation == "bool"
    with pytest.raises(TypeError, match=r"^MAF\(\) got an unexpected keyword argument 'foo'"):
        MAF(2, foo=1)
    with pytest.raises(TypeError, match=r"^IAF\(\) missing 1 required positional argument"):
        IAF()


def test_building_under_a_meta_default_device_is_refused_with_the_way_out():
    with torch.device("meta"), pytest.raises(RuntimeError, match="build the flow on the CPU"):
        flowkit.MAF(3)


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
@pytest.mark.parametrize("transformer", ["affine", "spline"])
def test_a_flow_computes_in_its_own_dtype_under_autocast(builder, transformer):
    """torch.autocast (CPU, bfloat16) does not reach a flow's products: log_prob, its gradients
    and sample_and_log_prob are those of the float32 flow (before, a perturbed spline MAF's
    log_prob was off by up to 1.7 nats and its gradients by more than their size)."""
    torch.manual_seed(0)
    flow = BUILDERS[builder](3, layers=2, hidden_features=(32,), context_features=2,
                             transformer=transformer, lu_linear=True)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.3 * torch.randn_like(p))
    flow.eval()
    x, c = torch.randn(64, 3), torch.randn(64, 2)

    def run(autocast):
        flow.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            log_p = flow.log_prob(x, c)
            torch.manual_seed(1)
            sample, log_q = flow.sample_and_log_prob(context=c)
        log_p.sum().backward()  # outside autocast, as torch recommends
        return log_p.detach(), [p.grad.clone() for p in flow.parameters()], sample, log_q

    expected, got = run(False), run(True)
    assert got[0].dtype == torch.float32
    torch.testing.assert_close(got[0], expected[0])
    for g, e in zip(got[1], expected[1], strict=True):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(got[2], expected[2])
    torch.testing.assert_close(got[3], expected[3])


def test_a_users_base_is_scored_by_its_log_prob():
    """The flow skips the check of its own z only for bases with _unchecked_log_prob
    (flowkit's); a user's base with a helper of its own named _log_prob (here the unnormalized
    part) is scored by its log_prob (review 20: a density off by log 2 pi, without an error)."""

    class Base(torch.nn.Module):
        features = 2

        def _log_prob(self, z):
            return -0.5 * z.square().sum(-1)

        def log_prob(self, z):
            return self._log_prob(z) - math.log(2 * math.pi)

        def rsample(self, n):
            return torch.randn(n, 2)

    transform = flowkit.MAF(2, hidden_features=(8,), layers=1, standardize=False).transform
    x = torch.randn(5, 2)
    mine, flowkits = Flow(transform, Base()), Flow(transform, flowkit.StandardNormal(2))
    torch.testing.assert_close(mine.log_prob(x), flowkits.log_prob(x))


@pytest.mark.parametrize("builder", [MAF, IAF])
def test_one_affine_feature_without_context_warns_that_it_is_a_gaussian(builder, recwarn,
                                                                      tmp_path, monkeypatch):
    """A one-feature MADE has nothing to condition on: every affine layer is one affine map
    and the stack a Gaussian, whatever its size (review 22: a bimodal column scored 2.53, a
    Gaussian's NLL, against 1.43 with the spline, without a word)."""
    name = builder.__name__
    message = rf"{name}\(1\) with transformer='affine' is a Gaussian whatever its layers"
    with pytest.warns(flowkit.checkpoint.BuildWarning, match=message) as w:
        flow = builder(1, layers=3, hidden_features=(8,))
    assert w[0].filename == __file__  # the caller's line, not the builders' registry
    for p in flow.parameters():  # any weights
        torch.nn.init.normal_(p)
    x = torch.linspace(-3, 3, 7, dtype=torch.float64)[:, None]
    log_p = flow.double().eval().log_prob(x).detach()
    second = log_p[2:] - 2 * log_p[1:-1] + log_p[:-2]  # a quadratic: the same everywhere
    assert (second < 0).all() and torch.allclose(second, second[0].expand(5), atol=1e-9)
    recwarn.clear()
    builder(1, transformer="spline")
    builder(1, context_features=2)  # a conditional Gaussian: a model of its own (docs/flows.md)
    builder(1, bounds=([0.0], [1.0]))
    builder(2)
    assert not [w for w in recwarn if "is a Gaussian" in str(w.message)]
    path = tmp_path / "one.pt"
    flowkit.save_model(flow, path)  # said when it was built, not again when it is loaded,
    with monkeypatch.context() as m:  # and without touching the warning filters (a change
        for name in ("catch_warnings", "simplefilter", "filterwarnings"):  # shows every
            m.setattr(warnings, name, None)  # warning the program gave once again: review 28)
        flowkit.load_model(path)
    assert not [w for w in recwarn if "is a Gaussian" in str(w.message)]


def test_rows_on_a_bound_warn_and_rows_outside_name_their_column():
    """A zero on bounds from 0 is scored 1e-38 inside (review 25: 10% zero incomes gave a
    validation NLL of 8.2 where the positive rows scored 18.5 against 14.9 without them);
    a row outside was named without its column or value."""
    g = torch.Generator().manual_seed(0)
    x = torch.stack([torch.randn(400, generator=g), torch.randn(400, generator=g).exp()], -1)
    x[:40, 1] = 0.0
    flow = MAF(2, layers=1, hidden_features=(8,), bounds=([None, 0.0], [None, None]))
    with pytest.warns(flowkit.train.DataWarning, match=r"'data' has 40 of its 400 rows exactly "
                      r"on a bound \(column 1 = 0, for one\)") as w:
        flowkit.fit(flow, x, steps=1, progress=False)
    assert w[0].filename == __file__
    x[7, 1] = -2.0
    with pytest.raises(ValueError, match=r"\(row 7\).*The first of them has column 1 = -2, "
                                         r"outside \[0, inf\]"):
        flowkit.fit(flow, x, steps=1, progress=False)


def test_a_row_inside_the_first_bounds_but_outside_a_later_support_is_named_without_a_crash():
    """A flow built by hand with a second, narrower Logit: _first_outside looked for a column
    outside the first one and crashed (review 27)."""
    from flowkit.transforms import Logit

    flow = MAF(1, layers=1, hidden_features=(4,), transformer="spline", bounds=([0.0], [10.0]))
    flow.transform.transforms.insert(1, Logit([-10.0], [-1.0]))  # after the first: z < -1 only
    x = torch.full((5, 1), 5.0)  # inside [0, 10], z = 0 outside (-10, -1)
    with pytest.raises(ValueError, match=r"holds 5 row\(s\).*log-density -inf"):
        flowkit.fit(flow, x, steps=1, progress=False)


@pytest.mark.parametrize("base", ["standard", "learnable", "conditional"])
@pytest.mark.parametrize("builder", [MAF, IAF])
def test_sample_from_noise_maps_the_base_noise_rsample_draws(builder, base):
    """Review 37: the zero-noise action of docs/rl.md, transform.inverse(0), ignored a
    conditional base's mean. sample_from_noise maps the base's standard-normal noise: the
    noise rsample draws gives rsample's samples, zero noise the image of the base's mode."""
    torch.manual_seed(0)
    flow = builder(2, layers=2, hidden_features=(8,), context_features=3, seed=1,
                   learnable_base=base == "learnable", conditional_base=base == "conditional")
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.3 * torch.randn_like(p))
    flow = flow.double().eval()
    c = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(7)
    x = flow.rsample(4, c)
    torch.manual_seed(7)
    noise = torch.randn(4, 5, 2, dtype=torch.float64)
    torch.testing.assert_close(flow.sample_from_noise(noise, c), x)
    # with their log-density from the same pass (review 43: a tempered proposal's density)
    warm, log_q = flow.sample_from_noise(0.7 * noise, c, log_prob=True)
    assert log_q.shape == (4, 5)
    torch.testing.assert_close(log_q, flow.log_prob(warm, c))
    zero = flow.sample_from_noise(torch.zeros(2, dtype=torch.float64), c)
    assert zero.shape == (5, 2)
    h = flow.embed_context(c)
    if base == "conditional":
        mode = flow.base.loc_and_log_scale(h)[0]
    else:
        mode = flow.base.loc.expand(5, 2)
    torch.testing.assert_close(zero, flow.transform.inverse(mode, h)[0])
    if base != "standard":
        assert (zero - flow.transform.inverse(torch.zeros_like(mode), h)[0]).abs().max() > 1e-3
    zero.sum().backward()
    assert c.grad is not None and c.grad.abs().sum() > 0
    assert flow.sample_from_noise(noise[:, :1], c[:1]).shape == (4, 1, 2)
    with pytest.raises(ValueError, match=re.escape("'noise' should have shape (..., 2), got (3,)")):
        flow.sample_from_noise(torch.zeros(3, dtype=torch.float64), c)
    with pytest.raises(ValueError, match="'noise' contains infinite"):
        flow.sample_from_noise(torch.full((2,), math.inf, dtype=torch.float64), c)


def test_sample_from_noise_needs_a_base_with_a_noise_map():
    class Uniform(torch.nn.Module):
        features = 2

        def __init__(self):
            super().__init__()
            self.register_buffer("low", torch.zeros(2))

        def rsample(self, n):
            return torch.rand(n, 2)

        def log_prob(self, z):
            return torch.zeros(len(z))

    flow = Flow(Compose([Permutation(torch.tensor([1, 0]))]), Uniform())
    with pytest.raises(TypeError, match="Uniform has none"):
        flow.sample_from_noise(torch.zeros(2))
    unconditional = MAF(2, layers=1, hidden_features=(8,))
    assert unconditional.sample_from_noise(torch.zeros(3, 2)).shape == (3, 2)
