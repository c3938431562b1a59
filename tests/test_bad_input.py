"""Bad input at every public entry point: one table of (call, error type, what the message must
say). Each message must name the argument as the user passed it. Other modules' tests check
their own entry points' details; this table is the walk over all of them."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

import flowkit
from flowkit import data, plot, testing, transforms

INF, NAN = math.inf, math.nan


def _maf(**kwargs) -> flowkit.Flow:
    return flowkit.MAF(2, layers=1, hidden_features=(8,), **kwargs)


Case = tuple[Callable[[], object], type[Exception], str]

CASES: dict[str, Case] = {
    # MADE and its masked layer
    "MADE activation instance": (
        lambda: flowkit.MADE(3, (8,), activation=torch.nn.ReLU()), ValueError, "'activation'"),
    "MADE activation name": (
        lambda: flowkit.MADE(3, (8,), activation="relu7"), ValueError, "'activation'"),
    "MADE activation function": (
        lambda: flowkit.MADE(3, (8,), activation=torch.tanh), ValueError, "'activation'"),
    "MADE features 0": (lambda: flowkit.MADE(0), ValueError, "'features'"),
    "MADE features 2.5": (lambda: flowkit.MADE(2.5), ValueError, "'features'"),
    "MADE hidden 8.5": (lambda: flowkit.MADE(3, (8.5,)), ValueError, r"'hidden_features\[0\]'"),
    "MADE hidden str": (lambda: flowkit.MADE(3, "64"), ValueError, "'hidden_features'"),
    "MADE order float": (lambda: flowkit.MADE(3, (8,), order=[0, 1, 2.5]), ValueError, "'order'"),
    "MADE order bool": (lambda: flowkit.MADE(2, (8,), order=[True, False]), ValueError, "'order'"),
    "MADE order nested": (lambda: flowkit.MADE(3, (8,), order=[[0, 1, 2]]), ValueError, "'order'"),
    "MADE order repeated": (lambda: flowkit.MADE(3, (8,), order=[0, 1, 1]), ValueError, "'order'"),
    "MADE order name": (lambda: flowkit.MADE(3, (8,), order="sorted"), ValueError, "'order'"),
    "MADE hidden_degrees": (
        lambda: flowkit.MADE(3, (8,), hidden_degrees="uniform"), ValueError, "'hidden_degrees'"),
    "MADE num_masks 0": (lambda: flowkit.MADE(3, (8,), num_masks=0), ValueError, "'num_masks'"),
    "MADE residual sizes": (
        lambda: flowkit.MADE(3, (8, 16), residual=True), ValueError, "'residual'"),
    "MADE seed -1": (lambda: flowkit.MADE(3, (8,), seed=-1), ValueError, "'seed'"),
    "MADE x int": (
        lambda: flowkit.MADE(3, (8,))(torch.ones(2, 3, dtype=torch.long)), TypeError, "'x'"),
    "MADE x width": (lambda: flowkit.MADE(3, (8,))(torch.ones(2, 4)), ValueError, "'x'"),
    "MADE x ndarray": (lambda: flowkit.MADE(3, (8,))(np.ones((2, 3))), TypeError, "'x'"),
    "MADE set_mask 5": (lambda: flowkit.MADE(3, (8,)).set_mask(5), ValueError, "'index'"),
    "MaskedLinear in 0": (lambda: flowkit.MaskedLinear(0, 4), ValueError, "'in_features'"),
    "MaskedLinear mask shape": (
        lambda: flowkit.MaskedLinear(3, 4).set_mask(torch.ones(3, 4)), ValueError, "'mask'"),
    "MaskedLinear mask 0.5": (
        lambda: flowkit.MaskedLinear(3, 4).set_mask(torch.full((4, 3), 0.5)), ValueError,
        "'mask'"),
    # transforms
    "Affine bound inf": (lambda: transforms.Affine(INF), ValueError, "'log_scale_bound'"),
    "Affine bound -1": (lambda: transforms.Affine(-1), ValueError, "'log_scale_bound'"),
    "Affine bound str": (lambda: transforms.Affine("3"), ValueError, "'log_scale_bound'"),
    "Spline bound inf": (
        lambda: transforms.RationalQuadraticSpline(bound=INF), ValueError, "'bound'"),
    "Spline bound nan": (
        lambda: transforms.RationalQuadraticSpline(bound=NAN), ValueError, "'bound'"),
    "Spline bins 1": (lambda: transforms.RationalQuadraticSpline(bins=1), ValueError, "'bins'"),
    "Spline min_derivative 1": (
        lambda: transforms.RationalQuadraticSpline(min_derivative=1), ValueError,
        "'min_derivative'"),
    "Spline min_bin_width nan": (
        lambda: transforms.RationalQuadraticSpline(min_bin_width=NAN), ValueError,
        "'min_bin_width'"),
    "BatchNorm momentum 2": (lambda: transforms.BatchNorm(2, momentum=2), ValueError,
                             "'momentum'"),
    "BatchNorm eps nan": (lambda: transforms.BatchNorm(2, eps=NAN), ValueError, "'eps'"),
    "BatchNorm features 0": (lambda: transforms.BatchNorm(0), ValueError, "'features'"),
    "Permutation repeated": (
        lambda: transforms.Permutation([0, 0, 1]), ValueError, "'permutation'"),
    "Permutation float": (lambda: transforms.Permutation([0.0, 1.0]), ValueError, "'permutation'"),
    # a uint8 index is a mask to torch: refused as a permutation everywhere (review 23 F17)
    "Permutation uint8": (lambda: transforms.Permutation(torch.tensor([1, 0], dtype=torch.uint8)),
                          ValueError, r"'permutation' .* got \[1, 0\] \(torch.uint8\)"),
    "MADE order uint8": (
        lambda: flowkit.MADE(2, (8,), order=torch.tensor([1, 0], dtype=torch.uint8)), ValueError,
        r"'order' should be a permutation of range\(2\) \(ints\), got \[1, 0\] \(torch.uint8\)"),
    "check_autoregressive order uint8": (
        lambda: testing.check_autoregressive(
            flowkit.MADE(2, (8,)), order=torch.tensor([1, 0], dtype=torch.uint8)),
        ValueError, r"'order' .* got \[1, 0\] \(torch.uint8\)"),
    "Permutation seed -1": (
        lambda: transforms.Permutation.random(3, seed=-1), ValueError, "'seed'"),
    "Compose widths": (
        lambda: transforms.Compose([transforms.Permutation([0, 1]),
                                    transforms.Permutation([0, 1, 2])]),
        ValueError, "'transforms'"),
    "Inverse of an int": (lambda: transforms.Inverse(3), TypeError, "'transform'"),
    "set_from_data of a str": (
        lambda: transforms.set_from_data("flow", [(torch.zeros(3, 2),)]), TypeError, "'model'"),
    "FlowDistribution of a str": (lambda: flowkit.FlowDistribution("x"), TypeError, "'flow'"),
    "StandardNormal rsample -1": (lambda: flowkit.StandardNormal(2).rsample(-1), ValueError,
                                  "'n'"),
    "StandardNormal rsample 2.0": (lambda: flowkit.StandardNormal(2).rsample(2.0), ValueError,
                                   "'n'"),
    "StandardNormal log_prob NaN": (
        lambda: flowkit.StandardNormal(2).log_prob(torch.tensor([[0.0, NAN]])), ValueError,
        "'z' contains NaN"),
    "sample shape -1 hints nothing negative": (
        lambda: _maf()().sample(-1), ValueError, r"non-negative integers, got -1$"),
    # builders
    "Compose one transform": (
        lambda: transforms.Compose(transforms.LULinear(2)), TypeError, "'transforms'"),
    "MAF features 0": (lambda: flowkit.MAF(0), ValueError, "'features'"),
    "MAF transformer_kwargs list": (
        lambda: flowkit.MAF(2, transformer_kwargs=[1]), TypeError, "'transformer_kwargs'"),
    "MAF layers 2.5": (lambda: flowkit.MAF(2, layers=2.5), ValueError, "'layers'"),
    "MAF transformer": (lambda: flowkit.MAF(2, transformer="cubic"), ValueError, "'transformer'"),
    "MAF transformer_kwargs key": (
        lambda: flowkit.MAF(2, transformer_kwargs={"bins": 8}), TypeError, "'transformer_kwargs'"),
    "MAF log_scale_bound inf": (
        lambda: flowkit.MAF(2, transformer_kwargs={"log_scale_bound": INF}), ValueError,
        "'log_scale_bound'"),
    "MAF spline bound nan": (
        lambda: flowkit.MAF(2, transformer="spline", transformer_kwargs={"bound": NAN}),
        ValueError, "'bound'"),
    "MAF permutation": (lambda: flowkit.MAF(2, permutation="shuffle"), ValueError,
                        "'permutation'"),
    "MAF context_features -1": (
        lambda: flowkit.MAF(2, context_features=-1), ValueError, "'context_features'"),
    "MAF batch_norm 1": (lambda: flowkit.MAF(2, batch_norm=1), ValueError, "'batch_norm'"),
    "IAF seed -1": (lambda: flowkit.IAF(2, seed=-1), ValueError, "'seed'"),
    # Flow
    "Flow log_prob NaN": (
        lambda: _maf().log_prob(torch.tensor([[NAN, 0.0]])), ValueError, "'x'"),
    "Flow log_prob width": (lambda: _maf().log_prob(torch.zeros(4, 3)), ValueError, "'x'"),
    "Flow log_prob list": (lambda: _maf().log_prob([[0.0, 0.0]]), TypeError, "'x'"),
    "Flow log_prob no context": (
        lambda: _maf(context_features=1).log_prob(torch.zeros(4, 2)), ValueError, "'context'"),
    "Flow log_prob extra context": (
        lambda: _maf().log_prob(torch.zeros(4, 2), torch.zeros(4, 1)), ValueError, "'context'"),
    "Flow sample 0": (lambda: _maf().sample(0), ValueError, "'n'"),
    "Flow sample 2.5": (lambda: _maf().sample(2.5), ValueError, "'n'"),
    # the lazy distribution flow(context)
    "flow() sample (-1,)": (lambda: _maf()().sample((-1,)), ValueError, "'sample_shape'"),
    "flow() sample 3": (lambda: _maf()().sample(3), ValueError, r"'sample_shape'.*\(3,\)"),
    "flow() rsample (2.5,)": (lambda: _maf()().rsample((2.5,)), ValueError, "'sample_shape'"),
    "flow() log_prob meta": (
        lambda: _maf()().log_prob(torch.empty(3, 2, device="meta")), ValueError, "'value'"),
    "flow(c) expand (4,) from (5,)": (
        lambda: _maf(context_features=1)(torch.zeros(5, 1)).expand((4,)), ValueError,
        "'batch_shape'"),
    # discrete models and bases
    "Bernoulli features 0": (lambda: flowkit.BernoulliMADE(0), ValueError, "'features'"),
    "Bernoulli x 0.5": (
        lambda: flowkit.BernoulliMADE(3, (8,)).log_prob(torch.full((2, 3), 0.5)), ValueError,
        "'x'"),
    "Bernoulli x width": (
        lambda: flowkit.BernoulliMADE(3, (8,)).log_prob(torch.zeros(2, 4)), ValueError, "'x'"),
    "Bernoulli sample 0": (lambda: flowkit.BernoulliMADE(3, (8,)).sample(0), ValueError, "'n'"),
    "Categorical classes 1": (lambda: flowkit.CategoricalMADE(3, 1), ValueError, "'classes'"),
    "Categorical x 5": (
        lambda: flowkit.CategoricalMADE(3, 4, (8,)).log_prob(torch.full((2, 3), 5)), ValueError,
        "'x'"),
    "Categorical x float": (
        lambda: flowkit.CategoricalMADE(3, 4, (8,)).log_prob(torch.full((2, 3), 1.5)),
        TypeError, "'x'"),
    "StandardNormal 0": (lambda: flowkit.StandardNormal(0), ValueError, "'features'"),
    "StandardNormal log_prob width": (
        lambda: flowkit.StandardNormal(2).log_prob(torch.zeros(5, 1)), ValueError, "'z'"),
    "DiagonalGaussian log_prob int": (
        lambda: flowkit.DiagonalGaussian(2).log_prob(torch.zeros(5, 2, dtype=torch.long)),
        TypeError, "'z'"),
    # data, plotting, testing helpers
    "sample_toy name": (lambda: data.sample_toy("bogus", 10), ValueError, "'name'"),
    "sample_toy n 0": (lambda: data.sample_toy("moons", 0), ValueError, "'n'"),
    "sample_toy n 2.5": (lambda: data.sample_toy("moons", 2.5), ValueError, "'n'"),
    "toy_log_prob moons": (
        lambda: data.toy_log_prob("moons", torch.zeros(2, 2)), ValueError, "'moons'"),
    "toy_log_prob width": (
        lambda: data.toy_log_prob("8gaussians", torch.zeros(2, 3)), ValueError, "'x'"),
    "energy name": (lambda: data.energy_log_density("U9", torch.zeros(2, 2)), ValueError,
                    "'name'"),
    "binarized_mnist split": (
        lambda: data.binarized_mnist("test2", root="/nonexistent", download=False), ValueError,
        "'split'"),
    "binarized_mnist missing": (
        lambda: data.binarized_mnist("train", root="/nonexistent", download=False),
        FileNotFoundError, "'train'"),
    "load_split_file missing": (
        lambda: data.load_split_file("/nonexistent.npz"), ValueError, "/nonexistent.npz"),
    "grid resolution 0": (
        lambda: plot.grid_log_density(lambda x: x.sum(-1), data.TOY_BOX, 0), ValueError,
        "'resolution'"),
    "check_autoregressive samples 0": (
        lambda: testing.check_autoregressive(flowkit.MADE(3, (8,)), samples=0), ValueError,
        "'samples'"),
    "check_autoregressive order": (
        lambda: testing.check_autoregressive(flowkit.MADE(3, (8,)), order=[0, 0, 1]),
        ValueError, "'order'"),
    # files
    "load_model missing": (
        lambda: flowkit.load_model("/nonexistent/flow.pt"), flowkit.CheckpointError,
        "/nonexistent/flow.pt"),
    "load_model map_location bogus": (
        lambda: flowkit.load_model("/nonexistent/flow.pt", map_location="bogus"), ValueError,
        "'map_location'"),
    "save_model path None": (
        lambda: flowkit.save_model(flowkit.MAF(2, layers=1), None), TypeError, "'path'"),
    "save_model path a folder": (
        lambda: flowkit.save_model(flowkit.MAF(2, layers=1), "/"), ValueError, "'path'"),
    "fit checkpoint_dir a file": (
        lambda: flowkit.fit(flowkit.MAF(2, layers=1), torch.randn(8, 2), steps=1,
                            checkpoint_dir=__file__, progress=False), ValueError,
        "'checkpoint_dir'"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_is_a_named_error(case):
    call, error, names = CASES[case]
    with pytest.raises(error, match=names):
        call()


def _target_bad_at(call: int, rows: int, value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """A standard normal log-density whose ``call``-th evaluation (0 is fit_reverse_kl's check
    before the first step) returns ``value`` for its first ``rows`` samples."""
    calls = []

    def target(x: torch.Tensor) -> torch.Tensor:
        log_p = -0.5 * x.square().sum(-1)
        if len(calls) == call:
            log_p = torch.cat([torch.full_like(log_p[:rows], value), log_p[rows:]])
        calls.append(None)
        return log_p

    return target


@pytest.mark.parametrize(
    ("call", "rows", "value", "message"),
    [
        (1, 64, NAN, "returned NaN for 64 of 64 samples at step 1"),
        (3, 5, NAN, "returned NaN for 5 of 64 samples at step 3"),
        (2, 1, -INF, "returned an infinite value for 1 of 64 samples at step 2"),
    ],
)
def test_reverse_kl_blames_a_target_that_is_not_finite(call, rows, value, message):
    from flowkit.train import NonFiniteLossError, fit_reverse_kl

    flow = flowkit.IAF(2, layers=1, hidden_features=(8,))
    with pytest.raises(NonFiniteLossError) as info:
        fit_reverse_kl(flow, _target_bad_at(call, rows, value), steps=5, batch_size=64, seed=0,
                       progress=False)
    text = str(info.value)
    assert text.startswith(f"'target_log_density' {message}")
    assert "Usual fixes" not in text and "standardise the data" not in text
    assert info.value.step == call


@pytest.mark.parametrize("where", ["x", "context"])
def test_fit_blames_nan_in_a_later_batch_of_a_data_loader(where):
    """A DataLoader's first batch is checked before training, the others are not read back;
    a NaN among them makes the loss NaN, and the error says so (it blamed the learning rate)."""
    from torch.utils.data import DataLoader, TensorDataset

    from flowkit.train import NonFiniteLossError

    x, c = torch.randn(320, 2), torch.randn(320, 1)
    (x if where == "x" else c)[200, 0] = NAN  # batch 7 of 32 rows
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=1)
    with pytest.raises(NonFiniteLossError) as info:
        flowkit.fit(flow, DataLoader(TensorDataset(x, c), batch_size=32), steps=20, seed=0,
                    progress=False, device="cpu")
    text = str(info.value)
    what = "x" if where == "x" else "the context"
    assert text.startswith(f"the batch of step 7 from 'data' holds NaN or Inf values in 1 row(s) "
                           f"of {what}")
    assert "Usual fixes" not in text and info.value.step == 7


def test_fit_names_nan_in_the_first_batch_of_a_loader_or_sampling_function():
    """It was "'x' contains NaN values", an argument the user did not pass."""
    from torch.utils.data import DataLoader, TensorDataset

    x = torch.randn(100, 2)
    x[3, 1] = NAN
    message = r"^the first batch of 'data' holds NaN or Inf values in x \(row 3 of the batch\)$"
    for source in (DataLoader(TensorDataset(x), batch_size=32), lambda n, generator: x[:n]):
        with pytest.raises(ValueError, match=message):
            flowkit.fit(flowkit.MAF(2, layers=1), source, steps=2, batch_size=100, progress=False,
                        device="cpu")
    with pytest.raises(ValueError, match=r"^'data' holds NaN or Inf values \(first at row "
                       r"3, column \d\); drop or fill those rows$"):
        flowkit.fit(flowkit.MAF(2, layers=1), x, steps=2, progress=False, device="cpu")


def test_fit_names_a_context_of_the_wrong_width_as_the_user_passed_it():
    """It was "'context' should have shape (..., 1), got (2, 2)": the shape of fit's two-row
    probe, and an argument the user did not pass."""
    from torch.utils.data import DataLoader, TensorDataset

    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=1)
    y, c = torch.randn(300, 2), torch.randn(300, 1)
    message = (r"the context of '{}' should have 1 features to match the model "
               r"\(model.context_features=1\), got shape \({}, 2\)")
    with pytest.raises(ValueError, match=message.format("data", 300)):
        flowkit.fit(flow, (y, torch.randn(300, 2)), steps=1, progress=False, device="cpu")
    with pytest.raises(ValueError, match=message.format("data", 32)):
        flowkit.fit(flow, DataLoader(TensorDataset(y, torch.randn(300, 2)), batch_size=32),
                    steps=1, progress=False, device="cpu")
    with pytest.raises(ValueError, match=message.format("valid", 10)):
        flowkit.fit(flow, (y, c), valid=(y[:10], torch.randn(10, 2)), steps=1, progress=False,
                    device="cpu")


@pytest.mark.parametrize("value", [NAN, INF])
def test_fit_refuses_nan_in_a_later_batch_of_a_validation_loader(value):
    """They made every validation loss NaN, which is never the best: early stopping then ended
    the run and restore_best kept the last weights, without a word."""
    from torch.utils.data import DataLoader, TensorDataset

    v = torch.randn(200, 2)
    v[120, 1] = value
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    with pytest.raises(flowkit.train.NonFiniteLossError, match=r"^'valid' holds NaN or Inf "
                       "values in 1 of its 200 rows, found by the validation at step 16"):
        flowkit.fit(flow, torch.randn(640, 2), valid=DataLoader(TensorDataset(v), batch_size=50),
                    steps=30, early_stopping_patience=3, seed=0, progress=False, device="cpu")


@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_a_validation_function_returning_a_non_finite_loss_ends_the_run_by_name(value):
    """Review 19: it was recorded as "no improvement", and early stopping ended the run on it
    without a word."""
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    with pytest.raises(flowkit.train.NonFiniteLossError, match=(
        rf"^the validation function 'valid' returned {value} at step 5 .*should return a "
        r"finite loss.*The model holds the weights of step 5")) as info:
        flowkit.fit(flow, torch.randn(64, 2), valid=lambda m: value, steps=20, batch_size=32,
                    valid_every=5, early_stopping_patience=2, seed=0, progress=False,
                    device="cpu")
    assert info.value.step == 5 and info.value.history.valid_loss == []


def test_validation_rows_outside_a_bounded_flow_end_the_run_by_name():
    """Review 19: a validation row outside the box made the validation loss inf, accepted as
    "no improvement": early stopping ended the run after its first validation. A DataLoader's
    rows are found at the validation (array rows are checked before training)."""
    from torch.utils.data import DataLoader, TensorDataset

    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), bounds=([0.0, 0.0], [1.0, 1.0]))
    v = torch.rand(100, 2)
    v[[37, 80], 0] = 1.5
    with pytest.raises(flowkit.train.NonFiniteLossError, match=(
        r"^the validation at step 4: 'valid' holds 2 row\(s\) \(rows 37, 80\) that the model "
        r"gives log-density -inf: points outside its support")) as info:
        flowkit.fit(flow, torch.rand(64, 2), valid=DataLoader(TensorDataset(v), batch_size=30),
                    steps=8, batch_size=16, early_stopping_patience=1, seed=0, progress=False,
                    device="cpu")
    assert info.value.step == 4 and info.value.value == INF


def _fit_quietly(flow, data, **kwargs):
    return flowkit.fit(flow, data, **{"steps": 3, "batch_size": 32, "seed": 0, "progress": False,
                                      "device": "cpu", **kwargs})


def test_fit_takes_unusual_numpy_arrays_as_their_values():
    """Review 19: a big-endian array (FITS files) met torch's byte-order error, and a read-only
    one (np.load(..., mmap_mode="r")) passed torch's UserWarning on; both are now taken as
    their values: big-endian converted to the native order, read-only copied (never
    written)."""
    import warnings

    def losses(x, c):
        torch.manual_seed(0)
        return _fit_quietly(_maf(context_features=1), (x, c), valid=(x[:20], c[:20])).train_loss

    x = np.random.default_rng(0).normal(size=(96, 2))
    c = np.random.default_rng(1).normal(size=(96, 1))
    expected = losses(x, c)
    frozen = x.copy()
    frozen.flags.writeable = False
    for pair in ((x.astype(">f8"), c.astype(">f4")), (frozen, c)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch's "not writable" warning among them
            warnings.simplefilter("ignore", flowkit.train.DataWarning)  # 96 rows, affine
            assert losses(*pair) == expected
    assert np.array_equal(frozen, x) and not frozen.flags.writeable


@pytest.mark.parametrize(("value", "error", "message"), [
    (np.ones((64, 2), dtype=np.longdouble), ValueError,
     r"^'data' holds numpy float\d+ values \(long double\), which torch cannot hold: cast them "
     r"to float64 first"),
    ((np.ones((64, 2)), np.ones((64, 1), dtype=np.longdouble)), ValueError,
     r"^'data context' holds numpy float\d+ values"),
    (torch.empty(64, 2, device="meta"), ValueError,
     "^'data' is on the meta device, which holds no values"),
    (lambda n: torch.randn(n, 2), TypeError,
     r"^'data', a sampling function, should have the signature sample\(n, generator\).* its "
     r"signature is \(n\)$"),
])
def test_fit_names_data_that_torch_cannot_take(value, error, message):
    """Review 19: these met torch's own errors (numpy.longdouble, 'Cannot copy out of meta
    tensor', '<lambda>() takes 1 positional argument but 2 were given')."""
    if np.dtype(np.longdouble).itemsize <= 8 and not callable(value) and not isinstance(
            value, torch.Tensor):
        pytest.skip("long double is float64 on this platform")
    context = 1 if isinstance(value, tuple) else 0
    with pytest.raises(error, match=message):
        _fit_quietly(_maf(context_features=context), value)


def test_fit_names_the_step_of_a_later_loader_batch_the_model_refuses():
    """Review 19: these read "'x' should have shape (..., 2), got (16, 3)", naming neither
    'data' nor the step (only the first batch is checked before training)."""
    from torch.utils.data import DataLoader

    from flowkit.validation import ArgumentError

    def loader(*batches):
        return DataLoader(list(batches), batch_size=None)

    wide = loader(torch.randn(16, 2), torch.randn(16, 2), torch.randn(16, 3))
    with pytest.raises(ArgumentError, match=r"^the batch of step 3 from 'data' was refused by the "
                       r"model: 'x' should have shape \(\.\.\., 2\), got \(16, 3\)"):
        _fit_quietly(_maf(), wide, steps=4)
    integers = loader(torch.randn(16, 2), torch.ones(16, 2, dtype=torch.long))
    with pytest.raises(TypeError, match=r"^the batch of step 2 from 'data' was refused by the "
                       r"model: 'x' should have dtype torch.float32"):
        _fit_quietly(_maf(), integers, steps=2)
    classes = loader(torch.zeros(8, 3, dtype=torch.long), torch.full((8, 3), 7))
    with pytest.raises(ArgumentError, match=r"^the batch of step 2 from 'data' was refused by the "
                       r"model: 'x' should hold class indices in 0\.\.2, found 7"):
        _fit_quietly(flowkit.CategoricalMADE(3, 3, (8,)), classes, steps=2)


def test_an_error_of_the_models_own_code_is_not_blamed_on_the_data():
    """Review 20: any ValueError or TypeError of a step read "the batch of step N from 'data'
    was refused by the model", a bug in the model's code included; only errors naming the
    model's arguments blame the batch."""

    class Buggy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.loc = torch.nn.Parameter(torch.zeros(2))
            self.calls = 0

        def log_prob(self, x):
            self.calls += 1
            if self.calls == 3:
                return x.sum(-1) + None  # a bug: TypeError
            return -(x - self.loc).square().sum(-1)

    with pytest.raises(TypeError, match=r"^unsupported operand type\(s\) for \+"):
        _fit_quietly(Buggy(), torch.randn(64, 2), steps=5, batch_size=16)


@pytest.mark.parametrize("where", ["data", "valid"])
def test_fit_says_what_a_loader_should_yield(where):
    """Review 19: a loader of dicts read "'data' should be a torch.Tensor or numpy array, got
    dict"; the data was a DataLoader."""
    from torch.utils.data import DataLoader

    dicts = DataLoader([{"x": torch.randn(2)} for _ in range(64)], batch_size=16)
    data, valid = (dicts, None) if where == "data" else (torch.randn(64, 2), dicts)
    with pytest.raises(TypeError, match=rf"^the DataLoader passed as '{where}' should yield "
                       r"batches x or \(x, context\) of tensors or numpy arrays, got a dict$"):
        _fit_quietly(_maf(), data, valid=valid)


def test_reverse_kl_names_the_target_of_the_wrong_shape_or_dtype():
    """Review 19: the shape error did not quote the argument, and an integer target was blamed
    for not depending on its input through autograd."""
    fit = flowkit.fit_reverse_kl
    iaf = flowkit.IAF(2, layers=1, hidden_features=(8,))
    with pytest.raises(ValueError, match=r"^'target_log_density' should return log-densities of "
                       r"shape \(N,\), got \(2, 1\) for N=2$"):
        fit(iaf, lambda x: x[:, :1], steps=1, progress=False, device="cpu")
    with pytest.raises(TypeError, match=r"^'target_log_density' should return floating "
                       "log-densities, got dtype torch.int64"):
        fit(iaf, lambda x: x.sum(-1).long(), steps=1, progress=False, device="cpu")


def test_building_blocks_of_the_wrong_kind_are_named():
    """Errors name the argument (they were AttributeErrors, or 'unhashable type: list')."""
    from flowkit import MAF, Flow, StandardNormal
    from flowkit.data import sample_toy
    from flowkit.transforms import Compose

    with pytest.raises(TypeError, match=r"'transforms\[0\]' should be a flowkit Transform, got "
                       "Linear"):
        Compose([torch.nn.Linear(2, 2)])
    with pytest.raises(TypeError, match="'transform' should be a flowkit Transform"):
        Flow(torch.nn.Identity(), StandardNormal(2))
    with pytest.raises(TypeError, match="'base' should be a base distribution"):
        Flow(Compose([]), None)
    with pytest.raises(ValueError, match=r"'transformer' should be 'affine' or 'spline', got "
                       r"\['affine'\]"):
        MAF(2, transformer=["affine"])
    assert sample_toy("moons", np.int64(5), seed=0).shape == (5, 2)  # a numpy integer is one
