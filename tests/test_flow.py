"""Flow: normalized densities, sampling shapes, conditional use, and bad input."""

import numpy as np
import pytest
import torch

import flowkit
from flowkit import IAF, MAF

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
    untrained = grid_integral(flow)
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-2)
    for _ in range(30):
        x = two_moons(128, generator)
        loss = -flow.log_prob(x).mean()  # an IAF scores outside points through its solver
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trained = grid_integral(flow)
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


def test_random_permutation_and_learnable_base():
    flow = MAF(4, layers=3, hidden_features=(8,), permutation="random", learnable_base=True)
    assert isinstance(flow.base, flowkit.DiagonalGaussian)
    flow.log_prob(torch.randn(3, 4)).sum().backward()
    assert flow.base.loc.grad is not None


def test_seeded_sampling_is_reproducible():
    flow = MAF(2, layers=2, hidden_features=(8,))
    torch.manual_seed(5)
    a = flow.sample(10)
    torch.manual_seed(5)
    assert torch.equal(a, flow.sample(10))


# ---------------------------------------------------------------------------- bad input


@pytest.fixture
def conditional():
    return MAF(2, layers=1, hidden_features=(8,), context_features=3)


@pytest.mark.parametrize(
    "x, context, error, match",
    [
        (torch.randn(4, 3), torch.randn(4, 3), ValueError, r"'x' should have shape \(N, 2\)"),
        (torch.randn(2), torch.randn(3), ValueError, r"'x' should have shape \(N, 2\), got \(2,\)"),
        (torch.randn(0, 2), torch.randn(0, 3), ValueError, "'x' is an empty batch"),
        (torch.ones(4, 2, dtype=torch.long), torch.randn(4, 3), TypeError, "'x' should have dtype"),
        (torch.randn(4, 2).double(), torch.randn(4, 3), TypeError, "'x' should have dtype"),
        (torch.tensor([[0.0, float("nan")]]), torch.randn(1, 3), ValueError, "'x' contains NaN"),
        (torch.tensor([[0.0, float("inf")]]), torch.randn(1, 3), ValueError, "'x' contains NaN"),
        (torch.randn(4, 2), None, ValueError, "'context' is required"),
        (torch.randn(4, 2), torch.randn(4, 5), ValueError, r"'context' should have shape \(N, 3\)"),
        (torch.randn(4, 2), torch.randn(3, 3), ValueError, r"'context' should have shape \(4, 3\)"),
        (torch.randn(4, 2), torch.randn(4, 3, 1), ValueError, "'context' should have shape"),
        ([[0.0, 1.0]], torch.randn(1, 3), TypeError, "'x' should be a torch.Tensor"),
    ],
)
def test_bad_input_names_the_argument(conditional, x, context, error, match):
    with pytest.raises(error, match=match):
        conditional.log_prob(x, context)


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
        conditional.sample(context=torch.randn(2, 2, 3))


@pytest.mark.parametrize("n", [2.5, True, "3", 0, -1, torch.tensor(3)])
def test_sample_count_must_be_a_positive_integer(conditional, n):
    """Checked by flowkit.validation.check_n, with the message of the discrete models (a float
    used to reach torch and fail with a TypeError that did not name 'n')."""
    with pytest.raises(ValueError, match=r"'n' should be a positive number of samples, got "):
        MAF(2, layers=1).sample(n)
    with pytest.raises(ValueError, match=r"'n' should be a positive number of samples, got "):
        conditional.sample(n, torch.randn(2, 3))
    with pytest.raises(ValueError, match=r"'n' should be a positive number of samples, got "):
        IAF(2, layers=1).sample_and_log_prob(n)


def test_numpy_sample_count_is_accepted():
    assert MAF(2, layers=1).sample(np.int64(3)).shape == (3, 2)


@pytest.mark.parametrize("method", ["sample", "rsample", "sample_and_log_prob", "log_prob"])
def test_context_that_is_not_a_tensor_is_a_type_error(conditional, method):
    context = [0.0, 1.0, 2.0]
    args = (torch.randn(2, 2), context) if method == "log_prob" else (2, context)
    with pytest.raises(TypeError, match=r"'context' should be a torch.Tensor .*got list"):
        getattr(conditional, method)(*args)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(layers=0), "'layers'"),
        (dict(permutation="shuffle"), "'permutation'"),
        (dict(transformer="planar"), "'transformer'"),
    ],
)
def test_bad_builder_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MAF(2, **kwargs)


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
    flow = MAF(2, layers=1)
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
