"""Embedding networks and the conditional Gaussian base: exactness, gradients, shapes,
save/load, errors."""

import copy
import math

import pytest
import torch
from torch import nn

import flowkit
from flowkit import IAF, MAF, ConditionalDiagonalGaussian, MLPEmbedding
from flowkit.checkpoint import CheckpointError
from flowkit.nn.made import MADE
from flowkit.transforms.standardize import set_from_data

BUILDERS = {"MAF": MAF, "IAF": IAF}


def perturb(module, scale=0.3, seed=0):
    """Random weights everywhere (the base head starts at zero, the identity base)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def grid_integral(log_density, half_width=8.0, points=321):
    """Trapezoidal integral of exp(log_density) over [-w, w]^2 (float64)."""
    axis = torch.linspace(-half_width, half_width, points, dtype=torch.float64)
    xx, yy = torch.meshgrid(axis, axis, indexing="ij")
    with torch.no_grad():
        density = log_density(torch.stack([xx.flatten(), yy.flatten()], -1)).exp()
    density = density.reshape(points, points)
    return torch.trapezoid(torch.trapezoid(density, axis), axis).item()


def conditional_flow(builder="MAF", embedding=True, transformer="affine", permutation="reverse"):
    """A conditional flow with random weights, in evaluation mode: its Standardize modules stay
    the identity (in training mode the first call, e.g. a whole integration grid, would set
    them; test_standardized_context_then_embedding covers them)."""
    flow = BUILDERS[builder](
        2, layers=2, hidden_features=(16,), context_features=5, transformer=transformer,
        embedding=MLPEmbedding(5, 3, hidden_features=(8,)) if embedding else None,
        conditional_base=True, permutation=permutation,
    ).double()
    return perturb(flow, scale=0.15).eval()


# ----------------------------------------------------------------- the base on its own


def test_base_log_prob_is_the_normal_density():
    base = perturb(ConditionalDiagonalGaussian(3, context_features=4, hidden_features=(8,)))
    base = base.double()
    c, z = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    loc, log_scale = base.loc_and_log_scale(c)
    expected = torch.distributions.Normal(loc, log_scale.exp()).log_prob(z).sum(-1)
    torch.testing.assert_close(base.log_prob(z, c), expected)
    draws, log_p = base.rsample_and_log_prob(c)
    torch.testing.assert_close(log_p, base.log_prob(draws, c))


def test_base_integrates_to_one_for_a_fixed_context():
    base = perturb(ConditionalDiagonalGaussian(2, context_features=3), scale=0.2).double()
    c = torch.randn(1, 3, dtype=torch.float64)
    total = grid_integral(lambda z: base.log_prob(z, c.expand(z.shape[0], -1)))
    assert abs(total - 1) < 1e-4, total


def test_base_samples_have_the_context_mean_and_scale():
    base = perturb(ConditionalDiagonalGaussian(2, context_features=3)).double()
    c = torch.randn(1, 3, dtype=torch.float64).expand(20000, -1)
    z = base.rsample(c, generator=torch.Generator().manual_seed(0))
    loc, log_scale = base.loc_and_log_scale(c[:1])
    torch.testing.assert_close(z.mean(0), loc[0], atol=0.05, rtol=0)
    torch.testing.assert_close(z.std(0), log_scale[0].exp(), atol=0.05, rtol=0.02)


def test_base_gradients_reach_head_and_context():
    base = ConditionalDiagonalGaussian(2, context_features=3)
    c = torch.randn(4, 3, requires_grad=True)
    z, log_p = base.rsample_and_log_prob(c)
    (z.sum() + log_p.sum()).backward()
    assert c.grad is not None and c.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in base.parameters())


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda b: b.log_prob(torch.randn(4, 3), torch.randn(4, 2)), r"'z' should have shape"),
        (lambda b: b.log_prob(torch.randn(4, 2), torch.randn(4, 5)),
         r"'context' should have shape \(N, 3\)"),
        (lambda b: b.log_prob(torch.randn(4, 2), torch.randn(3, 3)), "4 rows but 'context' has 3"),
        (lambda b: b.rsample(torch.randn(3)), r"'context' should have shape \(N, 3\)"),
    ],
)
def test_base_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call(ConditionalDiagonalGaussian(2, context_features=3))


def test_base_names_a_context_of_another_dtype():
    """Checked against the head's weights, as DiagonalGaussian checks against its own (it used
    to reach the head's product: 'mat1 and mat2 must have the same dtype')."""
    base = ConditionalDiagonalGaussian(2, context_features=3)
    for call in (lambda c: base.log_prob(torch.zeros(4, 2), c), base.rsample):
        with pytest.raises(TypeError, match="'context' should have dtype torch.float32"):
            call(torch.zeros(4, 3, dtype=torch.float64))


# ----------------------------------------------------------------- flows with both


@pytest.mark.parametrize(
    "builder, transformer, embedding",
    [("MAF", "affine", True), ("MAF", "spline", False), ("IAF", "affine", True)],
)
def test_flow_density_integrates_to_one_for_a_fixed_context(builder, transformer, embedding):
    flow = conditional_flow(builder, embedding, transformer)
    c = torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    total = grid_integral(lambda x: flow.log_prob(x, c), half_width=12.0, points=401)
    assert abs(total - 1) < 2e-3, total


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_sample_and_log_prob_agree_with_log_prob(builder):
    flow = conditional_flow(builder)
    c = torch.randn(4, 5, dtype=torch.float64)
    x, log_p = flow.sample_and_log_prob(3, c)
    assert x.shape == (3, 4, 2) and log_p.shape == (3, 4)
    expected = flow.log_prob(x.reshape(-1, 2), c.expand(3, -1, -1).reshape(-1, 5))
    torch.testing.assert_close(log_p.reshape(-1), expected, atol=1e-9, rtol=0)


def test_flow_with_conditional_base_is_the_base_when_the_layers_are_identity():
    """With zeroed MADEs the affine layers are the identity (and so are the LU-linear maps with
    zeroed parameters): log p(x | c) must then be the base's Gaussian density at x, with the
    mean and scale the head gives for e(c)."""
    flow = conditional_flow("IAF", permutation="none")
    for p in flow.transform.parameters():
        nn.init.zeros_(p)
    c, x = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    loc, log_scale = flow.base.loc_and_log_scale(flow.embedding(c))
    expected = torch.distributions.Normal(loc, log_scale.exp()).log_prob(x).sum(-1)
    torch.testing.assert_close(flow.log_prob(x, c), expected)


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_gradients_reach_embedding_base_and_layers(builder):
    flow = conditional_flow(builder)
    c = torch.randn(8, 5, dtype=torch.float64)
    x, log_p = flow.sample_and_log_prob(context=c)
    (flow.log_prob(x.detach(), c).sum() + log_p.sum()).backward()
    for name, p in flow.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert flow.embedding.net[0].weight.grad.abs().sum() > 0
    assert flow.base.head.net[0].weight.grad.abs().sum() > 0


def test_sample_shapes_with_embedding():
    flow = conditional_flow("MAF")
    c = torch.randn(4, 5, dtype=torch.float64)
    assert flow.sample(context=c).shape == (4, 2)
    assert flow.sample(3, c).shape == (3, 4, 2)
    assert flow.sample(3, c[0]).shape == (3, 2)
    assert flow.log_prob(torch.randn(4, 2, dtype=torch.float64), c[0]).shape == (4,)


class CountingEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 3)
        self.rows: list[int] = []

    def forward(self, c):
        self.rows.append(c.shape[0])
        return torch.tanh(self.linear(c))


def test_embedding_runs_once_per_distinct_context():
    embedding = CountingEmbedding()
    flow = IAF(2, layers=2, hidden_features=(8,), context_features=5, embedding=embedding,
               conditional_base=True)
    embedding.rows.clear()
    flow.sample_and_log_prob(100, torch.randn(4, 5))
    assert embedding.rows == [4]


def test_sample_and_log_prob_runs_the_base_head_once():
    """The base's draws and their log-density come from one head call
    (rsample_and_log_prob), not from a draw and then a second call to score it."""
    flow = IAF(2, layers=2, hidden_features=(8,), context_features=3, conditional_base=True)
    calls = []
    flow.base.head.register_forward_hook(lambda *_: calls.append(1))
    x, log_p = flow.sample_and_log_prob(context=torch.randn(5, 3))
    assert len(calls) == 1
    assert x.shape == (5, 2) and log_p.shape == (5,)


@pytest.mark.slow  # 300 Adam steps; test_gradients_reach_embedding_base_and_layers runs in CI
def test_embedding_trains_jointly():
    """A context of 20 numbers of which only the first matters: the flow learns p(x | c) only
    through the embedding (8 -> 2 features), and gets close to the true conditional NLL."""
    torch.manual_seed(0)
    flow = MAF(1, layers=2, hidden_features=(16,), context_features=20,
               embedding=MLPEmbedding(20, 2, hidden_features=(16,)), conditional_base=True)
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-2)
    for _ in range(300):
        c = torch.randn(256, 20)
        x = 2 * c[:, :1] + 0.1 * torch.randn(256, 1)
        loss = -flow.log_prob(x, c).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    c = torch.randn(4096, 20)
    x = 2 * c[:, :1] + 0.1 * torch.randn(4096, 1)
    nll = -flow.log_prob(x, c).mean().item()
    true_nll = 0.5 * math.log(2 * math.pi * 0.01) + 0.5
    assert nll < true_nll + 0.3, (nll, true_nll)


# ----------------------------------------------------------------- save and load


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_save_load_round_trip_with_built_in_embedding(builder, tmp_path):
    flow = conditional_flow(builder)
    flowkit.save_model(flow, tmp_path / "flow.pt")
    loaded = flowkit.load_model(tmp_path / "flow.pt")
    assert isinstance(loaded.embedding, MLPEmbedding)
    assert isinstance(loaded.base, ConditionalDiagonalGaussian)
    x, c = torch.randn(5, 2, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)
    torch.testing.assert_close(loaded.log_prob(x, c), flow.eval().log_prob(x, c), rtol=0, atol=0)


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_standardized_context_then_embedding(builder, tmp_path):
    """The builders standardize the raw context, then embed it: the embedding reads
    ``(c - mean) / std``, so a flow set from contexts ``a c + b`` gives the same density as its
    twin (same weights) set from ``c``; the Standardize buffers, the embedding and the
    conditional base come back from a file."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 2, generator=g, dtype=torch.float64)
    c = torch.randn(400, 5, generator=g, dtype=torch.float64)
    a = torch.tensor([100.0, 0.01, 3.0, 1.0, 50.0], dtype=torch.float64)
    b = torch.tensor([-30.0, 2.0, 0.0, 1000.0, 7.0], dtype=torch.float64)
    flow = conditional_flow(builder)
    twin = copy.deepcopy(flow)
    set_from_data(flow, [(x, a * c + b)])
    set_from_data(twin, [(x, c)])
    seen = []
    flow.embedding.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    log_p = flow.log_prob(x, a * c + b)
    torch.testing.assert_close(seen[0], (c - c.mean(0)) / c.std(0, correction=0))
    torch.testing.assert_close(log_p, twin.log_prob(x, c))
    flowkit.save_model(flow, tmp_path / "flow.pt")
    loaded = flowkit.load_model(tmp_path / "flow.pt")
    torch.testing.assert_close(loaded.standardize_context.scale, flow.standardize_context.scale,
                               rtol=0, atol=0)
    assert isinstance(loaded.embedding, MLPEmbedding)
    assert isinstance(loaded.base, ConditionalDiagonalGaussian)
    torch.testing.assert_close(loaded.log_prob(x, a * c + b), log_p, rtol=0, atol=0)


class MyEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 3)

    def forward(self, c):
        return torch.sin(self.linear(c))


def test_custom_embedding_is_loaded_with_the_network_given(tmp_path):
    flow = perturb(MAF(2, layers=2, hidden_features=(8,), context_features=5,
                       embedding=MyEmbedding(), conditional_base=True))
    path = tmp_path / "flow.pt"
    flowkit.save_model(flow, path)
    assert flow.config["kwargs"]["embedding"] == {"custom": f"{__name__}.MyEmbedding",
                                                  "structure": repr(MyEmbedding())}
    with pytest.raises(CheckpointError, match=r"custom embedding network .*MyEmbedding.*"
                                              r"load_model\(path, embedding=network\)"):
        flowkit.load_model(path)
    loaded = flowkit.load_model(path, embedding=MyEmbedding())  # fresh weights, then the file's
    x, c = torch.randn(5, 2), torch.randn(5, 5)
    torch.testing.assert_close(loaded.log_prob(x, c), flow.eval().log_prob(x, c), rtol=0, atol=0)
    with pytest.raises(CheckpointError, match=r"'embedding' is a Sequential, but the model in "
                       r".* was saved with a .*MyEmbedding"):
        flowkit.load_model(path, embedding=nn.Sequential(nn.Linear(5, 3)))

    class MyEmbedding2(MyEmbedding):  # the same weights' names, another function
        def forward(self, c):
            return torch.tanh(self.linear(c))

    with pytest.raises(CheckpointError, match="would load into another network"):
        flowkit.load_model(path, embedding=MyEmbedding2())


def test_a_custom_embedding_of_another_structure_is_refused(tmp_path):
    """Review 41: a Sequential(Linear, ReLU, Linear) loaded into a Sequential(Linear, Tanh,
    Linear), the same weights' names and shapes: the mean NLL went from 0.37 to 62.9, silently.
    The file records the network's repr (files written before it load as they did)."""
    def net(activation):
        return nn.Sequential(nn.Linear(5, 8), activation, nn.Linear(8, 3))

    flow = perturb(MAF(2, layers=1, hidden_features=(8,), context_features=5,
                       embedding=net(nn.ReLU())))
    path = tmp_path / "flow.pt"
    flowkit.save_model(flow, path)
    with pytest.raises(CheckpointError, match=r"(?s)another structure.*saved:.*ReLU.*given:.*Tanh"):
        flowkit.load_model(path, embedding=net(nn.Tanh()))
    loaded = flowkit.load_model(path, embedding=net(nn.ReLU()))
    x, c = torch.randn(5, 2), torch.randn(5, 5)
    torch.testing.assert_close(loaded.log_prob(x, c), flow.eval().log_prob(x, c), rtol=0, atol=0)
    # a file without the structure (written before 2026-11-27) loads, and resumes into the model
    del flow.config["kwargs"]["embedding"]["structure"]
    old = tmp_path / "old.pt"
    flowkit.save_model(flow, old)
    flowkit.load_model(old, embedding=net(nn.Tanh()))  # not detectable in such a file
    flowkit.checkpoint.load_checkpoint(old).restore(loaded)


def test_embedding_argument_is_refused_for_other_files(tmp_path):
    for name, flow in [("plain", MAF(2, layers=1, hidden_features=(4,), context_features=3)),
                       ("builtin", conditional_flow())]:
        flowkit.save_model(flow, tmp_path / f"{name}.pt")
        with pytest.raises(CheckpointError, match="'embedding' was given"):
            flowkit.load_model(tmp_path / f"{name}.pt", embedding=MyEmbedding())


# ----------------------------------------------------------------- errors and MLPEmbedding


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(embedding=MLPEmbedding(3, 2)), "'embedding' was given but 'context_features' is 0"),
        (dict(context_features=4, embedding=MLPEmbedding(3, 2)),
         "takes in_features=3 but the flow has context_features=4"),
        (dict(context_features=3, embedding=nn.Linear(4, 2)), "failed on a \\(1, 3\\) input"),
        (dict(context_features=3, embedding=nn.Flatten(0)), "it returned \\(3,\\)"),
        (dict(context_features=3, embedding="mlp"), "'embedding' should be an nn.Module"),
        (dict(conditional_base=True), "'conditional_base' is True but 'context_features' is 0"),
        (dict(context_features=3, conditional_base=True, learnable_base=True),
         "'learnable_base' and 'conditional_base' are both True"),
        (dict(context_features=3, conditional_base="yes"),
         "'conditional_base' should be True or False"),
    ],
)
def test_bad_builder_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MAF(2, layers=1, hidden_features=(4,), **kwargs)


def test_mlp_embedding_shapes_and_errors():
    e = MLPEmbedding(4, 2, hidden_features=(), activation="tanh")
    assert isinstance(e.net[0], nn.Linear) and len(e.net) == 1
    assert e(torch.randn(3, 5, 4)).shape == (3, 5, 2)
    with pytest.raises(ValueError, match=r"'context' should have shape \(\.\.\., 4\)"):
        e(torch.randn(3, 5))
    assert isinstance(MLPEmbedding(4, 2, activation="GELU").net[1], nn.GELU)
    with pytest.raises(ValueError, match="'activation' should be the name or class of a torch"):
        MLPEmbedding(4, 2, activation="softmax")
    with pytest.raises(ValueError, match="'out_features' should be"):
        MLPEmbedding(4, 0)
    with pytest.raises(ValueError, match="'hidden_features' should be a sequence"):
        MLPEmbedding(4, 2, hidden_features=8)


def test_flow_checks_widths_of_embedding_transform_and_base():
    made_flow = MAF(2, layers=1, hidden_features=(4,), context_features=3)
    base = ConditionalDiagonalGaussian(2, context_features=4)
    with pytest.raises(ValueError, match="transform' reads a context of 3 features but 'base'"):
        flowkit.Flow(made_flow.transform, base)
    with pytest.raises(ValueError, match="'context_features' \\(the width of the raw context"):
        flowkit.Flow(made_flow.transform, made_flow.base, embedding=MLPEmbedding(6, 3))
    with pytest.raises(ValueError, match="maps the context to 2 features but the transform"):
        flowkit.Flow(made_flow.transform, made_flow.base, embedding=MLPEmbedding(6, 2),
                     context_features=6)
    flow = flowkit.Flow(made_flow.transform, made_flow.base, embedding=MLPEmbedding(6, 3),
                        context_features=6)
    assert flow.context_features == 6
    assert flow.log_prob(torch.randn(2, 2), torch.randn(2, 6)).shape == (2,)


# ----------------------------------------------------------------- a base that reads the context


def raw_base_flow(builder="IAF", standardize=False):
    """A flow whose MADEs read a linear embedding (5 -> 3) of the context and whose base head
    reads the context itself (base_context="raw"), with random weights, in evaluation mode."""
    flow = BUILDERS[builder](
        2, layers=2, hidden_features=(16,), context_features=5, conditional_base=True,
        embedding=MLPEmbedding(5, 3, hidden_features=()), base_context="raw",
        standardize=standardize,
    ).double()
    return perturb(flow, scale=0.15).eval()


@pytest.mark.parametrize("builder", ["MAF", "IAF"])
def test_raw_base_reads_the_standardized_context_and_the_layers_its_embedding(builder):
    """log p(x | c) = log N(T(x; e(s(c))); mu(s(c)), sigma(s(c))^2) + log|det dT/dx|: the
    base's head reads the standardized context s(c), the MADEs its embedding e(s(c))."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 2, generator=g, dtype=torch.float64)
    c = 10.0 * torch.randn(300, 5, generator=g, dtype=torch.float64) + 3.0
    flow = raw_base_flow(builder, standardize=True)
    set_from_data(flow, [(x, c)])
    assert flow.base.context_features == 5
    assert {m.context_features for m in flow.modules() if isinstance(m, MADE)} == {3}
    s = (c - c.mean(0)) / c.std(0, correction=0)
    z, log_det = flow.transform(x, flow.embedding(s))
    torch.testing.assert_close(flow.log_prob(x, c), flow.base.log_prob(z, s) + log_det)
    samples, log_p = flow.sample_and_log_prob(3, c[:4])
    torch.testing.assert_close(
        log_p.reshape(-1), flow.log_prob(samples.reshape(-1, 2), c[:4].repeat(3, 1)),
        atol=1e-9, rtol=0,
    )


def test_raw_base_flow_integrates_to_one_for_a_fixed_context():
    flow = raw_base_flow("IAF")
    c = torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    total = grid_integral(lambda x: flow.log_prob(x, c), half_width=12.0, points=401)
    assert abs(total - 1) < 2e-3, total


def test_raw_base_gradients_and_one_embedding_per_context():
    embedding = CountingEmbedding()
    flow = perturb(IAF(2, layers=2, hidden_features=(8,), context_features=5,
                       embedding=embedding, conditional_base=True, base_context="raw"))
    embedding.rows.clear()
    x, log_p = flow.sample_and_log_prob(10, torch.randn(4, 5))
    assert embedding.rows == [4]
    (x.sum() + log_p.sum()).backward()
    assert embedding.linear.weight.grad.abs().sum() > 0
    assert flow.base.head.net[0].weight.grad.abs().sum() > 0


def test_raw_base_save_load_round_trip(tmp_path):
    flow = raw_base_flow("MAF")
    flowkit.save_model(flow, tmp_path / "flow.pt")
    loaded = flowkit.load_model(tmp_path / "flow.pt")
    assert loaded.base_context == "raw" and loaded.base.context_features == 5
    x, c = torch.randn(5, 2, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)
    torch.testing.assert_close(loaded.log_prob(x, c), flow.log_prob(x, c), rtol=0, atol=0)


def test_raw_base_errors():
    with pytest.raises(ValueError, match="'base_context' is 'raw' but 'conditional_base' is"):
        MAF(2, layers=1, context_features=3, base_context="raw")
    with pytest.raises(ValueError, match="'base_context' should be 'embedded' or 'raw'"):
        MAF(2, layers=1, context_features=3, conditional_base=True, base_context="context")
    made_flow = MAF(2, layers=1, hidden_features=(4,), context_features=3)
    with pytest.raises(ValueError, match="'base' reads a context of 4 features but"):
        flowkit.Flow(made_flow.transform, ConditionalDiagonalGaussian(2, context_features=4),
                     embedding=MLPEmbedding(6, 3), context_features=6, base_context="raw")
    with pytest.raises(ValueError, match="'base_context' is 'raw' but 'base' reads no context"):
        flowkit.Flow(made_flow.transform, made_flow.base, embedding=MLPEmbedding(6, 3),
                     context_features=6, base_context="raw")
    flow = flowkit.Flow(made_flow.transform, ConditionalDiagonalGaussian(2, context_features=6),
                        embedding=MLPEmbedding(6, 3), context_features=6, base_context="raw")
    assert flow.log_prob(torch.randn(2, 2), torch.randn(2, 6)).shape == (2,)


def test_embed_context_is_what_the_layers_read():
    """Standardized, then embedded; with base_context="raw" still the layers' part only."""
    c = 100.0 + 10.0 * torch.randn(64, 3, dtype=torch.float64)
    for base_context in ("embedded", "raw"):
        embedding = flowkit.MLPEmbedding(3, 4, hidden_features=(8,))
        flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=3,
                           embedding=embedding, conditional_base=True,
                           base_context=base_context).double()
        flow.standardize_context.set(c.mean(0), c.std(0))
        h = flow.embed_context(c[:5])
        torch.testing.assert_close(h, embedding.double()((c[:5] - c.mean(0)) / c.std(0)))
        assert flow.embed_context(c[:6].reshape(2, 3, 3)).shape == (2, 3, 4)
    with pytest.raises(ValueError, match="unconditional"):
        flowkit.MAF(2).embed_context(c[:2])


def test_importance_sampling_estimates_log_z_elbo_and_ess():
    """Review 43: a VI user had no ESS or importance-weighted log Z. For q = N(0, I) and the
    target p~ = N(m, I) times Z = 7, the weights are known: log Z, ELBO = log Z - |m|^2 / 2 and
    ESS = exp(-|m|^2)."""
    flow = IAF(2, layers=1, hidden_features=(8,)).double()  # the identity at construction
    m = torch.tensor([0.3, -0.2], dtype=torch.float64)
    log_z = math.log(7.0)

    def target(x):
        return log_z - 0.5 * (x - m).square().sum(-1) - math.log(2 * math.pi)

    torch.manual_seed(0)
    est = flowkit.flows.importance_sampling(flow, target, n=200_000)
    assert est.log_weights.shape == (200_000,)
    assert est.log_z.item() == pytest.approx(log_z, abs=0.01)
    assert est.elbo.item() == pytest.approx(log_z - 0.5 * m.square().sum().item(), abs=0.01)
    assert est.ess.item() == pytest.approx(math.exp(-m.square().sum().item()), abs=0.01)
    assert flow.training and not flow.transform.transforms[0].initialized  # left as it was
    # per context row, for a conditional flow; a wrong shape is named
    cond = IAF(2, layers=1, hidden_features=(8,), context_features=1).double()
    est = flowkit.flows.importance_sampling(
        cond, lambda x, c: -0.5 * x.square().sum(-1) - math.log(2 * math.pi), n=50,
        context=torch.zeros(3, 1, dtype=torch.float64))
    assert est.log_z.shape == (3,) and est.log_weights.shape == (50, 3)
    torch.testing.assert_close(est.ess, torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"one log-density per sample, shape \(10,\), got \(\)"):
        flowkit.flows.importance_sampling(flow, lambda x: x.sum(), n=10)
