"""The training engine shared by :func:`flowkit.train.fit` and
:func:`flowkit.train.fit_reverse_kl`: set-up, optimizer and schedule, validation bookkeeping,
checkpoints, resume and progress. Internal; the public API is in :mod:`flowkit.train`.

Implementation notes:

* **No per-step host synchronisation.** Each step's loss stays on the device in a list; it is
  copied to the host (one ``.tolist()``, averaged over processes) only every ``log_every`` steps,
  at validations and at checkpoints. Non-finite losses are detected at those points; the error
  names the first bad step. A checkpoint is only written after the losses since the previous
  one were checked and the weights and floating buffers were found finite (a step with a finite
  loss but an infinite gradient makes Adam write NaN weights; one host copy per checkpoint tells),
  so the last checkpoint on disk is always a good one.
* **Denormals.** On the CPU, :func:`session` calls ``torch.set_flush_denormal(True)`` (and sets it
  back to ``False`` on exit). A weight that the current MADE mask hides gets a zero gradient. If it
  had gradients before (another mask set in order- or connectivity-agnostic training), Adam's first
  moment for it decays by ``beta1 = 0.9`` per step and enters the subnormal range (below
  ``1.2e-38`` in float32) within several hundred steps; weight decay shrinks hidden weights the
  same way. On many x86 CPUs arithmetic on subnormals takes a slow microcode path (the project's
  reference MADE trained 2.5x slower). Flushing them to zero changes nothing that matters: these
  values only ever meet zero masks.
* **Resume.** A checkpoint holds everything the next step depends on: weights, optimizer and
  scheduler state, the step, every process's random state (torch CPU and GPU, numpy's global
  generator) and data position, the history and the early-stopping state. Restoring all of it
  makes a resumed run bit-for-bit equal to an uninterrupted one on the same hardware.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler
from tqdm.auto import tqdm

from ..checkpoint import (
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    run_lock,
    save_checkpoint,
)
from ..checkpoint.models import model_entry
from ..validation import validate_values
from .data import derive_seed
from .distributed import Dist, resolve_device, setup
from .history import History

CHECKPOINT_NAME = "checkpoint.pt"
"""File name of the training checkpoint inside ``checkpoint_dir``."""

TRAINING_KIND = "training"
"""The ``kind`` of training checkpoints (see :func:`flowkit.checkpoint.save_checkpoint`)."""

_REQUIRED_KEYS = (
    "optimizer",
    "scheduler",
    "step",
    "total_steps",
    "seed",
    "lr",
    "world_size",
    "processes",
    "history",
    "best",
)
"""The ``extra`` entries of a training checkpoint that resuming reads (``save`` in :func:`train`
writes them, with the model)."""

_OPTIMIZERS: dict[str, type[Optimizer]] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
}


class NonFiniteLossError(FloatingPointError):
    """The training loss, or the weights about to be checkpointed, became NaN or infinite.

    Attributes:
        step: the first step (1-based) whose loss was not finite, or the step of the checkpoint
            at which non-finite weights were found.
        value: that loss, or the first non-finite value of those weights.
    """

    def __init__(self, message: str, step: int, value: float):
        super().__init__(message)
        self.step, self.value = step, value


@dataclass
class Session:
    device: torch.device
    dist: Dist
    path: Path | None
    ckpt: dict[str, Any] | None  # the ``extra`` entries of the checkpoint resumed from
    seed: int
    objective: str  # "nll" or "neg_elbo", the History.objective of the run


@dataclass
class Options:
    steps: int
    lr: float
    optimizer: str | Callable[..., Optimizer]
    lr_schedule: str | Callable[[Optimizer, int], LRScheduler] | None
    clip_grad_norm: float | None
    valid_every: int | None
    patience: int | None
    restore_best: bool
    checkpoint_every: int
    progress: bool
    log_every: int


@contextmanager
def session(
    model: nn.Module,
    device: str | torch.device,
    seed: int | None,
    checkpoint_dir: str | PathLike | None,
    resume: bool,
    objective: str,
) -> Iterator[Session]:
    """Resolve the device, join ``torchrun``'s group, take the checkpoint folder's lock (held
    until the session ends), read and restore the checkpoint to resume from, seed."""
    dev = resolve_device(device)
    dist = setup(dev)
    path = _checkpoint_path(checkpoint_dir)
    if resume and path is None:
        raise ValueError("'resume=True' needs 'checkpoint_dir'")
    flushing = dev.type == "cpu" and torch.set_flush_denormal(True)
    try:
        with _folder_lock(path, dist):
            # rank 0 decides, so all ranks agree
            exists = path is not None and dist.broadcast(path.is_file())
            if exists and not resume:
                raise ValueError(
                    f"'{path}' exists: pass resume=True to continue that run, or pick another "
                    "checkpoint_dir"
                )
            ckpt = None
            if exists:
                loaded = load_checkpoint(path, kind=TRAINING_KIND, map_location="cpu")
                _check_resumable(loaded, model, dist, objective)
                ckpt = loaded.extra
            if path is not None:
                model_entry(model)  # a malformed model.config fails now, not at a checkpoint
            model.to(dev)
            yield Session(dev, dist, path, ckpt, _choose_seed(seed, ckpt, path, dist), objective)
    finally:
        if flushing:
            torch.set_flush_denormal(False)


def _checkpoint_path(checkpoint_dir: object) -> Path | None:
    """``checkpoint_dir / CHECKPOINT_NAME``, checked before anything runs: a folder (or a path to
    create one at), and no folder where the checkpoint file goes."""
    if checkpoint_dir is None:
        return None
    if not isinstance(checkpoint_dir, str | PathLike):
        raise TypeError(
            "'checkpoint_dir' should be a folder path (str or os.PathLike), got "
            f"{type(checkpoint_dir).__name__} {checkpoint_dir!r}"
        )
    folder = Path(checkpoint_dir)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"'checkpoint_dir' should be a folder, but '{folder}' is a file")
    if (folder / CHECKPOINT_NAME).is_dir():
        raise ValueError(
            f"'{folder / CHECKPOINT_NAME}' is a folder, where 'checkpoint_dir' should hold the "
            "checkpoint file"
        )
    return folder / CHECKPOINT_NAME


@contextmanager
def _folder_lock(path: Path | None, dist: Dist) -> Iterator[None]:
    """Hold the lock of the checkpoint's folder (:func:`flowkit.checkpoint.run_lock`) on rank 0,
    the process that writes; every rank fails if it cannot be taken."""
    with ExitStack() as stack:
        error = None
        if path is not None and dist.is_main:
            try:
                stack.enter_context(run_lock(path.parent))
            except (CheckpointError, OSError) as e:
                error = e
        message = dist.broadcast(None if error is None else str(error))
        if error is not None:
            raise error
        if message is not None:
            raise CheckpointError(f"rank 0 could not take the checkpoint folder: {message}")
        yield


def _check_resumable(ckpt: Checkpoint, model: nn.Module, dist: Dist, objective: str) -> None:
    """Refuse a checkpoint that this run cannot continue, and restore its weights into ``model``
    with every check of :func:`flowkit.load_model` (:meth:`Checkpoint.restore`)."""
    path, extra = ckpt.path, ckpt.extra
    missing = ["model"] if ckpt.model is None else []
    missing += [key for key in _REQUIRED_KEYS if key not in extra]
    if missing:
        raise CheckpointError(
            f"'{path}' is a flowkit training checkpoint without the entries {missing} (written "
            "by another program, or edited): it cannot be resumed"
        )
    stored, current = ckpt.model.get("config"), model_entry(model)["config"]
    if stored is not None and current is not None and stored != current:
        raise CheckpointError(
            f"'{path}' was written for a {stored['type']} with {stored['kwargs']}, not for this "
            f"{current['type']} with {current['kwargs']}: resume with the model it was written for"
        )
    if extra["history"]["objective"] != objective:
        raise CheckpointError(
            f"'{path}' was written by a run minimising {extra['history']['objective']!r}, "
            f"cannot resume it as {objective!r}"
        )
    if extra["world_size"] != dist.world_size:
        raise CheckpointError(
            f"'{path}' was written by {extra['world_size']} process(es); resume it with the same "
            f"number (this run has {dist.world_size})"
        )
    ckpt.restore(model)


def _choose_seed(
    seed: int | None, ckpt: dict[str, Any] | None, path: Path | None, dist: Dist
) -> int:
    if ckpt is not None:
        if seed is not None and seed != ckpt["seed"]:
            raise ValueError(
                f"'seed' is {seed} but '{path}' was written with seed {ckpt['seed']}; pass "
                f"seed={ckpt['seed']} or seed=None to resume it"
            )
        return ckpt["seed"]
    seed = dist.broadcast(secrets.randbits(63) if seed is None else seed)
    torch.manual_seed(derive_seed(seed, dist.rank))  # dropout, model sampling: per process
    return seed


def check_positive(**values: int | None) -> None:
    for name, v in values.items():
        if v is not None and (not isinstance(v, int) or v <= 0):
            raise ValueError(f"'{name}' should be a positive integer, got {v!r}")


def _make_optimizer(
    spec: str | Callable[..., Optimizer], params: list[Tensor], lr: float
) -> Optimizer:
    if isinstance(spec, str):
        if spec.lower() not in _OPTIMIZERS:
            raise ValueError(
                f"'optimizer' should be one of {sorted(_OPTIMIZERS)} or a callable, got {spec!r}"
            )
        return _OPTIMIZERS[spec.lower()](params, lr=lr)
    opt = spec(params, lr=lr)
    if not isinstance(opt, Optimizer):
        raise TypeError(f"'optimizer' returned {type(opt).__name__}, expected a torch Optimizer")
    return opt


def _make_schedule(
    spec: str | Callable[[Optimizer, int], LRScheduler] | None, opt: Optimizer, steps: int
) -> LRScheduler | None:
    if spec is None:
        return None
    if spec == "cosine":
        return CosineAnnealingLR(opt, T_max=steps)
    if spec == "linear":
        return LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=steps)
    if isinstance(spec, str):
        raise ValueError(
            f"'lr_schedule' should be None, 'cosine', 'linear' or a callable, got {spec!r}"
        )
    return spec(opt, steps)


class _Best:
    """Best validation loss so far, its weights (when ``keep`` is set) and patience count."""

    def __init__(self, patience: int | None, keep: bool):
        self.patience, self.keep, self.state, self.bad = patience, keep, None, 0

    def update(self, model: nn.Module, history: History, step: int, loss: float) -> None:
        history.valid_steps.append(step)
        history.valid_loss.append(loss)
        if history.best_valid_loss is None or loss < history.best_valid_loss:
            history.best_step, history.best_valid_loss, self.bad = step, loss, 0
            if self.keep:
                self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            self.bad += 1
            history.stopped_early = self.patience is not None and self.bad >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.state, "bad": self.bad}

    def load_state_dict(self, d: dict[str, Any], device: torch.device) -> None:
        self.bad = d["bad"]
        self.state = (
            None if d["state"] is None else {k: v.to(device) for k, v in d["state"].items()}
        )


def _rng_state(device: torch.device) -> dict[str, Any]:
    """Random state of this process (torch CPU, the training GPU, numpy's global generator)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002 (saved on purpose)
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "gauss": gauss,
        },
    }


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    n = state["numpy"]
    np.random.set_state(  # noqa: NPY002 (restoring the global generator on purpose)
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )


def _rescale_lr(opt: Optimizer, sched: LRScheduler | None, ratio: float) -> None:
    """Multiply the current and base learning rates (a new ``lr`` given on resume)."""
    for group in opt.param_groups:
        for key in ("lr", "initial_lr"):
            if key in group:
                group[key] *= ratio
    if sched is not None:
        sched.base_lrs = [b * ratio for b in sched.base_lrs]


def train(
    s: Session,
    model: nn.Module,
    objective: nn.Module,
    source: Any,
    check: Callable[[tuple[Any, ...]], None],
    o: Options,
    validate: Callable[[], float] | None,
) -> History:
    check_positive(
        steps=o.steps,
        checkpoint_every=o.checkpoint_every,
        log_every=o.log_every,
        valid_every=o.valid_every,
        early_stopping_patience=o.patience,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("'model' has no trainable parameters")
    opt = _make_optimizer(o.optimizer, params, o.lr)
    sched = _make_schedule(o.lr_schedule, opt, o.steps)
    best = _Best(o.patience, keep=o.restore_best or o.patience is not None)
    step, saved_step = 0, None
    history = History(objective=s.objective, seed=s.seed)
    if s.ckpt is not None:
        c = s.ckpt  # the weights were restored by session()
        opt.load_state_dict(c["optimizer"])
        if sched is not None:
            if c["total_steps"] != o.steps:
                raise ValueError(
                    f"'steps' is {o.steps} but '{s.path}' belongs to a run of {c['total_steps']} "
                    "steps, and its learning-rate schedule was built for that length; resume "
                    "with the same 'steps' (runs without lr_schedule can be extended)"
                )
            sched.load_state_dict(c["scheduler"])
        if o.lr != c["lr"]:
            _rescale_lr(opt, sched, o.lr / c["lr"])
        best.load_state_dict(c["best"], s.device)
        step = saved_step = c["step"]
        history = History.from_dict(c["history"])
        mine = c["processes"][s.dist.rank]
        source.load_state_dict(mine["data"], step)
        _set_rng_state(mine["rng"], s.device)

    def save() -> None:
        """Write the checkpoint, or raise if the weights are not finite (keeping the last one)."""
        bad = _first_nonfinite(model, s.dist)
        if bad is not None:
            name, value = bad
            raise NonFiniteLossError(
                _nonfinite_message(
                    f"the model's '{name}' is {value} at step {step}, although every loss so far "
                    "was finite (an infinite gradient, or a buffer such as a running statistic "
                    "that overflowed)",
                    o,
                    s.path,
                    saved_step,
                ),
                step,
                value,
            )
        history.wall_time = wall_start + time.perf_counter() - t0
        mine = {"rng": _rng_state(s.device), "data": source.state_dict()}
        processes = s.dist.gather(mine)
        if s.dist.is_main and s.path is not None:
            save_checkpoint(
                s.path,
                TRAINING_KIND,
                model=model,
                extra={
                    "optimizer": opt.state_dict(),
                    "scheduler": None if sched is None else sched.state_dict(),
                    "step": step,
                    "total_steps": o.steps,
                    "seed": s.seed,
                    "lr": o.lr,
                    "world_size": s.dist.world_size,
                    "processes": processes,
                    "history": history.to_dict(),
                    "best": best.state_dict(),
                },
            )

    pending: list[Tensor] = []  # losses of the steps since the last copy to the host

    def flush() -> float | None:
        """Copy pending losses to the history; the mean of them, or raise if one is not finite."""
        if not pending:
            return None
        values = s.dist.all_mean(torch.stack(pending)).tolist()
        pending.clear()
        first = len(history.train_loss) + 1
        for i, v in enumerate(values):
            if not math.isfinite(v):
                problem = f"the training loss is {v} at step {first + i}"
                raise NonFiniteLossError(
                    _nonfinite_message(problem, o, s.path, saved_step), first + i, v
                )
        history.train_loss.extend(values)
        _record_epochs(history, source.batches_per_epoch)
        return sum(values) / len(values)

    runner = s.dist.wrap(objective, s.device)
    bar = tqdm(
        total=o.steps,
        initial=step,
        unit="step",
        dynamic_ncols=True,
        desc=history.objective,
        disable=not (o.progress and s.dist.is_main),
    )
    postfix: dict[str, str] = {}
    # the bar shows the ELBO itself for reverse-KL runs, the minimised loss otherwise
    label, sign = ("elbo", -1.0) if s.objective == "neg_elbo" else ("loss", 1.0)
    wall_start, t0 = history.wall_time, time.perf_counter()
    model.train()
    checked = False
    # flowkit models check their inputs for NaN/Inf, which reads them back to the host; the
    # data was checked once up front (arrays) or shows up as a non-finite loss (other sources)
    with validate_values(False), bar:
        while step < o.steps and not history.stopped_early:
            args = source.next_batch(step)
            if not checked:
                cuda = [s.device] if s.device.type == "cuda" else []
                with torch.random.fork_rng(devices=cuda), validate_values(True):
                    check(args)
                checked = True
            opt.zero_grad(set_to_none=True)
            loss = runner(*args)
            loss.backward()
            if o.clip_grad_norm is not None:
                nn.utils.clip_grad_norm_(params, o.clip_grad_norm)
            opt.step()
            if sched is not None:
                sched.step()
            pending.append(loss.detach())
            step += 1
            bar.update()
            at_valid = validate is not None and (step % o.valid_every == 0 or step == o.steps)
            at_ckpt = s.path is not None and step % o.checkpoint_every == 0
            if at_valid or at_ckpt or step % o.log_every == 0 or step == o.steps:
                mean = flush()
                if mean is not None:
                    postfix[label] = f"{sign * mean:.4f}"
                if at_valid:
                    best.update(model, history, step, validate())
                    postfix["valid"] = f"{history.valid_loss[-1]:.4f}"
                    if history.stopped_early:
                        postfix["stopped early; best step"] = str(history.best_step)
                bar.set_postfix(postfix, refresh=False)
                if at_ckpt:
                    save()
                    saved_step = step
        flush()
        bar.set_postfix(postfix)
    history.wall_time = wall_start + time.perf_counter() - t0
    if best.state is not None:
        model.load_state_dict(best.state)
    if s.path is not None:
        save()
    model.eval()
    return history


def _first_nonfinite(model: nn.Module, dist: Dist) -> tuple[str, float] | None:
    """The name and first bad value of the first parameter or floating buffer of ``model`` that
    holds NaN or Inf on any process, or None when all are finite. One host copy when all are."""
    named = [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]
    flags = dist.all_sum(torch.stack([(~torch.isfinite(v)).any() for _, v in named]).int())
    first = next((i for i, flag in enumerate(flags.tolist()) if flag), None)
    if first is None:
        return None
    name, v = named[first]
    bad = v[~torch.isfinite(v)]  # empty on the processes whose copy is finite
    return name, bad[0].item() if bad.numel() else math.nan


def _record_epochs(history: History, steps_per_epoch: int | None) -> None:
    """Append to ``history.epoch_loss`` the mean loss of each epoch that ``history.train_loss``
    completes since the last call (nothing for data without epochs)."""
    if steps_per_epoch is None:
        return
    while (len(history.epoch_loss) + 1) * steps_per_epoch <= len(history.train_loss):
        start = len(history.epoch_loss) * steps_per_epoch
        history.epoch_loss.append(
            sum(history.train_loss[start : start + steps_per_epoch]) / steps_per_epoch
        )


def _nonfinite_message(problem: str, o: Options, path: Path | None, saved: int | None) -> str:
    """The text of a :class:`NonFiniteLossError`: ``problem``, the usual fixes, and what became
    of the checkpoint (in the spelling of :func:`~flowkit.train.fit`'s arguments; the
    ``flowkit fit`` command rewords them as options)."""
    text = (
        f"{problem}. Usual fixes: lower the learning rate (lr={o.lr:g} now), clip gradients "
        "(clip_grad_norm=1.0), standardise the data (zero mean and unit variance per feature) "
        "and check it for extreme values or duplicates (continuous densities on repeated points "
        "grow without bound)."
    )
    if saved is not None:
        return text + (
            f" The last good checkpoint, '{path}' (step {saved}), was kept: call fit again with "
            "resume=True and a lower lr to continue from it."
        )
    if path is not None:
        first = min(o.checkpoint_every, o.steps)
        return text + f" No checkpoint was written yet (the first is due at step {first})."
    return text + " No checkpoint was written (pass checkpoint_dir to keep one)."
