"""MADE: masks follow degrees, the autoregressive property holds, mask sets behave."""

import functools
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

import flowkit
from flowkit import MADE
from flowkit.checkpoint import BuildWarning
from flowkit.nn import MaskedLinear, masks
from flowkit.testing import check_autoregressive


@st.composite
def made_configs(draw):
    features = draw(st.integers(1, 6))
    return dict(
        features=features,
        hidden_features=tuple(draw(st.lists(st.integers(1, 12), min_size=0, max_size=3))),
        params_per_feature=draw(st.integers(1, 3)),
        context_features=draw(st.integers(0, 3)),
        order=draw(st.sampled_from(["natural", "reversed", "random"]))
        if draw(st.booleans())
        else draw(st.permutations(list(range(features)))),
        hidden_degrees=draw(st.sampled_from(["random", "even"])),
        direct_connection=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
    )


@settings(max_examples=60, deadline=None)
@given(made_configs())
def test_autoregressive_for_random_shapes_and_orderings(config):
    made = MADE(**config)
    torch.nn.init.normal_(made.output.weight)  # make every allowed path non-zero
    check_autoregressive(made)


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 6), st.integers(1, 3), st.integers(0, 100))
def test_residual_made_is_autoregressive(features, depth, seed):
    made = MADE(features, (10,) * depth, context_features=1, residual=True, seed=seed)
    check_autoregressive(made)


def test_every_mask_set_is_autoregressive_and_sets_differ():
    made = MADE(5, (16, 16), num_masks=4, order="random", seed=3)
    orders = set()
    for k in range(4):
        made.set_mask(k)
        check_autoregressive(made)
        orders.add(tuple(made.order.tolist()))
    assert len(orders) > 1


def test_check_autoregressive_catches_a_leak():
    made = MADE(4, (8,))
    made.output.mask.fill_(1.0)  # break the masks
    torch.nn.init.normal_(made.output.weight)
    with pytest.raises(AssertionError, match="depends on input"):
        check_autoregressive(made)


def test_first_output_depends_on_context_only_even_with_one_feature():
    made = MADE(1, (8,), context_features=2)
    torch.nn.init.normal_(made.output.weight)
    c = torch.randn(5, 2)
    out1 = made(torch.randn(5, 1), c)
    out2 = made(torch.randn(5, 1), c)
    assert torch.equal(out1, out2)
    assert not torch.allclose(made(torch.randn(5, 1), torch.randn(5, 2)), out1)


def test_context_reaches_every_output():
    made = MADE(4, (16,), context_features=3, order="random", seed=1)
    torch.nn.init.normal_(made.output.weight)
    x = torch.randn(1, 4)
    jac = torch.autograd.functional.jacobian(lambda c: made(x, c), torch.randn(1, 3))
    assert (jac.abs().sum(dim=(0, 2, 3, 4)) > 0).all()


@pytest.mark.parametrize("hidden_degrees", ["random", "even"])
@pytest.mark.parametrize("features, hidden", [(100, (64, 64)), (784, (500,)), (30, (16,) * 3)])
def test_every_hidden_layer_keeps_units_of_degree_0_for_the_context(features, hidden,
                                                                     hidden_degrees):
    """Review 38: with more features than hidden units, a layer often drew no unit of degree
    0, and the first feature's conditional then ignored the context (6 seeds of 10 at D=100,
    hidden (64, 64)). Each layer keeps min(CONTEXT_UNITS, H // 4) of them; without a context,
    none (they would see nothing)."""
    for seed in range(10):
        made = MADE(features, hidden, context_features=2, hidden_degrees=hidden_degrees,
                    order="random", seed=seed)
        for layer in made.degrees()[1:]:
            assert int((layer == 0).sum()) >= min(masks.CONTEXT_UNITS, len(layer) // 4)
        # paths from the context (the last input columns) to the first feature's outputs
        paths = made.hidden[0].mask[:, -2:]
        for layer in made.hidden[1:]:
            paths = layer.mask @ paths
        first = int(made.order[0])
        reach = made.output.mask.view(features, made.params_per_feature, -1)[first] @ paths
        assert (reach >= min(masks.CONTEXT_UNITS, min(hidden) // 4)).all(), seed
    assert all((d > 0).all() for d in MADE(features, hidden, seed=0).degrees()[1:])


def test_identical_mask_sets_are_warned_about_and_their_files_still_load(tmp_path):
    """Review 38: num_masks > 1 where no choice is left (no hidden layers, or D = 2 without a
    context, with a fixed order) made K copies of one model at K times the cost, silently. A
    warning, not an error (review 40): files saved before it load, without the warning."""
    for kwargs in (dict(features=3, hidden_features=()), dict(features=2, hidden_features=(8,)),
                   dict(features=1, hidden_features=(8,), context_features=2, order="random")):
        with pytest.warns(BuildWarning, match="gives identical mask sets"):
            MADE(num_masks=3, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MADE(2, (8,), num_masks=3, order="random")
        MADE(2, (8,), num_masks=3, context_features=1)
    with pytest.warns(BuildWarning):
        model = flowkit.BernoulliMADE(2, hidden_features=(8,), num_masks=3)
    flowkit.save_model(model, tmp_path / "m.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert flowkit.load_model(tmp_path / "m.pt").num_masks == 3


def test_masks_follow_degrees():
    degrees_in = torch.tensor([1, 2, 3])
    degrees_hidden = torch.tensor([1, 2, 2])
    assert masks.hidden_mask(degrees_hidden, degrees_in).tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, False],
    ]
    assert masks.output_mask(degrees_in, degrees_hidden).tolist() == [
        [False, False, False],
        [True, False, False],
        [True, True, True],
    ]


def test_hidden_degrees_have_no_dead_units():
    generator = torch.Generator().manual_seed(0)
    previous = torch.tensor([3, 4, 5, 6])
    d = masks.hidden_degrees(1000, 6, previous, "random", generator)
    assert d.min() >= 3 and d.max() <= 5
    even = masks.hidden_degrees(10, 6, torch.arange(1, 7), "even")
    assert even.tolist() == sorted(even.tolist()) and set(even.tolist()) == {1, 2, 3, 4, 5}


@pytest.mark.parametrize("features, context", [(1, 0), (1, 2), (2, 0), (4, 0), (4, 1)])
def test_every_hidden_unit_has_an_input_but_with_one_feature_and_no_context(features, context):
    made = MADE(features, (6, 6, 6), context_features=context, hidden_degrees="random")
    seen = [layer.mask.sum(1) > 0 for layer in made.hidden]
    assert seen[0].all() == (features > 1 or context > 0)  # the documented exception
    assert all(s.all() for s in seen[1:])


def test_ordering_specs():
    assert masks.ordering(3, "natural").tolist() == [0, 1, 2]
    assert masks.ordering(3, "reversed").tolist() == [2, 1, 0]
    assert masks.ordering(3, [2, 0, 1]).tolist() == [2, 0, 1]
    assert masks.input_degrees(torch.tensor([2, 0, 1])).tolist() == [2, 3, 1]
    with pytest.raises(ValueError, match="'order' should be a permutation"):
        masks.ordering(3, [0, 0, 1])
    with pytest.raises(ValueError, match="'order'"):
        masks.ordering(3, "sideways")


def test_given_order_is_respected():
    made = MADE(4, (32, 32), order=[3, 1, 0, 2])
    torch.nn.init.normal_(made.output.weight)
    assert made.order.tolist() == [3, 1, 0, 2]
    check_autoregressive(made)
    out_first = made(torch.randn(2, 4))[:, 3]
    # the first feature in the ordering (3) is unconditional: constant in x
    assert torch.allclose(out_first, made(torch.randn(2, 4))[:, 3])


def test_mask_sets_are_deterministic_per_seed_and_survive_state_dict():
    a = MADE(6, (20,), num_masks=3, order="random", seed=7)
    b = MADE(6, (20,), num_masks=3, order="random", seed=7)
    assert torch.equal(a.orders, b.orders)
    assert torch.equal(a.hidden_degree_sets, b.hidden_degree_sets)
    a.next_mask()
    a.next_mask()
    c = MADE(6, (20,), num_masks=3, order="random", seed=8)
    c.load_state_dict(a.state_dict())
    assert c.mask_set_index == 2
    assert torch.equal(c.order, a.order)
    x = torch.randn(4, 6)
    assert torch.equal(c(x), a(x))
    assert a.next_mask() == 0


def test_mask_set_context_manager_restores():
    made = MADE(3, (8,), num_masks=2, order="random")
    x = torch.randn(2, 3)
    before = made(x)
    with made.mask_set(1):
        assert made.mask_set_index == 1
    assert made.mask_set_index == 0
    assert torch.equal(made(x), before)


@pytest.mark.parametrize(
    "index, message",
    [
        (True, r"'index' should be an integer >= 0, got True"),
        (1.0, r"'index' should be an integer >= 0, got 1.0"),
        ("1", r"'index' should be an integer >= 0, got '1'"),
        (torch.tensor(1), r"'index' should be an integer >= 0"),
        (-1, r"'index' should be >= 0, got -1"),
        (3, r"'index' should be in \[0, 3\), got 3"),
    ],
    ids=["bool", "float", "str", "tensor", "negative", "too-large"],
)
def test_set_mask_and_mask_set_name_a_bad_index(index, message):
    """set_mask(True) and set_mask(1.0) used to fail inside torch (a shape mismatch, an
    IndexError); a refused index leaves the active set as it was."""
    made = MADE(4, (8,), num_masks=3, order="random")
    made.set_mask(1)
    with pytest.raises(ValueError, match=message):
        made.set_mask(index)
    with pytest.raises(ValueError, match=message), made.mask_set(index):
        pass
    assert made.mask_set_index == 1 and int(made.mask_index) == 1


def test_set_mask_stores_a_python_int_for_a_numpy_index():
    made = MADE(4, (8,), num_masks=3, order="random")
    with made.mask_set(np.int64(2)):
        assert type(made.mask_set_index) is int and made.mask_set_index == 2
    assert type(made.mask_set_index) is int and made.mask_set_index == 0
    made.set_mask(np.int64(2))
    assert type(made.mask_set_index) is int and made.mask_set_index == 2
    assert torch.equal(made.order, made.orders[2])


def test_masks_are_buffers_that_move_with_dtype():
    made = MADE(3, (8,)).double()
    assert made.hidden[0].mask.dtype == torch.float64
    assert "hidden.0.mask" in made.state_dict()


def test_output_layout_is_feature_by_param():
    made = MADE(3, (8,), params_per_feature=4)
    assert made(torch.randn(5, 3)).shape == (5, 3, 4)
    assert made(torch.randn(7, 5, 3)).shape == (7, 5, 3, 4)


def test_one_hot_inputs():
    made = MADE(3, (16,), params_per_feature=5, inputs_per_feature=5, order="random", seed=2)
    torch.nn.init.normal_(made.output.weight)
    x = torch.nn.functional.one_hot(torch.randint(0, 5, (4, 3)), 5).float()
    assert made(x).shape == (4, 3, 5)
    order = made.order
    # changing the last feature in the ordering changes no output
    y = x.clone()
    y[:, order[-1]] = torch.roll(y[:, order[-1]], 1, dims=-1)
    assert torch.equal(made(x), made(y))


def test_check_autoregressive_handles_one_hot_blocks():
    """With inputs_per_feature = m > 1 the check feeds (N, D, m) inputs and reports a leak from
    any of a later feature's m inputs (it used to fail on the input shape)."""
    made = MADE(3, (16,), params_per_feature=4, inputs_per_feature=4, order="random", seed=2)
    torch.nn.init.normal_(made.output.weight)
    check_autoregressive(made)
    made.hidden[0].mask.fill_(1.0)  # every hidden unit sees every input
    with pytest.raises(AssertionError, match="depends on input"):
        check_autoregressive(made)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(features=0), "'features' should be >= 1, got 0"),
        (dict(features=2.5), "'features' should be an integer >= 1, got 2.5"),
        (dict(features="2"), "'features' should be an integer >= 1, got '2'"),
        (dict(features=True), "'features' should be an integer >= 1, got True"),
        (dict(features=3, hidden_features=(0,)), r"'hidden_features\[0\]' should be >= 1"),
        (dict(features=3, hidden_features=(8.5,)), r"'hidden_features\[0\]' .* got 8.5"),
        (dict(features=3, hidden_features=8), "'hidden_features' should be a sequence"),
        (dict(features=3, hidden_features="64"), "'hidden_features' should be a sequence"),
        (dict(features=3, params_per_feature=0), "'params_per_feature' should be >= 1"),
        (dict(features=3, inputs_per_feature=1.0), "'inputs_per_feature' should be an integer"),
        (dict(features=3, context_features=1.5), "'context_features' should be an integer >= 0"),
        (dict(features=3, num_masks=0), "'num_masks' should be >= 1"),
        (dict(features=3, seed=0.5), "'seed' should be an integer >= 0"),
        (dict(features=3, residual="yes"), "'residual' should be True or False, got 'yes'"),
        (dict(features=3, direct_connection=1), "'direct_connection' should be True or False"),
        (dict(features=3, hidden_features=(4, 5), residual=True), "'residual'"),
        (dict(features=3, num_masks=2, order="natural", hidden_degrees="even"), "'num_masks'"),
        (dict(features=3, hidden_degrees="odd"), "'hidden_degrees'"),
        (dict(features=3, hidden_features=(), hidden_degrees="foo"), "'hidden_degrees'"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MADE(**kwargs)


@pytest.mark.parametrize(
    "x, context, error, match",
    [
        (torch.randn(4, 2), torch.randn(4, 2), ValueError, r"'x' should have shape \(\.\.\., 3\)"),
        (torch.tensor(1.0), torch.randn(2), ValueError, r"shape \(\.\.\., 3\), got \(\)"),
        ([[0.0, 1.0, 2.0]], torch.randn(1, 2), TypeError, "'x' should be a torch.Tensor of shape"),
        (torch.randn(4, 3).double(), torch.randn(4, 2), TypeError, "'x' should have dtype torch"),
        (torch.ones(4, 3, dtype=torch.long), torch.randn(4, 2), TypeError, "'x' should have dtype"),
        (torch.empty(4, 3, device="meta"), torch.randn(4, 2), ValueError, "'x' is on meta but"),
        (torch.randn(4, 3), None, ValueError, r"'context' is required: a tensor of shape \(4, 2\)"),
        (torch.randn(4, 3), torch.randn(4, 5), ValueError, r"'context' should have shape \(4, 2\)"),
        (torch.randn(4, 3), torch.randn(2), ValueError, r"'context' should have shape \(4, 2\)"),
        (torch.randn(3), torch.randn(1, 2), ValueError, r"'context' should have shape \(2,\)"),
        (torch.randn(4, 3), [[0.0, 1.0]] * 4, TypeError, r"'context' should be a torch.Tensor of"),
        (torch.randn(4, 3), torch.randn(4, 2).double(), TypeError, "'context' should have dtype"),
        (torch.randn(4, 3), torch.ones(4, 2, dtype=torch.long), TypeError, "'context' should have"),
    ],
)
def test_bad_inputs(x, context, error, match):
    """Checked from shapes, dtypes and devices only (no values read): a float64 or integer 'x'
    used to fail inside torch or be promoted silently, a 0-d one to raise IndexError."""
    with pytest.raises(error, match=match):
        MADE(3, (8,), context_features=2)(x, context)


def test_bad_inputs_without_context_and_with_one_hot_blocks():
    with pytest.raises(ValueError, match="context_features=0"):
        MADE(3, (8,))(torch.randn(4, 3), torch.randn(4, 2))
    made = MADE(3, (8,), params_per_feature=4, inputs_per_feature=4)
    assert made(torch.randn(2, 5, 3, 4)).shape == (2, 5, 3, 4)
    with pytest.raises(ValueError, match=r"'x' should have shape \(\.\.\., 3, 4\), got \(5, 3\)"):
        made(torch.randn(5, 3))


class _OneDevice(TorchFunctionMode):
    """Fails every torch call whose tensor arguments are on different devices (a CPU scalar
    aside), as CUDA kernels do; on the ``meta`` device this finds what CUDA would reject."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = {t.device for t in _tensors((args, kwargs)) if t.dim() or t.device.type != "cpu"}
        if len(devices) > 1:
            raise AssertionError(f"{func} mixes tensors on {sorted(map(str, devices))}")
        return func(*args, **kwargs)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, list | tuple):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def test_mask_sets_are_built_on_the_device_of_the_buffers():
    made = MADE(4, (8, 8), context_features=2, num_masks=3, order="random",
                direct_connection=True).to("meta")
    with _OneDevice():
        made.set_mask(2)
        degrees = made.degrees()
        assert masks.input_degrees(made.order).device.type == "meta"
    assert all(d.device.type == "meta" for d in degrees)
    assert made.output.mask.device.type == "meta"
    with pytest.raises(AssertionError, match="mixes"), _OneDevice():
        torch.empty(3, device="meta").index_put_((torch.arange(3, device="meta"),),
                                                  torch.arange(3.0))  # the mode works


def test_masked_linear_set_mask_checks_shape_and_values():
    layer = MaskedLinear(3, 2)
    mask = torch.tensor([[1, 0, 1], [0, 0, 1]])
    layer.set_mask(mask)
    assert layer.mask.dtype == torch.float32 and torch.equal(layer.mask, mask.float())
    layer.set_mask(mask.bool().logical_not())
    assert torch.equal(layer.mask, 1 - mask.float())
    with pytest.raises(ValueError, match=r"'mask' should have shape \(2, 3\)"):
        layer.set_mask(torch.ones(3, 2))
    with pytest.raises(ValueError, match="'mask' should be binary"):
        layer.set_mask(torch.full((2, 3), 0.5))


def test_hooks_on_masked_layers_are_refused_and_parametrizations_work():
    """The staircase and the solver read the weights without calling the layers: a hook (the
    old hook-based weight_norm) is refused on every path; a parametrization is used on all."""
    import flowkit

    flow = flowkit.MAF(3, layers=1, hidden_features=(16,))
    layer = flow.transform.transforms[1].made.hidden[0]
    handle = layer.register_forward_pre_hook(lambda module, args: None)
    x = torch.randn(8, 3)
    with pytest.raises(RuntimeError, match="layer 'hidden.0' has forward hooks"):
        flow.log_prob(x)
    with pytest.raises(RuntimeError, match="parametrizations.weight_norm"):
        flow.sample(4)
    handle.remove()
    torch.nn.utils.parametrizations.weight_norm(layer)
    flow.eval()
    with torch.no_grad():
        samples, log_p = flow.sample_and_log_prob(16)
        torch.testing.assert_close(log_p, flow.log_prob(samples), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("product", ["dense", "staircase"])
def test_made_products_are_in_its_dtype_under_autocast(product):
    """The one-pass products run with autocast off, as the solver's: the same float32 outputs
    inside a CPU bfloat16 autocast region (every layer and model that owns a MADE inherits it)."""
    torch.manual_seed(0)
    made = MADE(6, hidden_features=(64, 64), params_per_feature=2, context_features=2)
    made.product = product
    x, c = torch.randn(128, 6), torch.randn(128, 2)
    expected = made(x, c)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = made(x, c)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected)


def test_activation_by_name_class_or_factory():
    """A torch.nn activation by name, its class, or a factory of no arguments (a partial: the
    MADE stores no config, so any elementwise module will do); the autoregressive property
    holds with each."""
    for activation, kind in (("elu", torch.nn.ELU), (torch.nn.Tanh, torch.nn.Tanh),
                             (functools.partial(torch.nn.LeakyReLU, 0.2), torch.nn.LeakyReLU)):
        made = MADE(4, (16,), activation=activation)
        assert type(made.activation) is kind
        check_autoregressive(made)


def test_in_place_activations_are_refused_with_residual_blocks():
    """An in-place activation would overwrite the pre-activations that residual blocks add
    (review 49: the fast solver differed from the naive one by 0.035); without residual blocks
    it is exact and allowed (review 52)."""
    in_place = functools.partial(torch.nn.ReLU, inplace=True)
    with pytest.raises(ValueError, match="inplace=True"):
        MADE(3, (8, 8), residual=True, activation=in_place)
    made = MADE(3, (8, 8), activation=in_place).double()
    plain = MADE(3, (8, 8)).double()
    plain.load_state_dict(made.state_dict())
    x = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(made(x), plain(x), rtol=0, atol=0)
