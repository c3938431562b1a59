"""How `fit` builds its optimizer (flowkit.train.options.make_optimizer), and what a resumed run
must share with its checkpoint: the schedule, the model."""

import re

import numpy as np
import pytest
import torch

import flowkit
from flowkit.train.options import make_optimizer
from flowkit.validation import ArgumentError, check_int


@pytest.mark.parametrize("name", ["adam", "adamw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adam_is_fused_and_steps_as_the_loop_does(name: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(7, 5, dtype=dtype)) for _ in range(2)]
    looped = [torch.nn.Parameter(w.detach().clone()) for w in weights]
    fused = make_optimizer(name, weights, 1e-2)
    reference = type(fused)(looped, lr=1e-2)
    assert fused.defaults["fused"] is True
    for _ in range(5):
        for w, v in zip(weights, looped, strict=True):
            w.grad = torch.sin(w.detach() * 3)
            v.grad = torch.sin(v.detach() * 3)
        fused.step()
        reference.step()
    for w, v in zip(weights, looped, strict=True):
        torch.testing.assert_close(w, v)


def test_sgd_and_callables_are_left_as_given() -> None:
    weight = [torch.nn.Parameter(torch.zeros(3))]
    assert not make_optimizer("sgd", weight, 0.1).defaults.get("fused")
    built = make_optimizer(lambda p, lr: torch.optim.Adam(p, lr=lr), weight, 0.1)
    assert not built.defaults["fused"]


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_weight_decay_reaches_the_named_optimizer(name: str) -> None:
    weight = [torch.nn.Parameter(torch.ones(3))]
    opt = make_optimizer(name, weight, 0.1, weight_decay=0.5)
    assert opt.defaults["weight_decay"] == 0.5
    weight[0].grad = torch.zeros(3)
    opt.step()  # a zero gradient: only the decay moves the weights, towards zero
    assert (weight[0] < 1).all()


def _interrupted_run(folder, lr_schedule) -> None:
    """Four steps of a small MAF with ``lr_schedule``, checkpointed in ``folder``."""
    flowkit.fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), torch.randn(64, 2), steps=4,
                batch_size=32, lr_schedule=lr_schedule, seed=0, checkpoint_dir=folder,
                checkpoint_every=2, progress=False)


@pytest.mark.parametrize(
    ("written", "resumed", "message"),
    [
        (None, "cosine", "lr_schedule=None, not lr_schedule='cosine'; pass lr_schedule=None"),
        ("cosine", None, "lr_schedule='cosine', not lr_schedule=None; pass lr_schedule='cosine'"),
        ("cosine", "linear", "lr_schedule='cosine', not lr_schedule='linear'"),
    ],
)
def test_resuming_with_another_lr_schedule_is_refused(tmp_path, written, resumed, message):
    _interrupted_run(tmp_path, written)
    with pytest.raises(ArgumentError, match=re.escape(message)) as info:
        flowkit.fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), torch.randn(64, 2), steps=4,
                    batch_size=32, lr_schedule=resumed, checkpoint_dir=tmp_path, resume=True,
                    progress=False)
    assert info.value.argument == "lr_schedule"
    assert "was written by a run with" in str(info.value)


def test_steps_hint_names_the_runs_that_can_be_extended(tmp_path):
    _interrupted_run(tmp_path, "cosine")
    with pytest.raises(ValueError, match=re.escape(
            "(runs with no schedule, lr_schedule=None, can be extended)")):
        flowkit.fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), torch.randn(64, 2), steps=8,
                    batch_size=32, lr_schedule="cosine", checkpoint_dir=tmp_path, resume=True,
                    progress=False)


def test_model_mismatch_names_only_the_arguments_that_differ(tmp_path):
    _interrupted_run(tmp_path, None)
    with pytest.raises(flowkit.CheckpointError) as info:
        flowkit.fit(flowkit.MAF(2, layers=1, hidden_features=(8,), activation="tanh"),
                    torch.randn(64, 2), steps=4, batch_size=32, lr_schedule=None,
                    checkpoint_dir=tmp_path, resume=True, progress=False)
    message = str(info.value)
    assert ("was written for a MAF with {'activation': 'ReLU'}, not for this MAF with "
            "{'activation': 'Tanh'}") in message
    assert "layers" not in message and "hidden_features" not in message


def test_a_schedule_callable_that_returns_no_scheduler_is_refused() -> None:
    """Review 19: a schedule function that forgot its ``return`` trained at a constant rate.
    Review 20: a ReduceLROnPlateau passed the check and failed at step 1."""
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,))
    before = {k: v.clone() for k, v in flow.state_dict().items()}
    with pytest.raises(TypeError, match=r"^'lr_schedule' returned NoneType, expected a torch "
                       "LRScheduler"):
        flowkit.fit(flow, torch.randn(64, 2), steps=2, batch_size=32,
                    lr_schedule=lambda opt, steps: None, progress=False, device="cpu")
    assert all(torch.equal(v, flow.state_dict()[k]) for k, v in before.items())
    plateau = lambda opt, steps: torch.optim.lr_scheduler.ReduceLROnPlateau(opt)  # noqa: E731
    with pytest.raises(TypeError, match=r"^'lr_schedule' returned ReduceLROnPlateau, which steps "
                       r"on a validation metric .* but fit steps the schedule once per optimizer "
                       r"step without one"):  # review 20: it failed at step 1 (step() needs it)
        flowkit.fit(flow, torch.randn(64, 2), steps=2, batch_size=32, lr_schedule=plateau,
                    progress=False, device="cpu")
    assert all(torch.equal(v, flow.state_dict()[k]) for k, v in before.items())
    schedule = lambda opt, steps: torch.optim.lr_scheduler.LinearLR(opt, total_iters=steps)  # noqa: E731
    h = flowkit.fit(flow, torch.randn(64, 2), steps=2, batch_size=32, lr_schedule=schedule,
                    progress=False, device="cpu")
    assert len(h.train_loss) == 2


def test_numpy_scalar_options_checkpoint_and_resume(tmp_path) -> None:
    """Review 20: batch_size=np.int64(64) trained, then failed at the first checkpoint (the
    numpy integer was stored in it). Every numeric option comes back from its check as a Python
    int or float."""
    x = torch.randn(512, 2, generator=torch.Generator().manual_seed(0))
    options = dict(
        batch_size=np.int64(64), valid=np.float64(0.125), valid_every=np.int32(2),
        early_stopping_patience=np.int64(50), lr=np.float32(1e-3),
        clip_grad_norm=np.float64(1.0), divergence_threshold=np.float64(10.0),
        weight_decay=np.float64(0.0), seed=np.uint8(3), checkpoint_every=np.int64(3),
        log_every=np.int16(2), lr_schedule=None, checkpoint_dir=tmp_path, progress=False,
        device="cpu",
    )
    first = flowkit.fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), x, steps=np.int64(3),
                        **options)
    resumed = flowkit.fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), x,
                          steps=np.int64(6), resume=True, **options)
    assert resumed.train_loss[:3] == first.train_loss and len(resumed.train_loss) == 6
    by_epochs = flowkit.fit(flowkit.MAF(2, layers=1, hidden_features=(8,)), x,
                            valid=None, epochs=np.int64(1), batch_size=np.int64(64),
                            progress=False,
                            checkpoint_dir=tmp_path / "epochs", device="cpu")
    assert len(by_epochs.train_loss) == 8


@pytest.mark.parametrize("value", [np.int64(5), np.uint8(5), np.int32(5), 5])
def test_check_int_returns_a_python_int(value) -> None:
    checked = check_int("n", value, minimum=1)
    assert type(checked) is int and checked == 5
