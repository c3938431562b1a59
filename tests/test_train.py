"""The fit loops: learning, data kinds, validation and early stopping, resume equality, bad input,
progress output; and the ``flowkit`` command line."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import flowkit
from flowkit.app import cli
from flowkit.checkpoint import CheckpointError, load_checkpoint, load_model, save_checkpoint
from flowkit.nn.modes import evaluating
from flowkit.train import (
    CHECKPOINT_NAME,
    DivergenceError,
    History,
    NonFiniteLossError,
    fit,
    fit_reverse_kl,
    resolve_device,
)
from flowkit.train.arrays import linearly_dependent
from flowkit.train.sources import first_batch
from flowkit.validation import ArgumentError

SCALE, SHIFT = torch.tensor([2.0, 0.5]), torch.tensor([1.0, -1.0])
# differential entropy of N(SHIFT, diag(SCALE^2)): the best achievable mean NLL
ENTROPY = float(0.5 * 2 * math.log(2 * math.pi * math.e) + SCALE.log().sum())
QUIET = {"progress": False, "device": "cpu"}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These models are tiny: a second intra-op thread only adds synchronisation, which costs
    several times the compute on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def gaussian(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    return torch.randn(n, 2, generator=generator) * SCALE + SHIFT


def small_maf(**kwargs) -> flowkit.Flow:
    return flowkit.MAF(2, hidden_features=(16,), layers=2, **kwargs)


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ------------------------------------------------------------------------------------- learning


def test_fit_reaches_the_entropy_of_a_gaussian():
    """A one-layer affine MAF can represent N(SHIFT, diag(SCALE^2)) exactly, and the mean NLL
    of the exact density is the entropy (the per-point NLL has standard deviation 1 here, so a
    4096-point mean is within 0.05 of it with probability > 0.999)."""
    flow = flowkit.MAF(2, hidden_features=(8,), layers=1)
    valid = gaussian(4096)
    h = fit(flow, gaussian(4096), valid=valid, steps=100, batch_size=256, lr=5e-2, **QUIET)
    assert isinstance(h, History) and h.objective == "nll"
    assert len(h.train_loss) == 100 and h.steps[-1] == 100
    assert h.valid_steps[-1] == 100 and not flow.training
    assert h.valid_loss[-1] == pytest.approx(ENTROPY, abs=0.08)
    with torch.no_grad():  # with validation data, fit ends with the best validation's weights
        assert -flow.log_prob(valid).mean().item() == pytest.approx(h.best_valid_loss, abs=1e-5)


def test_reverse_kl_elbo_reaches_log_normalizer():
    """For p~(x) = exp(-|x - m|^2 / 2) the ELBO is bounded by log Z = log(2 pi) (D = 2), with
    equality when q = p; an IAF can represent p exactly."""
    flow = flowkit.IAF(2, hidden_features=(8,), layers=1)
    mean = torch.tensor([2.0, -1.0])
    h = fit_reverse_kl(
        flow,
        lambda x: -0.5 * (x - mean).square().sum(-1),
        steps=100,
        batch_size=256,
        lr=5e-2,
        seed=0,
        **QUIET,
    )
    assert h.objective == "neg_elbo" and h.elbo == [-v for v in h.train_loss]
    assert np.mean(h.elbo[-50:]) == pytest.approx(math.log(2 * math.pi), abs=0.02)
    assert all(v <= math.log(2 * math.pi) + 0.05 for v in h.elbo[-50:])  # a bound, up to noise
    assert flow.sample(2000).mean(0) == pytest.approx(mean, abs=0.1)


def test_numpy_float64_is_cast_to_the_model_dtype():
    flow = small_maf()
    h = fit(flow, gaussian(300).double().numpy(), steps=5, batch_size=100, seed=0, **QUIET)
    assert len(h.train_loss) == 5 and all(p.dtype == torch.float32 for p in flow.parameters())


def _class_indices(n: int) -> torch.Tensor:
    """(n, 3) int64 vectors in 0..3 with strong dependencies: x1 = x0, x2 = (x0 + 1) mod 4."""
    x0 = torch.multinomial(torch.tensor([0.7, 0.1, 0.1, 0.1]), n, replacement=True,
                           generator=torch.Generator().manual_seed(0))
    return torch.stack([x0, x0, (x0 + 1) % 4], dim=1)


@pytest.mark.parametrize("kind", ["tensor", "loader"])
def test_fit_trains_a_categorical_made_on_integer_data(kind):
    """Integer class indices reach the model as integers (casting them to the model's float
    dtype made CategoricalMADE.log_prob refuse every batch), in training and validation."""
    torch.manual_seed(0)
    model = flowkit.CategoricalMADE(3, classes=4, hidden_features=(32,))
    x = _class_indices(512)
    data = DataLoader(TensorDataset(x), batch_size=64, shuffle=True) if kind == "loader" else x
    valid = DataLoader(TensorDataset(x[:128]), batch_size=64) if kind == "loader" else x[:128]
    h = fit(model, data, valid=valid, steps=80, batch_size=64, lr=1e-2, valid_every=40,
            seed=0, **QUIET)
    assert np.mean(h.train_loss[-10:]) < np.mean(h.train_loss[:10]) - 1.0
    assert h.valid_loss[-1] < h.valid_loss[0]
    assert h.valid_loss[-1] < 3 * math.log(4) - 1.0  # well below the uniform model's NLL


def test_conditional_dataloader_and_epochs():
    flow = small_maf(context_features=1)
    c = torch.randn(200, 1)
    x = gaussian(200) + 3 * c
    loader = DataLoader(TensorDataset(x, c), batch_size=50, shuffle=True)
    h = fit(flow, loader, valid=(x[:64], c[:64]), epochs=3, seed=0, **QUIET)
    assert len(h.train_loss) == 3 * len(loader) == 12
    assert h.valid_steps == [4, 8, 12]  # default: one validation per epoch


def test_epochs_of_an_array_drop_the_last_partial_batch():
    h = fit(small_maf(), gaussian(250), epochs=2, batch_size=100, seed=0, **QUIET)
    assert len(h.train_loss) == 4


def test_sampling_function_is_seeded():
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(0)
        flow = small_maf()
        fit(flow, gaussian, steps=10, batch_size=64, seed=seed, **QUIET)
        runs.append(weights(flow))
    assert_same_weights(runs[0], runs[1])
    assert any(not torch.equal(runs[0][k], runs[2][k]) for k in runs[0])


def test_custom_optimizer_schedule_and_clipping():
    seen = []

    def schedule(opt, steps):
        seen.append(steps)
        return torch.optim.lr_scheduler.StepLR(opt, step_size=5)

    h = fit(
        small_maf(),
        gaussian(256),
        steps=12,
        batch_size=64,
        optimizer=torch.optim.SGD,
        lr_schedule=schedule,
        clip_grad_norm=1.0,
        seed=0,
        **QUIET,
    )
    assert seen == [12] and len(h.train_loss) == 12


def test_early_stopping_restores_the_best_weights():
    """Training on N(SHIFT, SCALE) moves the flow away from a validation set drawn from the
    initial flow's own density N(0, I): the first validation is the best."""
    flow = small_maf()
    valid = torch.randn(512, 2) * 0.1
    h = fit(
        flow,
        gaussian(1024) + 5,
        valid=valid,
        steps=500,
        batch_size=128,
        lr=1e-2,
        valid_every=10,
        early_stopping_patience=3,
        seed=0,
        **QUIET,
    )
    assert h.stopped_early and h.best_step == 10
    assert h.valid_steps == [10, 20, 30, 40] and len(h.train_loss) == 40
    with torch.no_grad():
        assert -flow.log_prob(valid).mean().item() == pytest.approx(h.best_valid_loss, abs=1e-5)


@pytest.mark.parametrize("restore_best", [True, False])
def test_restore_best_without_early_stopping(restore_best):
    """The setting of the test above, run for all 40 steps: restore_best ends with the weights of
    the first (best) validation, the default with those of the last step."""
    flow = small_maf()
    valid = torch.randn(512, 2) * 0.1
    h = fit(flow, gaussian(1024) + 5, valid=valid, steps=40, batch_size=128, lr=1e-2,
            valid_every=10, restore_best=restore_best, seed=0, **QUIET)
    assert not h.stopped_early and h.best_step == 10 and h.valid_steps == [10, 20, 30, 40]
    with torch.no_grad():
        final = -flow.log_prob(valid).mean().item()
    expected = h.best_valid_loss if restore_best else h.valid_loss[-1]
    assert final == pytest.approx(expected, abs=1e-5)
    assert h.valid_loss[-1] > h.best_valid_loss + 1.0


# ------------------------------------------------------------------------------- checkpoints


class Interrupted(Exception):
    """Stands in for a killed process."""


def test_amortized_reverse_kl_fits_a_posterior_for_every_context():
    """fit_reverse_kl(context=...): q(x | c) for the targets p~(x | c) = N(x; (c, -c), 0.5^2 I),
    unnormalised, log Z = log(2 pi 0.25) for every c; contexts from a function or the rows of
    a tensor. The ELBO reaches log Z and the posterior means follow c."""
    log_z = math.log(2 * math.pi * 0.25)

    def target(x, c):
        return -0.5 * ((x - torch.cat([c, -c], -1)) / 0.5).square().sum(-1)

    for context in (lambda n, g: 2.0 * torch.randn(n, 1, generator=g) + 1.0,
                    torch.linspace(-2.0, 4.0, 7)[:, None]):
        flow = flowkit.IAF(2, hidden_features=(16,), layers=2, context_features=1)
        h = fit_reverse_kl(flow, target, steps=300, batch_size=128, lr=1e-2, seed=0,
                           context=context, **QUIET)
        assert np.mean(h.elbo[-30:]) == pytest.approx(log_z, abs=0.05)
        flow.eval()
        c = torch.tensor([[-1.0], [3.0]])
        means = flow.sample(4000, c).mean(0)
        torch.testing.assert_close(means, torch.cat([c, -c], -1), atol=0.1, rtol=0)
        assert not flow.standardize_context.provisional


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [({}, ValueError, r"'flow' has context_features=1: pass 'context'"),
     ({"context": torch.zeros(4, 2)}, ValueError, r"'context' should have shape \(\.\.\., 1\)"),
     ({"context": torch.zeros(0, 1)}, ValueError, r"of M >= 1 contexts, got shape \(0, 1\)"),
     ({"context": lambda n: torch.zeros(n, 1)}, TypeError,
      r"'context', a sampling function, should have the signature sample\(n, generator\)"),
     ({"context": lambda n, g: torch.zeros(n + 1, 1)}, ValueError,
      r"should return 8 rows \(8, 1\) when asked for n=8, got \(9, 1\)"),
     ({"context": "c"}, TypeError, "'context' should be a tensor"),
     ({"context": torch.zeros(3, 1), "target": lambda x: x.sum(-1)}, TypeError,
      r"called as target_log_density\(x, c\), but its signature is \(x\)")],
)
def test_amortized_reverse_kl_names_bad_contexts_and_targets(kwargs, error, match):
    flow = flowkit.IAF(2, hidden_features=(8,), layers=1, context_features=1)
    target = kwargs.pop("target", lambda x, c: -x.square().sum(-1))
    with pytest.raises(error, match=match):
        fit_reverse_kl(flow, target, steps=2, batch_size=8, **kwargs, **QUIET)
    with pytest.raises(ValueError, match="'context' was given but 'flow' has context_features=0"):
        fit_reverse_kl(flowkit.IAF(2, layers=1), lambda x: x.sum(-1), steps=2,
                       context=torch.zeros(3, 1), **QUIET)


def test_reverse_kl_says_that_batch_norm_layers_stay_where_they_started():
    """Review 43: with batch_norm=True the running statistics never moved under reverse KL
    (only data update them), silently."""
    flow = flowkit.IAF(2, layers=2, hidden_features=(8,), batch_norm=True)
    with pytest.warns(UserWarning, match="batch-norm layers, whose statistics move only when "
                      "data pass through them"):
        fit_reverse_kl(flow, lambda x: -x.square().sum(-1), steps=3, batch_size=16, **QUIET)


def interrupt_after(fn, steps: int):
    """Wrap a per-step function so that the call of step ``steps + 1`` raises. Only calls with
    gradients enabled count (the loop's checks and validation run under no_grad)."""
    calls = 0

    def wrapped(*args, **kwargs):
        nonlocal calls
        if torch.is_grad_enabled():
            calls += 1
            if calls > steps:
                raise Interrupted
        return fn(*args, **kwargs)

    return wrapped


def _resume_case(kind: str):
    """(model factory, fit function, data, extra settings, which callable to interrupt)."""
    x = gaussian(200, torch.Generator().manual_seed(5))
    if kind == "tensor":
        extra = {"valid": x[:50], "valid_every": 10, "early_stopping_patience": 100}
        return small_maf(batch_norm=True), fit, x, extra, "log_prob"
    if kind == "loader":
        loader = DataLoader(TensorDataset(x), batch_size=32, shuffle=True)
        return small_maf(batch_norm=True), fit, loader, {}, "log_prob"
    if kind == "sampler":
        return small_maf(batch_norm=True), fit, gaussian, {}, "data"
    if kind == "amortized":  # contexts drawn by the run's generator: resumed with it
        target = lambda x, c: -0.5 * ((x - c) / 0.5).square().sum(-1)  # noqa: E731
        extra = {"context": lambda n, g: 3.0 * torch.randn(n, 1, generator=g)}
        flow = flowkit.IAF(2, hidden_features=(16,), layers=2, context_features=1)
        return flow, fit_reverse_kl, target, extra, "data"
    target = lambda x: -0.5 * ((x - 1.0) / 0.5).square().sum(-1)  # noqa: E731
    return flowkit.IAF(2, hidden_features=(16,), layers=2), fit_reverse_kl, target, {}, "data"


@pytest.mark.parametrize("kind", ["tensor", "loader", "sampler", "reverse_kl", "amortized"])
def test_resume_gives_the_same_weights_as_an_uninterrupted_run(kind, tmp_path):
    settings = dict(
        steps=40,
        batch_size=32,
        lr=5e-3,
        lr_schedule="cosine",
        clip_grad_norm=5.0,
        seed=3,
        checkpoint_every=10,
        log_every=5,
        **QUIET,
    )

    def run(folder, interrupt=None, resume=False, init_seed=0):
        torch.manual_seed(init_seed)
        model, fn, data, extra, hook = _resume_case(kind)
        if interrupt is not None and hook == "log_prob":
            model.log_prob = interrupt_after(model.log_prob, interrupt)
        elif interrupt is not None:
            data = interrupt_after(data, interrupt)
        h = fn(model, data, checkpoint_dir=folder, resume=resume, **extra, **settings)
        return model, h

    full, h_full = run(tmp_path / "full")
    with pytest.raises(Interrupted):
        run(tmp_path / "cut", interrupt=25)
    assert load_checkpoint(tmp_path / "cut" / CHECKPOINT_NAME).extra["step"] == 20
    resumed, h_resumed = run(tmp_path / "cut", resume=True, init_seed=99)
    assert_same_weights(weights(resumed), weights(full))
    assert h_resumed.train_loss == h_full.train_loss
    assert h_resumed.epoch_loss == h_full.epoch_loss
    assert h_resumed.valid_loss == h_full.valid_loss


def test_resume_without_checkpoint_starts_fresh_and_finished_run_is_a_no_op(tmp_path):
    flow, x = small_maf(), gaussian(256)
    fit(
        flow,
        x,
        steps=6,
        batch_size=64,
        seed=0,
        checkpoint_dir=tmp_path,
        resume=True,
        **QUIET,
    )
    done = weights(flow)
    again = small_maf()
    h = fit(
        again, x, steps=6, batch_size=64, checkpoint_dir=tmp_path, resume=True, **QUIET
    )
    assert_same_weights(weights(again), done)
    assert len(h.train_loss) == 6 and h.seed == 0


def test_extending_a_run_needs_a_constant_learning_rate(tmp_path):
    common = dict(batch_size=64, seed=0, **QUIET)
    x = gaussian(256)
    fit(small_maf(), x, steps=4, lr_schedule="cosine", checkpoint_dir=tmp_path / "a",
        **common)
    with pytest.raises(ValueError, match="'steps' is 8 but .* run of 4 steps"):
        fit(small_maf(), x, steps=8, lr_schedule="cosine", resume=True,
            checkpoint_dir=tmp_path / "a", **common)
    fit(small_maf(), x, steps=4, lr_schedule=None, checkpoint_dir=tmp_path / "b",
        **common)
    h = fit(small_maf(), x, steps=8, lr_schedule=None, resume=True,
            checkpoint_dir=tmp_path / "b", **common)
    assert len(h.train_loss) == 8


def test_a_fresh_run_refuses_to_replace_a_checkpoint(tmp_path):
    common = dict(steps=4, batch_size=64, seed=0, checkpoint_dir=tmp_path, **QUIET)
    fit(small_maf(), gaussian(256), **common)
    before = (tmp_path / CHECKPOINT_NAME).read_bytes()
    flow = small_maf()
    untouched = weights(flow)
    expected = (
        f"'{tmp_path / CHECKPOINT_NAME}' exists: pass resume=True to continue that run, or pick "
        "another 'checkpoint_dir'"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        fit(flow, gaussian(256), **common)
    assert (tmp_path / CHECKPOINT_NAME).read_bytes() == before
    assert_same_weights(weights(flow), untouched)


def test_checkpoint_is_a_loadable_model(tmp_path):
    flow = small_maf()
    fit(flow, gaussian(256), steps=5, batch_size=64, seed=0, checkpoint_dir=tmp_path, **QUIET)
    x = gaussian(8)
    assert torch.equal(load_model(tmp_path / CHECKPOINT_NAME).log_prob(x), flow.log_prob(x))


def test_resume_checks(tmp_path):
    fit(
        small_maf(), gaussian(256), steps=5, batch_size=64, seed=0, checkpoint_dir=tmp_path, **QUIET
    )
    with pytest.raises(ValueError, match="'seed' is 1 but .* was written with seed 0"):
        fit(
            small_maf(),
            gaussian(256),
            steps=9,
            batch_size=64,
            seed=1,
            checkpoint_dir=tmp_path,
            resume=True,
            **QUIET,
        )
    with pytest.raises(ValueError, match="minimising 'nll', cannot resume it as 'neg_elbo'"):
        fit_reverse_kl(
            small_maf(),
            lambda x: -x.square().sum(-1),
            steps=9,
            checkpoint_dir=tmp_path,
            resume=True,
            **QUIET,
        )
    with pytest.raises(CheckpointError, match=r"was written for a MAF with .*'hidden_features': "
                       r"\[16\].*not for this MAF with .*: resume with the model it was written"):
        fit(
            flowkit.MAF(2, hidden_features=(8,), layers=2),
            gaussian(256),
            steps=9,
            batch_size=64,
            checkpoint_dir=tmp_path,
            resume=True,
            **QUIET,
        )
    with pytest.raises(ValueError, match="resume=True needs 'checkpoint_dir'"):
        fit(small_maf(), gaussian(256), steps=5, resume=True, **QUIET)


def poisoned_at(step: int):
    """A sampling function of Gaussian data whose batch of ``step`` is so large that the loss
    overflows (finite data: a NaN in them is reported as such, test_bad_input.py)."""
    calls = 0

    def sample(n, generator):
        nonlocal calls
        calls += 1
        x = gaussian(n, generator)
        return x * 1e30 if calls == step else x  # finite data, an overflowing loss

    return sample


def test_nonfinite_loss_names_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    flow = small_maf()
    with pytest.raises(NonFiniteLossError,
                       match=r"(nan|inf) at step 15\. Usual fixes: lower") as info:
        fit(
            flow,
            poisoned_at(15),
            steps=40,
            batch_size=32,
            seed=0,
            checkpoint_dir=tmp_path,
            checkpoint_every=10,
            log_every=5,
            **QUIET,
        )
    assert isinstance(info.value, FloatingPointError) and info.value.step == 15
    assert f"'{tmp_path / CHECKPOINT_NAME}' (step 10), was kept" in str(info.value)
    kept = load_checkpoint(tmp_path / CHECKPOINT_NAME)
    assert kept.extra["step"] == 10
    assert all(torch.isfinite(v).all() for v in kept.model["state_dict"].values())


def test_nonfinite_loss_before_the_first_checkpoint_says_when_it_is_due(tmp_path):
    with pytest.raises(NonFiniteLossError, match=r"No checkpoint was written yet \(the first is "
                       r"due at step 10\)\.$"):
        fit(small_maf(), poisoned_at(3), steps=40, batch_size=32, seed=0, checkpoint_dir=tmp_path,
            checkpoint_every=10, log_every=5, **QUIET)
    assert not (tmp_path / CHECKPOINT_NAME).exists()


class _InfiniteGradientAt(nn.Module):
    """A Gaussian with a learnable mean whose loss at step ``bad`` is finite but has an infinite
    gradient (that of sqrt at 0), from which Adam writes NaN weights."""

    features = 2

    def __init__(self, bad: int):
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(2))
        self.bad, self.calls = bad, 0

    def log_prob(self, x):
        log_p = -(x - self.loc).square().sum(-1)
        if torch.is_grad_enabled():  # training steps only (checks and validation: no_grad)
            self.calls += 1
            if self.calls == self.bad:
                log_p = log_p + (self.loc - self.loc.detach()).sqrt().sum()  # adds 0
        return log_p


def test_nonfinite_weights_are_not_checkpointed(tmp_path):
    """The loss of step 20 is finite but its update makes the weights NaN: the checkpoint of step
    20 refuses them (it used to save them) and the one of step 10 stays on disk."""
    with pytest.raises(NonFiniteLossError, match=r"the model's 'loc' is nan at step 20, although "
                       r"every loss so far was finite.*Usual fixes: lower") as info:
        fit(_InfiniteGradientAt(bad=20), gaussian(256), steps=40, batch_size=32, seed=0,
            checkpoint_dir=tmp_path, checkpoint_every=10, log_every=5, **QUIET)
    assert info.value.step == 20 and math.isnan(info.value.value)
    assert f"'{tmp_path / CHECKPOINT_NAME}' (step 10), was kept" in str(info.value)
    kept = load_checkpoint(tmp_path / CHECKPOINT_NAME)
    assert kept.extra["step"] == 10 and torch.isfinite(kept.model["state_dict"]["loc"]).all()


def test_resuming_a_checkpoint_without_its_entries_names_them(tmp_path):
    save_checkpoint(tmp_path / CHECKPOINT_NAME, "training")
    with pytest.raises(CheckpointError, match=r"training checkpoint without the entries "
                       r"\['model', 'optimizer', .*'best'\]") as info:
        fit(small_maf(), gaussian(256), steps=5, batch_size=64, checkpoint_dir=tmp_path,
            resume=True, **QUIET)
    assert str(tmp_path / CHECKPOINT_NAME) in str(info.value)


# ------------------------------------------------------------------------------------ bad input


BAD_CALLS = {
    "wrong-feature-count": (
        lambda m: fit(m, torch.randn(100, 3), steps=5, batch_size=10, **QUIET),
        ValueError,
        r"'data' should have 2 features to match the model.*\(100, 3\)",  # the array, not a batch
    ),
    "wrong-valid-features": (
        lambda m: fit(m, gaussian(100), valid=torch.randn(10, 5), steps=5, batch_size=10, **QUIET),
        ValueError,
        r"'valid' should have 2 features",
    ),
    "wrong-valid-features-loader": (
        lambda m: fit(m, gaussian(100), valid=DataLoader(TensorDataset(torch.randn(10, 5)),
                      batch_size=5), steps=5, batch_size=10, **QUIET),
        ValueError,
        r"'valid' should have 2 features to match the model.*\(5, 5\)",
    ),
    "empty-valid-loader": (
        lambda m: fit(m, gaussian(100), valid=DataLoader(TensorDataset(torch.randn(0, 2))),
                      steps=5, batch_size=10, **QUIET),
        ValueError,
        r"the DataLoader passed as 'valid' yields no batches",
    ),
    "no-log-prob": (
        lambda m: fit(nn.Linear(2, 2), gaussian(100), steps=5, **QUIET),
        TypeError,
        r"fit\(\) needs a torch.nn.Module with a 'log_prob' method.*Linear",
    ),
    "no-sample-and-log-prob": (
        lambda m: fit_reverse_kl(nn.Linear(2, 2), lambda x: x.sum(-1), steps=5, **QUIET),
        TypeError,
        r"'sample_and_log_prob' method",
    ),
    "steps-and-epochs": (
        lambda m: fit(m, gaussian(100), steps=5, epochs=1, **QUIET),
        ValueError,
        r"exactly one of 'steps' and 'epochs'",
    ),
    "batch-larger-than-data": (
        lambda m: fit(m, gaussian(100), valid=None, steps=5, batch_size=256, **QUIET),
        ValueError,
        r"'batch_size' \(256\) exceeds the number of training rows \(100\)",
    ),
    "integer-data-for-a-flow": (
        lambda m: fit(m, torch.ones(100, 2, dtype=torch.long), steps=1, **QUIET),
        TypeError,
        r"'data' holds torch.int64 values, which Flow.log_prob refuses .*dequantization",
    ),
    "nan-in-data": (
        lambda m: fit(
            m, torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]), steps=1, batch_size=1, **QUIET
        ),
        ValueError,
        r"'data' holds NaN or Inf values \(first at row 1, column 0\); drop or fill",
    ),
    "missing-context": (
        lambda m: fit(
            small_maf(context_features=2), gaussian(100), steps=5, batch_size=10, **QUIET
        ),
        ValueError,
        r"conditional \(context_features=2\) but 'data' has no context",
    ),
    "context-mismatch": (
        lambda m: fit(m, (gaussian(100), torch.randn(99, 1)), steps=5, batch_size=10, **QUIET),
        ValueError,
        r"should have shape \(100, C\), one row of C context features per row of x",
    ),
    "context-one-dimensional": (  # review 41: the placeholder, and no reshape hint
        lambda m: fit(m, (gaussian(100), torch.randn(100)), steps=5, batch_size=10, **QUIET),
        ValueError,
        r"got \(100,\); one context feature per row is context.reshape\(-1, 1\)$",
    ),
    # a loader's first batch: the same check and message as arrays (review 23 F15)
    "loader-context-mismatch": (
        lambda m: fit(m, DataLoader(TensorDataset(gaussian(100), torch.randn(100, 1, 1)),
                                    batch_size=10), steps=5, **QUIET),
        ValueError,
        r"^the context of the first batch of 'data' should have shape \(10, C\), one row of C "
        r"context features per row of x \(shape \(10, 2\)\), got \(10, 1, 1\)$",
    ),
    "restore-best-without-valid": (
        lambda m: fit(m, gaussian(100), valid=None, steps=5, restore_best=True, **QUIET),
        ValueError,
        r"restore_best=True needs validation data: pass 'valid'",
    ),
    "patience-without-valid": (
        lambda m: fit(m, gaussian(100), valid=None, steps=5, early_stopping_patience=2, **QUIET),
        ValueError,
        r"needs validation data",
    ),
    "unknown-optimizer": (
        lambda m: fit(m, gaussian(100), steps=5, batch_size=10, optimizer="lbfgs", **QUIET),
        ValueError,
        r"'optimizer' should be one of \['adam', 'adamw', 'sgd'\]",
    ),
    "unknown-schedule": (
        lambda m: fit(m, gaussian(100), steps=5, batch_size=10, lr_schedule="cos", **QUIET),
        ValueError,
        r"'lr_schedule' should be None, 'cosine', 'linear'",
    ),
    "unsupported-data": (
        lambda m: fit(m, [[0.0, 1.0]], steps=5, **QUIET),
        TypeError,
        r"'data' should be a tensor, a numpy array, a pair",
    ),
    "zero-steps": (
        lambda m: fit(m, gaussian(100), steps=0, batch_size=10, **QUIET),
        ValueError,
        r"'steps' should be >= 1, got 0",
    ),
    "log-prob-shape": (
        lambda m: fit(_BadShape(), gaussian(100), steps=5, batch_size=10, **QUIET),
        ValueError,
        r"model.log_prob should return shape \(N,\), got \(2, 2\)",
    ),
}


class _BadShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2))

    def log_prob(self, x):
        return x * self.w


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_fails_before_training(case):
    call, error, message = BAD_CALLS[case]
    flow = small_maf()
    before = weights(flow)
    with pytest.raises(error, match=message):
        call(flow)
    assert_same_weights(weights(flow), before)


def test_the_first_validation_batch_is_checked_without_moving_random_state():
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(gaussian(64)), batch_size=16, shuffle=True, generator=g)
    torch_state, loader_state = torch.get_rng_state(), g.get_state()
    x, c = first_batch("valid", loader, torch.device("cpu"), torch.float32)
    assert x.shape == (16, 2) and c is None
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert torch.equal(g.get_state(), loader_state)


# --------------------------------------------------------------------------- progress, history


def test_progress_bar_shows_step_loss_valid_and_rate(capsys):
    fit(
        small_maf(),
        gaussian(256),
        valid=gaussian(64),
        steps=20,
        batch_size=64,
        log_every=5,
        seed=0,
        device="cpu",
    )
    err = capsys.readouterr().err
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert final.startswith("nll: 100%") and "20/20" in final
    assert "step/s" in final and "loss=" in final and "valid=" in final
    # valid data: the run returns its best validation's weights, and the bar ends saying which
    # (the last valid= shown may be another: review 18)
    h = fit(small_maf(), gaussian(256), valid=gaussian(64), steps=20, batch_size=64, seed=0,
            device="cpu")
    lines = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    final = lines[-1]
    assert (f"returned=best valid {h.best_valid_loss:.4f} (step {h.best_step})" in final)
    # the finished bar is drawn once (a log file showed it twice, with two rates)
    assert sum("20/20" in line for line in lines) == 1, lines
    # ... unless the best is the last validation, which valid= shows (review 20)
    for losses, said in (([3.0, 2.5, 2.75], "valid=2.7500, returned=best valid 2.5000 (step 8)"),
                         ([3.0, 2.75, 2.5], "valid=2.5000")):
        values = iter(losses)
        fit(small_maf(), gaussian(256), valid=lambda m, v=values: next(v), steps=12,
            batch_size=64, valid_every=4, seed=0, device="cpu")
        final = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
        assert final.rstrip("]").endswith(said), final
    fit(small_maf(), gaussian(256), steps=5, batch_size=64, **QUIET)
    assert capsys.readouterr().err == ""


def test_history_round_trips_through_json():
    h = fit(small_maf(), gaussian(256), valid=gaussian(64), steps=8, batch_size=64, seed=4, **QUIET)
    d = json.loads(json.dumps(h.to_dict()))
    assert History.from_dict(d) == h
    assert d["seed"] == 4 and len(d["train_loss"]) == 8 and d["valid_steps"] == [4, 8]
    assert len(d["epoch_loss"]) == 2


@pytest.mark.parametrize("kind", ["tensor", "loader", "sampler"])
def test_epoch_loss_is_the_mean_loss_of_each_completed_epoch(kind):
    x = gaussian(200)
    loader = DataLoader(TensorDataset(x), batch_size=50, shuffle=True)
    data = {"tensor": x, "loader": loader, "sampler": gaussian}[kind]
    h = fit(small_maf(), data, valid=None, steps=10, batch_size=50, log_every=3, seed=0, **QUIET)
    assert len(h.train_loss) == 10
    if kind == "sampler":  # no epochs
        assert h.epoch_loss == []
    else:  # 4 steps per epoch: two complete epochs, the partial third one left out
        expected = [np.mean(h.train_loss[:4]), np.mean(h.train_loss[4:8])]
        assert h.epoch_loss == pytest.approx(expected, rel=1e-12)


class _DenormalProbe(nn.Module):
    """Records whether subnormal floats are flushed to zero while the loss is computed."""

    features = 2

    def __init__(self):
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(2))
        self.flushed: list[bool] = []

    def log_prob(self, x):
        self.flushed.append(bool(torch.tensor([1e-39]).mul(1.0).item() == 0.0))
        return -(x - self.loc).square().sum(-1)


def test_denormals_are_flushed_during_training_on_cpu_only():
    probe = _DenormalProbe()
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush denormals")
    fit(probe, gaussian(64), steps=3, batch_size=32, **QUIET)
    assert probe.flushed[-1] is True
    assert torch.tensor([1e-39]).mul(1.0).item() != 0.0  # switched back off afterwards


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'device' is 'cuda' but CUDA is not available"):
            resolve_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fit_on_a_gpu_leaves_the_model_where_it_was():
    """A CPU model trained with device="auto" on a machine with a GPU comes back to the CPU
    (on an H100, four tests that used the model on CPU tensors after fit failed), also after a
    failed run; a model put on the GPU first stays there."""
    x = gaussian(256)
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    before = [p.detach().clone() for p in flow.parameters()]
    fit(flow, x, steps=3, batch_size=64, progress=False)  # device="auto": the GPU
    assert all(t.device.type == "cpu" for t in [*flow.parameters(), *flow.buffers()])
    assert any(not torch.equal(p, b) for p, b in zip(flow.parameters(), before, strict=True))
    flow.log_prob(x)  # CPU tensors, as before the call

    def stop(progress):
        assert next(flow.parameters()).device.type == "cuda"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(flow, x, steps=3, batch_size=64, progress=False,
            callbacks=flowkit.train.Callbacks(after_step=stop))
    assert next(flow.parameters()).device.type == "cpu"
    on_gpu = flowkit.MAF(2, layers=1, hidden_features=(8,)).cuda()
    fit(on_gpu, x, steps=3, batch_size=64, progress=False)
    assert next(on_gpu.parameters()).device.type == "cuda"


# ----------------------------------------------------------------------------------------- CLI


def test_cli_help_lists_subcommands_and_common_options(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "fit" in out and "flowkit <command> --help" in out
    with pytest.raises(SystemExit):
        cli.main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # help lines joined
    for option in ("--device {auto,cpu,cuda}", "--seed", "--out", "--data", "--steps"):
        assert option in out
    assert "--layers LAYERS autoregressive layers (default: 5)" in out
    assert "--steps STEPS optimizer steps (default: 2000, unless --epochs is given)" in out
    assert "--clip-grad-norm NORM clip the global gradient norm to NORM" in out
    assert "--threads N CPU threads for torch (default: torch's default)" in out


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_cli_fit_on_a_file_writes_checkpoint_metrics_and_figure(tmp_path, suffix):
    data = tmp_path / f"samples{suffix}"
    if suffix == ".npy":
        np.save(data, gaussian(600).numpy())
    else:  # the array named x is taken, whatever else the archive holds
        np.savez(data, labels=np.zeros(600), x=gaussian(600).numpy())
    out = tmp_path / "run"
    code = cli.main(
        [
            "fit",
            "--data",
            str(data),
            "--steps",
            "30",
            "--batch-size",
            "64",
            "--hidden",
            "16",
            "--layers",
            "2",
            "--quiet",
            "--device",
            "cpu",
            "--seed",
            "1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["command"] == "fit" and metrics["args"]["seed"] == 1
    assert metrics["metrics"]["steps"] == 30 and "valid_nll" in metrics["metrics"]
    assert (out / "loss.png").stat().st_size > 0
    assert load_model(out / CHECKPOINT_NAME).features == 2
    assert len(json.loads((out / "history.json").read_text())["train_loss"]) == 30


def test_cli_fit_on_a_toy_dataset_reports_the_kl_estimate(tmp_path):
    out = tmp_path / "toy"
    code = cli.main(
        [
            "fit",
            "--data",
            "8gaussians",
            "--steps",
            "10",
            "--valid-size",
            "256",
            "--hidden",
            "8",
            "--layers",
            "1",
            "--quiet",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    assert code == 0 and metrics["steps"] == 10
    assert metrics["kl_estimate"] == pytest.approx(metrics["valid_nll"] - metrics["entropy"])


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    np.save(tmp_path / "bad.npy", np.zeros((10, 2, 2)))
    code = cli.main(["fit", "--data", str(tmp_path / "bad.npy"), "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("flowkit fit: error: ") and "shape (N, D), got (10, 2, 2)" in err


def test_cli_names_its_options_in_errors(tmp_path, capsys):
    """fit()'s messages say resume=True, clip_grad_norm=1.0; the command says --resume, ..."""
    out = tmp_path / "toy"
    args = ["fit", "--data", "moons", "--steps", "4", "--valid-size", "64", "--hidden", "8",
            "--layers", "1", "--quiet", "--device", "cpu", "--threads", "1", "--out", str(out)]
    assert cli.main(args) == 0
    capsys.readouterr()
    assert cli.main(args) == 2  # without --resume into the same folder
    err = capsys.readouterr().err
    assert (f"'{out / CHECKPOINT_NAME}' exists: pass --resume to continue that run, or pick "
            "another '--out'") in err
    np.save(tmp_path / "huge.npy", gaussian(600).numpy() * 1e30)  # log-densities overflow
    code = cli.main(["fit", "--data", str(tmp_path / "huge.npy"), "--steps", "20", "--quiet",
                     "--no-standardize", "--device", "cpu", "--out", str(tmp_path / "huge")])
    err = capsys.readouterr().err
    assert code == 2 and "the training loss is inf at step 1" in err
    assert "(--lr 0.003 now)" in err and "(--clip-grad-norm 1.0)" in err
    assert "No checkpoint was written yet (the first is due at step 20)" in err
    assert "lr=" not in err and "clip_grad_norm" not in err


def test_python_dash_m_flowkit_runs():
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "flowkit", "--help"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
    )
    assert done.returncode == 0 and "usage: flowkit" in done.stdout


# ------------------------------------------------------------------ bad arguments, one table

X64 = gaussian(64)


def _fit(**kwargs):
    return lambda m: fit(m, X64, **{"steps": 3, "batch_size": 16, **QUIET, **kwargs})


def _fit_valid(**kwargs):
    return _fit(valid=X64, **kwargs)


def _reverse_kl(**kwargs):
    target = lambda x: -x.square().sum(-1)  # noqa: E731
    return lambda m: fit_reverse_kl(m, target, **{"steps": 3, "batch_size": 16, **QUIET, **kwargs})


def _flow_density(**kwargs):
    from flowkit.sklearn import FlowDensity

    X = kwargs.pop("X", X64.numpy())
    params = {"layers": 1, "hidden_features": (4,), "max_epochs": 1, **kwargs}
    return lambda m: FlowDensity(**params).fit(X)


NAN, INF = float("nan"), float("inf")
BAD_ARGUMENTS = {
    # fit: the shared options (TrainOptions)
    "fit-lr-inf": (_fit(lr=INF), ValueError, "lr"),
    "fit-lr-nan": (_fit(lr=NAN), ValueError, "lr"),
    "fit-lr-string": (_fit(lr="0.1"), ValueError, "lr"),
    "fit-lr-zero": (_fit(lr=0.0), ValueError, "lr"),
    "fit-lr-negative": (_fit(lr=-1e-3), ValueError, "lr"),
    "fit-lr-bool": (_fit(lr=True), ValueError, "lr"),
    "fit-clip-negative": (_fit(clip_grad_norm=-1), ValueError, "clip_grad_norm"),
    "fit-clip-zero": (_fit(clip_grad_norm=0), ValueError, "clip_grad_norm"),
    "fit-clip-nan": (_fit(clip_grad_norm=NAN), ValueError, "clip_grad_norm"),
    "fit-clip-inf": (_fit(clip_grad_norm=INF), ValueError, "clip_grad_norm"),
    "fit-divergence-zero": (_fit(divergence_threshold=0.0), ValueError, "divergence_threshold"),
    "fit-divergence-nan": (_fit(divergence_threshold=NAN), ValueError, "divergence_threshold"),
    "fit-device-bogus": (_fit(device="bogus"), ValueError, "device"),
    "fit-device-int": (_fit(device=3), ValueError, "device"),
    "fit-device-meta": (_fit(device="meta"), ValueError, "device"),
    "fit-seed-negative": (_fit(seed=-1), ValueError, "seed"),
    "fit-seed-float": (_fit(seed=1.5), ValueError, "seed"),
    "fit-seed-bool": (_fit(seed=True), ValueError, "seed"),
    "fit-seed-huge": (_fit(seed=2**63), ValueError, "seed"),
    "fit-optimizer-none": (_fit(optimizer=None), ValueError, "optimizer"),
    "fit-optimizer-unknown": (_fit(optimizer="lbfgs"), ValueError, "optimizer"),
    "fit-optimizer-case": (_fit(optimizer="Adam"), ValueError, "optimizer"),
    "fit-weight-decay-negative": (_fit(weight_decay=-0.1), ValueError, "weight_decay"),
    "fit-weight-decay-nan": (_fit(weight_decay=NAN), ValueError, "weight_decay"),
    "fit-weight-decay-with-callable": (
        _fit(optimizer=torch.optim.RMSprop, weight_decay=0.1), ValueError, "weight_decay"
    ),
    "fit-schedule-unknown": (_fit(lr_schedule="cos"), ValueError, "lr_schedule"),
    "fit-checkpoint-every-zero": (_fit(checkpoint_every=0), ValueError, "checkpoint_every"),
    "fit-log-every-float": (_fit(log_every=10.0), ValueError, "log_every"),
    "fit-resume-string": (_fit(resume="yes"), ValueError, "resume"),
    "fit-progress-int": (_fit(progress=1), ValueError, "progress"),
    "fit-checkpoint-dir-int": (_fit(checkpoint_dir=5), TypeError, "checkpoint_dir"),
    "fit-callbacks-function": (_fit(callbacks=print), ValueError, "callbacks"),
    "fit-callbacks-not-callable": (
        lambda m: _fit(callbacks=flowkit.train.Callbacks(after_step=3))(m),
        ValueError, "callbacks.after_step",
    ),
    "fit-unknown-option": (_fit(lrr=0.1), TypeError, "lrr"),
    # fit: its own arguments
    "fit-steps-bool": (_fit(steps=True), ValueError, "steps"),
    "fit-steps-string": (_fit(steps="10"), ValueError, "steps"),
    "fit-steps-negative": (_fit(steps=-5), ValueError, "steps"),
    "fit-epochs-zero": (lambda m: fit(m, X64, epochs=0, batch_size=16, **QUIET), ValueError,
                        "epochs"),
    "fit-batch-size-bool": (_fit(batch_size=True), ValueError, "batch_size"),
    "fit-batch-size-float": (_fit(batch_size=16.0), ValueError, "batch_size"),
    "fit-valid-every-zero": (_fit_valid(valid_every=0), ValueError, "valid_every"),
    "fit-patience-zero": (_fit_valid(early_stopping_patience=0), ValueError,
                          "early_stopping_patience"),
    "fit-restore-best-string": (_fit_valid(restore_best="True"), ValueError, "restore_best"),
    "fit-data-complex": (lambda m: fit(m, X64.to(torch.complex64), steps=3, batch_size=16,
                                       **QUIET), ValueError, "data"),
    "fit-data-complex-numpy": (lambda m: fit(m, X64.numpy() + 1j, steps=3, batch_size=16,
                                             **QUIET), ValueError, "data"),
    "fit-data-strings": (lambda m: fit(m, np.array([["a", "b"]] * 20), steps=3, batch_size=16,
                                       **QUIET), ValueError, "data"),
    "fit-valid-complex": (_fit(valid=X64.to(torch.complex128)), ValueError, "valid"),
    # fit_reverse_kl: its own arguments and the shared options
    "reverse-kl-steps-zero": (_reverse_kl(steps=0), ValueError, "steps"),
    "reverse-kl-batch-size-bool": (_reverse_kl(batch_size=True), ValueError, "batch_size"),
    "reverse-kl-lr-nan": (_reverse_kl(lr=NAN), ValueError, "lr"),
    "reverse-kl-clip-negative": (_reverse_kl(clip_grad_norm=-1.0), ValueError, "clip_grad_norm"),
    "reverse-kl-device-bogus": (_reverse_kl(device="bogus"), ValueError, "device"),
    "reverse-kl-seed-negative": (_reverse_kl(seed=-1), ValueError, "seed"),
    "reverse-kl-unknown-option": (_reverse_kl(valid=X64), TypeError, "valid"),
    # the scikit-learn estimator
    "FlowDensity-weight-decay-nan": (_flow_density(weight_decay=NAN), ValueError, "weight_decay"),
    "FlowDensity-weight-decay-negative": (_flow_density(weight_decay=-1.0), ValueError,
                                          "weight_decay"),
    "FlowDensity-weight-decay-string": (_flow_density(weight_decay="0"), ValueError,
                                        "weight_decay"),
    "FlowDensity-lr-inf": (_flow_density(lr=INF), ValueError, "lr"),
    "FlowDensity-lr-string": (_flow_density(lr="0.1"), ValueError, "lr"),
    "FlowDensity-max-epochs-bool": (_flow_density(max_epochs=True), ValueError, "max_epochs"),
    "FlowDensity-batch-size-zero": (_flow_density(batch_size=0), ValueError, "batch_size"),
    "FlowDensity-validation-fraction-nan": (_flow_density(validation_fraction=NAN), ValueError,
                                            "validation_fraction"),
    "FlowDensity-validation-fraction-one": (_flow_density(validation_fraction=1.0), ValueError,
                                            "validation_fraction"),
    "FlowDensity-n-iter-no-change-zero": (_flow_density(n_iter_no_change=0), ValueError,
                                          "n_iter_no_change"),
    "FlowDensity-standardize-string": (_flow_density(standardize="no"), ValueError,
                                       "standardize"),
    "FlowDensity-dtype": (_flow_density(dtype="float16"), ValueError, "dtype"),
    "FlowDensity-device-bogus": (_flow_density(device="bogus"), ValueError, "device"),
    "FlowDensity-random-state-string": (_flow_density(random_state="x"), ValueError,
                                        "random_state"),
    "FlowDensity-complex-X": (_flow_density(X=X64.numpy() + 1j), ValueError, "X"),
}


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments_are_named_errors_before_training(case):
    """Each bad value is refused before the first step, with an error of the expected type whose
    message names the argument as the caller passed it."""
    call, error, name = BAD_ARGUMENTS[case]
    model = small_maf()
    before = weights(model)
    with pytest.raises(error) as info:
        call(model)
    message = str(info.value)
    assert f"'{name}'" in message or f"{name}=" in message, message
    if isinstance(info.value, ArgumentError):
        assert info.value.argument == name
    assert_same_weights(weights(model), before)


# ------------------------------------------------------- divergence, non-finite, callbacks


class _RisingLoss(nn.Module):
    """A Gaussian with a learnable mean whose training loss jumps by ``jump`` nats from step
    ``at`` on (a constant added to the log-density of training steps only)."""

    features = 2

    def __init__(self, at: int, jump: float):
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(2))
        self.at, self.jump, self.calls = at, jump, 0

    def log_prob(self, x):
        log_p = -0.5 * (x - self.loc).square().sum(-1)
        if torch.is_grad_enabled():
            self.calls += 1
            if self.jumps(self.calls):
                log_p = log_p - self.jump
        return log_p

    def jumps(self, call: int) -> bool:
        return call >= self.at


def test_divergence_is_an_error_that_says_what_to_try(tmp_path):
    """The loss is about 2.8 nats, then 1000 nats higher from step 30: the running median
    crosses best + 10 x max(1, |best|) within a few steps; the error says what to change, the
    model is given back the weights of the last recording before (step 30), the checkpoint of
    step 20 is kept."""
    model = _RisingLoss(at=30, jump=1000.0)
    with pytest.raises(DivergenceError, match=r"the training loss diverged at step 3\d: .*"
                       r"Usual fixes: lower the learning rate \(lr=0\.003 now\), clip gradients "
                       r"\(clip_grad_norm=1\.0\)") as info:
        fit(model, gaussian, steps=100, batch_size=64, seed=0, checkpoint_dir=tmp_path,
            checkpoint_every=20, log_every=10, **QUIET)
    e = info.value
    assert isinstance(e, FloatingPointError) and 30 <= e.step < 40 and e.value > e.best + 10
    assert "its median over the last 11 steps reached" in str(e)
    assert "The model holds the weights of step 30" in str(e)  # the recording before
    assert f"'{tmp_path / CHECKPOINT_NAME}' (step 20), was kept" in str(e)
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME).extra["step"] == 20
    # a smaller jump stays under the threshold; None turns the check off
    fit(_RisingLoss(at=30, jump=20.0), gaussian, steps=60, batch_size=64, seed=0, **QUIET)
    h = fit(_RisingLoss(at=30, jump=1000.0), gaussian, steps=60, batch_size=64, seed=0,
            divergence_threshold=None, **QUIET)
    assert len(h.train_loss) == 60


def test_a_failed_run_that_keeps_its_best_weights_ends_with_them(tmp_path):
    """With restore_best, a run that diverges gives the model the weights of its best
    validation, not those of the last recording: the mean moves from 0 towards SHIFT, so the
    validation that scores the distance to 0 is best at its first call (step 10)."""
    seen = []

    def valid(model):
        seen.append(model.loc.detach().clone())
        return model.loc.square().sum()

    model = _RisingLoss(at=35, jump=1000.0)
    with pytest.warns(flowkit.train.DivergenceWarning,
                      match=r"diverged at step 4\d: .* steps after the best validation "
                      r"\(step 10\): the run stopped there and returns the weights"):
        h = fit(model, gaussian, valid=valid, steps=100, batch_size=64, valid_every=10,
                restore_best=True, lr=1e-2, log_every=10, seed=0, **QUIET)
    # review 42: the run ends as early stopping ends it, and returns its history (a
    # DivergenceError lost it, though the model held good weights)
    assert h.stopped_early and 40 <= h.diverged_step < 50 and h.best_step == 10
    assert len(h.train_loss) == h.diverged_step and len(h.train_loss) < 100
    assert not torch.equal(seen[0], seen[-1])
    assert torch.equal(model.loc.detach(), seen[0])
    assert flowkit.train.History.from_dict(h.to_dict()) == h
    # losses and weights that become NaN after the divergence, within the same recording,
    # are past the run's end: no error, the best weights, no NaN in the checkpoint
    class ThenNaN(_RisingLoss):
        def log_prob(self, x):
            log_p = super().log_prob(x)
            if self.calls >= self.at + 8:
                with torch.no_grad():
                    self.loc.fill_(math.nan)
            return log_p

    model = ThenNaN(at=35, jump=1000.0)
    folder = tmp_path / "nan"
    with pytest.warns(flowkit.train.DivergenceWarning):
        h = fit(model, gaussian, valid=valid, steps=100, batch_size=64, valid_every=10,
                restore_best=True, lr=1e-2, log_every=20, seed=0, checkpoint_dir=folder, **QUIET)
    assert torch.isfinite(model.loc).all() and len(h.train_loss) == h.diverged_step
    assert all(math.isfinite(v) for v in h.train_loss)
    for entry in load_checkpoint(folder / CHECKPOINT_NAME).extra.values():
        assert not isinstance(entry, dict) or all(
            torch.isfinite(t).all() for t in entry.values() if isinstance(t, torch.Tensor))
    # without a best validation to return it is still an error
    with pytest.raises(DivergenceError):
        fit(_RisingLoss(at=35, jump=1000.0), gaussian, steps=100, batch_size=64, lr=1e-2,
            log_every=10, seed=0, **QUIET)


def test_a_large_learning_rate_ends_in_a_clear_error_and_finite_weights():
    flow = small_maf()
    with pytest.raises((DivergenceError, NonFiniteLossError), match="lower the learning rate"):
        fit(flow, gaussian, steps=200, batch_size=64, lr=10.0, seed=0, **QUIET)
    assert all(torch.isfinite(v).all() for v in flow.state_dict().values())
    assert not flow.training


def test_nonfinite_weights_without_checkpoints_are_not_returned():
    """The update of step 20 makes the weights NaN (with a finite loss): without a checkpoint
    folder the error comes at the next recording, and the model holds the weights of the one
    before (step 15)."""
    model = _InfiniteGradientAt(bad=20)
    with pytest.raises(NonFiniteLossError, match="the model holds the weights of step 15"
                       .replace("the model", "The model")) as info:
        fit(model, gaussian(256), valid=None, steps=40, batch_size=32, seed=0, log_every=5,
            **QUIET)
    assert info.value.step == 20
    assert torch.isfinite(model.loc).all()


def test_a_nan_validation_loss_ends_the_run_with_the_best_weights():
    """Review 19: a NaN validation loss was recorded as "no improvement" (early stopping then
    ended the run on it); it is now an error, and the model holds its best validation's
    weights."""
    values = iter([3.0, 2.0, math.nan])
    saved = {}

    def valid(m):
        saved[len(saved)] = {k: v.clone() for k, v in m.state_dict().items()}
        return next(values)

    flow = small_maf()
    with pytest.raises(NonFiniteLossError, match=r"'valid' returned nan at step 6 .*The model "
                       r"holds the weights of its best validation \(step 4\)") as info:
        fit(flow, gaussian(256), valid=valid, steps=10, batch_size=64, valid_every=2,
            restore_best=True, seed=0, **QUIET)
    assert info.value.history.valid_steps == [2, 4] and info.value.history.best_step == 4
    assert all(torch.equal(v, flow.state_dict()[k]) for k, v in saved[1].items())
    assert not flow.training



def test_a_nan_validation_loss_advises_resuming_without_a_lower_lr(tmp_path):
    """Review 20: after a non-finite validation loss the message said to resume from the kept
    checkpoint "with a lower 'lr'", which does not mend a validation that returns NaN; a
    non-finite training loss still advises it."""
    values = iter([3.0, 2.0, 2.5, math.nan])
    options = dict(steps=12, batch_size=64, valid_every=2, checkpoint_every=3, seed=0, **QUIET)
    with pytest.raises(NonFiniteLossError) as info:
        fit(small_maf(), gaussian(256), valid=lambda m: next(values),
            checkpoint_dir=tmp_path / "valid", **options)
    message = str(info.value)
    assert "'valid' returned nan at step 8" in message
    assert re.search(r"\(step 6\), was kept: continue from it with resume=True\.", message)
    assert "lower" not in message

    def diverge(progress):
        if progress.step == 7:
            next(progress.model.parameters()).data.fill_(math.nan)

    with pytest.raises(NonFiniteLossError, match=r"was kept: continue from it with resume=True "
                       r"and a lower 'lr'"):
        fit(small_maf(), gaussian(256), checkpoint_dir=tmp_path / "train",
            callbacks=flowkit.train.Callbacks(after_step=diverge), **options)

def test_valid_as_a_function_is_called_in_eval_mode_without_gradients():
    seen = []

    def valid(model):
        seen.append((model.training, torch.is_grad_enabled()))
        return torch.tensor(1.5)

    flow = small_maf()
    h = fit(flow, gaussian(256), valid=valid, steps=4, batch_size=64, valid_every=2, seed=0,
            **QUIET)
    assert seen == [(False, False), (False, False)] and h.valid_loss == [1.5, 1.5]
    with pytest.raises(ArgumentError, match=r"'valid' should return the validation loss as a "
                       r"number, got 'x'"):
        fit(small_maf(), gaussian(256), valid=lambda m: "x", steps=2, batch_size=64, **QUIET)


def test_a_raising_valid_function_leaves_the_model_in_training_mode():
    """fit trains in training mode; the validation runs in eval mode and gives the mode back
    even when ``valid(model)`` raises (review 23 F5)."""

    def valid(model):
        assert not model.training
        raise RuntimeError("broken validation")

    flow = small_maf()
    with pytest.raises(RuntimeError, match="broken validation"):
        fit(flow, gaussian(256), valid=valid, steps=4, batch_size=64, valid_every=2, **QUIET)
    assert all(m.training for m in flow.modules())
    assert torch.is_grad_enabled()


def test_evaluating_restores_the_mode_it_found_after_an_exception():
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout())
    for mode in (True, False):
        net.train(mode)
        with pytest.raises(RuntimeError, match="inside"), evaluating(net):
            assert not net.training and not net[1].training and not torch.is_grad_enabled()
            raise RuntimeError("inside")
        assert all(m.training == mode for m in net.modules()) and torch.is_grad_enabled()


def test_evaluating_gives_each_submodule_back_its_own_mode():
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(), nn.BatchNorm1d(2)).train()
    net[2].eval()  # a user's frozen layer inside a training model
    with evaluating(net):
        assert not any(m.training for m in net.modules())
    assert [m.training for m in net.modules()] == [True, True, True, False]


def test_callbacks_run_after_steps_epochs_and_checkpoints(tmp_path):
    events = []
    callbacks = flowkit.train.Callbacks(
        after_step=lambda p: events.append(("step", p.step, p.epoch, p.loss.shape)),
        after_epoch=lambda p: events.append(
            ("epoch", p.step, p.epoch, len(p.history.epoch_loss), len(p.history.valid_loss))),
        on_checkpoint=lambda p: events.append(("checkpoint", p.step, p.checkpoint)),
    )
    x = gaussian(64)  # 2 batches of 32 per epoch
    fit(small_maf(), x, valid=x[:16], epochs=2, batch_size=32, seed=0, callbacks=callbacks,
        checkpoint_dir=tmp_path, checkpoint_every=3, **QUIET)
    path = tmp_path / CHECKPOINT_NAME
    assert events == [
        ("step", 1, 0, ()), ("step", 2, 1, ()), ("epoch", 2, 1, 1, 1),
        ("step", 3, 1, ()), ("checkpoint", 3, path),
        ("step", 4, 2, ()), ("epoch", 4, 2, 2, 2), ("checkpoint", 4, path),
    ]
    events.clear()  # the last step on the checkpoint period: written once, not twice
    fit(small_maf(), x, valid=None, epochs=2, batch_size=32, seed=0, callbacks=callbacks,
        checkpoint_dir=tmp_path / "even", checkpoint_every=2, **QUIET)
    assert [e[1] for e in events if e[0] == "checkpoint"] == [2, 4]


def test_callbacks_do_not_change_a_resumed_run(tmp_path):
    """Resume equality holds with a callback that changes the model (mask cycling)."""
    def run(folder, steps, **kwargs):
        torch.manual_seed(0)
        model = flowkit.distributions.BernoulliMADE(6, hidden_features=(8,), num_masks=3,
                                                    order="random", seed=0)
        x = (torch.rand(96, 6, generator=torch.Generator().manual_seed(1)) < 0.3).float()
        cycle = flowkit.train.Callbacks(after_step=lambda p: p.model.next_mask())
        fit(model, x, steps=steps, batch_size=32, seed=0, callbacks=cycle, lr_schedule=None,
            checkpoint_dir=folder, checkpoint_every=4, **QUIET, **kwargs)  # extended: constant
        return weights(model)

    whole = run(tmp_path / "whole", 10)
    run(tmp_path / "cut", 4)
    assert_same_weights(run(tmp_path / "cut", 10, resume=True), whole)


def test_cli_spells_a_divergence_with_its_options(tmp_path, capsys):
    np.save(tmp_path / "x.npy", gaussian(600).numpy())
    code = cli.main(["fit", "--data", str(tmp_path / "x.npy"), "--steps", "50", "--lr", "10",
                     "--quiet", "--device", "cpu", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "(--lr 10.0 now)" in err and "(--clip-grad-norm 1.0)" in err
    assert "lr=" not in err and "clip_grad_norm" not in err
    code = cli.main(["fit", "--data", "moons", "--steps", "0", "--quiet", "--device", "cpu",
                     "--out", str(tmp_path / "p")])
    assert code == 2 and "'--steps' should be >= 1, got 0" in capsys.readouterr().err


# ------------------------------------------------------------------ defaults for small data


def test_default_batch_size_gives_small_data_several_steps_per_epoch():
    """Without ``batch_size``: N // 16 rows between 16 and 256, all rows below 16; 256 for a
    sampling function."""
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    for rows, per_epoch in ((10, 1), (50, 3), (600, 16), (8192, 32)):
        history = fit(flow, gaussian(rows), valid=None, epochs=2, seed=0, **QUIET)
        assert len(history.train_loss) == 2 * per_epoch, rows
    seen = []

    def sample(n, generator):
        seen.append(n)
        return torch.randn(n, 2, generator=generator)

    fit(flow, sample, steps=2, seed=0, **QUIET)
    assert seen == [256, 256]


class _RowRecorder(nn.Module):
    """A Gaussian with a learnable mean that records the rows (their first coordinate, a row
    id) of every batch it scores with gradients (training) and without (validation)."""

    features = 2

    def __init__(self):
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(2))
        self.trained: set[int] = set()
        self.validated: set[int] = set()

    def log_prob(self, x):
        ids = {int(i) for i in x[:, 0]}
        (self.trained if torch.is_grad_enabled() else self.validated).update(ids)
        return -0.5 * ((x - self.loc) ** 2).sum(-1)


def test_valid_as_a_fraction_holds_out_rows_of_the_data():
    x = torch.stack([torch.arange(200.0), torch.randn(200)], 1)
    model = _RowRecorder()
    history = fit(model, x, valid=0.25, epochs=3, batch_size=150, seed=0, **QUIET)
    assert len(history.train_loss) == 3  # 150 training rows, one full batch per epoch
    validated = model.validated - model.trained  # the first-batch check also scores 2 rows
    assert len(model.trained) == 150 and len(validated) == 50
    assert model.trained | validated == set(range(200))
    again = _RowRecorder()
    fit(again, x, valid=0.25, epochs=1, batch_size=150, seed=0, **QUIET)
    assert again.trained == model.trained  # the seed draws the split
    for fraction in (np.float32(0.25), np.float16(0.25)):  # any real scalar, as lr accepts
        same = _RowRecorder()
        fit(same, x, valid=fraction, epochs=1, batch_size=150, seed=0, **QUIET)
        assert same.trained == model.trained
    for bad, message in ((1.0, r"in \(0, 1\), got 1.0"), (1, r"a float in \(0, 1\), got the "
                         "integer 1$"), (np.int64(0), "the integer"), (0.001, "holds out 0")):
        with pytest.raises(ValueError, match=message):
            fit(_RowRecorder(), x, valid=bad, steps=1, **QUIET)
    with pytest.raises(ValueError, match=r"valid=0.1 holds out a fraction of array data, but "
                       r"'data' is a function"):
        fit(_RowRecorder(), lambda n, g: torch.randn(n, 2, generator=g), valid=0.1, steps=1,
            **QUIET)


def test_valid_auto_holds_out_rows_of_array_data_and_keeps_the_best_weights():
    """fit's default validates on rows of array data (review 32: without validation a flow
    trained 1000 steps on 337 rows of 30-D data scored 5.7e5 nats on held-out rows)."""
    x = torch.stack([torch.arange(300.0), torch.randn(300)], 1)
    model = _RowRecorder()
    history = fit(model, x, epochs=2, batch_size=90, seed=0, **QUIET)  # valid="auto"
    validated = model.validated - model.trained
    assert flowkit.train.auto_valid_rows(300) == 30 == len(validated)
    assert len(model.trained) == 270 == history.train_rows
    assert history.valid_steps == [3, 6] and history.best_step in (3, 6)  # the best kept
    same = _RowRecorder()
    fit(same, x, valid=0.1, epochs=1, batch_size=90, seed=0, **QUIET)
    assert same.trained == model.trained  # "auto" is a fraction of 30 / 300 here
    everything = _RowRecorder()
    history = fit(everything, x, valid=None, epochs=1, batch_size=90, seed=0, **QUIET)
    assert len(everything.trained) == 270 and history.valid_loss == []  # 3 batches of 90
    assert history.train_rows == 300
    assert [flowkit.train.auto_valid_rows(n) for n in (4, 5, 15, 99, 100, 250)] == [
        0, 1, 3, 19, 20, 25]
    tiny = _RowRecorder()
    assert fit(tiny, x[:4], steps=2, seed=0, **QUIET).valid_loss == []  # none below 5 rows
    for data in (lambda n, g: torch.randn(n, 2, generator=g),
                 DataLoader(TensorDataset(x), batch_size=30)):  # no rows to hold out
        assert fit(_RowRecorder(), data, steps=2, seed=0, **QUIET).valid_loss == []
        with pytest.raises(ArgumentError, match=r"restore_best=True needs validation data: "
                           r"pass 'valid'; valid='auto' holds out rows of array data only"):
            fit(_RowRecorder(), data, steps=2, restore_best=True, **QUIET)
    with pytest.raises(ArgumentError, match=r"'valid' should be validation data, a fraction "
                       r"in \(0, 1\), 'auto' or None, got the string 'none'"):
        fit(_RowRecorder(), x, valid="none", steps=1, **QUIET)


def test_a_small_validation_fraction_warns_naming_it():
    with pytest.warns(flowkit.train.DataWarning, match=r"^valid=0.01 holds out 3 of the 300 rows "
                      r"for validation: a validation loss over so few rows is noisy"):
        fit(small_maf(transformer="spline"), gaussian(300), valid=0.01, steps=1, **QUIET)


def test_an_affine_flow_on_few_training_rows_warns():
    """Review 32: on 80-200 rows the affine MAF gave single held-out rows 1e2-1e6 nats while it
    validated well; the spline did not."""
    small = gaussian(100)  # 80 rows train after valid="auto"
    with pytest.warns(flowkit.train.DataWarning, match=r"^'data' leaves 80 rows to train a flow "
                      r"with affine autoregressive layers.*\(transformer='spline'\) does not"):
        fit(small_maf(), small, steps=1, **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("error", flowkit.train.DataWarning)
        fit(small_maf(transformer="spline"), small, steps=1, **QUIET)
        fit(small_maf(), gaussian(200), steps=1, **QUIET)  # 180 rows train
    with pytest.warns(flowkit.train.DataWarning, match=r"leaves 80 rows"):  # about the model,
        fit(small_maf(), small, steps=1, data_warnings=False, **QUIET)  # not the rows' values


def test_valid_auto_trains_on_every_row_where_copies_leave_none_to_hold_out():
    """Review 33: 50 equal rows raised "valid=0.2 of 50 rows holds out every row", a value the
    caller never passed, and two repeated points lost half the rows to validation."""
    for x, held in ((torch.ones(50, 2), 50), (torch.tensor([[0.0, 1.0], [2.0, 3.0]]).repeat(100, 1),
                                              100)):
        with pytest.warns(flowkit.train.DataWarning, match=rf"the default holdout would take {held}"
                          r"\): it trains on every row without validation"):
            history = fit(small_maf(), x, steps=2, data_warnings=False, **QUIET)
        assert history.valid_loss == [] and history.train_rows == len(x)


def test_a_batch_larger_than_the_rows_left_to_train_names_valid():
    with pytest.raises(ArgumentError, match=r"^'batch_size' \(100\) exceeds the 80 training "
                       r"rows left after valid='auto' held out 20 of the 100 rows passed; pass "
                       r"batch_size <= 80, or valid=None to train on every row$") as e:
        fit(small_maf(), gaussian(100), steps=1, batch_size=100, **QUIET)
    assert e.value.argument == "batch_size"
    assert fit(small_maf(), gaussian(100), valid=None, steps=1, batch_size=100,
               **QUIET).train_rows == 100


def test_resume_of_a_run_without_validation_under_the_default_names_valid(tmp_path):
    x = gaussian(256)
    options = dict(steps=4, batch_size=64, seed=0, lr_schedule=None, checkpoint_dir=tmp_path,
                   **QUIET)
    fit(small_maf(), x, valid=None, **options)
    with pytest.raises(ArgumentError, match=r"^the checkpoint was trained on all of 'data', this "
                       r"run on 'data' less what valid='auto' holds out: other rows train; pass "
                       r"valid=None to resume it$"):
        fit(small_maf(), x, **{**options, "steps": 8, "resume": True})
    assert len(fit(small_maf(), x, valid=None, **{**options, "steps": 8, "resume": True})
               .train_loss) == 8
    defaults = {**options, "checkpoint_dir": tmp_path / "defaults"}
    del defaults["batch_size"]  # its default follows the rows: the valid message comes first
    fit(small_maf(), x, valid=None, **defaults)
    with pytest.raises(ArgumentError, match=r"pass valid=None to resume it$"):
        fit(small_maf(), x, **{**defaults, "steps": 8, "resume": True})
    tenth = {**options, "checkpoint_dir": tmp_path / "tenth"}  # the rows "auto" holds out
    fit(small_maf(), x, valid=0.1, **tenth)
    assert len(fit(small_maf(), x, **{**tenth, "steps": 8, "resume": True}).train_loss) == 8


def test_data_as_a_list_pair_trains_as_the_tuple_does():
    # ``valid`` took [x, context] but ``data`` refused it, although its message asks for a pair
    torch.manual_seed(0)
    x, c = torch.randn(64, 2), torch.randn(64, 3)
    losses = []
    for data in ((x, c), [x, c], [x.numpy(), c.numpy()]):
        torch.manual_seed(0)
        flow = flowkit.MAF(2, context_features=3, hidden_features=(8,), layers=1)
        history = fit(flow, data, valid=[x[:16], c[:16]], steps=3, batch_size=16, seed=0,
                      **QUIET)
        losses.append(history.train_loss)
    assert losses[0] == losses[1] == losses[2]
    with pytest.raises(TypeError, match=r"'data' should be a tensor, a numpy array, a pair"):
        fit(flowkit.MAF(2), [x, c, c], steps=1, **QUIET)


class _Frame:
    """A data frame as pandas and polars present one: ``columns``, ``frame[column]`` with
    ``to_numpy()``, and ``to_numpy()`` of the whole (which, for mixed column types, pandas gives
    as Python objects)."""

    def __init__(self, **columns):
        self._columns = columns

    @property
    def columns(self):
        return list(self._columns)

    def __len__(self):
        return len(next(iter(self._columns.values())))

    def __getitem__(self, name):
        return _Column(self._columns[name])

    def to_numpy(self):
        return np.array(list(zip(*self._columns.values(), strict=True)), dtype=object)


class _Column:
    def __init__(self, values):
        self.values = values

    def to_numpy(self):
        return np.asarray(self.values)


def test_data_frames_train_as_the_arrays_of_their_columns():
    """A data frame (pandas, polars) is taken as the array of its columns, exactly, as data, in
    a pair and as validation data; it used to be a TypeError (review 22, tenth session)."""
    g = np.random.default_rng(0)
    a, b, c = g.normal(size=64), g.normal(size=64) * 100, g.integers(0, 5, size=64)
    runs = []
    for data, valid in (((np.column_stack([a, b]), c[:, None]), (np.column_stack([a, b])[:16],
                                                                c[:16, None])),
                        ((_Frame(a=a, b=b), _Frame(c=c)), [_Frame(a=a[:16], b=b[:16]),
                                                          _Frame(c=c[:16])])):
        torch.manual_seed(0)
        flow = flowkit.MAF(2, context_features=1, hidden_features=(8,), layers=1)
        runs.append(fit(flow, data, valid=valid, steps=3, batch_size=16, seed=0, **QUIET))
    assert runs[0].train_loss == runs[1].train_loss and runs[0].valid_loss == runs[1].valid_loss
    mixed = _Frame(a=a, n=c)  # floats and integers: a float array, as numpy makes it
    torch.manual_seed(0)
    fit(flowkit.MAF(2, hidden_features=(8,), layers=1), mixed, valid=0.25, steps=2, **QUIET)
    with pytest.raises(ValueError, match=r"'data' is a _Frame whose columns 's' \(<U1\) do not "
                       r"hold numbers \(text, dates, categories, or values numpy holds as"):
        fit(flowkit.MAF(2), _Frame(a=a, s=["x"] * 64), steps=1, **QUIET)
    with pytest.raises(ValueError, match=r"'valid context' is a _Frame whose columns 'k' \(object"):
        fit(flowkit.MAF(1, context_features=1), (a[:, None], c[:, None]), steps=1,
            valid=(a[:, None], _Frame(k=[None] * 64)), **QUIET)
    with pytest.raises(TypeError, match=r"'data' holds torch.int64 values"):
        fit(flowkit.MAF(1), _Frame(n=c), steps=1, **QUIET)  # integers, as an integer array


def test_pandas_data_frames_and_series():
    pd = pytest.importorskip("pandas")
    g = np.random.default_rng(1)
    frame = pd.DataFrame({"a": g.normal(size=80), "b": pd.array(g.integers(0, 9, 80),
                                                                 dtype="Int64")})
    fit(flowkit.MAF(2, hidden_features=(8,), layers=1), frame, steps=2, **QUIET)
    with pytest.warns(flowkit.train.DataWarning, match=r"'data', column 1 \('b'\), takes only"):
        fit(flowkit.MAF(2, hidden_features=(8,), layers=1), frame, steps=1, **QUIET)
    frame["k"] = pd.Categorical(["u", "v"] * 40)
    with pytest.raises(ValueError, match=r"columns 'k' \(category\) do not hold numbers"):
        fit(flowkit.MAF(3), frame, steps=1, **QUIET)
    frame["k"] = pd.date_range("2026-01-01", periods=80)  # review 29: named as text before
    with pytest.raises(ValueError, match=r"columns 'k' \(datetime64\[.s\]\) do not hold numbers "
                       r"\(text, dates"):
        fit(flowkit.MAF(3), frame, steps=1, **QUIET)
    series = pd.Series(g.normal(size=80), name="y")  # one column (review 24: a 1-D array)
    fit(flowkit.MAF(2, context_features=1, hidden_features=(8,)), (frame[["a", "b"]], series),
        steps=1, **QUIET)
    from flowkit.train.arrays import frames_as_arrays

    rows = np.arange(6.0).reshape(2, 3)
    named = pd.DataFrame(rows, columns=["a", "b", "a"])  # repeated names: kept, in order
    assert np.array_equal(frames_as_arrays("data", named), rows)
    mixed = pd.DataFrame(rows[:, :2], columns=[1, "1"])  # names equal as text
    assert np.array_equal(frames_as_arrays("data", mixed), rows[:, :2])


def test_fit_warns_about_a_constant_column():
    x = gaussian(200)
    x[:, 1] = 3.0
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    with pytest.warns(flowkit.train.DataWarning, match=r"'data', column 1, holds a single value "
                      r"\(3\) in all 200 rows"):
        fit(flow, x, steps=1, seed=0, **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("error", flowkit.train.DataWarning)
        fit(flow, gaussian(200), steps=1, seed=0, **QUIET)
        context = torch.ones(200, 1)  # a constant context is no point mass: no warning
        fit(flowkit.MAF(2, layers=1, hidden_features=(8,), context_features=1),
            (gaussian(200), context), steps=1, seed=0, **QUIET)
        binary = (torch.rand(200, 3) < 0.3).float()  # a discrete model of discrete data
        fit(flowkit.BernoulliMADE(3, hidden_features=(8,)), binary, steps=1, seed=0, **QUIET)


def test_fit_warns_an_affine_flow_of_positive_columns_spread_over_orders_of_magnitude():
    """Review 42: on 3-D log-normal data (sigma 2) the default affine MAF scored one held-out
    row at 2.65e8 nats (mean 132,707), silently; a lower bound of 0 gave 5.98. Columns that
    bounds= bounds, the spline, and data of moderate spread are not warned of."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(300, 1, generator=g),
                   torch.exp(2.0 * torch.randn(300, 2, generator=g))], 1)
    with pytest.warns(flowkit.train.DataWarning, match=r"'data', columns 1 and 2, hold only "
                      r"positive values whose 99th percentile is [\d.]+ and [\d.]+ times their "
                      r"median: .* lower bound of 0 \('bounds'.*transformer='spline'"):
        fit(flowkit.MAF(3, layers=1, hidden_features=(8,)), x, steps=1, seed=0, **QUIET)
    with pytest.warns(flowkit.train.DataWarning, match=r"column 2, holds only positive") as seen:
        fit(flowkit.MAF(3, layers=1, hidden_features=(8,), bounds=([None, 0, None], [None] * 3)),
            x, steps=1, seed=0, **QUIET)
    assert "column 2, holds only positive" in str(seen[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", flowkit.train.DataWarning)
        fit(flowkit.MAF(3, layers=1, hidden_features=(8,), transformer="spline"), x, steps=1,
            seed=0, **QUIET)
        moderate = torch.exp(0.8 * torch.randn(300, 2, generator=g))  # incomes, say
        fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), moderate, steps=1, seed=0, **QUIET)


def test_fit_warns_about_a_single_row():
    """Once, in the data's terms: set_from_data's own warning (which names its 'batches') is
    filtered."""
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    with pytest.warns(flowkit.train.DataWarning, match=r"'data' has a single row") as caught:
        fit(flow, gaussian(1), steps=1, seed=0, **QUIET)
    assert not [w for w in caught if issubclass(w.category, flowkit.transforms.SingleRowWarning)]


def test_fit_warns_about_a_column_of_few_values():
    """Rounded data: 9 distinct values in 400 rows (at most 5% of the rows) is a warning, 21 is
    not."""
    x = gaussian(400)
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    few = x.clone()
    few[:, 0] = few[:, 0].round().clamp(-4, 4)
    with pytest.warns(flowkit.train.DataWarning,
                      match=r"'data', column 0, takes only \d distinct values in 400 rows"):
        fit(flow, few, steps=1, seed=0, **QUIET)
    enough = x.clone()
    enough[:, 0] = torch.arange(400.0) % 21
    with warnings.catch_warnings():
        warnings.simplefilter("error", flowkit.train.DataWarning)
        fit(flow, enough, steps=1, seed=0, **QUIET)



def _degenerate_warnings(x: torch.Tensor) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flowkit.train.warn_if_degenerate("data", x, stacklevel=2)
    return [str(w.message) for w in caught]


def test_small_discrete_columns_get_the_few_values_warning_not_the_point_mass_one():
    """Review 20: a binary column in 30 rows, Likert 1-5 in 60 and counts in 100 take more
    values than 5% of their rows, and were called a point mass inside a continuous column. Up
    to 10 distinct values (and at most half the rows) is the few-values warning; a small
    continuous column, all of whose values differ, gets none."""
    generator = torch.Generator().manual_seed(0)
    binary = torch.randint(0, 2, (30, 1), generator=generator).double()
    likert = torch.randint(1, 6, (60, 1), generator=generator).double()
    counts = torch.poisson(torch.ones(100, 1), generator=generator).double()
    for x in binary, likert, counts:
        messages = _degenerate_warnings(x)
        assert len(messages) == 1 and "distinct values in" in messages[0], messages
    for n in 6, 12, 30:  # continuous: n distinct values in n rows
        assert _degenerate_warnings(torch.randn(n, 2, generator=generator)) == []

def test_linearly_dependent_columns_are_named_and_independent_ones_are_not():
    """Review 34: columns [a, 2a + 1, z] passed every check, and the NLL fell without bound
    while the flow contracted across the plane they lie on. Exact dependence, in float64 or
    float32 and in any units, is a warning naming the columns (by their labels too); noise of a
    hundredth of a column's spread, a discrete column's dependence (warned as discrete) and data
    with no more rows than columns are not."""
    g = torch.Generator().manual_seed(0)
    a, b, z = (torch.randn(500, 1, generator=g, dtype=torch.float64) for _ in range(3))
    dependent = torch.cat([z, a, 3 * a - 2 * b + 7, b], dim=1)
    assert linearly_dependent(dependent) == [1, 2, 3]
    scaled = (dependent * torch.tensor([1.0, 1e4, 1e-3, 50.0], dtype=torch.float64)
              + torch.tensor([0.0, 1e4, 0.0, 1e2], dtype=torch.float64))
    assert linearly_dependent(scaled.float()) == [1, 2, 3]
    messages = _degenerate_warnings(dependent)
    assert len(messages) == 1 and "'data', columns 1, 2 and 3, are linearly dependent" in (
        messages[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flowkit.train.warn_if_degenerate("X", dependent, stacklevel=2, labels=list("zabc"))
    assert "columns 1 ('a'), 2 ('b') and 3 ('c'), are linearly dependent" in str(caught[0].message)
    noisy = torch.cat([a, 2 * a + 1e-2 * torch.randn(500, 1, generator=g, dtype=torch.float64),
                       z], dim=1)
    assert _degenerate_warnings(noisy) == []
    one_hot = torch.nn.functional.one_hot(torch.arange(500) % 3).double()
    messages = _degenerate_warnings(torch.cat([one_hot, z], dim=1))
    assert messages and all("distinct values" in m for m in messages), messages
    assert _degenerate_warnings(torch.randn(4, 6, generator=g)) == []
    # review 35: two dependences are both named; full-rank but ill-conditioned data (a Hilbert
    # covariance, condition number 1.5e10) is not flagged; a column skipped as made constant
    # by the cast does not shift the columns named
    e = torch.randn(500, 1, generator=g, dtype=torch.float64)
    assert linearly_dependent(torch.cat([a, b, a + b, e, 2 * e], dim=1)) == [0, 1, 2, 3, 4]
    hilbert = 1.0 / (torch.arange(8.0)[:, None] + torch.arange(8.0) + 1).double()
    normal = torch.randn(5000, 8, generator=g, dtype=torch.float64)
    ill = normal @ torch.linalg.cholesky(hilbert).T
    assert _degenerate_warnings(ill.float()) == []
    rounded = torch.cat([1e8 + torch.rand(500, 1, generator=g, dtype=torch.float64), a, b,
                         a + b], dim=1)
    with pytest.warns(flowkit.train.DataWarning, match=r"columns 1, 2 and 3, are linearly"):
        fit(flowkit.MAF(4, layers=1, hidden_features=(8,)), rounded, steps=1, seed=0, **QUIET)
    flow = flowkit.MAF(4, layers=1, hidden_features=(8,))
    with pytest.warns(flowkit.train.DataWarning, match=r"are linearly dependent"):
        fit(flow, dependent.float(), steps=1, seed=0, **QUIET)


def test_fit_warns_about_a_point_mass_inside_a_continuous_column():
    """Zero-inflated data (review 18: half the rows exactly 0, the rest continuous) passed the
    checks of constant and few-valued columns, and the NLL fell without bound. One value in 20%
    of the rows is a warning naming it; in 15%, as in a rounded column, it is not."""
    x = torch.randn(400, 2, generator=torch.Generator().manual_seed(0))
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    inflated = x.clone()
    inflated[:, 1] = inflated[:, 1].clamp_min(0.0)
    with pytest.warns(flowkit.train.DataWarning,
                      match=r"'data', column 1, holds one value in many of the 400 rows "
                            r"\(0 in \d+ rows\)"):
        fit(flow, inflated, steps=1, seed=0, **QUIET)
    some = x.clone()
    some[:60, 1] = 0.0  # 15%
    with warnings.catch_warnings():
        warnings.simplefilter("error", flowkit.train.DataWarning)
        fit(flow, some, steps=1, seed=0, **QUIET)


# ------------------------------------------------------------------ precision of the cast


def test_fit_warns_when_the_cast_rounds_a_column_away():
    """float64 data at 1e4 with a spread of 1e-3: float32 keeps less than one step of it."""
    generator = np.random.default_rng(0)
    x = np.c_[1e4 + generator.normal(0, 1e-3, 300), generator.normal(size=300)]
    options = dict(steps=1, batch_size=100, progress=False, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), x, **options)
    # what the cast left of the column (7 values) is the PrecisionWarning's to tell: no
    # DataWarning says that the user's column takes few values (review 10)
    assert [type(w.message) for w in caught if w.category is not flowkit.train.BaselineWarning
            ] == [flowkit.train.PrecisionWarning]  # (one step does not beat a Gaussian)
    assert re.search(r"'data', column 0, .*torch.float32", str(caught[0].message))
    with pytest.warns(flowkit.train.PrecisionWarning, match="the context of 'data', column 0"):
        conditional = flowkit.MAF(1, layers=1, hidden_features=(8,), context_features=2)
        fit(conditional, (x[:, 1:], x), **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", flowkit.train.PrecisionWarning)
        fit(flowkit.MAF(2, layers=1, hidden_features=(8,)).double(), x, **options)  # no cast
        fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), x - x.mean(0), **options)  # centred


def test_a_sampling_function_that_ignores_n_is_refused():
    """The batch size is what a sampling function is asked for; one that returns another
    number of rows would silently train on other batches."""
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    with pytest.raises(ValueError, match=r"'data', a sampling function, should return 64 rows "
                       r"when asked for n=64, got shape \(7, 2\)"):
        fit(flow, lambda n, g: torch.randn(7, 2, generator=g), steps=3, batch_size=64, **QUIET)


def test_batch_norm_with_batches_of_one_row_is_refused_before_training():
    flow = flowkit.MAF(2, layers=2, hidden_features=(8,), batch_norm=True)
    before = [p.detach().clone() for p in flow.parameters()]
    with pytest.raises(ValueError, match=r"'batch_size' gives batches of one row .*BatchNorm"):
        fit(flow, gaussian(50), steps=6, batch_size=1, **QUIET)
    with pytest.raises(ValueError, match=r"'batch_size' gives batches of one row"):
        fit(flow, lambda n, g: torch.randn(n, 2, generator=g), steps=2, batch_size=1, **QUIET)
    assert all(torch.equal(a, b) for a, b in zip(before, flow.parameters(), strict=True))
    fit(flow, gaussian(50), steps=2, batch_size=2, **QUIET)  # two rows are enough


# ------------------------------------------------------------- what a resumed run checks


def _first_segment(tmp_path, x, **kwargs):
    options = dict(steps=4, batch_size=64, seed=0, lr_schedule=None, checkpoint_dir=tmp_path,
                   **QUIET)
    fit(small_maf(), x, **{"valid": None, **options, **kwargs})
    return {**options, "steps": 8, "resume": True, "valid": kwargs.get("valid")}


def test_resume_refuses_other_data_batch_size_and_optimizer(tmp_path):
    x = gaussian(256)
    options = _first_segment(tmp_path, x)
    with pytest.raises(ArgumentError, match=r"'data' \(256 rows\) is not the data the checkpoint"
                       r" was trained on \(256 rows, other values\)") as e:
        fit(small_maf(), gaussian(256), **options)
    assert e.value.argument == "data"
    with pytest.raises(ArgumentError, match=r"\(200 rows\) is not .* \(256 rows\)"):
        fit(small_maf(), x[:200], **options)
    with pytest.raises(ArgumentError, match="'batch_size' is 32 but the checkpoint was trained "
                       "with batches of 64; pass batch_size=64"):
        fit(small_maf(), x, **{**options, "batch_size": 32})
    with pytest.raises(ArgumentError, match="with the optimizer Adam, not SGD") as e:
        fit(small_maf(), x, **options, optimizer="sgd")
    assert e.value.argument == "optimizer"
    # the same rows in another order are the same data
    h = fit(small_maf(), x.flip(0), **options)
    assert len(h.train_loss) == 8


def test_resume_with_another_validation_split_names_valid(tmp_path):
    """Review 19: it read "'data' (230 rows) is not the data the checkpoint was trained on (256
    rows)", rows the caller never passed."""
    x = gaussian(256)
    options = _first_segment(tmp_path, x)
    with pytest.raises(ArgumentError, match=r"^the checkpoint was trained on all of 'data', this "
                       r"run on 'data' less valid=0.1: other rows train; pass valid=None to "
                       r"resume it$") as e:
        fit(small_maf(), x, **{**options, "valid": 0.1})
    assert e.value.argument == "valid"


def test_resume_with_another_validation_fraction_names_it(tmp_path):
    x = gaussian(320)
    options = _first_segment(tmp_path, x, valid=0.2)
    with pytest.raises(ArgumentError, match=r"trained on 'data' less valid=0.2, this run on "
                       r"'data' less valid=0.25: .* pass valid=0.2 to resume it$"):
        fit(small_maf(), x, **{**options, "valid": 0.25})
    assert len(fit(small_maf(), x, **{**options, "valid": 0.2}).train_loss) == 8


def test_resume_of_a_sampling_function_refuses_another_batch_size(tmp_path):
    def sample(n, generator):
        return torch.randn(n, 2, generator=generator)

    options = _first_segment(tmp_path, sample)
    with pytest.raises(ArgumentError, match="'batch_size' is 32 .* batches of 64"):
        fit(small_maf(), sample, **{**options, "batch_size": 32})
    assert len(fit(small_maf(), sample, **options).train_loss) == 8


def test_resume_of_reverse_kl_refuses_another_batch_size(tmp_path):
    """Review 19: it continued with the other batch size, as fit refuses (the same check)."""
    def target(x):
        return -0.5 * (x**2).sum(-1)

    options = dict(steps=4, batch_size=64, seed=0, checkpoint_dir=tmp_path, **QUIET)
    flowkit.fit_reverse_kl(flowkit.IAF(2, layers=1, hidden_features=(8,)), target, **options)
    resumed = {**options, "steps": 6, "resume": True}
    with pytest.raises(ArgumentError, match="'batch_size' is 32 but the checkpoint was trained "
                       "with batches of 64; pass batch_size=64") as e:
        flowkit.fit_reverse_kl(flowkit.IAF(2, layers=1, hidden_features=(8,)), target,
                               **{**resumed, "batch_size": 32})
    assert e.value.argument == "batch_size"
    h = flowkit.fit_reverse_kl(flowkit.IAF(2, layers=1, hidden_features=(8,)), target, **resumed)
    assert len(h.train_loss) == 6


def test_resume_with_fewer_steps_than_done_is_refused(tmp_path):
    """Review 19: it returned the longer run without a word."""
    x = gaussian(256)
    options = _first_segment(tmp_path, x)
    with pytest.raises(ArgumentError, match=r"^'steps' is 2 but '.*checkpoint.pt' has done 4 "
                       r"steps already: .* pass 'steps' of at least 4") as e:
        fit(small_maf(), x, **{**options, "steps": 2})
    assert e.value.argument == "steps"
    assert len(fit(small_maf(), x, **{**options, "steps": 4}).train_loss) == 4


def test_extending_a_run_that_restored_its_best_weights_continues_from_its_last(tmp_path):
    x, xv = gaussian(60), gaussian(500)
    options = dict(valid=xv, batch_size=60, lr=3e-2, lr_schedule=None, seed=0, valid_every=5,
                   **QUIET)
    torch.manual_seed(1)
    whole = small_maf()
    start = weights(whole)
    fit(whole, x, steps=60, restore_best=False, **options)
    parts = small_maf()
    parts.load_state_dict(start)
    h = fit(parts, x, steps=30, checkpoint_dir=tmp_path, **options)  # restores its best
    assert h.best_step < 30  # so the returned and the last weights differ
    saved = load_model(tmp_path / "checkpoint.pt")
    assert_same_weights(weights(saved), weights(parts))  # the file's model is the returned one
    parts = small_maf()
    fit(parts, x, steps=60, checkpoint_dir=tmp_path, resume=True, restore_best=False, **options)
    assert_same_weights(weights(parts), weights(whole))


def test_fit_without_a_seed_follows_torch_manual_seed():
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        flow = small_maf()
        h = fit(flow, gaussian(256), steps=3, batch_size=64, **QUIET)
        runs.append((h.seed, h.train_loss, torch.rand(2)))
    assert runs[0][0] == runs[1][0] and runs[0][1] == runs[1][1]
    assert torch.equal(runs[0][2], runs[1][2])


def test_an_empty_dataloader_is_refused_with_epochs_too():
    empty = DataLoader(TensorDataset(torch.zeros(0, 2)), batch_size=16)
    with pytest.raises(ValueError, match="yields no batches"):
        fit(small_maf(), empty, epochs=3, **QUIET)


def test_a_context_for_a_model_whose_log_prob_takes_none_is_named():
    class Gaussian(nn.Module):
        def __init__(self):
            super().__init__()
            self.loc = nn.Parameter(torch.zeros(2))

        def log_prob(self, x):
            return torch.distributions.Normal(self.loc, 1.0).log_prob(x).sum(-1)

    with pytest.raises(ValueError, match="'data' carries a context but Gaussian.log_prob takes "
                       "no 'context' argument"):
        fit(Gaussian(), (torch.zeros(32, 2), torch.zeros(32, 1)), steps=2, **QUIET)


def test_a_dataloader_ending_with_one_row_is_refused_for_batch_norm_before_training():
    flow = flowkit.MAF(2, hidden_features=(8,), layers=2, batch_norm=True)
    before = weights(flow)
    loader = DataLoader(TensorDataset(torch.randn(129, 2)), batch_size=64)
    with pytest.raises(ArgumentError, match=r"ends every epoch with a batch of one row \(129 rows"
                       r" in batches of 64\).*drop_last=True") as e:
        fit(flow, loader, steps=5, **QUIET)
    assert e.value.argument == "data"
    assert_same_weights(weights(flow), before)
    loader = DataLoader(TensorDataset(torch.randn(129, 2)), batch_size=64, drop_last=True)
    assert len(fit(flow, loader, steps=5, **QUIET).train_loss) == 5


class _Spikes(_RisingLoss):
    """A Gaussian whose training loss jumps by ``jump`` at the steps in ``at`` only: isolated
    batches far off, as heavy-tailed data gives now and then."""

    def jumps(self, call: int) -> bool:
        return call in self.at


def test_isolated_far_off_batches_are_not_a_divergence():
    """Single batch losses of 10^4 nats (a few rows of heavy-tailed data), two of them in a
    row, do not stop a run that goes on as before; the running median ignores them."""
    h = fit(_Spikes({4, 15, 16, 40}, 1e4), gaussian, steps=60, batch_size=64, seed=0, **QUIET)
    assert len(h.train_loss) == 60 and max(h.train_loss) > 1e4



def test_divergence_benchmark_reports_fits_statistic():
    """benchmarks/divergence.py (quoted in docs/training.md) computes the statistic that fit
    checks: the rise of the median of the last 11 losses above its lowest value so far, in
    units of max(1, |lowest|). One far-off batch does not move it; a sustained rise does."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "divergence.py"
    spec = importlib.util.spec_from_file_location("divergence_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.excursion([2.0] * 5 + [1e4] + [2.0] * 5) == 0.0
    assert module.excursion([2.0] * 11 + [8.0] * 11) == pytest.approx(3.0)  # (8 - 2) / 2

def test_a_run_that_fails_at_once_keeps_its_standardization_and_says_no_more_to_standardize():
    """The weights given back after a failure at the first recording are those after fit set the
    standardization (they were those before it: an unset Standardize); the message does not tell
    a flow that standardizes its data to standardize it."""
    flow = small_maf()
    x = gaussian(1000) * 5.0 + 100.0
    with pytest.raises(DivergenceError) as info:
        fit(flow, x, valid=None, steps=200, batch_size=64, lr=10.0, seed=0, **QUIET)
    standardize = flow.transform.transforms[0]
    assert bool(standardize.initialized)
    torch.testing.assert_close(standardize.shift, x.mean(0))
    assert "standardise the data" not in str(info.value)


def test_validation_scores_the_model_in_evaluation_mode():
    """A BatchNorm flow's validation loss is its evaluation-mode NLL (running averages, which
    validation leaves alone), not the NLL under the validation batch's own statistics."""
    torch.manual_seed(0)
    flow = flowkit.MAF(2, layers=3, hidden_features=(8,), batch_norm=True, standardize=False)
    x, v = 3 * torch.randn(512, 2) + 1, 3 * torch.randn(128, 2) + 1
    h = fit(flow, x, valid=v, steps=30, batch_size=64, restore_best=False, progress=False,
            seed=0)
    assert not flow.training
    with torch.no_grad():
        eval_nll = -flow.log_prob(v).mean().item()
        flow.train()
        batch_nll = -flow.log_prob(v).mean().item()  # batch statistics (moves the averages)
    assert h.valid_loss[-1] == pytest.approx(eval_nll, rel=1e-6)
    assert abs(batch_nll - eval_nll) > 1e-3  # the two modes differ: the check above can fail


def test_clip_grad_norm_bounds_the_step():
    """With SGD at lr 1, one step moves the parameters by the clipped gradient: a global norm
    of at most clip_grad_norm (and by more without the clip)."""
    x = 50 * torch.randn(256, 2)

    def moved(clip: float | None) -> float:
        torch.manual_seed(0)
        flow = flowkit.MAF(2, layers=2, hidden_features=(8,), standardize=False)
        before = [p.detach().clone() for p in flow.parameters()]
        fit(flow, x, valid=None, steps=1, batch_size=256, optimizer="sgd", lr=1.0,
            lr_schedule=None, clip_grad_norm=clip, progress=False, seed=0)
        return torch.cat([(p.detach() - b).flatten()
                          for p, b in zip(flow.parameters(), before, strict=True)]).norm().item()

    assert moved(None) > 1.0
    assert moved(1e-3) == pytest.approx(1e-3, rel=1e-4)


@pytest.mark.parametrize(
    "detach", [lambda x: x.detach(), lambda x: torch.from_numpy(x.detach().numpy())],
    ids=["detach", "numpy"],
)
def test_reverse_kl_refuses_a_target_without_gradients(detach):
    """A target computed off the autograd graph would train nothing (silently at first, then a
    DivergenceError blaming the learning rate): refused before the first step."""
    def target(x):
        return -0.5 * (detach(x) ** 2).sum(-1)

    with pytest.raises(ValueError, match="'target_log_density' returned log-densities that do not "
                                         "depend on its input through autograd"):
        fit_reverse_kl(flowkit.IAF(2, hidden_features=(8,)), target, steps=5, **QUIET)


def test_reverse_kl_warns_when_a_spline_interval_holds_the_samples():
    """In reverse KL the spline's interval is in the target's units: a target centred at 10
    (outside [-5, 5]) piles the samples at the edge, which the ELBO alone would not reveal."""
    def far(x):
        return -0.5 * ((x - 10.0) ** 2).sum(-1)

    def near(x):
        return -0.5 * ((x - 1.0) ** 2).sum(-1)

    def fit_to(target):
        flow = flowkit.IAF(2, layers=2, hidden_features=(16,), transformer="spline")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit_reverse_kl(flow, target, steps=150, seed=0, **QUIET)
        return [str(w.message) for w in caught]

    assert any("reach the edge of a spline layer's interval" in m for m in fit_to(far))
    assert not any("spline layer" in m for m in fit_to(near))


def test_repeated_rows_warn_and_valid_fraction_holds_out_whole_groups(monkeypatch):
    """A table appended to itself: every held-out row had a copy among the training rows, so
    validation never saw a new row and early stopping kept an overfitted flow (review 22: test
    NLL 160 with a validation NLL of 4.4). Now a DataWarning names the repeats, and
    valid=<fraction> holds out whole groups of equal rows, each that fits in the fraction (a
    large group stays with the training rows, review 24)."""
    from flowkit.train import likelihood
    from flowkit.train.arrays import equal_row_groups

    splits = []
    hold_out = likelihood._hold_out
    monkeypatch.setattr(likelihood, "_hold_out",
                        lambda *a, **k: splits.append(hold_out(*a, **k)) or splits[-1])
    g = torch.Generator().manual_seed(0)
    unique = torch.randn(300, 2, generator=g)
    x = torch.cat([unique, unique[:150]])  # 150 of 450 rows repeat an earlier one
    with pytest.warns(flowkit.train.DataWarning, match=r"'data' has 150 rows that repeat an "
                      r"earlier row \(150 of 450; 300 distinct\).*drop the duplicates"):
        history = fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), x, valid=0.2, steps=2,
                      seed=3, **QUIET)
    (train, _), (held, _) = splits[-1]
    assert len(held) == 90 and len(train) == 360 == history.train_rows
    train_rows = {tuple(r) for r in train.tolist()}
    assert not any(tuple(r) in train_rows for r in held.tolist())  # no copy on both sides
    point_mass = torch.cat([torch.zeros(60, 2), torch.randn(40, 2, generator=g)])
    fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), point_mass, valid=0.1, steps=1,
        data_warnings=False, **QUIET)
    (train, _), (held, _) = splits[-1]
    assert len(held) == 10 and (held != 0).any(1).all()  # the 60 copies stay to train on
    from flowkit.train.arrays import split_rows

    groups = torch.tensor([0] * 90 + [1] * 5 + [2] * 5)  # no group fits in 4 rows
    for seed in range(3):
        order = torch.randperm(100, generator=torch.Generator().manual_seed(seed))
        kept, held = split_rows(order, 4, groups)
        assert len(held) == 5 and len(kept) == 95  # the smallest group, not the 90 (review 27)
    assert equal_row_groups(unique) is None  # distinct rows: the split of before
    with warnings.catch_warnings():
        warnings.simplefilter("error", flowkit.train.DataWarning)
        fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), torch.cat([unique, unique[:10]]),
            steps=1, **QUIET)  # 10 of 310 (3%): below DUPLICATE_ROWS, no warning
        fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), x, steps=1, data_warnings=False,
            **QUIET)  # the caller checked the rows
    with pytest.raises(ArgumentError, match=r"'data_warnings' should be True or False"):
        fit(flowkit.MAF(2), x, steps=1, data_warnings="no", **QUIET)


def test_a_data_warning_is_shown_once_for_fits_in_a_loop(tmp_path):
    """Python shows a warning from one line once, unless the warning filters change between
    the calls: fit's own catch_warnings (around setting the standardization) made every fit in
    a loop, or in a grid search, print the same DataWarning again (review 22)."""
    script = tmp_path / "loop.py"
    script.write_text(
        "import numpy as np, flowkit\n"
        "x = np.random.default_rng(0).normal(size=(300, 2)); x[:, 1] = np.round(x[:, 1])\n"
        "flowkit.fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), x, steps=1, progress=False)\n"
        "for lr in (1e-3, 3e-3, 1e-2):\n"
        "    flowkit.fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), x, steps=1, lr=lr,\n"
        "                progress=False)\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    # the first fit imports modules that reset the registry once; the loop's three fits, none
    assert result.stderr.count("DataWarning: 'data', column 1, takes only") <= 2  # 4 before


def test_values_beyond_float32_are_named_as_such_not_as_nan():
    """A finite float64 column up to 2e40 became Inf in the cast to a float32 model, and fit
    said the data held NaN or Inf (review 22)."""
    x = np.random.default_rng(0).normal(size=(50, 2))
    x[7, 1] = 2e40
    with pytest.raises(ValueError, match=r"'data' has values beyond the range of torch.float32, "
                       r"the model's dtype \(first at row 7, column 1\)"):
        fit(flowkit.MAF(2), x, steps=1, **QUIET)
    c = np.ones((50, 1))
    c[3, 0] = np.nan
    with pytest.raises(ValueError, match=r"the context of 'data' holds NaN or Inf values \(first "
                       r"at row 3, column 0\)"):
        fit(flowkit.MAF(2, context_features=1), (x[:, :2] * 0, c), steps=1, **QUIET)
    with pytest.raises(ValueError, match=r"'data' should have shape \(N, features\), got \(50,\); "
                       r"one feature per row is x.reshape\(-1, 1\)"):
        fit(flowkit.MAF(1, transformer="spline"), x[:, 0], steps=1, **QUIET)


def test_progress_bar_refreshes_rarely_in_a_log_file(monkeypatch):
    """tqdm writes ten updates a second; into a log file that is 3.6 MB an hour (review 22)."""
    from flowkit.train import loop

    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.setattr(loop.sys, "stderr", Stream(False))
    assert loop.refresh_interval() == loop.LOG_REFRESH_S == 10.0
    monkeypatch.setattr(loop.sys, "stderr", Stream(True))
    assert loop.refresh_interval() == 0.1


@pytest.mark.parametrize("valid", ["auto", None])
def test_data_that_require_grad_are_taken_as_values(valid):
    """Review 57: a graph of the data failed the second backward, and a leaf had the loss's
    gradient written into its .grad."""
    leaf = torch.randn(200, 2, requires_grad=True)
    for x in (leaf, leaf * 2.0):
        fit(small_maf(), x, steps=2, valid=valid, **QUIET)
    assert leaf.grad is None


def test_gaussian_baseline_is_the_exact_gaussian_and_its_conditional():
    """flowkit.train.baseline.gaussian_nll against torch's MultivariateNormal: the maximum-
    likelihood Gaussian of the training rows, and of x given the context the joint's
    conditional (a linear regression with Gaussian noise)."""
    from torch.distributions import MultivariateNormal

    from flowkit.train.baseline import gaussian_nll

    g = torch.Generator().manual_seed(0)
    joint = torch.randn(500, 3, generator=g, dtype=torch.float64) @ torch.tensor(
        [[1.0, 0.5, 0.2], [0.0, 1.0, -0.3], [0.0, 0.0, 2.0]], dtype=torch.float64)
    train, valid = joint[:400], joint[400:]
    mean, cov = train.mean(0), torch.cov(train.T, correction=0)
    full = MultivariateNormal(mean, cov)
    expected = -full.log_prob(valid).mean()
    assert math.isclose(gaussian_nll((train, None), (valid, None)), float(expected), rel_tol=1e-9)
    # x = the first two columns, the context the third: -log p(x, c) + log p(c)
    marginal = MultivariateNormal(mean[2:], cov[2:, 2:])
    expected = -(full.log_prob(valid) - marginal.log_prob(valid[:, 2:])).mean()
    got = gaussian_nll((train[:, :2], train[:, 2:]), (valid[:, :2], valid[:, 2:]))
    assert math.isclose(got, float(expected), rel_tol=1e-9)
    assert gaussian_nll((train[:2], None), (valid, None)) is None  # fewer rows than columns


def test_fit_says_when_a_gaussian_beats_the_flow_it_returns():
    """Nearly collinear columns (review 54: 5 nats per row behind a Gaussian, silently) and
    a run far too short: a BaselineWarning with both numbers; a flow that beats the Gaussian
    (the moons) gets none."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1000, 1, generator=g)
    x = torch.cat([a, 2 * a + 1 + 1e-3 * torch.randn(1000, 1, generator=g)], 1)
    with pytest.warns(flowkit.train.BaselineWarning,
                      match=r"best validation loss, -?[\d.]+ nats per row, is worse than that of "
                            r"a full-covariance Gaussian .* -?[\d.]+, on the same 100"):
        fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), x, steps=20, seed=0, **QUIET)
    moons = flowkit.data.sample_toy("moons", 1000, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", flowkit.train.BaselineWarning)
        fit(flowkit.MAF(2, transformer="spline"), moons, steps=300, seed=0, **QUIET)


def test_a_checkpoint_of_a_model_without_config_resumes_only_into_its_class(tmp_path):
    """Review 57: a model without a config (any module with log_prob) resumed into another
    class of the same weight shapes, silently."""

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.mu = nn.Parameter(torch.zeros(2))

        def log_prob(self, x):
            return -((x - self.mu) ** 2).sum(-1)

    class Other(Plain):
        def log_prob(self, x):
            return -((x + self.mu) ** 2).sum(-1)

    x = torch.randn(64, 2)
    options = dict(lr_schedule=None, valid=None, checkpoint_dir=tmp_path / "run", **QUIET)
    fit(Plain(), x, steps=3, **options)
    with pytest.raises(flowkit.checkpoint.CheckpointError,
                       match=r"written for a .*Plain, not for this .*Other"):
        fit(Other(), x, steps=6, resume=True, **options)
    assert fit(Plain(), x, steps=6, resume=True, **options).train_loss


def test_fit_names_a_column_whose_few_gross_outliers_set_its_scale():
    """Review 54: two rows at 10^6 among 2400 of unit spread left the bulk in a sliver of the
    standardization, silently; heavy tails (Cauchy: ratios up to ~400) and the robust or
    bounded flows get no warning."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2400, 2, generator=g, dtype=torch.float64)
    x[[5, 700], 1] = torch.tensor([1e6, -2e6], dtype=torch.float64)
    with pytest.warns(flowkit.train.DataWarning,
                      match=r"'data', column 1, has a standard deviation [\d.e+]+ times its "
                            r"interquartile range / 1.349 \(most extreme: row 700: -2e\+06\).*"
                            r"standardize='robust'"):
        fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), x, steps=1, seed=0, **QUIET)
    cauchy = torch.cat([torch.distributions.Cauchy(0.0, 1.0).sample((4000, 1)),
                        torch.randn(4000, 1)], 1)
    for model, data in ((flowkit.MAF(2, layers=1, hidden_features=(8,), standardize="robust"),
                         x),
                        (flowkit.MAF(2, layers=1, hidden_features=(8,),
                                     bounds=([None, -3e6], [None, 3e6])), x),
                        (flowkit.MAF(2, layers=1, hidden_features=(8,)), cauchy)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit(model, data, steps=1, seed=0, **QUIET)
        assert not [w for w in caught if "interquartile" in str(w.message)]
