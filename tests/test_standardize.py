"""Standardize: fixed and data-set shift and scale, named errors, state, unit invariance.
(Round trips and log-determinants against autograd are in test_transforms' registry.)"""

import copy
import math
import pickle
import warnings

import pytest
import torch

from flowkit import MADE, MAF, Flow, StandardNormal
from flowkit.flows.builders import DEFAULT_STANDARDIZATION
from flowkit.transforms import Compose, MaskedAutoregressive, Permutation, Standardize, standardize
from flowkit.transforms.elementwise import make_transformer
from flowkit.transforms.standardize import (
    SingleRowWarning,
    set_from_data,
    standardizations_to_set,
)


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


def test_sampling_first_in_training_mode_fixes_the_identity_once_an_optimizer_steps():
    """A transform that produced samples that were trained through (reverse KL: an optimizer
    stepped after them) must not change later; before that step, the samples were only a
    look, and the first training batch replaces the identity."""
    data = torch.randn(5, 2) * 50.0 + 3.0
    for step in (True, False):
        t = Standardize(2)
        z = torch.randn(5, 2)
        x, _ = t.inverse(z)
        assert torch.equal(x, z) and t.initialized
        if step:
            torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1).step()
        t(data)
        if step:
            assert torch.equal(t.shift, torch.zeros(2)) and torch.equal(t.scale, torch.ones(2))
        else:
            torch.testing.assert_close(t.shift, data.mean(0))


def test_an_rsample_to_check_shapes_gives_way_to_a_hand_written_loop():
    """Review 29: a zuko user's shape check, ``flow().rsample((5,))``, before a training loop
    of their own fixed the identity for good: data near 1000 trained to a loss of 516
    against 5.94. The loop's first batch now sets the standardization."""
    import flowkit

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 2, generator=g) * 30.0 + 1000.0
    for look in ("rsample", "rsample_and_log_prob", "entropy"):
        torch.manual_seed(0)
        flow = flowkit.MAF(2, layers=2, hidden_features=(16,))
        if look == "rsample":
            assert flow().rsample((5,)).shape == (5, 2)
        elif look == "rsample_and_log_prob":
            flow().rsample_and_log_prob((5,))[1].sum().backward()
        else:
            flow().entropy(8)
        optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
        for rows in x.split(64):
            loss = -flow.log_prob(rows).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        std = flow.transform.transforms[0]
        torch.testing.assert_close(std.shift, x[:64].mean(0), msg=look)
        assert loss.item() < 15.0, (look, loss.item())
    # an rsample and a first data batch in one loss: the data replace the identity that the
    # samples' graph used, which backward still reads (review 30: an in-place error)
    flow = flowkit.MAF(2, layers=2, hidden_features=(16,))
    samples = flow.rsample(16)
    (samples.square().sum() - flow.log_prob(x[:64]).sum()).backward()
    torch.testing.assert_close(flow.transform.transforms[0].shift, x[:64].mean(0))
    # another model's optimizer steps do not count as training through the samples (review 31:
    # a shape check, an unrelated step, then the loop kept the identity: 9557 against 10.6)
    other = torch.nn.Linear(2, 1)
    for then in ("loop", "fit"):
        flow = flowkit.MAF(2, layers=2, hidden_features=(16,))
        flow().entropy(8) if then == "fit" else flow().rsample((5,))
        torch.optim.SGD(other.parameters(), lr=0.1).step()
        if then == "fit":
            flowkit.fit(flow, x, valid=None, steps=1, seed=0, progress=False, device="cpu")
            torch.testing.assert_close(flow.transform.transforms[0].shift, x.mean(0))
        else:
            flow.log_prob(x[:64]).mean().backward()
            torch.testing.assert_close(flow.transform.transforms[0].shift, x[:64].mean(0))
    # the flow's own samples keep the identity: their log-density is the one sampling gave
    flow = flowkit.MAF(2, layers=2, hidden_features=(16,))
    samples, log_p = flow().rsample_and_log_prob((64,))
    torch.testing.assert_close(flow.log_prob(samples.clone()), log_p)
    assert torch.equal(flow.transform.transforms[0].scale, torch.ones(2))


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
    x = torch.randn(4000, 2, generator=g, dtype=torch.float64) * 1e-3 + 1e6
    model = Compose([Standardize(2), Permutation.reverse(2)]).double()
    (t,) = set_from_data(model, [(chunk,) for chunk in x.split(300)], call=model)  # uneven
    assert torch.allclose(t.shift, x.mean(0), rtol=0, atol=1e-9)
    assert torch.allclose(t.scale, x.std(0, correction=0), rtol=1e-9)
    assert not standardizations_to_set(model)


class _Counting(Permutation):
    calls = 0

    def forward(self, x, context=None):
        type(self).calls += 1
        return super().forward(x, context)


def test_set_from_data_stops_each_pass_early_and_keeps_the_mode():
    """The layers behind the standardizers are not run; BatchNorm-like state is untouched."""
    lazy = Standardize(2)
    model = Compose([lazy, _Counting(torch.tensor([1, 0]))])
    x = torch.randn(10, 2) * 5.0 + 2.0
    assert set_from_data(model, [(x[:4],), (x[4:],)], call=model) == [lazy]
    assert _Counting.calls == 0 and model.training and lazy._collector is None
    assert torch.allclose(lazy.shift, x.mean(0))
    assert torch.allclose(lazy.scale, x.std(0, correction=0))
    assert set_from_data(model, [(x,)], call=model) == []  # nothing left to set


def test_set_from_data_sets_both_standardizers_of_a_conditional_flow():
    from flowkit import MAF

    flow = MAF(2, layers=2, hidden_features=(8,), context_features=3)
    x, c = torch.randn(100, 2) * 10.0, torch.randn(100, 3) + 50.0
    done = set_from_data(flow, [(x[:50], c[:50]), (x[50:], c[50:])])
    assert len(done) == 2 and not standardizations_to_set(flow)
    assert torch.allclose(flow.standardize_context.shift, c.mean(0))
    assert torch.allclose(flow.transform.transforms[0].scale, x.std(0, correction=0))


def test_set_from_data_sets_nothing_when_a_batch_fails():
    lazy = Standardize(2)
    bad = torch.tensor([[0.0, math.nan]])
    with pytest.raises(ValueError, match="NaN or Inf"):
        set_from_data(lazy, [(torch.randn(4, 2),), (bad,)], call=lazy)
    assert not lazy.initialized and lazy._collector is None


@pytest.mark.parametrize(("batches", "name"), [
    (torch.randn(4, 2), "'batches' should be an iterable of batches"),  # rows would be unpacked
    ([torch.randn(4, 2)], r"'batches\[0\]' should be a tuple"),
    (3, "'batches' should be an iterable"),
])
def test_set_from_data_names_batches_of_the_wrong_kind(batches, name):
    lazy = Standardize(2)
    with pytest.raises(TypeError, match=name):
        set_from_data(lazy, batches, call=lazy)
    assert not lazy.initialized


def test_set_from_data_warns_when_one_row_sets_the_scale_to_one():
    lazy = Standardize(2)
    with pytest.warns(SingleRowWarning, match="'batches' hold a single row"):
        set_from_data(lazy, [(torch.tensor([[5.0, 7.0]]),)], call=lazy)
    assert lazy.shift.tolist() == [5.0, 7.0] and lazy.scale.tolist() == [1.0, 1.0]
    flow = MAF(2, layers=1, hidden_features=(8,), context_features=1, standardize=True)
    assert len(standardizations_to_set(flow)) == 2  # on the data and on the context
    with warnings.catch_warnings(record=True) as caught:  # review 20: once per Standardize
        warnings.simplefilter("always")
        set_from_data(flow, [(torch.tensor([[5.0, 7.0]]), torch.tensor([[1.0]]))])
    assert [str(w.message)[:33] for w in caught] == ["'batches' hold a single row: it s"]


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


# ------------------------------------------------------------------ the builders' standardize


def test_builders_standardize_data_and_context_by_default():
    from flowkit import IAF, MAF

    for build in (MAF, IAF):
        flow = build(3, layers=2, hidden_features=(8,), context_features=2)
        first = flow.transform.transforms[0]
        assert isinstance(first, Standardize) and first.features == 3
        assert isinstance(flow.standardize_context, Standardize)
        assert flow.standardize_context.features == 2
        assert first.covariance == DEFAULT_STANDARDIZATION
        assert flow.config["kwargs"]["standardize"] == DEFAULT_STANDARDIZATION  # True, as stored
        assert len(standardizations_to_set(flow)) == 2
        plain = build(3, layers=2, hidden_features=(8,), context_features=2, standardize=False)
        assert not standardizations_to_set(plain) and plain.standardize_context is None
        assert not any(isinstance(m, Standardize) for m in plain.modules())
    assert MAF(2, layers=1).standardize_context is None
    with pytest.raises(ValueError, match="'standardize'"):
        MAF(2, standardize="yes")


@pytest.mark.parametrize("transformer", ["affine", "spline"])
@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_builders_are_exactly_invariant_to_units_of_data_and_context(builder, transformer):
    """Fitted to y = a x + b with context c' = a' c + b', the same flow gives
    log p(y | c') = log p(x | c) - sum log a, to float64 rounding."""
    import flowkit

    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, 2, generator=g, dtype=torch.float64)
    c = torch.randn(300, 2, generator=g, dtype=torch.float64)
    a, b = torch.tensor([1e-3, 250.0], dtype=torch.float64), torch.tensor([7.0, -1e4]).double()
    a_c, b_c = torch.tensor([40.0, 0.01], dtype=torch.float64), torch.tensor([1e3, 2.0]).double()

    def flow():
        torch.manual_seed(0)
        f = getattr(flowkit, builder)(
            2, layers=2, hidden_features=(16,), context_features=2, transformer=transformer
        ).double()
        with torch.no_grad():  # leave the identity
            for p in f.parameters():
                p.add_(0.2 * torch.randn_like(p))
        return f

    own, other = flow(), flow()
    set_from_data(own, [(x, c)])
    set_from_data(other, [(x * a + b, c * a_c + b_c)])
    expected = own.log_prob(x[:20], c[:20]) - torch.log(a).sum()
    got = other.log_prob(x[:20] * a + b, c[:20] * a_c + b_c)
    assert torch.allclose(got, expected, rtol=0, atol=1e-8)


def test_fit_sets_the_standardization_from_the_whole_training_set():
    import flowkit

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 2, generator=g) * torch.tensor([100.0, 0.01]) + torch.tensor([1e3, 0.0])
    c = torch.randn(3000, 1, generator=g) * 50.0
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=1)
    flowkit.fit(flow, (x, c), valid=None, steps=1, batch_size=64, seed=0, progress=False,
                device="cpu")
    data_std, context_std = flow.transform.transforms[0], flow.standardize_context
    assert torch.allclose(data_std.shift, x.double().mean(0).float())  # all rows, not a batch
    assert torch.allclose(data_std.scale, x.double().std(0, correction=0).float())
    assert torch.allclose(context_std.shift, c.double().mean(0).float())


def test_fit_on_fresh_samples_sets_the_standardization_from_the_first_batch():
    import flowkit

    def sample(n, generator):
        return torch.randn(n, 2, generator=generator) * 30.0 + 500.0

    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    flowkit.fit(flow, sample, steps=2, batch_size=512, seed=0, progress=False, device="cpu")
    std = flow.transform.transforms[0]
    assert std.initialized and (std.shift - 500.0).abs().max() < 5.0
    assert ((std.scale - 30.0).abs() < 5.0).all()


def test_standardization_survives_save_and_load(tmp_path):
    import flowkit

    flow = flowkit.MAF(2, layers=2, hidden_features=(8,), context_features=1)
    x, c = torch.randn(100, 2) * 7.0 + 3.0, torch.randn(100, 1) * 9.0
    flow.log_prob(x, c)  # training mode: sets both
    flowkit.save_model(flow, tmp_path / "flow.pt")
    loaded = flowkit.load_model(tmp_path / "flow.pt")
    assert not standardizations_to_set(loaded)
    assert torch.equal(loaded.transform.transforms[0].shift, flow.transform.transforms[0].shift)
    assert torch.equal(loaded.log_prob(x, c), flow.eval().log_prob(x, c))
    fresh = flowkit.MAF(2, layers=2, hidden_features=(8,))
    flowkit.save_model(fresh, tmp_path / "fresh.pt")
    loaded_fresh = flowkit.load_model(tmp_path / "fresh.pt")
    assert len(standardizations_to_set(loaded_fresh)) == 1  # still unset


def test_sampling_first_fixes_the_data_identity_and_sets_the_context():
    import flowkit

    flow = flowkit.IAF(2, layers=2, hidden_features=(8,), context_features=1)
    c = torch.randn(50, 1) * 4.0 + 10.0
    flow.rsample(context=c)
    data_std = flow.transform.transforms[0]
    assert data_std.initialized and torch.equal(data_std.scale, torch.ones(2))
    assert torch.allclose(flow.standardize_context.shift, c.mean(0))


@pytest.mark.parametrize("peek", ["sample", "lazy sample", "log_prob of one row",
                                  "log_prob of a few rows under no_grad"])
def test_a_look_before_fit_does_not_decide_the_standardization(peek):
    """A new flow is in training mode: samples drawn, or a few rows scored, before fit set the
    standardization only provisionally, and fit replaces it from its whole training set."""
    import flowkit

    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 2, generator=g) * torch.tensor([1e4, 1.0]) + torch.tensor([1e5, 0.0])
    c = torch.randn(400, 1, generator=g) * 1e3 + 5e3
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=1)
    if peek == "sample":
        flow.sample(5, c[:1])
    elif peek == "lazy sample":
        flow(c[:1]).sample((5,))
    elif peek == "log_prob of one row":
        flow.log_prob(x[:1], c[:1])
    else:
        with torch.no_grad():
            flow.log_prob(x[:3], c[:3])
    assert len(standardizations_to_set(flow)) == 2  # provisional
    flowkit.fit(flow, (x, c), valid=None, steps=1, batch_size=64, seed=0, progress=False,
                device="cpu")
    data_std, context_std = flow.transform.transforms[0], flow.standardize_context
    assert not standardizations_to_set(flow)
    assert torch.allclose(data_std.shift, x.double().mean(0).float())
    assert torch.allclose(data_std.scale, x.double().std(0, correction=0).float())
    assert torch.allclose(context_std.shift, c.double().mean(0).float())


def test_fit_on_fresh_samples_replaces_a_provisional_standardization():
    import flowkit

    def sample(n, generator):
        return torch.randn(n, 2, generator=generator) * 30.0 + 500.0

    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    flow.sample(3)  # provisional identity
    flowkit.fit(flow, sample, steps=1, batch_size=512, seed=0, progress=False, device="cpu")
    std = flow.transform.transforms[0]
    assert not std.provisional and (std.shift - 500.0).abs().max() < 5.0


def test_a_provisional_value_is_not_re_estimated_by_later_calls():
    """In your own loop the first training batch sets the standardization; later batches
    (another scale, here) leave it as it is, so the layers train against one fixed map."""
    t = Standardize(2)
    first = torch.randn(64, 2) * 3.0 + 1.0
    t(first)
    assert t.provisional
    shift, scale = t.shift.clone(), t.scale.clone()
    t(torch.randn(64, 2) * 100.0)
    assert torch.equal(t.shift, shift) and torch.equal(t.scale, scale)
    with torch.no_grad():
        t.inverse(torch.randn(4, 2))  # a look at samples
    assert torch.equal(t.shift, shift) and t.provisional
    t.inverse(torch.randn(4, 2))  # samples to train through: no call re-estimates it ...
    t(torch.randn(64, 2) * 100.0)
    assert torch.equal(t.shift, shift) and t.provisional
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1).step()
    assert not t.provisional  # ... and once an optimizer stepped, it is the model's


def test_training_by_reverse_kl_fixes_the_identity_and_fit_keeps_it():
    """Reparameterized samples in training mode (gradients on) followed by an optimizer step
    are training by reverse KL: the identity the samples were drawn with is fixed, and a later
    fit does not replace it."""
    import flowkit

    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3, fused=True)
    x, log_q = flow().rsample_and_log_prob((16,))
    (log_q + 0.5 * x.square().sum(-1)).mean().backward()
    optimizer.step()
    std = flow.transform.transforms[0]
    assert std.initialized and not std.provisional and not standardizations_to_set(flow)
    for copied in (copy.deepcopy(flow), pickle.loads(pickle.dumps(flow))):  # final in copies
        assert not standardizations_to_set(copied)
    flowkit.fit(flow, torch.randn(200, 2) * 50.0 + 7.0, steps=1, seed=0, progress=False,
                device="cpu")
    assert torch.equal(std.shift, torch.zeros(2)) and torch.equal(std.scale, torch.ones(2))
    peeked = flowkit.MAF(2, layers=1, hidden_features=(8,))
    peeked.sample(4)  # a look first: provisional ...
    peeked.rsample(16)
    torch.optim.SGD(peeked.parameters(), lr=1e-3).step()  # ... then a step through samples
    assert not standardizations_to_set(peeked)


@pytest.mark.parametrize("look", ["entropy", "kl_divergence", "rsample"])
def test_a_monte_carlo_look_with_gradients_before_fit_does_not_decide_it(look):
    """``flow().entropy()`` or a KL of a new flow draws reparameterized samples in training
    mode; with no optimizer step after it, fit still standardizes by its data (review 10:
    a held-out NLL of 933 instead of 9.0 on data near 1000)."""
    import flowkit

    torch.manual_seed(0)
    x = torch.randn(400, 2) * 50.0 + 1000.0
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    if look == "entropy":
        flow().entropy(16)
    elif look == "kl_divergence":
        torch.distributions.kl_divergence(
            flow(), torch.distributions.Independent(torch.distributions.Normal(
                torch.zeros(2), torch.ones(2)), 1))
    else:
        flow.rsample(16).sum().backward()
    std = flow.transform.transforms[0]
    assert std.provisional and standardizations_to_set(flow) == [std]
    flowkit.fit(flow, x, valid=None, steps=1, seed=0, progress=False, device="cpu")
    assert not std.provisional
    torch.testing.assert_close(std.shift, x.mean(0).double().float())


def test_a_value_from_one_row_gives_way_to_the_first_training_batch():
    """One row has no spread to measure: a look at one context (``flow(c[:1]).entropy()``)
    or a check of one point sets a value that the first training-mode call with gradients on
    more rows replaces (review 10: it stayed, shift = that row, scale = 1). Calls of one row
    each (a policy acting on one state at a time) keep the first value."""
    import flowkit

    torch.manual_seed(0)
    c = torch.randn(64, 3) * 10.0 + 5.0
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=3)
    flow(c[:1]).entropy(8)
    std = flow.standardize_context
    torch.testing.assert_close(std.shift, c[0])
    flow.log_prob(torch.randn(64, 2), c).mean().backward()  # the loop's first step
    torch.testing.assert_close(std.shift, c.mean(0).double().float())
    # nor do a few contexts sampled at with gradients (review 31: three set the scale)
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=3)
    flow(c[:3]).entropy(8)
    assert flow.standardize_context.provisional
    flow.log_prob(torch.randn(64, 2), c).mean().backward()
    torch.testing.assert_close(flow.standardize_context.shift, c.mean(0).double().float())
    torch.testing.assert_close(flow.standardize_context.scale, c.std(0, correction=0))
    one_at_a_time = Standardize(3)
    with warnings.catch_warnings():  # no optimizer step trained through it: nothing to say
        warnings.simplefilter("error")
        for row in c[:5].split(1):
            one_at_a_time(row)
    torch.testing.assert_close(one_at_a_time.shift, c[0])


def test_a_loaded_or_set_value_is_not_provisional(tmp_path):
    import flowkit

    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    flow.log_prob(torch.randn(10, 2) * 5.0)
    flowkit.save_model(flow, tmp_path / "flow.pt")
    again = flowkit.MAF(2, layers=1, hidden_features=(8,))
    again.sample(2)  # provisional before the load
    again.load_state_dict(flowkit.load_model(tmp_path / "flow.pt").state_dict())
    assert not standardizations_to_set(again)
    assert not standardizations_to_set(flowkit.load_model(tmp_path / "flow.pt"))
    t = Standardize(2)
    t(torch.randn(5, 2))
    t.set([0.0, 0.0], [2.0, 2.0])
    assert not t.provisional and "provisional" not in repr(t)
    lazy = Standardize(2)
    lazy(torch.randn(5, 2))
    assert "provisional" in repr(lazy)
    done = set_from_data(lazy, [(torch.full((4, 2), 3.0) + torch.arange(4.0)[:, None],)],
                         call=lambda x: lazy(x))
    assert done == [lazy] and not lazy.provisional
    assert torch.allclose(lazy.shift, 4.5 * torch.ones(2))


def test_a_file_saved_before_standardize_existed_loads_as_it_was(tmp_path):
    """Files saved before the builders had 'standardize' (format 1, a bare torch.save, and
    format 2 as main wrote it) have no such argument in their config: they rebuild the flow
    without standardization and load strictly, giving the same densities."""
    import warnings

    import flowkit
    from flowkit.checkpoint import LegacyFormatWarning

    for build in (flowkit.MAF, flowkit.IAF):
        flow = build(2, layers=2, hidden_features=(8,), context_features=1, standardize=False)
        del flow.config["kwargs"]["standardize"]  # as the previous version recorded it
        x, c = torch.randn(5, 2), torch.randn(5, 1)
        expected = flow.eval().log_prob(x, c)
        format_2 = tmp_path / f"{build.__name__}-2.pt"
        flowkit.save_model(flow, format_2)
        format_1 = tmp_path / f"{build.__name__}-1.pt"
        torch.save({"flowkit_format": 1, "kind": "model",
                    "model": {"config": flow.config, "state_dict": flow.state_dict()}}, format_1)
        for path in (format_1, format_2):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", LegacyFormatWarning)
                loaded = flowkit.load_model(path)
            assert not any(isinstance(m, Standardize) for m in loaded.modules())
            assert loaded.config["kwargs"]["standardize"] is False
            assert torch.equal(loaded.log_prob(x, c), expected)


def test_fit_sets_a_standardize_behind_another_from_the_standardized_data():
    """Two flows' transforms stacked in one Compose (each starts with a Standardize): the inner
    one is set from what the outer one gives it, not from the raw data (it was set in the same
    pass from the raw rows, and the stacked flow trained at NLLs of 10^5)."""
    import flowkit

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 2, generator=g) * 3.0 + 1e4
    torch.manual_seed(0)
    first, second = (flowkit.MAF(2, layers=1, hidden_features=(8,)) for _ in range(2))
    stacked = Flow(Compose([first.transform, second.transform]), StandardNormal(2))
    flowkit.fit(stacked, x, steps=1, seed=0, progress=False, device="cpu")
    outer, inner = first.transform.transforms[0], second.transform.transforms[0]
    assert torch.allclose(outer.shift, x.double().mean(0).float())
    assert inner.shift.abs().max() < 1e-3 and (inner.scale - 1.0).abs().max() < 1e-3
    assert set_from_data(stacked, [(x,)]) == []  # nothing left to set


def test_a_look_without_gradients_gives_way_to_the_first_step_of_a_hand_written_loop():
    """flow.sample (no gradients) before a loop of your own: the loop's first training batch,
    not the look, sets both standardizations; later batches keep them."""
    import flowkit

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 2, generator=g) * 50.0 + 1000.0
    c = torch.randn(256, 1, generator=g) * 10.0 + 300.0
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=1)
    flow.sample(4, c[0])
    data_std, context_std = flow.transform.transforms[0], flow.standardize_context
    assert torch.equal(data_std.scale, torch.ones(2))  # the look set the identity
    (-flow.log_prob(x, c).mean()).backward()  # the loop's first step
    torch.testing.assert_close(data_std.shift, x.mean(0))
    torch.testing.assert_close(context_std.shift, c.mean(0))
    shift = data_std.shift.clone()
    flow.log_prob(x[:64] * 2.0, c[:64])  # a later step
    assert torch.equal(data_std.shift, shift)


# ------------------------------------------------------------------ full covariance


def _correlated(n, generator, dtype=torch.float64):
    mixing = torch.tensor([[1.0, 0.0, 0.0], [0.9, 0.3, 0.0], [-0.5, 0.7, 0.2]], dtype=dtype)
    x = torch.randn(n, 3, generator=generator, dtype=dtype) @ mixing.T
    return x * torch.tensor([1e3, 1.0, 1e-3], dtype=dtype) + torch.tensor([5e3, -2.0, 0.0])


def test_full_covariance_whitens_the_data_it_was_set_from(monkeypatch):
    """Without shrinkage the standardized rows have exactly the identity covariance; with it,
    (1 - a) R + a I = L L^T, and log|det| is -sum log scale - sum log diag L."""
    x = _correlated(2000, torch.Generator().manual_seed(0))
    monkeypatch.setattr(Standardize, "SHRINKAGE", 0.0)
    monkeypatch.setattr(standardize, "oas_shrinkage", lambda correlation, rows: 0.0)
    t = Standardize.from_data(x, covariance="full")
    z, log_det = t(x)
    assert torch.allclose(z.mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(torch.cov(z.T, correction=0), torch.eye(3, dtype=torch.float64),
                          atol=1e-10)
    covariance = torch.cov(x.T, correction=0)
    assert torch.allclose(log_det, torch.full((2000,), -0.5 * torch.logdet(covariance).item(),
                                              dtype=torch.float64), atol=1e-9)
    monkeypatch.setattr(Standardize, "SHRINKAGE", 0.25)
    shrunk = Standardize.from_data(x, covariance="full")
    correlation = torch.corrcoef(x.T)
    expected = 0.75 * correlation + 0.25 * torch.eye(3, dtype=torch.float64)
    assert torch.allclose(shrunk.cholesky @ shrunk.cholesky.T, expected, atol=1e-10)
    assert torch.equal(torch.triu(shrunk.cholesky, 1), torch.zeros(3, 3, dtype=torch.float64))


def test_full_covariance_shrinks_by_the_rows_own_oas_when_they_are_few():
    """Review 42: 80 rows of 30 correlated features, where a shrinkage Gaussian (Ledoit-Wolf
    37.1 nats) beat every flow (about 40): the fixed 1% kept the sample correlation's noise.
    The shrinkage is now the rows' oracle approximating shrinkage (scikit-learn's OAS of the
    standardized rows), at least Standardize.SHRINKAGE."""
    g = torch.Generator().manual_seed(0)
    factors = torch.randn(30, 5, generator=g, dtype=torch.float64)

    def rows(n):
        return (torch.randn(n, 5, generator=g, dtype=torch.float64) @ factors.T
                + 0.5 * torch.randn(n, 30, generator=g, dtype=torch.float64))

    few, many = rows(80), rows(20000)
    for x, expected in ((few, None), (many, Standardize.SHRINKAGE)):
        t = Standardize.from_data(x, covariance="full")
        correlation = torch.corrcoef(x.T)
        shrunk = t.cholesky @ t.cholesky.T
        a = float(1.0 - shrunk[0, 1] / correlation[0, 1])
        if expected is None:
            covariance = pytest.importorskip("sklearn.covariance")
            z = ((x - x.mean(0)) / x.std(0, correction=0)).numpy()
            expected = covariance.OAS(assume_centered=True).fit(z).shrinkage_
            assert 0.05 < expected < 0.2
        assert a == pytest.approx(expected, rel=1e-6)
        torch.testing.assert_close(shrunk, (1 - a) * correlation + a * torch.eye(30,
                                   dtype=torch.float64))
    assert standardize.oas_shrinkage(torch.eye(4, dtype=torch.float64), 10) == 1.0


def test_full_covariance_round_trip_and_log_det_against_autograd():
    x = _correlated(500, torch.Generator().manual_seed(1))
    t = Standardize.from_data(x, covariance="full")
    z, log_det = t(x[:7])
    back, inverse_log_det = t.inverse(z)
    assert torch.allclose(back, x[:7], rtol=1e-12, atol=1e-9)
    assert torch.allclose(log_det, -inverse_log_det, rtol=0, atol=1e-12)
    for row, value in zip(x[:7], log_det, strict=True):
        jacobian = torch.autograd.functional.jacobian(lambda v: t(v[None])[0][0], row)
        assert torch.allclose(torch.logdet(jacobian), value, rtol=0, atol=1e-10)
        assert torch.equal(torch.triu(jacobian, 1), torch.zeros(3, 3, dtype=torch.float64))


def test_full_covariance_from_many_batches_equals_one_pass():
    """Co-moments merged batch by batch (uneven batches, data far from zero) give the values
    of one pass over all rows (to the float64 resolution of the third feature: deviations of
    1e-3 at 1e6)."""
    x = _correlated(3000, torch.Generator().manual_seed(2)) + 1e6
    one = Standardize.from_data(x, covariance="full")
    model = Compose([Standardize(3, covariance="full"), Permutation.reverse(3)]).double()
    (many,) = set_from_data(model, [(chunk,) for chunk in x.split(700)], call=model)
    for name in ("shift", "scale", "cholesky"):
        assert torch.allclose(getattr(many, name), getattr(one, name), rtol=1e-7, atol=1e-7)


def test_full_covariance_with_constant_and_collinear_features():
    """A constant feature is only shifted (scale 1, uncorrelated); exactly collinear features
    and fewer rows than features still give a finite, invertible map (the shrinkage)."""
    g = torch.Generator().manual_seed(3)
    u = torch.randn(200, 2, generator=g, dtype=torch.float64)
    x = torch.cat([u, u[:, :1] + u[:, 1:], torch.full((200, 1), 747.0, dtype=torch.float64)], 1)
    t = Standardize.from_data(x, covariance="full")
    assert t.scale[3] == 1.0 and torch.equal(t.cholesky[3], torch.tensor([0.0, 0, 0, 1]).double())
    z, log_det = t(x)
    assert torch.isfinite(z).all() and torch.isfinite(log_det).all()
    assert torch.allclose(t.inverse(z)[0], x, atol=1e-9)
    few = Standardize.from_data(torch.randn(3, 6, generator=g, dtype=torch.float64),
                                covariance="full")
    assert torch.isfinite(few.cholesky).all() and (torch.diagonal(few.cholesky) > 0).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"covariance": "block"}, r"'covariance' should be 'diagonal' or 'full', got 'block'"),
        ({"cholesky": torch.eye(2)}, r"'cholesky' was given but 'covariance' is 'diagonal'"),
        ({"covariance": "full", "shift": [0.0, 0.0], "scale": [1.0, 1.0]},
         r"pass 'shift', 'scale' and 'cholesky' together"),
        ({"covariance": "full", "cholesky": torch.eye(2)},
         r"pass 'shift', 'scale' and 'cholesky' together"),
        ({"covariance": "full", "shift": [0.0, 0.0], "scale": [1.0, 1.0],
          "cholesky": torch.eye(3)}, r"'cholesky' should have shape \(2, 2\)"),
        ({"covariance": "full", "shift": [0.0, 0.0], "scale": [1.0, 1.0],
          "cholesky": [[1.0, 0.5], [0.0, 1.0]]}, r"'cholesky' should be lower triangular"),
        ({"covariance": "full", "shift": [0.0, 0.0], "scale": [1.0, 1.0],
          "cholesky": [[1.0, 0.0], [0.5, 0.0]]}, r"'cholesky' should have a positive diagonal"),
        ({"covariance": "full", "shift": [0.0, 0.0], "scale": [1.0, 1.0],
          "cholesky": [[1.0, 0.0], [math.nan, 1.0]]}, r"'cholesky' should be finite"),
    ],
)
def test_bad_covariance_or_cholesky_is_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Standardize(2, **kwargs)


def test_a_diagonal_standardize_refuses_a_cholesky_in_set():
    with pytest.raises(ValueError, match="covariance='diagonal'"):
        Standardize(2).set([0.0, 0.0], [1.0, 1.0], torch.eye(2))
    with pytest.raises(ValueError, match="covariance='full'"):
        Standardize(2, covariance="full").set([0.0, 0.0], [1.0, 1.0])


@pytest.mark.parametrize("transformer", ["affine", "spline"])
@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_full_standardization_is_invariant_to_units_and_without_shrinkage_to_triangular_maps(
    builder, transformer, monkeypatch
):
    """Fitted to y = A x + b, the flow gives log p(y) = log p(x) - log det A: for any positive
    diagonal A (units), and without shrinkage for any lower-triangular A with a positive
    diagonal (each feature also shifted by the ones before it; the shrunk correlation of A x is
    not that of x carried over)."""
    import flowkit

    g = torch.Generator().manual_seed(4)
    x = _correlated(400, g)
    c = torch.randn(400, 2, generator=g, dtype=torch.float64)
    units = torch.diag(torch.tensor([1e-3, 250.0, 40.0], dtype=torch.float64))
    triangular = torch.tensor([[1e-3, 0.0, 0.0], [2e-3, 250.0, 0.0], [-1e-3, 0.5, 4e3]],
                              dtype=torch.float64)
    b = torch.tensor([7.0, -1e4, 3.0], dtype=torch.float64)

    def flow():
        torch.manual_seed(0)
        f = getattr(flowkit, builder)(3, layers=2, hidden_features=(16,), context_features=2,
                                      transformer=transformer, standardize="full").double()
        with torch.no_grad():  # leave the identity
            for p in f.parameters():
                p.add_(0.2 * torch.randn_like(p))
        return f

    for a, shrinkage in ((units, Standardize.SHRINKAGE), (triangular, 0.0)):
        monkeypatch.setattr(Standardize, "SHRINKAGE", shrinkage)
        if shrinkage == 0.0:  # the correlation, and so its shrinkage, changes with the map
            monkeypatch.setattr(standardize, "oas_shrinkage", lambda correlation, rows: 0.0)
        own, other = flow(), flow()
        set_from_data(own, [(x, c)])
        set_from_data(other, [(x @ a.T + b, c * 30.0)])
        expected = own.log_prob(x[:20], c[:20]) - torch.logdet(a)
        got = other.log_prob(x[:20] @ a.T + b, c[:20] * 30.0)
        assert torch.allclose(got, expected, rtol=0, atol=1e-8)
    assert other.standardize_context.covariance == "diagonal"  # the context: per feature


def test_full_standardization_is_saved_and_loaded_and_old_configs_keep_the_diagonal(tmp_path):
    import warnings

    import flowkit

    x = _correlated(300, torch.Generator().manual_seed(5)).float()
    flow = flowkit.MAF(3, layers=2, hidden_features=(8,), standardize="full")
    assert flow.config["kwargs"]["standardize"] == "full"
    set_from_data(flow, [(x,)])
    flowkit.save_model(flow, tmp_path / "full.pt")
    loaded = flowkit.load_model(tmp_path / "full.pt")
    assert loaded.transform.transforms[0].covariance == "full"
    assert torch.equal(loaded.log_prob(x[:5]), flow.eval().log_prob(x[:5]))
    # a file of config version 2 recorded standardize=True for the diagonal standardization
    old = flowkit.MAF(3, layers=2, hidden_features=(8,), standardize="diagonal")
    old.config["kwargs"]["standardize"] = True
    old.config["version"] = 2
    flowkit.save_model(old, tmp_path / "old.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = flowkit.load_model(tmp_path / "old.pt")
    assert again.transform.transforms[0].covariance == "diagonal"
    assert again.config["kwargs"]["standardize"] == "diagonal"


def test_is_initialized_follows_every_write_of_the_buffer():
    """The flag is read on the host only when the buffer changed (no device read per call),
    so loads, direct writes, pickles and buffers passed to torch.func.functional_call count."""

    a = Standardize.from_data(torch.randn(50, 2) * 3 + 1)
    b = Standardize(2)
    assert not b.is_initialized
    b.load_state_dict(a.state_dict())
    b.train()
    b(torch.randn(10, 2) * 100)  # a training-mode call leaves a loaded value alone
    assert b.is_initialized and torch.equal(b.shift, a.shift) and torch.equal(b.scale, a.scale)
    b.initialized.fill_(False)
    assert not b.is_initialized and standardizations_to_set(b) == [b]
    b.initialized.fill_(True)
    assert b.is_initialized and not standardizations_to_set(b)
    assert pickle.loads(pickle.dumps(a)).is_initialized
    fresh = Standardize(2).train()
    state = {k: v.clone() for k, v in a.state_dict().items()}
    torch.func.functional_call(fresh, state, (torch.randn(10, 2) * 100,))
    assert torch.equal(state["shift"], a.shift)  # set values passed in are not re-estimated


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_the_flows_own_samples_never_re_standardize_it(builder):
    """Review 43: a learnable base started at a guess of (40, -25) drew samples "in other
    units" than the unit scale the rule compared with, and a training-mode log_prob of them
    set the data standardization from them: 305 nats between sample_and_log_prob and log_prob,
    and an ELBO above log Z in a MAF's rsample-then-log_prob loop. The rule compares with the
    moments of the samples the identity gave."""
    import flowkit

    torch.manual_seed(0)
    flow = getattr(flowkit, builder)(2, layers=2, hidden_features=(16,), learnable_base=True)
    with torch.no_grad():
        flow.base.loc.copy_(torch.tensor([40.0, -25.0]))
        flow.base.log_scale.fill_(math.log(2.0))
    x, log_q = flow.sample_and_log_prob(256)
    # the samples, a view, a copy (review 44: a copy was re-standardized by a first version
    # that recognised the samples' memory)
    for same in (x, x.detach(), x[:100], x.clone()):
        torch.testing.assert_close(flow.log_prob(same), log_q[: len(same)])
    std = flow.transform.transforms[0]
    assert torch.equal(std.shift, torch.zeros(2)) and torch.equal(std.scale, torch.ones(2))
    # a reverse-KL step through rsample and log_prob, then the map stays
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
    x = flow.rsample(64)
    loss = flow.log_prob(x).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert not std.provisional and torch.equal(std.scale, torch.ones(2))
    # data in other units before any sample was trained through still set it
    fresh = getattr(flowkit, builder)(2, layers=1, hidden_features=(8,))
    fresh.rsample(5)
    data = torch.randn(64, 2) * 30.0 + 1000.0
    fresh.log_prob(data)
    torch.testing.assert_close(fresh.transform.transforms[0].shift, data.mean(0))


def test_contexts_sampled_at_are_fixed_once_an_optimizer_steps_through_the_samples():
    """Review 43: in amortized variational inference (samples at a batch of contexts, no
    data) the context standardization was a look at every step, re-set from each batch of
    contexts (KL 0.74 against 0.035 without it). The contexts of the first sampling pass
    now set it, and the first optimizer step fixes it."""
    import flowkit

    torch.manual_seed(0)
    flow = flowkit.IAF(2, layers=2, hidden_features=(16,), context_features=3)
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
    std = flow.standardize_context
    first = torch.randn(128, 3) * 5.0 + 2.0
    for step in range(3):
        c = first if step == 0 else torch.randn(128, 3) * 5.0 - 7.0
        x, log_q = flow.sample_and_log_prob(None, c)
        loss = (log_q + 0.5 * (x**2).sum(-1)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.testing.assert_close(std.shift, first.mean(0))
        torch.testing.assert_close(std.scale, first.std(0, correction=0))
    assert not std.provisional
    # before any step a later data batch still replaces such a look (review 31)
    look = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=3)
    look(torch.randn(3, 3)).entropy(8)
    c = torch.randn(64, 3) * 100.0
    look.log_prob(torch.randn(64, 2), c)
    torch.testing.assert_close(look.standardize_context.shift, c.mean(0))


def test_a_context_shared_by_every_batch_of_a_loop_is_warned_of():
    """Review 41: a loop whose batches share one context row ``(C,)`` set the context
    standardization from the first one (scale 1) for good, silently. It now says so, once;
    contexts per row, or set_from_data first, give no warning."""
    import flowkit

    contexts = torch.randn(6, 3) * 1000.0 + 5000.0

    def loop(flow, context_of_each_row=False):
        optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
        for c in contexts:
            x = torch.randn(32, 2)
            if context_of_each_row:
                c = contexts[torch.randint(len(contexts), (32,))]
            loss = -flow.log_prob(x, c).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=3)
    with pytest.warns(UserWarning, match=r"standardization of the context \(a flowkit "
                      r"Standardize\) was set from a single row") as seen:
        loop(flow)
    assert sum("single row" in str(w.message) for w in seen) == 1
    assert "one context row per data row" in str(seen[0].message)
    for each_row, prepared in ((True, False), (False, True)):
        flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=3)
        if prepared:
            set_from_data(flow, [(torch.randn(6, 2), contexts)])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loop(flow, each_row)
    # copies of one row have no more spread than one: the same warning
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=3)
    optimizer = torch.optim.SGD(flow.parameters(), lr=1e-3)
    with pytest.warns(UserWarning, match="single row, or copies of one"):
        for c in contexts[:3]:
            flow.log_prob(torch.randn(32, 2), c.expand(32, 3)).mean().backward()
            optimizer.step()
    assert torch.equal(flow.standardize_context.shift, contexts[0])
    # review 44: no warning where the value does not stay, or has nothing to standardize: a
    # policy acting on one state at a time with gradients, then its first batch update; a
    # reverse-KL fit at one fixed context
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy = flowkit.IAF(2, layers=1, hidden_features=(8,), context_features=3)
        for state in contexts[:3]:
            policy(state).rsample()
        loop(policy, context_of_each_row=True)
        fixed = flowkit.IAF(2, layers=1, hidden_features=(8,), context_features=3)
        flowkit.fit_reverse_kl(fixed, lambda x, c: -x.square().sum(-1), steps=3, batch_size=1,
                               context=contexts[:1], progress=False)
    # a loop of one's own that steps at one context, then samples at others: the value the
    # step fixed stays, which is said
    amortized = flowkit.IAF(2, layers=1, hidden_features=(8,), context_features=3)
    optimizer = torch.optim.SGD(amortized.parameters(), lr=1e-3)
    amortized.sample_and_log_prob(None, contexts[:1])[1].sum().backward()
    optimizer.step()
    with pytest.warns(UserWarning, match="single row, or copies of one"):
        amortized.sample_and_log_prob(None, contexts)
    # batches of one data row: the data standardization's own words
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
    with pytest.warns(UserWarning, match="standardization of the data .* single row.*batches "
                      "of rows"):
        for row in torch.randn(3, 1, 2):
            loss = -flow.log_prob(row).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


# ------------------------------------------------------------------ robust standardization


def test_robust_standardization_is_the_median_and_the_normal_iqr():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2001, 3, generator=g, dtype=torch.float64) * torch.tensor(
        [1.0, 50.0, 1e-3], dtype=torch.float64) + torch.tensor([5.0, -100.0, 0.0],
                                                                dtype=torch.float64)
    x[:4, 0] = 1e6  # gross outliers: they move the mean and the deviation, not the quartiles
    x[:1700, 2] = 0.0  # most of a column at one value: no interquartile range, the deviation
    t = Standardize.from_data(x, robust=True)
    q = torch.quantile(x, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64), dim=0)
    torch.testing.assert_close(t.shift[:2], q[1, :2])
    torch.testing.assert_close(t.scale[:2], (q[2, :2] - q[0, :2]) / 1.3489795003921634)
    torch.testing.assert_close(t.shift[2], x[:, 2].mean())
    torch.testing.assert_close(t.scale[2], x[:, 2].std(correction=0))
    assert 0.9 < float(t.scale[0]) < 1.1  # the mean and deviation: 2000 and 4.5e4
    z, log_det = t(x)
    torch.testing.assert_close(z, (x - t.shift) / t.scale)
    torch.testing.assert_close(log_det, -t.scale.log().sum().expand(len(x)))
    with pytest.raises(ValueError, match="'robust' standardization is per feature"):
        Standardize(3, covariance="full", robust=True)


def test_robust_standardization_keeps_an_even_sample_past_its_row_limit(monkeypatch):
    monkeypatch.setattr(standardize, "ROBUST_ELEMENTS", 100)
    x = torch.arange(1000, dtype=torch.float64).reshape(-1, 1)
    lazy = Standardize(1, robust=True).double()
    standardize.set_from_data(lazy, [(chunk,) for chunk in x.split(64)], call=lazy)
    assert abs(float(lazy.shift) - 499.5) < 20 and abs(float(lazy.scale) - 500 / 1.349) < 30


def test_builders_standardize_robustly_data_and_context_and_save_it(tmp_path):
    import flowkit

    flow = MAF(2, layers=1, hidden_features=(8,), context_features=1, standardize="robust")
    x, c = torch.randn(400, 2), torch.randn(400, 1)
    x[:2] = 1e6
    flowkit.fit(flow, (x, c), steps=2, progress=False)
    data_side = flow.transform.transforms[0]
    assert data_side.robust and flow.standardize_context.robust
    assert float(data_side.scale.max()) < 2  # not 7e4, the deviation the two rows give
    flowkit.save_model(flow, tmp_path / "f.pt")
    loaded = flowkit.load_model(tmp_path / "f.pt")
    assert loaded.transform.transforms[0].robust
    torch.testing.assert_close(loaded.log_prob(x[2:], c[2:]), flow.eval().log_prob(x[2:], c[2:]))
