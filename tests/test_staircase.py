"""Block-staircase products equal the dense masked products, values and gradients, in every
composition (mask sets, contexts, residual blocks, direct connections, flows, solver, compile,
save/load); the automatic choice and the block plans behave."""

import io
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import made_configs

import flowkit
from flowkit import MADE
from flowkit.nn import MaskedLinear, staircase
from flowkit.nn.scratch import Scratch
from flowkit.nn.staircase import LayerPlan

f64 = dict(dtype=torch.float64)

# hidden layers wide enough to cut into blocks
MADES = made_configs(max_features=12, hidden=(16, 80), max_context=3, inputs_per_feature=True)


@contextmanager
def product(model: torch.nn.Module, name: str):
    """Every MADE of ``model`` computes its products the ``name`` way within the block."""
    mades = [m for m in model.modules() if isinstance(m, MADE)]
    for made in mades:
        made.product = name
    try:
        yield
    finally:
        for made in mades:
            made.product = "auto"


def _made(config: dict, mask: int = 0) -> MADE:
    made = MADE(**config).double()
    made.set_mask(mask)
    with torch.no_grad():
        for p in made.parameters():
            p.normal_(0, 0.5)  # every allowed path non-zero, the masked-out entries too
    return made


def _inputs(made: MADE, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    m = made.inputs_per_feature
    x = torch.randn(n, made.features, *((m,) if m > 1 else ()), generator=g, **f64)
    c = made.context_features
    return x, (torch.randn(n, c, generator=g, **f64) if c else None)


def _run(made: MADE, x, context, mode: str):
    """Outputs without autograd, outputs with autograd and the gradients of a fixed loss with
    respect to the inputs, the context and every parameter."""
    leaves = [x.clone().requires_grad_(), *([] if context is None else
                                            [context.clone().requires_grad_()])]
    with product(made, mode):
        with torch.no_grad():
            plain = made(x, context)
        out = made(*leaves) if context is not None else made(leaves[0])
        weights = torch.linspace(-1, 1, out.numel(), **f64, device=out.device)
        weights = weights.reshape(out.shape)
        grads = torch.autograd.grad((out * weights).sum(), [*leaves, *made.parameters()])
    return plain, out.detach(), grads


def _assert_same(made: MADE, x, context):
    dense, staircased = _run(made, x, context, "dense"), _run(made, x, context, "staircase")
    torch.testing.assert_close(staircased[0], dense[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(staircased[1], dense[1], rtol=0, atol=1e-12)
    for got, expected in zip(staircased[2], dense[2], strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-11)


@settings(max_examples=25, deadline=None)
@given(MADES, st.integers(1, 40))
def test_equals_the_dense_product_for_random_shapes_orderings_and_mask_sets(config, n):
    config, mask = config
    made = _made(config, mask)
    _assert_same(made, *_inputs(made, n))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.integers(1, 70), st.integers(1, 70), st.booleans(),
       st.booleans(), st.booleans(), st.data())
def test_any_block_partition_is_exact(features, width, rows, strict, bias, in_place, data):
    """One layer through its autograd function, for arbitrary block cuts (down to one row per
    block) of random sorted degrees, against ``F.linear`` with the masked weight; with units
    stored in any order, or ``in_place`` (stored sorted: no permutations)."""
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 10**6)))
    in_degrees = torch.randint(0, features + 1, (width,), generator=g)
    out_degrees = torch.randint(1 if strict else 0, features + 1, (rows,), generator=g)
    if in_place:
        in_degrees, out_degrees = in_degrees.sort().values, out_degrees.sort().values
    layer = MaskedLinear(width, rows, bias=bias).double()
    with torch.no_grad():
        layer.weight.normal_(generator=g)
        if bias:
            layer.bias.normal_(generator=g)
    mask = (out_degrees[:, None] > in_degrees) if strict else out_degrees[:, None] >= in_degrees
    layer.set_mask(mask)
    rows_perm = torch.argsort(out_degrees, stable=True)  # the identity when in_place
    cols_perm = torch.argsort(in_degrees, stable=True)
    seen = (in_degrees[None, :] < out_degrees[rows_perm, None]) if strict else (
        in_degrees[None, :] <= out_degrees[rows_perm, None])
    prefix = seen.sum(1).tolist()
    edges = sorted(set(data.draw(st.lists(st.integers(1, rows - 1), max_size=rows))
                       if rows > 1 else []) | {0, rows})
    blocks = [(a, b, min(width, prefix[b - 1] + data.draw(st.integers(0, 3))))
              for a, b in zip(edges, edges[1:], strict=False)]
    blocks = [(a, b, max(n for _, _, n in blocks[: i + 1])) for i, (a, b, _) in
              enumerate(blocks)]  # reads never shrink: later rows see at least as much
    lp = LayerPlan(rows_perm, cols_perm, torch.argsort(rows_perm), torch.argsort(cols_perm),
                   blocks) if not in_place else LayerPlan(None, None, None, None, blocks)
    x = torch.randn(5, width, generator=g, **f64, requires_grad=True)
    expected = F.linear(x, layer.weight * layer.mask, layer.bias)
    got = staircase.linear(x[:, cols_perm], layer, lp)[:, torch.argsort(rows_perm)]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    w = torch.randn(expected.shape, generator=g, **f64)
    params = [x, *layer.parameters()]
    for a, b in zip(torch.autograd.grad((got * w).sum(), params),
                    torch.autograd.grad((expected * w).sum(), params), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    with torch.no_grad():  # the cached sorted weights
        got = staircase.linear(x[:, cols_perm], layer, lp)[:, torch.argsort(rows_perm)]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=3000), st.integers(1, 300))
@settings(max_examples=60, deadline=None)
def test_blocks_cover_the_staircase_with_aligned_edges(prefix, width):
    prefix = sorted(min(p, width) for p in prefix)
    blocks, cost, dense = staircase.blocks(prefix, width)
    assert cost <= dense
    assert blocks[0][0] == 0 and blocks[-1][1] == len(prefix)
    for (_, b, n), (a, _, m) in zip(blocks, blocks[1:], strict=False):
        assert a == b and n <= m and a % 16 == 0  # contiguous, reads grow, rows aligned
    for _, b, n in blocks:
        assert n >= prefix[b - 1] and (n % 8 == 0 or n == width)


@pytest.mark.parametrize("limit", [None, 48 * 20], ids=["kept", "large-batches-fresh"])
@pytest.mark.parametrize("residual", [False, True])
def test_reused_scratch_memory_leaves_earlier_outputs_alone(residual, limit, monkeypatch):
    """Without autograd the hidden stages reuse memory between calls (and between MADEs); the
    outputs of earlier calls keep their values, for any batch size, in inference mode too,
    and batches above the size limit get fresh memory."""
    if limit is not None:
        monkeypatch.setattr(Scratch, "LIMIT", limit)
    config = dict(features=6, hidden_features=(48, 48, 48), params_per_feature=2,
                  residual=residual, order="random")
    made = _made(dict(config, direct_connection=True))
    other = _made(dict(config, seed=1))
    calls = [(made, 7), (other, 7), (made, 30), (other, 3), (made, 7), (made, 5)]
    inputs = [_inputs(model, n, seed=i)[0] for i, (model, n) in enumerate(calls)]
    got = []
    with product(made, "staircase"), product(other, "staircase"), torch.no_grad():
        for i, ((model, _), x) in enumerate(zip(calls, inputs, strict=True)):
            if i == len(calls) - 2:
                with torch.inference_mode():
                    got.append(model(x))
            else:
                got.append(model(x))
    with product(made, "dense"), product(other, "dense"), torch.no_grad():
        for (model, _), x, value in zip(calls, inputs, got, strict=True):
            torch.testing.assert_close(value, model(x), rtol=0, atol=1e-12)


def test_vmap_without_autograd_uses_no_scratch_memory():
    """``torch.func.vmap`` tensors have no storage and take no ``out=``: the staircase then
    allocates as before (same values as a loop)."""
    made = _made(dict(features=6, hidden_features=(48, 48), params_per_feature=2,
                      order="random"))
    x = _inputs(made, 15)[0].reshape(5, 3, 6)
    with product(made, "staircase"), torch.no_grad():
        torch.testing.assert_close(torch.func.vmap(made)(x), torch.stack([made(v) for v in x]),
                                   rtol=0, atol=1e-12)


def test_automatic_choice_by_shape_and_batch():
    big = MADE(64, (512, 512), params_per_feature=2, order="reversed")
    small = MADE(2, (64, 64), params_per_feature=2)
    assert staircase.applies(big, 1024)
    assert not staircase.applies(big, 1)
    assert not staircase.applies(small, 4096)
    with product(big, "dense"):
        assert not staircase.applies(big, 1024)
    with product(small, "staircase"):
        assert staircase.applies(small, 1)
    with pytest.raises(ValueError, match="'product' should be 'auto', 'dense' or 'staircase'"):
        small.product = "fast"
    # the D=64 plan cuts every layer into several aligned blocks and most of the arithmetic
    plan = staircase.plan(big)
    assert all(len(lp.blocks) > 1 for reads in plan.reads for lp in reads)
    assert plan.saving > 0.25 * (64 * 512 + 512 * 512 + 512 * 128)


def test_mask_sets_plans_and_cached_weights_follow_every_change():
    made = _made(dict(features=10, hidden_features=(48, 48), num_masks=3, order="random",
                      direct_connection=True, context_features=2))
    x, context = _inputs(made, 20)
    plans = []
    for _ in range(3):
        plans.append(staircase.plan(made))
        _assert_same(made, x, context)
        made.next_mask()
    assert staircase.plan(made) is plans[0]  # kept per mask set while the degrees stay
    assert len({id(p) for p in plans}) == 3

    def dense_and_cached():
        with torch.no_grad(), product(made, "dense"):
            dense = made(x, context)
        with torch.no_grad(), product(made, "staircase"):
            return dense, made(x, context)

    optimizer = torch.optim.Adam(made.parameters(), lr=0.1)
    for change in [
        lambda: made.set_mask(2),
        lambda: (made(x, context).sum().backward(), optimizer.step()),
        lambda: made.load_state_dict(_made(dict(features=10, hidden_features=(48, 48),
                                                num_masks=3, order="random", seed=5,
                                                direct_connection=True,
                                                context_features=2)).state_dict()),
        lambda: made.output.bias.data.add_(1.0),
    ]:
        before = dense_and_cached()[1]
        change()
        dense, cached = dense_and_cached()
        torch.testing.assert_close(cached, dense, rtol=0, atol=1e-12)
        assert not torch.equal(cached, before)


def test_state_dict_stays_the_unsorted_one():
    made = MADE(16, (64, 64), params_per_feature=2, order="random", seed=3)
    x = torch.randn(50, 16)
    before = {k: v.clone() for k, v in made.state_dict().items()}
    with product(made, "staircase"):
        out = made(x)
        made(x).sum().backward()
    after = made.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    buffer = io.BytesIO()
    torch.save(made.state_dict(), buffer)
    buffer.seek(0)
    loaded = MADE(16, (64, 64), params_per_feature=2, order="random", seed=3)
    loaded.load_state_dict(torch.load(buffer))
    with product(loaded, "dense"):
        torch.testing.assert_close(loaded(x), out.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("residual", [False, True])
def test_flows_and_discrete_models_agree_with_the_dense_products(residual):
    torch.manual_seed(0)
    maf = flowkit.MAF(6, layers=2, hidden_features=(24, 24), context_features=2,
                      residual=residual).double()
    iaf = flowkit.IAF(6, layers=2, hidden_features=(24, 24), residual=residual).double()
    for flow in (maf, iaf):
        for p in flow.parameters():
            torch.nn.init.normal_(p, 0, 0.2)
    x, context = torch.randn(30, 6, **f64), torch.randn(30, 2, **f64)
    bernoulli = flowkit.BernoulliMADE(8, (48,), residual=residual, direct_connection=True,
                                      num_masks=2, order="random").double()
    categorical = flowkit.CategoricalMADE(5, 3, (48, 48), residual=residual).double()
    bits, classes = torch.randint(0, 2, (30, 8)).double(), torch.randint(0, 3, (30, 5))

    models = (maf, iaf, bernoulli, categorical)

    def results(mode):
        with product(maf, mode), product(iaf, mode), product(bernoulli, mode), \
                product(categorical, mode):
            values = [maf.log_prob(x, context), iaf.log_prob(x),
                      bernoulli.log_prob(bits), categorical.log_prob(classes)]
            grads = [torch.autograd.grad(v.sum(), list(m.parameters()))
                     for v, m in zip(values, models, strict=True)]
            torch.manual_seed(1)
            with torch.no_grad():
                samples = [maf.sample(context=context[:7]), *iaf.sample_and_log_prob(7)]
        return values, grads, samples

    dense, staircased = results("dense"), results("staircase")
    for got, expected in zip(staircased[0] + staircased[2], dense[0] + dense[2], strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    for got, expected in zip(staircased[1], dense[1], strict=True):
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    with product(maf, "staircase"), torch.no_grad():  # the solver inverts the staircase
        y, log_p = maf.sample_and_log_prob(context=context[:7])
        torch.testing.assert_close(maf.log_prob(y, context[:7]), log_p, rtol=0, atol=1e-10)


def test_compiled_forward_uses_the_dense_product_and_agrees():
    made = _made(dict(features=5, hidden_features=(32,), params_per_feature=2))
    x = torch.randn(20, 5, **f64)
    with product(made, "staircase"):
        eager = made(x)
        torch._dynamo.reset()
        compiled = torch.compile(made, backend="aot_eager", fullgraph=True)(x)
        torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_equals_the_dense_product():
    made = _made(dict(features=12, hidden_features=(64, 64), params_per_feature=2,
                      context_features=2, direct_connection=True, num_masks=2,
                      order="random")).cuda()
    x, context = _inputs(made, 33)
    _assert_same(made, x.cuda(), context.cuda())


def test_auto_takes_the_dense_products_off_the_cpu():
    """The staircase was measured slower on a GPU (docs/performance.md): "auto" keeps it to
    the CPU. A meta-device copy stands for any other device, so the rule is checked here."""
    made = MADE(64, (512, 512), params_per_feature=2)
    assert made.product == "auto" and staircase.applies(made, 1024)
    assert not staircase.applies(made.to("meta"), 1024)


@pytest.mark.parametrize("residual", [False, True])
def test_relabelled_hidden_units_keep_the_network_of_every_mask_set(residual, monkeypatch):
    """The hidden units are stored in order of their first-set degree; the network (for every
    mask set) is the one the same seeds gave before the relabelling."""
    config = dict(features=7, hidden_features=(20, 20), params_per_feature=2,
                  context_features=2, num_masks=3, order="random", residual=residual,
                  direct_connection=True, seed=4)
    torch.manual_seed(1)
    made = MADE(**config).double()
    with monkeypatch.context() as patch:
        patch.setattr(MADE, "_relabel", lambda self, degrees: degrees)
        torch.manual_seed(1)
        reference = MADE(**config).double()
    for degrees in made.degrees()[1:]:
        assert torch.equal(degrees, degrees.sort().values)
    assert not all(torch.equal(d, d.sort().values) for d in reference.degrees()[1:])
    x, context = torch.randn(9, 7, **f64), torch.randn(9, 2, **f64)
    for k in range(3):
        made.set_mask(k)
        reference.set_mask(k)
        torch.testing.assert_close(made(x, context), reference(x, context), rtol=0, atol=1e-12)
