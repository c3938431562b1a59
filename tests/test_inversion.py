"""The incremental solver equals the naive D-pass solver; MaskedLinear's cache stays correct."""

import contextlib
import copy
import pickle
import random
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import made_configs

import flowkit
from flowkit import IAF, MADE, MAF
from flowkit.nn import inversion_program
from flowkit.nn.inversion import (
    OneHot,
    solve,
    solve_naive,
    solve_naive_with_params,
    solve_with_params,
)
from flowkit.nn.inversion_program import build_program
from flowkit.nn.layout import sorted_layout
from flowkit.nn.linear import _spread
from flowkit.nn.scratch import Scratch
from flowkit.validation import validate_values

torch_f64 = dict(dtype=torch.float64)


# small: the naive solver runs D full passes
MADES = made_configs(max_features=7, hidden=(1, 24), max_context=2)


def _made(config: dict, mask: int = 0) -> MADE:
    made = MADE(**config).double()
    made.set_mask(mask)
    with torch.no_grad():
        for layer in [*made.hidden, made.output]:
            layer.bias.normal_(0, 0.5)
        made.output.weight.normal_(0, 0.5)  # make every allowed path non-zero
    return made


def _problem(made: MADE, n: int = 5, seed: int = 0):
    """Noise, context and an affine-like step (bounded scale, so values stay O(1))."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, made.features, generator=g, **torch_f64)
    c = made.context_features
    context = torch.randn(n, c, generator=g, **torch_f64) if c else None

    def step(params, index):
        return z[:, index] * torch.exp(torch.tanh(params[..., -1])) + params[..., 0]

    return z, context, step


# None: the solver's choice; an int: every connection gets that window; a tuple: each
# connection draws one of them (connections into one stage with different windows)
WINDOWS = st.sampled_from([None, 1, 2, 3, (1, 2, 3, 5, 7, 8, 20)])


def _windows(window: int | tuple[int, ...] | None):
    """The connections of the programs built inside get ``window`` (see WINDOWS)."""
    if window is None:
        return contextlib.nullcontext()
    inversion_program._windows.clear()  # chosen once per MADE: choose again
    if isinstance(window, int):
        return mock.patch.object(inversion_program, "choose_window",
                                 lambda traffic, features: window)
    draw = random.Random(0).choice
    return mock.patch.object(inversion_program, "choose_window",
                             lambda traffic, features: draw(window))


@settings(max_examples=50, deadline=None)
@given(MADES, st.booleans(), WINDOWS)
def test_equals_naive_for_random_shapes_orderings_and_mask_sets(config, tracked, window):
    config, mask = config
    made = _made(config, mask)
    z, context, step = _problem(made)
    with torch.set_grad_enabled(tracked), _windows(window):
        expected = solve_naive(made, step, z, context)
        y, params = solve_with_params(made, step, z, context)
        torch.testing.assert_close(y, expected, rtol=0, atol=1e-10)
        torch.testing.assert_close(params, made(y, context), rtol=0, atol=1e-10)


@settings(max_examples=10, deadline=None)
@given(MADES, WINDOWS)
def test_gradients_equal_the_naive_solvers(config, window):
    config, mask = config
    made = _made(config, mask)
    z, context, step = _problem(made)
    z.requires_grad_()
    if context is not None:
        context.requires_grad_()
    inputs = [z, *made.parameters(), *([] if context is None else [context])]

    def grads(solver):
        loss = solver(made, step, z, context).sin().sum()
        return torch.autograd.grad(loss, inputs, allow_unused=True, materialize_grads=True)

    with _windows(window):
        fast = grads(solve)
    for got, expected in zip(fast, grads(solve_naive), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("window", [1, 2, 3, 7])
@pytest.mark.parametrize(
    "config",
    [dict(hidden_features=(64, 64)), dict(hidden_features=(48, 4), params_per_feature=3),
     dict(hidden_features=(40, 40, 40), residual=True, context_features=2),
     dict(hidden_features=(30,), direct_connection=True, num_masks=3)],
    ids=["wide", "narrow-layer", "residual-context", "direct-masks"],
)
def test_every_window_is_exact_with_its_gradients(monkeypatch, config, window):
    """Windows of one degree (NADE), a few, and all degrees (whole prefixes) for every
    connection give the naive solver's values and gradients, with and without autograd."""
    monkeypatch.setattr(inversion_program, "choose_window", lambda traffic, features: window)
    mask = 1 if "num_masks" in config else 0
    made = _made(dict(features=6, order="random", seed=3, **config), mask)
    z, context, step = _problem(made)
    with torch.no_grad():
        program = build_program(made, sorted_layout(made), one_hot=False)
    assert bool(any(program.flushes)) == (window <= 6)
    z.requires_grad_()
    if context is not None:
        context.requires_grad_()
    inputs = [z, *made.parameters(), *([] if context is None else [context])]

    def solved(solver):
        y = solver(made, step, z, context)
        return y, torch.autograd.grad(y.sin().sum(), inputs, allow_unused=True,
                                      materialize_grads=True)

    (y, grads), (expected, expected_grads) = solved(solve), solved(solve_naive)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-10)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    with torch.no_grad():
        torch.testing.assert_close(solve(made, step, z, context), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("window", [None, 1, 2, (1, 2, 3, 6)])
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("hidden", [(), (12,), (10, 10)])
def test_one_hot_inputs_gather_one_weight_row_per_feature(hidden, direct, window):
    classes = 4
    made = MADE(5, hidden, params_per_feature=classes, inputs_per_feature=classes,
                context_features=2, order="random", direct_connection=direct, seed=1).double()
    torch.nn.init.normal_(made.output.weight)
    g = torch.Generator().manual_seed(0)
    gumbel = -torch.log(-torch.log(torch.rand(6, 5, classes, generator=g, **torch_f64)))
    context = torch.randn(6, 2, generator=g, **torch_f64)

    def step(params, index):
        return (params + gumbel[:, index]).argmax(-1)

    like = torch.zeros(6, 5, dtype=torch.long)
    with _windows(window):
        expected = solve_naive(made, step, like, context, OneHot(classes, torch.float64))
        for encode in [OneHot(classes, torch.float64),
                       lambda y: torch.nn.functional.one_hot(y, classes).double()]:
            with torch.no_grad():
                assert torch.equal(solve(made, step, like, context, encode), expected)
            assert torch.equal(solve(made, step, like, context, encode), expected)


@pytest.mark.parametrize("window", [None, 1, 2, 4])
@pytest.mark.parametrize("context", [0, 2])
def test_params_a_step_keeps_are_not_overwritten_by_later_calls(window, context):
    """Without autograd the solver works in memory that the thread reuses: what it hands a
    step (which may keep it) is never that memory (review 49)."""
    made = _made(dict(features=4, hidden_features=(6,), params_per_feature=2, seed=0,
                      context_features=context))
    kept = []

    def step(params, index):
        kept.append(params)
        return params[..., 0] * 0 + 1.0

    like = torch.zeros(3, 4, **torch_f64)
    c = torch.randn(3, context, **torch_f64) if context else None
    with torch.no_grad(), _windows(window):
        solve(made, step, like, c)
        first = [p.clone() for p in kept]
        solve(made, lambda params, index: params[..., 0] * 0 + 5.0, like, c)
    for was, now in zip(first, kept, strict=True):
        assert torch.equal(was, now)


def test_bernoulli_samples_are_identical_in_float32():
    made = MADE(30, (64, 64), params_per_feature=1, order="random", seed=2)
    torch.nn.init.normal_(made.output.weight)
    u = torch.rand(20, 30, generator=torch.Generator().manual_seed(0))

    def step(params, index):
        return (u[:, index] < torch.sigmoid(params[..., 0])).float()

    with torch.no_grad():
        assert torch.equal(solve(made, step, u), solve_naive(made, step, u))


def test_frozen_made_under_autograd_differentiates_the_noise():
    made = _made(dict(features=4, hidden_features=(16, 16), params_per_feature=2))
    made.requires_grad_(False)
    z, _, step = _problem(made)
    z.requires_grad_()
    (got,) = torch.autograd.grad(solve(made, step, z).sum(), z)
    (expected,) = torch.autograd.grad(solve_naive(made, step, z).sum(), z)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("transformer", ["affine", "spline"])
@pytest.mark.parametrize("builder", [MAF, IAF])
def test_flow_layers_match_the_naive_solver(builder, transformer):
    flow = builder(3, layers=2, hidden_features=(8, 8), context_features=2,
                   transformer=transformer, residual=True, seed=1).double()
    layers = [t for t in flow.transform.transforms if hasattr(t, "made")]
    for layer in layers:
        torch.nn.init.normal_(layer.made.output.weight, std=0.3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, generator=g, **torch_f64)
    context = torch.randn(4, 2, generator=g, **torch_f64)

    def run():
        torch.manual_seed(0)
        sample = flow.rsample(context=context)
        loss = sample.square().sum() + flow.log_prob(x, context).sum()
        return loss, torch.autograd.grad(loss, list(flow.parameters()), allow_unused=True,
                                         materialize_grads=True)

    loss, grads = run()
    for layer in layers:
        layer.made.solver = "naive"  # the reference solver
    expected_loss, expected_grads = run()
    torch.testing.assert_close(loss, expected_loss, rtol=1e-12, atol=1e-10)
    for got, expected in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def test_maf_sample_round_trips_in_float32():
    flow = MAF(6, layers=2, hidden_features=(16, 16), transformer="spline")
    for layer in (t for t in flow.transform.transforms if hasattr(t, "made")):
        torch.nn.init.normal_(layer.made.output.weight, std=0.1)
    with torch.no_grad(), validate_values(False):
        x = flow.sample(16)
        z, _ = flow.transform(x)
        torch.testing.assert_close(flow.transform.inverse(z)[0], x, rtol=1e-4, atol=1e-4)


def test_scratch_memory_is_reused_safely_across_calls_and_nested_solves():
    """Without autograd the solver's buffers are memory reused between calls: results of
    earlier calls keep their values, other batch sizes work, and a step that itself solves
    (a nested call) gets buffers of its own."""
    made = MADE(5, (24, 24), params_per_feature=1, order="random", seed=2).double()
    other = MADE(5, (32,), params_per_feature=1, order="random", seed=3).double()
    z = torch.randn(7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def inner(v):
        return lambda params, index: v.index_select(1, index) + params[..., 0]

    def outer(params, index):
        nested = solve(other, inner(z), z)
        return 0.5 * z.index_select(1, index) + torch.tanh(params[..., 0]) + nested[:, index]

    with torch.no_grad():
        solve(made, outer, z)  # the scratch exists from here on
        first = solve(made, outer, z)
        kept = first.clone()
        expected = solve_naive(made, outer, z)
        for n in (3, 7):
            torch.testing.assert_close(solve(other, inner(z[:n]), z[:n]),
                                       solve_naive(other, inner(z[:n]), z[:n]), rtol=0,
                                       atol=1e-12)
    torch.testing.assert_close(first, expected, rtol=0, atol=1e-12)
    assert torch.equal(first, kept)


def test_cached_program_follows_optimizer_steps_and_mask_changes():
    made = MADE(5, (16, 16), params_per_feature=2, num_masks=2, order="random", seed=4)
    z = torch.randn(3, 5)

    def step(params, index):
        return z[:, index] * torch.exp(torch.tanh(params[..., 1])) + params[..., 0]

    def check():
        with torch.no_grad():
            torch.testing.assert_close(solve(made, step, z), solve_naive(made, step, z))

    check()
    optimizer = torch.optim.Adam(made.parameters(), lr=0.1, fused=True)
    made(z).square().sum().backward()
    optimizer.step()  # fused: updates the weights without bumping their version counters
    check()
    made.set_mask(1)
    check()
    other = MADE(5, (16, 16), params_per_feature=2, num_masks=2, order="random", seed=5)
    made.load_state_dict(other.state_dict())
    check()


@pytest.mark.parametrize("solver", [solve, solve_with_params, solve_naive,
                                    solve_naive_with_params])
def test_like_and_context_are_checked(solver):
    def step(params, index):
        return params[..., 0]

    made = MADE(3, (8,))
    for like in (torch.zeros(2, 5), torch.zeros(2, 3, 1), torch.zeros(3)):
        with pytest.raises(ValueError, match=r"'like' should have shape \(N, 3\), got "):
            solver(made, step, like)
    with pytest.raises(TypeError, match=r"'like' should be a torch.Tensor of shape \(N, 3\)"):
        solver(made, step, [[0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="'context' was given"):
        solver(made, step, torch.zeros(2, 3), torch.zeros(2, 1))
    conditional = MADE(3, (8,), context_features=2)
    with pytest.raises(ValueError, match=r"'context' is required: a tensor of shape \(2, 2\)"):
        solver(conditional, step, torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"'context' should have shape \(2, 2\)"):
        solver(conditional, step, torch.zeros(2, 3), torch.zeros(4, 2))


class TestMaskedLinearCache:
    def layer(self):
        made = MADE(4, (8,), params_per_feature=1)
        return made.hidden[0], torch.randn(3, 4)

    def test_reused_without_gradients_and_dropped_with_them(self):
        layer, x = self.layer()
        with torch.no_grad():
            first = layer.masked_weight()
            assert layer.masked_weight() is first
        assert layer.masked_weight().requires_grad and layer._cache is None

    @pytest.mark.parametrize(
        "change",
        [
            lambda layer: torch.nn.init.normal_(layer.weight),
            lambda layer: layer.set_mask(torch.ones_like(layer.mask)),
            lambda layer: layer.load_state_dict(
                {k: v + 1 for k, v in layer.state_dict().items()}),
            lambda layer: torch.optim.SGD(layer.parameters(), lr=1.0).step(),
            lambda layer: torch.optim.Adam(layer.parameters(), fused=True).step(),
            lambda layer: layer.weight.data.mul_(0.5).add_(0.5 * torch.randn_like(layer.weight)),
            lambda layer: layer.weight.data.copy_(torch.randn_like(layer.weight)),
            lambda layer: layer.weight.data.normal_(),
        ],
        ids=["init", "set_mask", "load_state_dict", "sgd", "fused-adam", "soft-update-data",
             "copy-into-data", "reinit-data"],
    )
    def test_any_change_invalidates_it(self, change):
        layer, x = self.layer()
        for p in layer.parameters():
            p.grad = torch.ones_like(p)
        with torch.no_grad():
            layer(x)
            change(layer)
            torch.testing.assert_close(layer(x), x @ (layer.weight * layer.mask).T + layer.bias)

    @pytest.mark.parametrize("fused", [False, True])
    def test_kept_across_steps_of_other_models(self, fused):
        layer, x = self.layer()
        other = copy.deepcopy(layer)
        for p in [*layer.parameters(), *other.parameters()]:
            p.grad = torch.ones_like(p)
        with torch.no_grad():
            first = layer.masked_weight()
            torch.optim.Adam(other.parameters(), fused=fused).step()
            assert layer.masked_weight() is first
            torch.optim.Adam(layer.parameters(), fused=fused).step()
            assert layer.masked_weight() is not first
            torch.testing.assert_close(layer(x), x @ (layer.weight * layer.mask).T + layer.bias)

    def test_moves_with_dtype_and_stays_out_of_copies(self):
        layer, x = self.layer()
        with torch.no_grad():
            layer(x)
            assert layer._cache is not None
            assert copy.deepcopy(layer)._cache is None
            assert pickle.loads(pickle.dumps(layer))._cache is None
            layer.double()
            assert layer(x.double()).dtype == torch.float64

    def test_a_write_of_one_entry_through_data_needs_clear_cache(self):
        """Writes through ``.data`` bump no version counter; a sample of entries catches updates
        of the whole weight (above), ``clear_cache`` a write to one entry."""
        made = MADE(16, (512,), params_per_feature=1)
        layer, x = made.hidden[0], torch.randn(3, 16)
        row, column = layer.mask.nonzero()[1].tolist()
        assert row * 16 + column not in _spread(layer.mask).tolist()
        with torch.no_grad():
            layer(x)
            layer.weight.data[row, column] += 1.0
            layer.clear_cache()
            torch.testing.assert_close(layer(x), x @ (layer.weight * layer.mask).T + layer.bias)

    def test_clear_caches_forgets_every_masked_layers_product_and_the_solvers_program(self):
        """Review 41: after one entry written through ``.data`` a flow's log_prob was off by
        up to 2.8 nats, sample too, and clearing meant a call per layer."""
        torch.manual_seed(0)
        flow = MAF(16, layers=2, hidden_features=(512,)).eval()
        for p in flow.parameters():
            torch.nn.init.normal_(p, std=0.05)
        x = torch.randn(5, 16)
        layer = flow.transform.transforms[-1].made.hidden[0]
        row, column = layer.mask.nonzero()[1].tolist()
        with torch.no_grad():
            flow.log_prob(x), flow.sample(3)  # caches the products and the solver's program
            layer.weight.data[row, column] += 5.0
            stale = flow.log_prob(x)
            flowkit.nn.clear_caches(flow)
            fresh = flow.log_prob(x)
            noise = torch.randn(3, 16)
            expected = copy.deepcopy(flow).sample_from_noise(noise)  # a copy caches nothing
            torch.testing.assert_close(flow.sample_from_noise(noise), expected)
        assert not torch.allclose(stale, fresh)
        torch.testing.assert_close(fresh, copy.deepcopy(flow).log_prob(x))

    def test_a_target_network_updated_through_data_samples_with_its_new_weights(self):
        """The soft update of SAC code, through ``.data``, under no_grad: sampling and density
        use the updated weights (the cached products used to keep the old ones)."""
        torch.manual_seed(0)
        policy = IAF(2, layers=2, hidden_features=(16,), context_features=3)
        target = copy.deepcopy(policy)
        obs = torch.randn(4, 3)
        with torch.no_grad():
            target.sample_and_log_prob(context=obs)  # caches the products
            for p in policy.parameters():
                p.add_(0.5 * torch.randn_like(p))
        for tp, p in zip(target.parameters(), policy.parameters(), strict=True):
            tp.data.copy_(0.5 * p.data + 0.5 * tp.data)
        x = torch.randn(4, 2)
        with torch.no_grad():
            stale_or_not = target.log_prob(x, obs)
            fresh = copy.deepcopy(target).log_prob(x, obs)  # a copy has no cached products
        torch.testing.assert_close(stale_or_not, fresh)

    def test_inference_mode_product_is_not_used_under_autograd(self):
        layer, x = self.layer()
        layer.requires_grad_(False)
        with torch.inference_mode():
            layer(x)
        x.requires_grad_()
        layer(x).sum().backward()  # would fail on an inference tensor saved for backward
        assert x.grad is not None



def test_made_solver_naive_switches_to_the_reference():
    made = MADE(4, (16,), params_per_feature=1, order="random", seed=3)
    u = torch.rand(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    made = made.double()

    def step(params, index):
        return (u[:, index] < params[..., 0].sigmoid()).double()

    fast = solve_with_params(made, step, u)
    made.solver = "naive"
    naive = solve_with_params(made, step, u)
    assert torch.equal(fast[0], naive[0])
    torch.testing.assert_close(fast[1], naive[1])
    with pytest.raises(ValueError, match="'solver' should be 'fast' or 'naive'"):
        made.solver = "quick"
    assert made.solver == "naive"


@pytest.mark.parametrize("call", ["maf_sample", "iaf_log_prob"])
def test_the_solver_runs_under_autocast(call):
    """Under torch.autocast the solver's in-place products met bfloat16 operands and failed;
    it runs with autocast off and gives the float32 results."""
    torch.manual_seed(0)
    flow = (MAF if call == "maf_sample" else IAF)(2, layers=2, hidden_features=(16,)).eval()
    x = torch.randn(8, 2)

    def run():
        if call == "maf_sample":
            torch.manual_seed(1)
            return flow.sample(4)
        return flow.log_prob(x)

    expected = run()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = run()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("window", [1, 3, None])
def test_the_path_without_scratch_memory_is_exact(monkeypatch, window):
    """What a GPU runs (no scratch memory: fresh buffers at every call), on the CPU."""
    monkeypatch.setattr(Scratch, "applies", staticmethod(lambda like: False))
    made = _made(dict(features=6, hidden_features=(24, 24), context_features=2, order="random",
                      direct_connection=True, seed=5))
    z, context, step = _problem(made)
    with torch.no_grad(), _windows(window):
        y, params = solve_with_params(made, step, z, context)
        torch.testing.assert_close(y, solve_naive(made, step, z, context), rtol=0, atol=1e-10)
        torch.testing.assert_close(params, made(y, context), rtol=0, atol=1e-10)
