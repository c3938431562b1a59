"""FlowDensity: scikit-learn conventions, densities in the input space, reproducibility."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils import check_random_state
from sklearn.utils.estimator_checks import parametrize_with_checks

from flowkit.app.cli import main
from flowkit.app.sklearn_compare import load_dataset
from flowkit.sklearn import FlowDensity
from flowkit.train import DataWarning, DivergenceError, NonFiniteLossError


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These models are tiny: extra threads only add contention on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _small(**kwargs) -> FlowDensity:
    settings = dict(layers=2, hidden_features=(16,), max_epochs=3, batch_size=64, random_state=0)
    return FlowDensity(**{**settings, **kwargs})


def _data(n: int = 300, seed: int = 0) -> np.ndarray:
    """Correlated 2-D Gaussian rows with very different column scales and offsets."""
    z = np.random.default_rng(seed).normal(size=(n, 2))
    return np.column_stack([10.0 * z[:, 0] + 100.0, 0.5 * (z[:, 0] + z[:, 1]) - 3.0])


@parametrize_with_checks([_small(layers=1, hidden_features=(8,), max_epochs=2, batch_size=16)])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_params_clone_and_not_fitted():
    est = FlowDensity(layers=3, hidden_features=(32,), lr=3e-3)
    assert est.get_params()["layers"] == 3 and est.get_params()["hidden_features"] == (32,)
    assert est.set_params(layers=4) is est and est.layers == 4
    fitted = _small().fit(_data())
    copy = clone(fitted)
    assert copy.get_params() == fitted.get_params() and not hasattr(copy, "flow_")
    for method in (copy.score_samples, copy.score):
        with pytest.raises(NotFittedError):
            method(_data())
    with pytest.raises(NotFittedError):
        copy.sample(2)


def test_scores_are_densities_of_the_raw_rows():
    """score_samples = log q(u) - sum log s with u the standardized rows, and the density
    integrates to 1 over the raw space."""
    X = _data()
    est = _small().fit(X)
    u = torch.as_tensor((X - est.mean_) / est.scale_, dtype=torch.float32)
    with torch.no_grad():
        expected = est.flow_.log_prob(u).double().numpy() - np.log(est.scale_).sum()
    np.testing.assert_allclose(est.score_samples(X), expected, rtol=1e-6)
    assert est.score(X) == pytest.approx(est.score_samples(X).mean())
    # Riemann sum over +-8 standard deviations of each column.
    axes = [np.linspace(m - 8 * s, m + 8 * s, 241) for m, s in np.c_[est.mean_, est.scale_]]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 2)
    cell = np.prod([a[1] - a[0] for a in axes])
    assert np.exp(est.score_samples(grid)).sum() * cell == pytest.approx(1.0, abs=0.01)


def test_affine_equivariance():
    """Fitting c * X + b gives the same flow on the same standardized rows, so the scores
    shift by exactly -D log c."""
    X = _data()
    a = _small(dtype="float64").fit(X)
    b = _small(dtype="float64").fit(4.0 * X - 7.0)
    np.testing.assert_allclose(
        b.score_samples(4.0 * X - 7.0), a.score_samples(X) - 2 * np.log(4.0), atol=1e-6
    )


def test_sample():
    X = _data(1000)
    est = _small(max_epochs=20).fit(X)
    s = est.sample(2000, random_state=1)
    assert s.shape == (2000, 2) and s.dtype == np.float64
    assert np.all(np.abs(s.mean(0) - X.mean(0)) < 0.2 * X.std(0))  # in the raw space
    np.testing.assert_array_equal(est.sample(5, random_state=3), est.sample(5, random_state=3))
    with pytest.raises(ValueError, match="'n_samples' should be a positive integer"):
        est.sample(0)


def test_reproducible_and_leaves_global_rng_alone():
    X = _data()
    state = torch.get_rng_state()
    a, b = _small().fit(X), _small().fit(X)
    est = _small().fit(X)
    est.sample(3, random_state=0)
    assert torch.equal(state, torch.get_rng_state())
    np.testing.assert_array_equal(a.score_samples(X), b.score_samples(X))
    c = _small(random_state=1).fit(X)
    assert not np.array_equal(a.score_samples(X), c.score_samples(X))


def test_input_dtypes():
    X = _data()
    est = _small().fit(X)
    np.testing.assert_allclose(
        est.score_samples(X.astype(np.float32)), est.score_samples(X), rtol=1e-4
    )
    assert est.score_samples(X).dtype == np.float64
    fitted32 = _small().fit(X.astype(np.float32))
    np.testing.assert_allclose(fitted32.score_samples(X), est.score_samples(X), rtol=1e-3)
    with pytest.warns(DataWarning, match="distinct values"):  # rounded: a few values per column
        ints = _small().fit(np.round(X).astype(np.int64))
    assert np.isfinite(ints.score(X))


@pytest.mark.parametrize(
    "options",
    [dict(validation_fraction=0.0), dict(n_iter_no_change=None), dict(weight_decay=1e-4),
     dict(standardize=False), dict(batch_norm=True), dict(transformer="spline")],
    ids=lambda o: next(iter(o)),
)
def test_options(options):
    X = _data()
    est = _small(**options).fit(X)
    assert np.isfinite(est.score(X))


def test_lu_linear_reaches_the_maf_and_is_a_parameter():
    """FlowDensity builds flowkit.MAF, whose default gained LU-linear maps: the estimator takes
    the option like the builder (review 28), so the previous model stays reachable."""
    X = _data()
    kinds = {lu: {type(t).__name__ for t in _small(lu_linear=lu).fit(X).flow_.transform.transforms}
             for lu in (True, False)}
    assert "LULinear" in kinds[True] and "LULinear" not in kinds[False]
    assert FlowDensity().get_params()["lu_linear"] is True


def test_without_n_iter_no_change_the_best_epoch_is_kept():
    """n_iter_no_change=None runs every epoch but keeps the weights of the best validation
    (here an early epoch: 20 training rows and 40 epochs overfit)."""
    X = _data(40)
    est = _small(hidden_features=(32,), max_epochs=40, batch_size=10, lr=1e-2,
                 validation_fraction=0.5, n_iter_no_change=None).fit(X)
    h = est.history_
    assert not h.stopped_early and h.best_step < h.valid_steps[-1]
    assert h.valid_loss[-1] > h.best_valid_loss + 0.1
    rng = check_random_state(0)
    rng.randint(np.iinfo(np.int32).max)  # the torch seed drawn first in fit
    held_out = X[rng.permutation(len(X))[:20]]
    # the validation loss is the NLL of the standardized rows
    nll = -est.score(held_out) - np.log(est.scale_).sum()
    assert nll == pytest.approx(h.best_valid_loss, abs=1e-4)


def test_grid_search_and_pipeline():
    X = _data()
    search = GridSearchCV(_small(), {"hidden_features": [(8,), (16,)]}, cv=2).fit(X)
    assert search.best_params_["hidden_features"] in [(8,), (16,)]
    assert np.isfinite(search.score(X))
    pipe = make_pipeline(StandardScaler(), _small()).fit(X)
    assert pipe.score_samples(X).shape == (len(X),) and np.isfinite(pipe.score(X))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(max_epochs=0), "'max_epochs' should be >= 1, got 0"),
        (dict(batch_size=2.5), "'batch_size' should be an integer >= 1, got 2.5"),
        (dict(n_iter_no_change=0), "'n_iter_no_change' should be >= 1, got 0"),
        (dict(lr=0.0), "'lr' should be positive, got 0.0"),
        (dict(lr_schedule="step"), "'lr_schedule' should be None, 'cosine', 'linear'"),
        (dict(weight_decay=-1.0), "'weight_decay' should be >= 0"),
        (dict(validation_fraction=1.0), r"'validation_fraction' should be in \[0, 1\)"),
        (dict(dtype="float16"), "'dtype' should be 'float32' or 'float64'"),
        (dict(transformer="planar"), "'transformer' should be 'affine' or 'spline'"),
        (dict(layers=0), "'layers' should be >= 1"),
        (dict(hidden_features=8), "'hidden_features' should be a sequence of layer sizes"),
        (dict(hidden_features=(8, 0)), r"'hidden_features\[1\]' should be >= 1, got 0"),
        (dict(hidden_features=(8, 2.5)), r"'hidden_features\[1\]' should be an integer"),
    ],
)
def test_bad_parameters(options, message):
    with pytest.raises(ValueError, match=message):
        _small(**options).fit(_data(20))


def _fitted(est: FlowDensity) -> dict:
    """The fitted attributes (scikit-learn's convention: names ending in '_')."""
    return {k: v for k, v in vars(est).items() if k.endswith("_") and not k.startswith("_")}


@pytest.mark.parametrize(
    "change, X_new, error",
    [
        # a run without validation rows to return the best of: an error
        (dict(lr=1e4, validation_fraction=0.0), _data(200, seed=1) * 50 + 300,
         "diverged|not finite|is nan"),
        (dict(layers=0), _data(200, seed=1) * 50 + 300, "'layers' should be >= 1"),
        (dict(hidden_features=(8, 0)), _data(200, seed=1), r"'hidden_features\[1\]'"),
        (dict(dtype="float64", layers=0), np.c_[_data(200, seed=1), _data(200, seed=2)],
         "'layers' should be >= 1"),  # other columns and dtype: n_features_in_ stays 2
    ],
    ids=["diverges", "bad-layers", "bad-hidden", "other-width-and-dtype"],
)
def test_a_failed_refit_leaves_the_previous_fit_as_it_was(change, X_new, error):
    """A refit that raises used to leave the new rows' mean_, scale_ and n_features_in_ beside
    the old flow_, which then scored wrong densities without an error."""
    X = _data()
    est = _small().fit(X)
    before, scores = _fitted(est), est.score_samples(X)
    est.set_params(**change)
    with pytest.raises((ValueError, DivergenceError, NonFiniteLossError), match=error):
        est.fit(X_new)
    after = _fitted(est)
    assert after.keys() == before.keys()
    assert all(after[k] is before[k] for k in before)  # the same objects, not equal copies
    np.testing.assert_array_equal(est.score_samples(X), scores)
    assert est.sample(3, random_state=0).shape == (3, 2)


@pytest.mark.parametrize("change", [dict(layers=0), dict(lr=1e4, validation_fraction=0.0)],
                         ids=["bad", "diverges"])
def test_a_failed_first_fit_leaves_the_estimator_unfitted(change):
    """validate_data sets n_features_in_ before training fails; it used to stay, so that
    check_is_fitted passed and score_samples raised AttributeError: no attribute 'flow_'."""
    est = _small(**change)
    with pytest.raises((ValueError, DivergenceError, NonFiniteLossError),
                       match="'layers'|diverged|not finite|is nan"):
        est.fit(_data(200) * 50)
    assert _fitted(est) == {}
    for method in (est.score_samples, est.score):
        with pytest.raises(NotFittedError):
            method(_data())
    with pytest.raises(NotFittedError):
        est.sample(2)


def test_a_failed_refit_keeps_the_feature_names():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(_data(), columns=["a", "b"])
    est = _small().fit(frame)
    est.set_params(layers=0)
    with pytest.raises(ValueError, match="'layers'"):
        est.fit(_data())  # no names: validate_data would delete feature_names_in_
    assert list(est.feature_names_in_) == ["a", "b"]


def test_too_few_rows_for_batch_norm_names_the_rows_and_validation_fraction():
    """With 2 rows, validation_fraction holds out 1 and the batches have one row; the error
    used to name 'batch_size', which the user never passed."""
    with pytest.raises(ValueError, match=r"validation_fraction=0.1 holds out 1 of the 2 rows of "
                       r"'X'.*batch_norm=True needs batches of at least 2 rows") as info:
        _small(batch_norm=True, batch_size=None).fit(_data(2))
    assert "batch_size" not in str(info.value)
    with pytest.raises(ValueError, match=r"'validation_fraction' \(0.9\) leaves no training rows "
                       r"out of the 2 rows of 'X'"):
        _small(validation_fraction=0.9).fit(_data(2))
    assert np.isfinite(_small(batch_norm=True, validation_fraction=0.0).fit(_data(2)).score(
        _data(2)))


def test_load_dataset():
    train, test, exact = load_dataset("digits", 0, 0, digits_test=500, seed=0)
    assert train.shape == (1297, 64) and test.shape == (500, 64)
    assert np.all(train >= 0) and np.all(train < 17) and len(np.unique(train)) > 1000
    train, test, exact = load_dataset("8gaussians", 100, 50, digits_test=500, seed=0)
    assert train.shape == (100, 2) and test.shape == (50, 2) and np.isfinite(exact)
    assert load_dataset("moons", 100, 50, digits_test=500, seed=0)[2] is None


def test_compare_command(tmp_path):
    argv = ["sklearn-compare", "--datasets", "moons", "--n-train", "200", "--n-test", "100",
            "--epochs", "2", "--hidden", "16", "--layers", "2", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    record = json.loads((tmp_path / "metrics.json").read_text())
    moons = record["metrics"]["results"]["moons"]
    for model in ("gmm", "kde", "maf"):
        assert np.isfinite(moons[model]["test_log_likelihood"]) and moons[model]["stderr"] > 0
    table = (tmp_path / "table.md").read_text()
    assert table.startswith("| dataset | D | gmm | kde | maf | exact |")
    assert "| moons | 2 |" in table


def test_standardize_false_builds_a_flow_without_standardization():
    """The estimator standardizes in float64 itself; its flow has no Standardize of its own, so
    standardize=False fits the raw rows (it used to change nothing: the builder's default
    standardization stayed on)."""
    from flowkit.transforms import Standardize

    X = _data() * np.array([1000.0, 0.01]) + np.array([5e4, 3.0])
    on, off = _small().fit(X), _small(standardize=False).fit(X)
    for est in (on, off):
        assert not any(isinstance(m, Standardize) for m in est.flow_.modules())
    assert np.all(off.mean_ == 0) and np.all(off.scale_ == 1)
    assert abs(on.score(X) - off.score(X)) > 1.0  # two different models


def test_rows_beyond_float32_are_named_as_X():
    """Finite float64 rows that overflow the flow's float32 are an error about 'X' (it used to
    say that 'data' holds NaN or Inf, which the user's X does not)."""
    X = _data() * 1e39
    with pytest.raises(ValueError, match=r"'X' has values beyond the range of float32"):
        _small(standardize=False).fit(X)
    _small(standardize=False, dtype="float64").fit(X)  # float64 holds them


def test_data_warnings_name_X_and_its_values():
    """The estimator fits standardized rows; its warnings are about the X the user passed."""
    X = _data(300)
    X[:, 1] = 7.0
    with pytest.warns(DataWarning, match=r"'X', column 1, holds a single value \(7\) in all "
                      r"300 rows") as caught:
        _small().fit(X)
    assert len([w for w in caught if issubclass(w.category, DataWarning)]) == 1
    assert all(w.filename == __file__ for w in caught)


def test_learning_rate_is_constant_unless_a_schedule_is_chosen(monkeypatch):
    """FlowDensity trains at a constant rate by default (fit's own default decays it) and
    passes a chosen schedule on to fit."""
    import flowkit.sklearn as module

    schedules = []
    real_fit = module.fit_flow

    def recording(flow, *args, **kwargs):
        history = real_fit(flow, *args, **kwargs)
        schedules.append(kwargs["lr_schedule"])
        return history

    monkeypatch.setattr(module, "fit_flow", recording)
    _small(max_epochs=2, validation_fraction=0.0).fit(_data(40))
    _small(max_epochs=2, validation_fraction=0.0, lr_schedule="cosine").fit(_data(40))
    assert schedules == [None, "cosine"]


def test_repeated_rows_warn_and_are_held_out_whole(monkeypatch):
    """As fit(valid=<fraction>): a DataWarning names the repeated rows of X, and the validation
    rows fit trains with have no copies among its training rows (review 22: 5 copies of 600
    rows gave a test NLL of 671 after early stopping on a validation NLL of 3.6)."""
    import flowkit.sklearn as sk

    passed = []
    fit_flow = sk.fit_flow
    monkeypatch.setattr(sk, "fit_flow", lambda flow, u, valid, **kw: passed.append((u, valid))
                        or fit_flow(flow, u, valid=valid, **kw))
    unique = np.random.default_rng(0).normal(size=(200, 2))
    X = np.concatenate([unique] * 3)
    est = FlowDensity(layers=1, hidden_features=(8,), max_epochs=1, random_state=0)
    with pytest.warns(DataWarning, match=r"'X' has 400 rows that repeat an earlier row"):
        est.fit(X)
    train, valid = passed[-1]
    assert len(valid) == 60 and len(train) == 540  # 20 groups of 3 copies
    train_rows = {tuple(r) for r in train.tolist()}
    assert not any(tuple(r) in train_rows for r in valid.tolist())


def test_a_small_validation_fraction_warns():
    X = np.random.default_rng(1).normal(size=(60, 2))
    est = FlowDensity(layers=1, hidden_features=(8,), max_epochs=1, random_state=0)
    with pytest.warns(DataWarning, match=r"validation_fraction=0.1 of the 60 rows of 'X' holds "
                                         r"out 6: a validation loss over so few rows is noisy"):
        est.fit(X)


def test_warnings_name_a_data_frames_columns():
    """FlowDensity records feature_names_in_ but warned about 'column 0' (review 22)."""
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"age": rng.integers(18, 30, 300).astype(float),
                          "income": rng.normal(size=300)})
    est = FlowDensity(layers=1, hidden_features=(8,), max_epochs=1, random_state=0)
    with pytest.warns(DataWarning, match=r"'X', column 0 \('age'\), takes only 12 distinct"):
        est.fit(frame)


def test_positive_columns_spread_over_orders_of_magnitude_are_warned_of():
    """Review 44: fit warned an affine flow of log-normal columns, FlowDensity did not; it has
    no bounds, so the advice is the logarithm or the spline."""
    X = np.exp(2.0 * np.random.default_rng(0).normal(size=(300, 2)))
    with pytest.warns(DataWarning, match=r"'X', columns 0 and 1, hold only positive values"
                      r".*np.log.*transformer='spline'"):
        _small(max_epochs=1).fit(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        _small(max_epochs=1, transformer="spline").fit(X)


def test_a_pickled_estimator_is_verified_when_read():
    """Review 57: a fitted FlowDensity pickled its flow as a plain module, so a flipped bit in a
    weight loaded and changed the scores (by 5e-4); its flow now travels as a flowkit file."""
    import pickle

    from flowkit.checkpoint import CheckpointError

    X = np.random.default_rng(0).normal(size=(200, 2))
    estimator = _small(max_epochs=2).fit(X)
    data = pickle.dumps(estimator)
    again = pickle.loads(data)
    np.testing.assert_array_equal(again.score_samples(X), estimator.score_samples(X))
    assert again.flow_.training == estimator.flow_.training
    embedded = estimator.__getstate__()["flow_file_"][0]
    start = data.find(embedded)
    assert start >= 0
    damaged = bytearray(data)
    damaged[start + len(embedded) * 3 // 4] ^= 0x08  # a bit of the flow's weights
    with pytest.raises(CheckpointError,
                       match="pickled FlowDensity is damaged: its file .*checksum"):
        pickle.loads(bytes(damaged))
    assert pickle.loads(pickle.dumps(_small())).get_params() == _small().get_params()
