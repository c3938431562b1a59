"""GraphedSampler: sampling replayed from a CUDA graph draws from the model's distribution."""

import itertools

import pytest
import torch

import flowkit
from flowkit import GraphedSampler

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_a_model_on_the_cpu_is_a_clear_error():
    with pytest.raises(ValueError, match="'model' should be on a CUDA device"):
        GraphedSampler(flowkit.MAF(2, layers=1, hidden_features=(8,)), 10)


@cuda
def test_a_model_in_training_mode_is_a_clear_error():
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,)).cuda()
    training = r"'model' \(or one of its modules\) is in training mode"
    with pytest.raises(ValueError, match=training):
        GraphedSampler(flow, 10)
    sampler = GraphedSampler(flow.eval(), 10)
    flow.transform.transforms[0].train()  # one module put back into training mode
    with pytest.raises(ValueError, match=training):
        sampler()


@pytest.mark.parametrize("model, kwargs, error, message", [
    (torch.nn.Linear(2, 2), dict(n=3), TypeError, "'model' should be a flowkit model"),
    (flowkit.BernoulliMADE(3, (8,)), dict(n=3, log_prob=True), TypeError,
     "BernoulliMADE has no 'sample_and_log_prob'"),
    (flowkit.MAF(2, layers=1), dict(n=0), ValueError, "'n' should be a positive"),
    (flowkit.MAF(2, layers=1), dict(n=(4, 0)), ValueError, r"'n\[1\]'"),
    (flowkit.MAF(2, layers=1), dict(n=None), ValueError, "'n', the number of samples, is required"),
    (flowkit.MAF(2, layers=1), dict(n=4, log_prob=1), ValueError, "'log_prob'"),
])
def test_bad_arguments_name_the_argument(model, kwargs, error, message):
    with pytest.raises(error, match=message):
        GraphedSampler(model, **kwargs)


def _flows():
    return {
        "maf-affine": (flowkit.MAF(5, layers=3, hidden_features=(32, 32), seed=1), None),
        "maf-spline-context": (flowkit.MAF(4, layers=2, hidden_features=(32,), seed=2,
                                           transformer="spline", context_features=3),
                               torch.randn(6, 3)),
        "iaf-conditional-base": (flowkit.IAF(3, layers=2, hidden_features=(16,), seed=3,
                                             context_features=2, conditional_base=True),
                                 torch.randn(2)),
    }


def _perturb(flow):
    """Weights away from the identity the layers start as, so sampling has work to do."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return flow


@cuda
@pytest.mark.parametrize("name", list(_flows()))
def test_replayed_samples_have_the_flows_log_density(name):
    flow, context = _flows()[name]
    flow = _perturb(flow).cuda().eval()
    context = None if context is None else context.cuda()
    sampler = GraphedSampler(flow, (7, 2), context, log_prob=True)
    x, log_p = sampler()
    batch = () if context is None else context.shape[:-1]
    assert x.shape == (7, 2, *batch, flow.features) and log_p.shape == (7, 2, *batch)
    torch.testing.assert_close(log_p, flow.log_prob(x, context), rtol=1e-4, atol=1e-4)
    x2, log_p2 = sampler()  # the same context again
    assert not torch.equal(x, x2)  # new noise at each replay
    torch.testing.assert_close(log_p2, flow.log_prob(x2, context), rtol=1e-4, atol=1e-4)
    if context is not None:  # new context values, same shape
        other = torch.randn_like(context)
        x3, log_p3 = sampler(other)
        torch.testing.assert_close(log_p3, flow.log_prob(x3, other), rtol=1e-4, atol=1e-4)


@cuda
def test_replayed_samples_follow_the_eager_distribution():
    flow = _perturb(flowkit.MAF(2, layers=3, hidden_features=(32,), seed=0)).cuda().eval()
    graphed = GraphedSampler(flow, 20000)()
    eager = flow.sample(20000)
    torch.testing.assert_close(graphed.mean(0), eager.mean(0), rtol=0, atol=0.05)
    torch.testing.assert_close(graphed.std(0), eager.std(0), rtol=0.05, atol=0)


@cuda
def test_an_optimizer_step_is_seen_by_the_next_call():
    flow = _perturb(flowkit.MAF(3, layers=2, hidden_features=(16,), seed=0)).cuda()
    flow.eval()  # training by log_prob in eval mode: the standardization stays as it is
    sampler = GraphedSampler(flow, 64, log_prob=True)
    for fused in (False, True):
        optimizer = torch.optim.Adam(flow.parameters(), lr=0.05, fused=fused)
        loss = -flow.log_prob(torch.randn(32, 3, device="cuda") * 3).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        x, log_p = sampler()
        with torch.no_grad():
            torch.testing.assert_close(log_p, flow.log_prob(x), rtol=1e-4, atol=1e-4)


@cuda
@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
def test_discrete_frequencies_match_the_probabilities(kind):
    if kind == "bernoulli":
        model = flowkit.BernoulliMADE(3, (16,), seed=0)
        values = [list(v) for v in itertools.product([0.0, 1.0], repeat=3)]
    else:
        model = flowkit.CategoricalMADE(2, 3, (16,), seed=0)
        values = [list(v) for v in itertools.product(range(3), repeat=2)]
    _perturb(model)
    model = model.cuda().eval()
    samples = GraphedSampler(model, 40000)()
    table = torch.tensor(values, device="cuda", dtype=samples.dtype)
    with torch.no_grad():
        p = model.log_prob(table).exp()
    frequency = (samples[:, None, :] == table[None]).all(-1).float().mean(0)
    torch.testing.assert_close(frequency, p.float(), rtol=0, atol=0.015)


@cuda
def test_bad_context_at_call_names_the_argument():
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=1).cuda().eval()
    sampler = GraphedSampler(flow, 3, torch.zeros(4, 1, device="cuda"))
    with pytest.raises(ValueError, match="'context' should have the captured shape"):
        sampler(torch.zeros(5, 1, device="cuda"))
    flat = flowkit.GraphedSampler(flowkit.MAF(2, layers=1, hidden_features=(8,)).cuda().eval(), 3)
    with pytest.raises(ValueError, match="'context' was given but the sampler"):
        flat(torch.zeros(4, 1, device="cuda"))
    with pytest.raises(ValueError, match="'context'"):
        sampler(torch.full((4, 1), float("nan"), device="cuda"))


def test_the_cached_objects_stay_the_same_until_a_call_with_autograd():
    """What flowkit.nn.caches.cached reports, which GraphedSampler compares before each replay:
    eager calls without autograd reuse the caches; a call with autograd drops them, and the
    next call builds new objects (a graph reading the old ones must be recorded again)."""
    from flowkit.nn.caches import cached

    flow = _perturb(flowkit.MAF(3, layers=2, hidden_features=(16,), seed=0)).eval()
    flow.sample(5)
    before = cached(flow)
    assert sum(c is not None for c in before) >= 4  # masked products and solver programs
    flow.sample(5)
    assert all(a is b for a, b in zip(cached(flow), before, strict=True))
    flow.log_prob(torch.randn(4, 3)).sum().backward()  # eval mode, with autograd
    flow.sample(5)
    assert not any(a is b for a, b in zip(cached(flow), before, strict=True) if a is not None)


@cuda
def test_calls_replay_the_same_graph_until_the_caches_change():
    flow = _perturb(flowkit.MAF(3, layers=2, hidden_features=(16,), seed=0,
                                context_features=2)).cuda().eval()
    context = torch.randn(4, 2, device="cuda")
    sampler = GraphedSampler(flow, 8, context, log_prob=True)
    graph = sampler._graph
    sampler()
    last = torch.randn(4, 2, device="cuda")
    sampler(last)  # later calls without a context sample given this one
    flow.sample(3, context)  # eager calls without autograd keep the caches
    sampler()
    assert sampler._graph is graph
    # a call with autograd drops the cached products the graph read: it is recorded again,
    # and what it samples is still the flow's distribution after the memory is reused
    x = torch.randn(5, 3, device="cuda", requires_grad=True)
    torch.autograd.grad(flow.log_prob(x, context[:1]).sum(), x)
    torch.cuda.empty_cache()
    garbage = [torch.full((1 << 20,), float("nan"), device="cuda") for _ in range(25)]
    samples, log_p = sampler()
    assert sampler._graph is not graph
    del garbage
    # (run on an H100 on 2026-11-26, this line compared with the first context, not the last)
    torch.testing.assert_close(log_p, flow.log_prob(samples, last), rtol=1e-4, atol=1e-4)
