"""Standardize: fixed and data-set shift and scale, named errors, state, unit invariance.
(Round trips and log-determinants against autograd are in test_transforms' registry.)"""

import math

import pytest
import torch

from flowkit import MADE, Flow, StandardNormal
from flowkit.flows.builders import make_transformer
from flowkit.transforms import Compose, MaskedAutoregressive, Permutation, Standardize
from flowkit.transforms.standardize import collect_statistics, uninitialized


def test_fixed_values_and_constant_log_det():
    t = Standardize(3, shift=[1.0, -2.0, 1000.0], scale=[2.0, 0.5, 100.0]).double()
    x = torch.tensor([[3.0, -1.0, 1100.0], [1.0, -2.0, 900.0]], dtype=torch.float64)
    z, log_det = t(x)
    assert torch.equal(z, torch.tensor([[1.0, 2.0, 1.0], [0.0, 0.0, -1.0]], dtype=torch.float64))
    expected = -(math.log(2.0) + math.log(0.5) + math.log(100.0))
    assert torch.allclose(log_det, torch.full((2,), expected, dtype=torch.float64), atol=1e-15)
    assert t.initialized


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shift": [0.0, 0.0], "scale": [1.0, 0.0]}, r"'scale' should be positive .*\[1\]"),
        ({"shift": [0.0, 0.0], "scale": [-1.0, 1.0]}, r"'scale' should be positive .*\[0\]"),
        ({"shift": [0.0, 0.0], "scale": [1.0, math.inf]}, r"'scale' should be positive and finite"),
        ({"shift": [0.0, 0.0], "scale": [math.nan, 1.0]}, r"'scale' should be positive and finite"),
        ({"shift": [math.nan, 0.0], "scale": [1.0, 1.0]}, r"'shift' should be finite"),
        ({"shift": [0.0, -math.inf], "scale": [1.0, 1.0]}, r"'shift' should be finite"),
        ({"shift": [0.0, 0.0, 0.0], "scale": [1.0, 1.0]}, r"'shift' should have shape \(2,\)"),
        ({"shift": [0.0, 0.0], "scale": [[1.0, 1.0]]}, r"'scale' should have shape \(2,\)"),
        ({"shift": [0.0, 0.0]}, r"pass both 'shift' and 'scale'"),
        ({"scale": [1.0, 1.0]}, r"pass both 'shift' and 'scale'"),
        ({"shift": [0.0, 0.0], "scale": [1e-50, 1.0]}, r"'scale' .* underflows to zero"),
    ],
)
def test_bad_shift_or_scale_is_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Standardize(2, **kwargs)


def test_bad_features_and_non_finite_data():
    with pytest.raises(ValueError, match="'features'"):
        Standardize(0)
    with pytest.raises(ValueError, match="NaN or Inf"):
        Standardize.from_data(torch.tensor([[0.0, math.nan], [1.0, 2.0]]))
    with pytest.raises(ValueError, match=r"'x' should have shape \(N, D\)"):
        Standardize.from_data(torch.zeros(0, 2))
    lazy = Standardize(2)
    with pytest.raises(ValueError, match="NaN or Inf"):
        lazy(torch.tensor([[0.0, math.inf], [1.0, 2.0]]))
    assert not lazy.initialized  # a refused batch sets nothing


def test_first_training_batch_sets_mean_and_std_and_later_batches_do_not():
    t = Standardize(2)
    assert "uninitialized" in repr(t)
    x = torch.tensor([[0.0, 10.0], [2.0, 30.0], [4.0, 20.0]])
    z, _ = t(x)
    assert torch.allclose(t.shift, x.mean(0)) and torch.allclose(t.scale, x.std(0, correction=0))
    assert torch.allclose(z.mean(0), torch.zeros(2), atol=1e-6)
    assert torch.allclose(z.std(0, correction=0), torch.ones(2), atol=1e-6)
    before = t.shift.clone(), t.scale.clone()
    t(100.0 * x)
    assert torch.equal(t.shift, before[0]) and torch.equal(t.scale, before[1])


def test_uninitialized_is_the_identity_in_eval_mode_and_stays_uninitialized():
    t = Standardize(2).eval()
    x = torch.randn(5, 2) * 50.0
    z, log_det = t(x)
    assert torch.equal(z, x) and torch.equal(log_det, torch.zeros(5))
    assert not t.initialized


def test_sampling_first_in_training_mode_fixes_the_identity():
    """A transform that produced samples (e.g. trained by reverse KL) must not change later."""
    t = Standardize(2)
    z = torch.randn(5, 2)
    x, _ = t.inverse(z)
    assert torch.equal(x, z) and t.initialized
    t(torch.randn(5, 2) * 50.0 + 3.0)
    assert torch.equal(t.shift, torch.zeros(2)) and torch.equal(t.scale, torch.ones(2))


def test_constant_feature_gets_scale_one():
    x = torch.tensor([[747.0, 1.0], [747.0, 3.0], [747.0, 5.0]])
    t = Standardize.from_data(x)
    assert t.scale[0] == 1.0 and t.shift[0] == 747.0
    assert torch.allclose(t(x)[0][:, 0], torch.zeros(3))
    single = Standardize(2)
    single(torch.tensor([[3.0, 4.0]]))  # one row: no spread to measure
    assert torch.equal(single.scale, torch.ones(2))
    assert torch.equal(single.shift, torch.tensor([3.0, 4.0]))


def test_statistics_far_from_zero_keep_their_precision():
    """Moments are merged in float64 from centred batches, not from raw sums of squares."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4000, 2, generator=g, dtype=torch.float64) * 1e-3 + 1e6)
    model = Compose([Standardize(2), Permutation.reverse(2)]).double()
    with torch.no_grad(), collect_statistics(model) as pending:
        for chunk in x.split(300):  # uneven chunks
            model(chunk)
    (t,) = pending
    assert torch.allclose(t.shift, x.mean(0), rtol=0, atol=1e-9)
    assert torch.allclose(t.scale, x.std(0, correction=0), rtol=1e-9)
    assert not uninitialized(model)


def test_collect_statistics_passes_data_through_and_leaves_set_modules_alone():
    fixed = Standardize(2, shift=[1.0, 1.0], scale=[2.0, 2.0])
    lazy = Standardize(2)
    model = Compose([fixed, Permutation.reverse(2)])
    with collect_statistics(model) as pending:
        assert pending == []
    model = Compose([lazy, Permutation.reverse(2)]).eval()
    x = torch.randn(10, 2) * 5.0
    with collect_statistics(model) as pending:
        z, _ = model(x)
        assert torch.equal(z, x.flip(1)) and not lazy.initialized
    assert pending == [lazy] and lazy.initialized
    assert lazy._collecting is None


def test_collect_statistics_sets_nothing_when_the_block_fails():
    lazy = Standardize(2)
    with pytest.raises(RuntimeError, match="boom"), collect_statistics(lazy):
        lazy(torch.randn(4, 2))
        raise RuntimeError("boom")
    assert not lazy.initialized and lazy._collecting is None


def test_state_is_in_buffers_and_survives_a_state_dict_round_trip():
    t = Standardize(2)
    t(torch.randn(20, 2) * 3.0 + 1.0)
    state = t.state_dict()
    assert set(state) == {"shift", "scale", "initialized"}
    fresh = Standardize(2)
    fresh.load_state_dict(state)
    assert fresh.initialized and torch.equal(fresh.shift, t.shift)
    x = torch.randn(6, 2)
    assert torch.equal(fresh.eval()(x)[0], t.eval()(x)[0])
    assert not list(t.parameters())
    assert t.double().shift.dtype == torch.float64 and t.initialized.dtype == torch.bool


def _flow() -> Flow:
    torch.manual_seed(0)
    tau = make_transformer("spline")
    made = MADE(2, (16,), tau.params_per_feature, seed=0)
    with torch.no_grad():
        for p in made.parameters():
            p.add_(0.3 * torch.randn_like(p))
    layer = MaskedAutoregressive(made, tau, "maf")
    return Flow(Compose([Standardize(2), layer]), StandardNormal(2)).double()


def test_change_of_units_changes_log_prob_by_the_log_jacobian_only():
    """The same flow initialised on data in metres and on the same data in other units gives
    log p(y) = log p(x) - sum log|a| for y = a x + b: the layers after the standardization see
    the same numbers."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(500, 2, generator=g, dtype=torch.float64) @ torch.tensor(
        [[1.0, 0.5], [0.0, 0.3]], dtype=torch.float64
    )
    a = torch.tensor([100.0, 1e-3], dtype=torch.float64)
    b = torch.tensor([1000.0, -5.0], dtype=torch.float64)
    metres, other = _flow(), _flow()
    metres.log_prob(x)  # training mode: sets the standardization
    other.log_prob(x * a + b)
    metres.eval()
    other.eval()
    expected = metres.log_prob(x) - torch.log(a).sum()
    assert torch.allclose(other.log_prob(x * a + b), expected, rtol=0, atol=1e-9)
    samples = other.sample(1000)  # in the data's own units
    assert (samples[:, 0] - 1000.0).abs().mean() < 1000.0 and samples[:, 0].mean() > 500.0
