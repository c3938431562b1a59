"""The session around a training run: the device, the ``torchrun`` process group, the lock of
the checkpoint folder, the checkpoint to resume from (checked and restored into the model), the
seed; and the random states a checkpoint saves. Internal, used by :mod:`flowkit.train.loop`.

Implementation notes:

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
* **Device.** The model trains on the resolved ``device`` and goes back to the device it was on
  when the session ends, also when the run fails: ``fit(flow, x)`` leaves ``flow`` where the
  user put it, so a script written on a CPU-only machine runs unchanged where ``"auto"`` picks a
  GPU. A model whose tensors are on several devices stays on ``device``. After a failed run, an
  error in moving it back gives way to the run's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..checkpoint import Checkpoint, CheckpointError, load_checkpoint, run_lock
from ..checkpoint.models import check_same_config, model_entry, unwrap_compiled
from ..validation import ArgumentError, Mention
from .distributed import Dist, resolve_device, setup
from .sources import derive_seed

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
"""The ``extra`` entries of a training checkpoint that resuming reads (:meth:`Trainer._save`
writes them, with the model)."""


@dataclass
class Session:
    device: torch.device
    dist: Dist
    path: Path | None
    ckpt: dict[str, Any] | None  # the ``extra`` entries of the checkpoint resumed from
    seed: int
    objective: str  # "nll" or "neg_elbo", the History.objective of the run


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
        raise ArgumentError("resume", Mention("resume", True), " needs ", Mention("checkpoint_dir"))
    flushing = dev.type == "cpu" and torch.set_flush_denormal(True)
    home = _home_device(model)
    finished = False
    try:
        with _folder_lock(path, dist):
            # rank 0 decides, so all ranks agree
            exists = path is not None and dist.broadcast(path.is_file())
            if exists and not resume:
                raise ArgumentError(
                    "checkpoint_dir", f"'{path}' exists: pass ", Mention("resume", True),
                    " to continue that run, or pick another ", Mention("checkpoint_dir"),
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
        finished = True
    finally:
        if flushing:
            torch.set_flush_denormal(False)
        if home is not None and home != dev:
            try:
                model.to(home)
            except Exception:
                if finished:
                    raise
                # the run's own error (a CUDA error, say) is the one to report, not this one


def _home_device(model: nn.Module) -> torch.device | None:
    """The one device of all of ``model``'s parameters and buffers; None if it has none or
    several."""
    devices = {t.device for t in [*model.parameters(), *model.buffers()]}
    return devices.pop() if len(devices) == 1 else None


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
    folder = Path(checkpoint_dir).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ArgumentError("checkpoint_dir", f"should be a folder, but '{folder}' is a file")
    if (folder / CHECKPOINT_NAME).is_dir():
        raise ArgumentError(
            "checkpoint_dir", f"'{folder / CHECKPOINT_NAME}' is a folder, where ",
            Mention("checkpoint_dir"), " should hold the checkpoint file",
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


def model_class(model: nn.Module) -> str:
    """The name of ``model``'s class (a compiled model's, of the module it wraps) that a
    training checkpoint records, so that a model without a ``config`` (any ``nn.Module`` with
    ``log_prob``) is not resumed into another class of the same weight shapes."""
    return type(unwrap_compiled(model)).__qualname__


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
    check_same_config(path, ckpt.model.get("config"), model,
                      "resume with the model it was written for")
    written_for = extra.get("model_class")  # (not recorded before 2026-11-27)
    if written_for is not None and written_for != model_class(model):
        raise CheckpointError(
            f"'{path}' was written for a {written_for}, not for this {model_class(model)}: "
            "resume with the model it was written for")
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
            raise ArgumentError(
                "seed", Mention("seed"), f" is {seed} but '{path}' was written with seed "
                f"{ckpt['seed']}; pass ", Mention("seed", ckpt["seed"]), " to resume it",
            )
        return ckpt["seed"]
    if seed is None:  # from torch's generator, so torch.manual_seed makes the run repeatable
        seed = int(torch.randint(2**63 - 1, (), dtype=torch.int64))
    seed = dist.broadcast(seed)
    torch.manual_seed(derive_seed(seed, dist.rank))  # dropout, model sampling: per process
    return seed


def rng_state(device: torch.device) -> dict[str, Any]:
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


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    n = state["numpy"]
    np.random.set_state(  # noqa: NPY002 (restoring the global generator on purpose)
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
