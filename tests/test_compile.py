"""torch.compile: the density paths trace as one graph (no data-dependent branches, no graph
breaks) and give eager mode's values and gradients. The ``aot_eager`` backend runs the traced
graph without generating code, so these tests need no compiler and stay fast."""

from __future__ import annotations

import math

import pytest
import torch

import flowkit

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled(fn):
    return torch.compile(fn, backend="aot_eager", fullgraph=True)


@pytest.mark.parametrize("transformer", ["affine", "spline"])
def test_flow_log_prob_and_gradients(transformer):
    torch.manual_seed(0)
    flow = flowkit.MAF(3, layers=2, hidden_features=(16,), context_features=2,
                       transformer=transformer, batch_norm=True)
    x, context = torch.randn(8, 3), torch.randn(8, 2)

    eager = flow.log_prob(x, context)
    eager.sum().backward()
    eager_grads = [p.grad.clone() for p in flow.parameters()]
    flow.zero_grad()

    compiled = _compiled(flow.log_prob)(x, context)
    compiled.sum().backward()
    torch.testing.assert_close(compiled, eager)
    for p, g in zip(flow.parameters(), eager_grads, strict=True):
        torch.testing.assert_close(p.grad, g)
    with torch.no_grad():  # the cached masked weights are bypassed while compiling
        torch.testing.assert_close(_compiled(flow.log_prob)(x, context), eager.detach())


def test_iaf_sample_and_log_prob():
    torch.manual_seed(0)
    flow = flowkit.IAF(3, layers=2, hidden_features=(16,))
    torch.manual_seed(1)
    x, log_p = flow.sample_and_log_prob(5)
    torch.manual_seed(1)
    cx, clog_p = _compiled(flow.sample_and_log_prob)(5)
    torch.testing.assert_close(cx, x)
    torch.testing.assert_close(clog_p, log_p)


@pytest.mark.parametrize("conditional_base", [False, True])
def test_a_sampling_step_compiled_for_one_batch_size_runs_at_others(conditional_base):
    """Review 37: an RL policy's compiled rsample_and_log_prob broke at the second batch size
    (dynamo then traces the batch as dynamic, and torch.randn(..., generator=None) cannot be
    traced so); also with dynamic=True from the start."""
    flow = flowkit.IAF(2, layers=2, hidden_features=(16,), context_features=4,
                       conditional_base=conditional_base).eval()

    def step(obs):
        return flow(obs).rsample_and_log_prob()

    for compiled in (torch.compile(step, backend="aot_eager"),
                     torch.compile(step, backend="aot_eager", dynamic=True)):
        for batch in (6, 7, 11):
            obs = torch.randn(batch, 4)
            torch.manual_seed(batch)
            x, log_p = compiled(obs)
            torch.manual_seed(batch)
            ex, elog_p = step(obs)
            torch.testing.assert_close(x, ex)
            torch.testing.assert_close(log_p, elog_p)


def test_discrete_log_prob():
    model = flowkit.BernoulliMADE(6, hidden_features=(16,), seed=0)
    x = torch.randint(0, 2, (4, 6)).float()
    torch.testing.assert_close(_compiled(model.log_prob)(x), model.log_prob(x))
    model = flowkit.CategoricalMADE(3, classes=4, hidden_features=(16,), seed=0)
    x = torch.randint(0, 4, (5, 3))
    torch.testing.assert_close(_compiled(model.log_prob)(x), model.log_prob(x))


def test_compiled_code_skips_only_the_value_check():
    """Shapes are still checked when compiling; NaN/Inf (a data-dependent branch) is not."""
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    flow.log_prob(torch.randn(8, 2))  # sets the standardization (a graph break if compiled)
    compiled = _compiled(flow.log_prob)
    assert torch.isnan(compiled(torch.full((2, 2), float("nan")))).all()
    with pytest.raises(ValueError, match="'x' contains NaN"):
        flow.log_prob(torch.full((2, 2), float("nan")))
    # an infinite entry is still a point outside the support, log-density -inf (review 10: it
    # was NaN), computed without a branch on the values; the other rows are unchanged
    x = torch.tensor([[math.inf, 0.0], [0.5, -0.3], [1.0, -math.inf]])
    flow.eval()  # (an eager training-mode call would set the standardization from its rows)
    for fn in (flow.log_prob, lambda v: flow().log_prob(v)):
        out = _compiled(fn)(x)
        assert out[0] == -math.inf and out[2] == -math.inf
        torch.testing.assert_close(out[1], flow.log_prob(x[1:2])[0])
    torch._dynamo.reset()  # raising ends a graph: without fullgraph, the error reaches the user
    with pytest.raises(ValueError, match=r"'x' should have shape \(\.\.\., 2\)"):
        torch.compile(flow.log_prob, backend="aot_eager")(torch.zeros(2, 3))


@pytest.mark.parametrize("covariance", ["diagonal", "full"])
def test_a_flow_compiled_before_training_is_standardized_as_an_eager_one(covariance):
    """Review 21: compiled code skipped the standardization's data-dependent start, so a flow
    trained from scratch inside torch.compile kept it unset (88.5 nats off after one eager
    call). Now the first compiled training-mode call sets it outside the graph (one graph
    break), and the steps after it trace as one graph."""
    x = torch.randn(256, 3) @ torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 3.0, 1.0]])
    x = 50 * x + 1000

    def train(compile_it):
        torch.manual_seed(0)  # the same initial weights
        flow = flowkit.MAF(3, layers=2, hidden_features=(16,), seed=0,
                           standardize=covariance)
        optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
        log_prob = torch.compile(flow.log_prob, backend="aot_eager") if compile_it else (
            flow.log_prob)
        for rows in x.split(64):
            loss = -log_prob(rows).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return flow

    eager, compiled = train(False), train(True)
    for (name, a), b in zip(eager.state_dict().items(), compiled.state_dict().values(),
                            strict=True):
        torch.testing.assert_close(b, a, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(compiled.log_prob(x), eager.log_prob(x))
    torch._dynamo.reset()  # now that it is set: no graph break, in training mode too
    loss = _compiled(compiled.log_prob)(x[:64]).mean()
    loss.backward()


def test_a_module_pickled_before_the_host_noted_its_flag_compiles_as_one_graph():
    """Review 30: a Standardize pickled by an older version has no note of its flag, so
    compiled code took it for unset and broke the graph (an error with fullgraph=True)."""
    import pickle

    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    flowkit.fit(flow, torch.randn(256, 2) * 3 + 5, steps=2, progress=False, device="cpu")
    for m in flow.modules():
        if isinstance(m, flowkit.transforms.Standardize):
            del m.__dict__["_flag"], m.__dict__["_sampled"]  # as the older version pickled it
    old = pickle.loads(pickle.dumps(flow)).train()
    _compiled(old.log_prob)(torch.randn(8, 2)).sum().backward()


def test_a_flow_trained_by_reverse_kl_inside_torch_compile_keeps_its_identity():
    """Review 30: compiled sampling skipped the standardization's bookkeeping, so a flow
    trained by reverse KL inside torch.compile stayed unset, and a later training-mode
    log_prob set it from that batch (the log-density of its samples fell from -1.4 to -44.6)."""
    torch.manual_seed(0)
    flow = flowkit.MAF(2, layers=2, hidden_features=(16,))
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
    draw = torch.compile(flow.sample_and_log_prob, backend="aot_eager")
    for _ in range(3):
        x, log_q = draw(64)
        loss = (log_q + 0.5 * (x - 3.0).square().sum(-1)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    std = flow.transform.transforms[0]
    assert std.initialized and not std.provisional
    x = flow.sample(256) * 40.0 + 1000.0  # a later training-mode call on other data
    flow.log_prob(x).sum().backward()
    assert torch.equal(std.shift, torch.zeros(2)) and torch.equal(std.scale, torch.ones(2))


def test_reverse_kl_compiled_as_one_graph_after_the_standardization_is_set():
    """Review 31: with fullgraph=True, sampling with gradients failed even after fit or
    set_from_data had set the standardization, as these pages advise doing first."""
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    flowkit.fit(flow, torch.randn(256, 2) * 3 + 5, steps=2, progress=False, device="cpu")
    x, log_q = _compiled(flow.sample_and_log_prob)(16)
    (log_q + x.square().sum(-1)).mean().backward()
