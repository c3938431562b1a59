"""FlowDistribution: torch.distributions semantics, batched contexts in one pass, composition."""

from __future__ import annotations

import re

import pytest
import torch
from torch.distributions import Independent, TanhTransform, TransformedDistribution

import flowkit
from flowkit.flows import FlowDistribution
from flowkit.nn import MADE
from flowkit.nn.inversion import solve_with_params
from flowkit.transforms import autoregressive

D, C = 3, 4


def _perturbed(flow: flowkit.Flow) -> flowkit.Flow:
    """A float64 copy of ``flow`` moved away from its identity initialisation."""
    flow = flow.double()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return flow


def _flow(kind: str, context_features: int = C) -> flowkit.Flow:
    build = {"maf": flowkit.MAF, "iaf": flowkit.IAF}[kind]
    return _perturbed(build(D, layers=2, hidden_features=(16,), context_features=context_features))


def _made_calls(flow: flowkit.Flow, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the work the flow's MADEs do: one per forward pass, one per autoregressive
    solve (which evaluates the MADE incrementally and never calls its ``forward``)."""
    calls = [0]

    def hook(*_):
        calls[0] += 1

    made_forward = MADE._forward

    def counted_forward(made, *args, **kwargs):
        hook()
        return made_forward(made, *args, **kwargs)

    monkeypatch.setattr(MADE, "_forward", counted_forward)

    def counted_solve(*args, **kwargs):
        calls[0] += 1
        return solve_with_params(*args, **kwargs)

    monkeypatch.setattr(autoregressive, "solve_with_params", counted_solve)
    return calls


@pytest.fixture(params=["maf", "iaf"])
def kind(request) -> str:
    return request.param


def test_shapes_unconditional(kind):
    d = FlowDistribution(_flow(kind, 0))
    assert d.batch_shape == () and d.event_shape == (D,)
    assert d.has_rsample
    assert d.rsample().shape == (D,)
    assert d.sample((5, 2)).shape == (5, 2, D)
    assert d.log_prob(torch.randn(7, D, dtype=torch.float64)).shape == (7,)


def test_shapes_batched_context(kind):
    context = torch.randn(2, 5, C, dtype=torch.float64)
    d = FlowDistribution(_flow(kind), context)
    assert d.batch_shape == (2, 5) and d.event_shape == (D,)
    x = d.rsample((6,))
    assert x.shape == (6, 2, 5, D)
    assert d.log_prob(x).shape == (6, 2, 5)
    x, log_p = d.rsample_and_log_prob((6,))
    assert x.shape == (6, 2, 5, D) and log_p.shape == (6, 2, 5)
    assert d.sample((0,)).shape == (0, 2, 5, D)
    # an empty value has an empty log-density, with torch's argument validation on or off (its
    # support check fails on empty values, so it runs only on values with rows)
    for validate_args in (None, False):
        d = FlowDistribution(d.flow, context, validate_args=validate_args)
        assert d.log_prob(torch.empty(0, 2, 5, D, dtype=torch.float64)).shape == (0, 2, 5)


def test_log_prob_matches_flow_row_by_row(kind):
    flow = _flow(kind)
    context = torch.randn(2, 5, C, dtype=torch.float64)
    x = torch.randn(3, 2, 5, D, dtype=torch.float64)
    log_p = FlowDistribution(flow, context).log_prob(x)
    for s in range(3):
        for i in range(2):
            expected = flow.log_prob(x[s, i], context[i])
            torch.testing.assert_close(log_p[s, i], expected)


def test_log_prob_broadcasts_like_torch():
    flow = _flow("maf")
    context = torch.randn(5, C, dtype=torch.float64)
    d = FlowDistribution(flow, context)
    x = torch.randn(D, dtype=torch.float64)  # one point scored under every context
    torch.testing.assert_close(d.log_prob(x), flow.log_prob(x.expand(5, D), context))
    x = torch.randn(4, 1, D, dtype=torch.float64)  # 4 points, each under every context
    assert d.log_prob(x).shape == (4, 5)
    torch.testing.assert_close(d.log_prob(x)[2], flow.log_prob(x[2].expand(5, D), context))
    for validate_args in (True, False):  # flowkit's own check, also with validation off
        d = FlowDistribution(flow, context, validate_args=validate_args)
        with pytest.raises(ValueError, match="broadcastable"):
            d.log_prob(torch.randn(3, D, dtype=torch.float64))


def test_rsample_and_log_prob_agree_with_log_prob(kind):
    d = FlowDistribution(_flow(kind), torch.randn(4, C, dtype=torch.float64))
    x, log_p = d.rsample_and_log_prob((3,))
    torch.testing.assert_close(log_p, d.log_prob(x.clone()))  # clone: no cache, recomputed


def test_batched_context_costs_one_call(kind, monkeypatch):
    """A (2, 5) batch of contexts costs the flow's MADEs as many calls as a single context:
    the batch is flattened, never looped over."""
    flow = _flow(kind)
    calls = _made_calls(flow, monkeypatch)

    def count(context: torch.Tensor) -> tuple[int, int]:
        d = FlowDistribution(flow, context)
        calls[0] = 0
        x, _ = d.rsample_and_log_prob((3,))
        sampling, calls[0] = calls[0], 0
        d.log_prob(x.clone())
        return sampling, calls[0]

    single = count(torch.randn(C, dtype=torch.float64))
    assert single[0] > 0 and single[1] > 0
    assert count(torch.randn(2, 5, C, dtype=torch.float64)) == single


def test_rsample_is_reparameterized():
    """rsample gives the flow's own samples, with gradients to the parameters and context."""
    flow = _flow("iaf")
    context = torch.randn(5, C, dtype=torch.float64, requires_grad=True)
    d = FlowDistribution(flow, context)
    torch.manual_seed(3)
    x = d.rsample((2,))
    torch.manual_seed(3)
    torch.testing.assert_close(x, flow.rsample(2, context))
    x.square().sum().backward()
    assert context.grad is not None and context.grad.abs().sum() > 0
    grads = [p.grad for p in flow.parameters()]
    assert all(g is not None for g in grads) and sum(g.abs().sum() for g in grads) > 0
    assert not d.sample((2,)).requires_grad


def test_cached_log_prob_of_own_sample(kind, monkeypatch):
    """log_prob of the tensor rsample returned costs no flow pass and keeps its gradient."""
    flow = _flow(kind)
    d = FlowDistribution(flow, torch.randn(5, C, dtype=torch.float64))
    x = d.rsample((2,))
    calls = _made_calls(flow, monkeypatch)
    log_p = d.log_prob(x)
    assert calls[0] == 0 and log_p.requires_grad
    torch.testing.assert_close(log_p, d.log_prob(x.clone()))
    # Each call returns a tensor of its own (review 37: an in-place edit of one moved the next)
    with torch.no_grad():
        log_p.add_(100.0)
    torch.testing.assert_close(d.log_prob(x), d.log_prob(x.clone()))
    # A sample drawn without gradients is scored afresh, so its log-density has gradients.
    y = d.sample()
    calls[0] = 0
    assert d.log_prob(y).requires_grad and calls[0] > 0


def test_a_sample_written_in_place_is_scored_afresh(kind):
    flow = _flow(kind)
    d = FlowDistribution(flow, torch.randn(5, C, dtype=torch.float64))
    x = d.rsample()
    with torch.no_grad():
        x.mul_(3.0)
    torch.testing.assert_close(d.log_prob(x), d.log_prob(x.clone()))


@pytest.mark.parametrize("change", ["fused Adam", "Polyak update", "through .data"])
def test_a_sample_of_an_older_flow_is_scored_afresh(kind, change):
    """The kept log-density belongs to the weights it was drawn with: after an optimizer step
    (fused kernels bump no version counter) or a write by hand, log_prob recomputes it, as a
    zuko flow would."""
    flow = _flow(kind)
    d = FlowDistribution(flow, torch.randn(5, C, dtype=torch.float64))
    x = d.rsample()
    if change == "fused Adam":
        optimizer = torch.optim.Adam(flow.parameters(), lr=0.1, fused=True)
        (-d.log_prob(x).sum()).backward()
        optimizer.step()
    elif change == "Polyak update":
        with torch.no_grad():
            for p in flow.parameters():
                p.mul_(0.9)
    else:  # SAC's soft update: writes through .data bump no version counter
        for p in flow.parameters():
            p.data.copy_(0.9 * p.data)
    torch.testing.assert_close(d.log_prob(x), d.log_prob(x.clone()))


def test_a_distribution_that_kept_a_sample_can_be_copied(kind):
    """The kept pair belongs to a graph (torch cannot deepcopy it): copies leave it out."""
    import copy
    import pickle

    d = FlowDistribution(_flow(kind).eval(), torch.randn(5, C, dtype=torch.float64))
    x = d.rsample()
    for twin in (copy.deepcopy(d), pickle.loads(pickle.dumps(d))):
        torch.testing.assert_close(twin.log_prob(x.detach()), d.log_prob(x).detach())


def test_support_is_the_flows_and_zuko_names_point_to_flowkits():
    box = flowkit.MAF(2, layers=1, hidden_features=(8,), bounds=([0.0, -1.0], [1.0, 1.0]))
    support = box().support
    assert support.event_dim == 1
    assert support.check(torch.tensor([[0.5, 0.0], [2.0, 0.0], [0.5, -1.5]])).tolist() == [
        True, False, False]
    assert box().log_prob(torch.tensor([[2.0, 0.0]])).item() == float("-inf")
    # the validation of torch's arguments does not turn -inf outside the support into an error
    assert FlowDistribution(box, validate_args=True).log_prob(
        torch.tensor([[2.0, 0.0]])).item() == float("-inf")
    assert _flow("maf")(torch.randn(C, dtype=torch.float64)).support.check(
        torch.tensor([[1e30] * D])).all()
    squashed = flowkit.Flow([flowkit.transforms.TorchBijection(TanhTransform(), maps="to_data")],
                            flowkit.StandardNormal(2))
    assert squashed().support.check(torch.tensor([[0.5, 0.9], [0.5, 1.5]])).tolist() == [
        True, False]
    half_line = flowkit.MAF(2, layers=1, hidden_features=(8,), bounds=([0.0, 1.0], [None, None]))
    mapped = torch.distributions.biject_to(half_line().support)(torch.tensor([[-30.0, 5.0]]))
    assert (mapped > torch.tensor([0.0, 1.0])).all() and torch.isfinite(mapped).all()
    d = box()
    with pytest.raises(AttributeError, match=r"d\.to_base\(value\)"):
        _ = d.transform
    with pytest.raises(AttributeError, match=r"d\.flow\.base"):
        _ = d.base


def test_expand():
    flow = _flow("maf")
    context = torch.randn(5, C, dtype=torch.float64)
    d = FlowDistribution(flow, context).expand((3, 5))
    assert d.batch_shape == (3, 5) and d.context.shape == (3, 5, C)
    x = d.rsample((2,))
    assert x.shape == (2, 3, 5, D)
    torch.testing.assert_close(d.log_prob(x)[1, 2], flow.log_prob(x[1, 2], context))
    for shape in ((4,), (1,), ()):  # torch's expand rule, in an error naming the argument
        with pytest.raises(ValueError, match=re.escape(f"'batch_shape' {shape} cannot")):
            FlowDistribution(flow, context).expand(shape)
    u = FlowDistribution(_flow("maf", 0)).expand((4,))  # i.i.d. copies of one density
    assert u.batch_shape == (4,) and u.rsample((2,)).shape == (2, 4, D)
    x = torch.randn(3, 1, D, dtype=torch.float64)
    assert u.log_prob(x).shape == (3, 4)
    torch.testing.assert_close(u.log_prob(x)[:, 1], u.flow.log_prob(x[:, 0]))


def test_independent():
    """Independent turns the context batch into part of the event: log-densities add up."""
    flow = _flow("maf")
    context = torch.randn(2, 5, C, dtype=torch.float64)
    d = Independent(FlowDistribution(flow, context), 1)
    assert d.batch_shape == (2,) and d.event_shape == (5, D) and d.has_rsample
    x = d.rsample((3,))
    assert x.shape == (3, 2, 5, D)
    expected = FlowDistribution(flow, context).log_prob(x.clone()).sum(-1)
    torch.testing.assert_close(d.log_prob(x), expected)


def test_tanh_squash(kind, monkeypatch):
    """Bounded actions: log q(a) = log p(u) - sum_d log(1 - tanh(u_d)^2), a = tanh(u)."""
    flow = _flow(kind).eval()  # Standardize stays the identity (unset): samples as before
    base = FlowDistribution(flow, torch.randn(5, C, dtype=torch.float64))
    policy = TransformedDistribution(base, [TanhTransform(cache_size=1)])
    assert policy.batch_shape == (5,) and policy.event_shape == (D,)
    a = policy.rsample((2,))
    assert a.shape == (2, 5, D) and a.abs().max() < 1
    u = torch.atanh(a.detach())
    expected = base.log_prob(u) - torch.log1p(-a.detach().square()).sum(-1)
    calls = _made_calls(flow, monkeypatch)
    log_q = policy.log_prob(a)  # the cached pre-squash sample and its log-density: no pass
    assert calls[0] == 0
    torch.testing.assert_close(log_q, expected)
    (log_q.sum() + a.sum()).backward()
    assert all(p.grad is not None for p in flow.parameters())
    # An action it did not sample is scored through atanh and the flow.
    b = torch.rand(4, 5, D, dtype=torch.float64) * 1.8 - 0.9
    expected = base.log_prob(torch.atanh(b)) - torch.log1p(-b.square()).sum(-1)
    torch.testing.assert_close(policy.log_prob(b), expected)


def test_bad_input():
    conditional, unconditional = _flow("maf"), _flow("maf", 0)
    with pytest.raises(ValueError, match=r"'context' is required: a tensor of shape \(\.\.\., 4\)"):
        FlowDistribution(conditional)
    with pytest.raises(ValueError, match=r"'context' should have shape \(\.\.\., 4\)"):
        FlowDistribution(conditional, torch.randn(5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="context_features=0"):
        FlowDistribution(unconditional, torch.randn(5, C, dtype=torch.float64))
    # checked by flowkit whatever validate_args says (torch.compile switches its default off)
    for validate_args in (True, False):
        with pytest.raises(ValueError, match="'context' contains NaN"):
            FlowDistribution(conditional, torch.full((5, C), float("nan"), dtype=torch.float64),
                             validate_args=validate_args)
    # flowkit's checks of the value come before torch's own validation
    for validate_args in (True, False):
        d = FlowDistribution(conditional, torch.randn(5, C, dtype=torch.float64),
                             validate_args=validate_args)
        with pytest.raises(ValueError, match=r"'value' should have shape \(\.\.\., 3\)"):
            d.log_prob(torch.randn(5, D + 1, dtype=torch.float64))


def test_repr():
    d = FlowDistribution(_flow("maf"), torch.randn(2, 5, C, dtype=torch.float64))
    assert repr(d) == "FlowDistribution(features=3, context_features=4, batch_shape=(2, 5))"


def test_shapes_take_what_torch_takes():
    """numpy integers, integer tensors and 1-D arrays are sizes, as for torch's distributions
    (review 20: they were refused); bools, negatives, floats and bare integers are not."""
    import numpy as np

    d = FlowDistribution(_flow("maf", 0))
    for shape in ((np.int64(3),), (torch.tensor(3),), np.array([3]), torch.Size([3]), [3]):
        assert d.sample(shape).shape == (3, D)
    assert d.expand((np.int64(2),)).batch_shape == (2,)
    for bad in ((True,), (-1,), (2.5,), 3, torch.tensor(3)):
        with pytest.raises(ValueError, match="'sample_shape' should be a tuple of non-negative"):
            d.sample(bad)


def test_a_context_from_an_autocast_encoder_is_widened_exactly():
    """Review 55: an encoder run under torch.autocast gives a bfloat16 context, which zuko takes
    and flowkit refused (the fix it suggested, a bfloat16 model, costs 0.4-0.8 nats)."""
    flow = _flow("iaf").float().eval()
    encoder = torch.nn.Linear(5, C)
    inputs = torch.randn(4, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        context = encoder(inputs)
        assert context.dtype == torch.bfloat16
        x, log_p = flow(context).rsample_and_log_prob()
        again = flow.log_prob(x, context)
    assert x.dtype == log_p.dtype == torch.float32
    torch.testing.assert_close(again, flow.log_prob(x, context.float()))
    log_p.sum().backward()
    assert encoder.weight.grad is not None
    with pytest.raises(TypeError, match="should have dtype torch.float32"):  # outside: refused
        flow.log_prob(x, context)
