"""``flow(context)``: the lazy conditional distribution, torch's shape semantics on Flow's own
methods (any batch shape, broadcasting, sample shapes), values outside the support, the
Monte-Carlo estimators, and the builders' MADE options."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.distributions import Independent, Normal, kl_divergence

import flowkit
from flowkit.flows import KL_SAMPLES, monte_carlo_kl
from flowkit.nn.activation import activation_class

D, C = 3, 5
BUILDERS = {"MAF": flowkit.MAF, "IAF": flowkit.IAF}


def _flow(name: str, context_features: int = C, **kwargs) -> flowkit.Flow:
    """A float64 flow moved away from its identity initialisation."""
    flow = BUILDERS[name](D, layers=2, hidden_features=(16,), context_features=context_features,
                          **kwargs).double()
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return flow


@pytest.fixture(params=list(BUILDERS))
def name(request) -> str:
    return request.param


def test_lazy_flow_as_zuko_tests_it(name, tmp_path):
    """The checks zuko's test_flows makes of every flow: log_prob shape and gradients to every
    parameter, sample shapes, rsample gradients, save/load, repr."""
    flow = _flow(name)
    x, c = torch.randn(256, D, dtype=torch.float64), torch.randn(C, dtype=torch.float64)
    log_p = flow(c).log_prob(x)
    assert log_p.shape == (256,) and log_p.requires_grad
    flow.zero_grad(set_to_none=True)
    (-log_p.mean()).backward()
    assert all(p.grad is not None for p in flow.parameters())
    assert flow(c).sample((32,)).shape == (32, D)
    assert flow(c).has_rsample
    y = flow(c).rsample()
    assert y.shape == (D,)
    flow.zero_grad(set_to_none=True)
    y.square().sum().sqrt().backward()
    assert all(p.grad is not None for p in flow.parameters())
    path = tmp_path / "flow.pt"
    flowkit.save_model(flow, path)
    loaded = flowkit.load_model(path)
    x, c = torch.randn(D, dtype=torch.float64), torch.randn(C, dtype=torch.float64)
    assert flow(c).log_prob(x).shape == ()
    torch.testing.assert_close(loaded(c).log_prob(x), flow(c).log_prob(x))
    assert repr(flow(c)) == f"FlowDistribution(features={D}, context_features={C}, batch_shape=())"


def test_unconditional_call(name):
    flow = _flow(name, 0)
    d = flow()
    assert d.batch_shape == () and d.event_shape == (D,)
    x = d.sample((4, 2))
    assert x.shape == (4, 2, D)
    torch.testing.assert_close(d.log_prob(x), flow.log_prob(x.reshape(-1, D)).reshape(4, 2))


@pytest.mark.parametrize(
    "x_shape, c_shape, expected",
    [
        ((7, D), (7, C), (7,)),
        ((7, D), (C,), (7,)),
        ((7, D), (1, C), (7,)),  # a (1, C) context serves every row
        ((1, D), (7, C), (7,)),  # one point under 7 contexts
        ((D,), (C,), ()),
        ((4, 6, D), (6, C), (4, 6)),  # sbi's (S, B, D) against (B, C)
        ((4, 1, D), (6, C), (4, 6)),
        ((2, 3, 4, D), (3, 1, C), (2, 3, 4)),
    ],
)
def test_log_prob_broadcasts_like_torch(name, x_shape, c_shape, expected):
    """Every batch shape, with size-1 axes broadcast, equals the row-by-row log-density of the
    expanded inputs."""
    flow = _flow(name)
    x = torch.randn(x_shape, dtype=torch.float64)
    c = torch.randn(c_shape, dtype=torch.float64)
    log_p = flow.log_prob(x, c)
    assert log_p.shape == expected
    rows_x = x.expand(*expected, D).reshape(-1, D)
    rows_c = c.expand(*expected, C).reshape(-1, C)
    reference = torch.stack([flow.log_prob(a[None], b[None])[0]
                             for a, b in zip(rows_x, rows_c, strict=True)])
    torch.testing.assert_close(log_p.reshape(-1), reference)
    torch.testing.assert_close(flow(c).log_prob(x), log_p)


def test_batch_shapes_that_do_not_broadcast_are_named(name):
    flow = _flow(name)
    x, c = torch.randn(4, D, dtype=torch.float64), torch.randn(3, C, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"'x' of shape \(4, 3\) and 'context' of shape \(3, 5\)"):
        flow.log_prob(x, c)
    with pytest.raises(ValueError, match="(?i)'?value'? .*not broadcastable"):
        flow(c).log_prob(x)


@pytest.mark.parametrize(
    "n, c_shape, expected",
    [
        (4, None, (4, D)),
        ((4,), None, (4, D)),
        ((), None, (D,)),
        ((2, 3), None, (2, 3, D)),
        (torch.Size([2, 3]), None, (2, 3, D)),
        (None, (6, C), (6, D)),
        (None, (C,), (D,)),
        (4, (C,), (4, D)),
        (4, (6, C), (4, 6, D)),
        ((2, 3), (2, 6, C), (2, 3, 2, 6, D)),
    ],
)
@pytest.mark.parametrize("method", ["sample", "rsample", "sample_and_log_prob"])
def test_sample_shapes(name, method, n, c_shape, expected):
    """``(*sample_shape, *context.shape[:-1], D)``; an int n is (n,), None is () with a context
    (one sample per context row, as before)."""
    flow = _flow(name, 0 if c_shape is None else C)
    c = None if c_shape is None else torch.randn(c_shape, dtype=torch.float64)
    out = getattr(flow, method)(n, c)
    if method == "sample_and_log_prob":
        x, log_p = out
        assert log_p.shape == expected[:-1]
        torch.testing.assert_close(log_p, flow.eval().log_prob(x, c))
    else:
        x = out
    assert x.shape == expected


@pytest.mark.parametrize("n", [(0,), (2, 0), (2, -1), [2.5], ("3",)])
def test_bad_sample_shapes_are_named(n):
    with pytest.raises(ValueError, match=r"'n\[\d\]' should be"):
        _flow("MAF", 0).sample(n)


def test_distribution_keeps_the_one_pass_paths(monkeypatch):
    """flow(c).rsample then log_prob of that sample costs no second pass; the IAF's
    rsample_and_log_prob is one MADE pass per layer."""
    flow = _flow("IAF")
    c = torch.randn(6, C, dtype=torch.float64)
    passes = []
    made_forward = flowkit.MADE._forward
    monkeypatch.setattr(flowkit.MADE, "_forward",
                        lambda made, *a: passes.append(1) or made_forward(made, *a))
    d = flow(c)
    x, log_p = d.rsample_and_log_prob((4,))
    assert len(passes) == 2 and x.shape == (4, 6, D) and log_p.shape == (4, 6)
    y = d.rsample((4,))
    assert len(passes) == 4
    torch.testing.assert_close(d.log_prob(y), flow.log_prob(y, c))
    passes.clear()
    d.log_prob(y)
    assert passes == []


def test_context_gradients_flow_through_the_lazy_distribution(name):
    flow = _flow(name)
    c = torch.randn(4, C, dtype=torch.float64, requires_grad=True)
    flow(c).rsample((3,)).sum().backward()
    assert c.grad is not None and c.grad.abs().sum() > 0


# ------------------------------------------------------------------ outside the support


def test_infinite_values_have_log_density_minus_infinity(name):
    """As torch's distributions: -inf outside R^D (a clipped action's atanh); the other rows
    are scored as without it."""
    flow = _flow(name).eval()
    c = torch.randn(4, C, dtype=torch.float64)
    x = torch.randn(4, D, dtype=torch.float64)
    expected = flow.log_prob(x, c)
    x[1, 0], x[3, 2] = math.inf, -math.inf
    log_p = flow.log_prob(x, c)
    assert log_p[1] == -math.inf and log_p[3] == -math.inf
    torch.testing.assert_close(log_p[[0, 2]], expected[[0, 2]])
    torch.testing.assert_close(flow(c).log_prob(x), log_p)


def test_a_batch_of_only_infinite_rows_is_minus_infinity_in_training_mode_too():
    """A new flow is in training mode; with no finite row there is nothing to score, nor to set
    its standardization from (it raised "a Standardize cannot be set from an empty batch")."""
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=1)
    x = torch.tensor([[0.0, math.inf], [-math.inf, 1.0]])
    log_p = flow.log_prob(x, torch.zeros(2, 1))
    assert log_p.tolist() == [-math.inf, -math.inf]
    assert flow(torch.zeros(1)).log_prob(x[0]).item() == -math.inf
    assert not flow.transform.transforms[0].initialized  # the data's: it never saw a row


def test_a_batch_of_only_infinite_rows_keeps_its_graph():
    """With one finite row the result has a graph, so with none it must too: a loss that masks
    the -inf rows out (a replayed action at the edge of a squash) back-propagates zeros instead
    of failing in backward() ("does not require grad")."""
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=3).eval()
    x = torch.tensor([[0.0, math.inf]], requires_grad=True)
    c = torch.randn(1, 3, requires_grad=True)
    for log_p in (flow.log_prob(x, c), flow(c).log_prob(x)):
        assert log_p.item() == -math.inf and log_p.requires_grad
        flow.zero_grad()
        log_p.clamp_min(-1e3).sum().backward()
        assert x.grad.eq(0).all() and c.grad.eq(0).all()
        assert all(p.grad is None or p.grad.eq(0).all() for p in flow.parameters())
    with torch.no_grad():
        assert not flow.log_prob(x, c).requires_grad


def test_an_empty_context_batch_is_an_error_naming_the_context():
    """``flow(torch.zeros(0, C))`` failed inside torch's constraint check ("cannot reshape
    tensor of 0 elements"); it is the error ``Flow.sample`` gives for the same context."""
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=3)
    with pytest.raises(ValueError, match=r"'context' is an empty batch: shape \(0, 3\)"):
        flow(torch.zeros(0, 3))
    with pytest.raises(ValueError, match=r"'context' is an empty batch: shape \(2, 0, 3\)"):
        flow(torch.zeros(2, 0, 3))


def test_nan_is_an_error_naming_the_users_argument(name):
    flow = _flow(name)
    x = torch.randn(4, D, dtype=torch.float64)
    x[2, 1] = math.nan
    c = torch.randn(4, C, dtype=torch.float64)
    with pytest.raises(ValueError, match="'x' contains NaN"):
        flow.log_prob(x, c)
    # torch's validation when its global default is on, else flowkit's
    with pytest.raises(ValueError, match="'value' contains NaN|value argument"):
        flow(c).log_prob(x)
    with pytest.raises(ValueError, match="'value' contains NaN"):  # flowkit's, always
        flowkit.FlowDistribution(flow, c, validate_args=False).log_prob(x)


def test_clipped_action_through_tanh_behaves_as_a_torch_base():
    """A clipped action (atanh(1) = inf): the flow's log-density there is -inf, and the squashed
    policy gives what torch gives with a Gaussian base (no error about an internal 'x')."""
    from torch.distributions import TanhTransform, TransformedDistribution

    flow = _flow("IAF", 0).eval()  # (training mode: the first row would set Standardize)
    a = torch.tensor([[1.0, 0.0, 0.5]], dtype=torch.float64)
    assert flow().log_prob(torch.atanh(a)).item() == -math.inf
    gaussian = Independent(Normal(torch.zeros(D, dtype=torch.float64),
                                  torch.ones(D, dtype=torch.float64)), 1)
    ours, theirs = (TransformedDistribution(base, [TanhTransform()], validate_args=False)
                    for base in (flow(), gaussian))
    torch.testing.assert_close(ours.log_prob(a), theirs.log_prob(a), equal_nan=True)


# ------------------------------------------------------------------ Monte-Carlo estimators


def _gaussian_flow() -> tuple[flowkit.Flow, Independent]:
    """An identity-initialised MAF with a learnable base moved to N(mu, s^2): its exact
    distribution, for checking the estimators against closed forms."""
    flow = flowkit.MAF(2, layers=2, hidden_features=(8,), learnable_base=True,
                        permutation="none").double()
    with torch.no_grad():
        flow.base.loc.copy_(torch.tensor([1.0, -2.0]))
        flow.base.log_scale.copy_(torch.tensor([0.5, -0.3]))
    exact = Independent(Normal(flow.base.loc.detach(), flow.base.log_scale.detach().exp()), 1)
    return flow, exact


def test_monte_carlo_estimators_against_closed_forms():
    torch.manual_seed(0)
    flow, exact = _gaussian_flow()
    d, n = flow(), 20000
    # 6 standard errors: the tests fail only if an estimator is wrong
    entropy = d.entropy(n)
    assert entropy.shape == ()
    assert abs(entropy - exact.entropy()) < 6 * math.sqrt(2 * 0.5 / n)
    torch.testing.assert_close(d.sample_mean(n), exact.mean, atol=6 * 1.7 / n**0.5, rtol=0)
    torch.testing.assert_close(d.sample_variance(n), exact.variance, atol=6 * 2.8 * 2**0.5 / n**0.5,
                               rtol=0)
    # the estimators are the sample mean and the unbiased sample variance of their draws
    torch.manual_seed(1)
    mean, variance = d.sample_mean(10), d.sample_variance(10)
    torch.manual_seed(1)
    draws = [d.rsample((10,)), d.rsample((10,))]
    torch.testing.assert_close(mean, draws[0].mean(0))
    torch.testing.assert_close(variance, draws[1].var(0, unbiased=True))
    q = Independent(Normal(torch.zeros(2, dtype=torch.float64),
                           torch.ones(2, dtype=torch.float64)), 1)
    exact_kl = kl_divergence(exact, q)
    assert abs(monte_carlo_kl(d, q, n) - exact_kl) < 0.15
    assert abs(monte_carlo_kl(q, d, n) - kl_divergence(q, exact)) < 0.15
    assert abs(kl_divergence(d, q) - exact_kl) < 6 * 3 / KL_SAMPLES**0.5


def test_estimators_are_differentiable_and_batched():
    flow = _flow("IAF")
    d = flow(torch.randn(4, C, dtype=torch.float64))
    h = d.entropy(16)
    assert h.shape == (4,)
    h.sum().backward()
    assert all(p.grad is not None for p in flow.parameters())
    assert d.sample_mean(8).shape == (4, D) and d.sample_variance(8).shape == (4, D)
    q = Independent(Normal(torch.zeros(4, D, dtype=torch.float64),
                           torch.ones(4, D, dtype=torch.float64)), 1)
    assert kl_divergence(d, q).shape == (4,) and kl_divergence(q, d).shape == (4,)
    assert kl_divergence(d, d).shape == (4,)


def test_what_torch_asks_but_a_flow_cannot_answer_is_named():
    d = _flow("MAF", 0)()
    with pytest.raises(NotImplementedError, match="sample_mean"):
        _ = d.mean
    with pytest.raises(NotImplementedError, match="sample_variance"):
        _ = d.stddev
    with pytest.raises(NotImplementedError, match="mode has no closed form"):
        _ = d.mode
    with pytest.raises(NotImplementedError, match="no cdf"):
        d.cdf(torch.zeros(D, dtype=torch.float64))
    with pytest.raises(NotImplementedError, match="no icdf"):
        d.icdf(torch.zeros(D, dtype=torch.float64))
    with pytest.raises(ValueError, match="'n' should be a positive number"):
        d.entropy(0)
    with pytest.raises(ValueError, match="'n' should be at least 2"):
        d.sample_variance(1)


# ------------------------------------------------------------------ builder options


@pytest.mark.parametrize("activation", ["elu", "GELU", nn.Tanh, "silu", "leakyrelu"])
def test_activation_reaches_every_made_and_survives_save_load(name, activation, tmp_path):
    flow = _flow(name, 0, activation=activation, residual=True)
    cls = activation_class(activation)
    mades = [m for m in flow.modules() if isinstance(m, flowkit.MADE)]
    assert mades and all(type(m.activation) is cls and m.residual for m in mades)
    assert flow.config["kwargs"]["activation"] == cls.__name__
    flowkit.save_model(flow, tmp_path / "f.pt")
    loaded = flowkit.load_model(tmp_path / "f.pt")
    x = torch.randn(5, D, dtype=torch.float64)
    torch.testing.assert_close(loaded.log_prob(x), flow.eval().log_prob(x))


@pytest.mark.parametrize("activation", ["softmax", "swish", nn.Linear, 3, None, type("A", (), {})])
def test_bad_activation_is_named(activation):
    with pytest.raises(ValueError, match="'activation' should be the name or class of a torch.nn"):
        flowkit.MAF(2, activation=activation)


def test_float64_context_is_refused_like_float64_x():
    """Neither x nor the context is cast: both must have the model's dtype (documented)."""
    flow = flowkit.MAF(2, layers=1, context_features=3)
    with pytest.raises(TypeError, match=r"'x' should have dtype torch.float32 .*\.to\(torch"):
        flow.log_prob(torch.randn(4, 2, dtype=torch.float64), torch.randn(4, 3))
    with pytest.raises(TypeError, match=r"'context' should have dtype torch.float32 .*\.to\("):
        flow.log_prob(torch.randn(4, 2), torch.randn(4, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="'context' should have dtype torch.float32"):
        flow(torch.randn(4, 3, dtype=torch.float64))


# ------------------------------------------------------------------ checked once


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_input_is_checked_once_per_call(builder, monkeypatch):
    """A 5-layer flow checks x and the context once each (it used to check x 15 times and the
    context 6 times: in the flow, each layer, each MADE and each permutation)."""
    from flowkit import validation
    from flowkit.nn import made

    flow = BUILDERS[builder](2, layers=5, hidden_features=(8,), context_features=3)
    checked = []
    check_tensor = validation.check_tensor

    def spy(name, *args, **kwargs):
        checked.append(name)
        return check_tensor(name, *args, **kwargs)

    monkeypatch.setattr(validation, "check_tensor", spy)
    monkeypatch.setattr(made, "check_tensor", spy)
    flow.log_prob(torch.randn(6, 2), torch.randn(6, 3))
    assert sorted(checked) == ["context", "x"]
    checked.clear()
    flow.sample_and_log_prob(4, torch.randn(6, 3))
    flow(torch.randn(6, 3)).rsample((2,))
    assert checked == ["context", "context"]


def test_kl_against_a_batch_of_distributions_has_the_broadcast_batch_shape():
    """KL(p || q) with q of a larger batch shape (torch's closed forms broadcast too); an event
    shape that differs, or batch shapes that do not broadcast, are errors naming p and q."""
    torch.manual_seed(0)
    p = flowkit.MAF(2, layers=2, hidden_features=(8,))()
    q = Independent(Normal(torch.randn(5, 2), torch.ones(5, 2)), 1)
    torch.manual_seed(1)
    kl = kl_divergence(p, q)
    assert kl.shape == (5,)
    torch.manual_seed(1)  # the same draws: the estimate is the mean of log p - log q over them
    x, log_p = p.expand((5,)).rsample_and_log_prob((KL_SAMPLES,))
    gap = (log_p - q.log_prob(x)).detach()
    torch.testing.assert_close(kl, gap.mean(0))
    base = Independent(Normal(torch.zeros(2), torch.ones(2)), 1)  # the new flow is the identity
    error = (kl - kl_divergence(base, q)).abs()
    assert (error < 6 * gap.std(0) / KL_SAMPLES**0.5).all()  # 6 standard errors
    conditional = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=1)
    wide = Independent(Normal(torch.zeros(4, 1, 2), torch.ones(4, 1, 2)), 1)
    assert monte_carlo_kl(conditional(torch.randn(5, 1)), wide, n=10).shape == (4, 5)
    with pytest.raises(ValueError, match=r"same event shape, got \(2,\) and \(\)"):
        monte_carlo_kl(p, Normal(torch.zeros(2), torch.ones(2)), n=10)
    with pytest.raises(ValueError, match=r"batch shapes of 'p' \(5,\) and 'q' \(4,\)"):
        four = Independent(Normal(torch.zeros(4, 2), torch.ones(4, 2)), 1)
        monte_carlo_kl(conditional(torch.randn(5, 1)), four, n=10)


def test_per_sample_scores_with_vmap_need_the_value_checks_off():
    """vmap cannot read values back: the NaN check says what to do, and with it off per-sample
    scores match autograd."""
    from torch.func import grad, vmap

    from flowkit.validation import validate_values

    flow = flowkit.MAF(2, layers=2, hidden_features=(16,), context_features=3).double().eval()
    x, c = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, 3, dtype=torch.float64)
    score = vmap(grad(lambda xi, ci: flow.log_prob(xi, ci)))
    with pytest.raises(RuntimeError, match=r"validate_values\(False\)"):
        score(x, c)
    with validate_values(False):
        scores = score(x, c)
    x.requires_grad_()
    expected, = torch.autograd.grad(flow.log_prob(x, c).sum(), x)
    torch.testing.assert_close(scores, expected)
    # a new flow in training mode sets its standardization from its first batch, which vmap
    # cannot read either: the error says how to set it first (review 21: torch's .item() text)
    fresh = flowkit.MAF(2, layers=2, hidden_features=(16,), context_features=3).double()
    with validate_values(False), pytest.raises(RuntimeError, match="Set it first"):
        vmap(grad(lambda xi, ci: fresh.log_prob(xi, ci)))(x.detach(), c)


def test_torch_func_through_the_solver_and_with_respect_to_parameters():
    """An IAF's log_prob and a MAF's rsample run sequential passes: under torch.func they match
    autograd; gradients with respect to a parameter dict go through a wrapping module."""
    from torch import nn
    from torch.func import functional_call, grad, jacrev, vmap

    from flowkit.validation import validate_values

    torch.manual_seed(0)
    iaf = flowkit.IAF(2, layers=2, hidden_features=(16,), context_features=3).double().eval()
    maf = flowkit.MAF(2, layers=2, hidden_features=(16,), context_features=3).double().eval()
    for flow in (iaf, maf):
        with torch.no_grad():
            for p in flow.parameters():
                p.add_(0.3 * torch.randn_like(p))
    x, c = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, 3, dtype=torch.float64)
    with validate_values(False):
        scores = vmap(grad(lambda xi, ci: iaf.log_prob(xi, ci)))(x, c)
    xg = x.clone().requires_grad_()
    expected, = torch.autograd.grad(iaf.log_prob(xg, c).sum(), xg)
    torch.testing.assert_close(scores, expected)

    eps = torch.randn(2, dtype=torch.float64)
    def sample(ci):  # a reparameterised MAF sample as a function of the context
        return maf.transform.inverse(eps[None], ci[None])[0][0]
    with validate_values(False):
        jac = jacrev(sample)(c[0])
    cg = c[0].clone().requires_grad_()
    rows = [torch.autograd.grad(sample(cg)[i], cg)[0] for i in range(2)]
    torch.testing.assert_close(jac, torch.stack(rows))

    class NLL(nn.Module):
        def __init__(self, flow):
            super().__init__()
            self.flow = flow

        def forward(self, x, c):
            return -self.flow.log_prob(x, c).mean()

    wrapped = NLL(iaf)
    params = {k: v.detach() for k, v in wrapped.named_parameters()}
    grads = grad(lambda p: functional_call(wrapped, p, (x, c)))(params)
    wrapped.zero_grad()
    wrapped(x, c).backward()
    for k, v in wrapped.named_parameters():
        torch.testing.assert_close(grads[k], v.grad)


@pytest.mark.parametrize("kind", ["standardized", "embedding", "conditional_base"])
def test_to_base_maps_data_where_the_base_scores_it(kind):
    """``z, log_det = flow.to_base(x, c)`` decomposes ``log_prob`` with the context the
    transforms read (review 50: ``flow.transform(x, c)`` with the raw context mapped ``x``
    under another context, by up to 62 in ``z``)."""
    options = {"standardized": {},
               "embedding": {"embedding": flowkit.nn.MLPEmbedding(2, 4, hidden_features=(8,))},
               "conditional_base": {"conditional_base": True}}[kind]
    flow = flowkit.MAF(3, layers=2, hidden_features=(16,), context_features=2, **options)
    flow = flow.double()
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(300, 3, generator=g, dtype=torch.float64) * 4 + 10,
            torch.randn(300, 2, generator=g, dtype=torch.float64) * 50 - 3)
    flowkit.fit(flow, data, steps=20, valid=None, progress=False, seed=0)
    flow.eval()
    x = torch.randn(4, 1, 3, generator=g, dtype=torch.float64) + 10
    c = torch.randn(5, 2, generator=g, dtype=torch.float64) * 50
    z, log_det = flow.to_base(x, c)
    assert z.shape == (4, 5, 3) and log_det.shape == (4, 5)
    base = flow.base.log_prob(z.reshape(-1, 3), *(
        [flow.embed_context(c).expand(4, 5, -1).reshape(-1, flow.base.context_features)]
        if kind == "conditional_base" else [])).reshape(4, 5)
    torch.testing.assert_close(base + log_det, flow.log_prob(x, c), rtol=0, atol=1e-10)
    z2, log_det2 = flow(c).to_base(x)
    assert torch.equal(z2, z) and torch.equal(log_det2, log_det)
    x0, _ = flow.transform._inverse(z.reshape(-1, 3), flow.embed_context(c).expand(4, 5, -1)
                                    .reshape(-1, flow.embed_context(c).shape[-1]))
    torch.testing.assert_close(x0.reshape(4, 5, 3), x.expand(4, 5, 3), rtol=0, atol=1e-8)
    with pytest.raises(ValueError, match="'x' contains infinite"):
        flow.to_base(torch.full((3,), math.inf, dtype=torch.float64), c)
    with pytest.raises(ValueError, match="'x'"):
        flow.to_base(torch.randn(5, 4, dtype=torch.float64), c)


def test_to_base_refuses_points_without_an_image():
    """Points outside a bounded flow's support have no image in the base's space (review 52:
    they came back as the box centre's z with log_det -inf); the distribution's errors name
    its 'value'."""
    flow = flowkit.MAF(2, layers=2, hidden_features=(8,), bounds=((0.0, 0.0), (1.0, 1.0)))
    with pytest.raises(ValueError, match=r"'x' has points outside the flow's support \(the "
                                         r"first at row 1"):
        flow.to_base(torch.tensor([[0.5, 0.5], [2.0, 0.5]]))
    z, log_det = flow.to_base(torch.tensor([[0.5, 0.5]]))
    assert torch.isfinite(z).all() and torch.isfinite(log_det).all()
    with pytest.raises(ValueError, match="'value' should have shape"):
        flow().to_base(torch.randn(3))
    with pytest.raises(ValueError, match="'value' has points outside"):
        flow().to_base(torch.tensor([2.0, 0.5]))
