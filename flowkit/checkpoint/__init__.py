"""Checkpoint files and run folders: the file format, atomic writes, integrity checks, the model
registry and the one-writer lock, in one place.

* :mod:`~flowkit.checkpoint.format`: the bytes of a file (a torch payload, its length and a
  SHA-256 checksum over everything), atomic writes, and reading files of formats 1 and 2;
* :mod:`~flowkit.checkpoint.models`: what a checkpoint holds (``kind``, ``model``, ``extra``),
  :func:`save_checkpoint` / :func:`load_checkpoint` for any writer, and :func:`save_model` /
  :func:`load_model` for models;
* :mod:`~flowkit.checkpoint.registry`: :func:`register_model` and :func:`register_check`, through
  which model classes say how they are rebuilt and checked (this package imports no model);
* :mod:`~flowkit.checkpoint.lock`: :func:`run_lock`, one writer per run folder.

Example: an application's own checkpoint, with a model and its training state:

    >>> import os, tempfile, torch, flowkit
    >>> from flowkit.checkpoint import save_checkpoint, load_checkpoint
    >>> flow = flowkit.MAF(2, hidden_features=(8,), layers=2)
    >>> path = os.path.join(tempfile.mkdtemp(), "run.pt")
    >>> save_checkpoint(path, "my-app", model=flow, extra={"epoch": 3, "lr": 1e-3})
    >>> ckpt = load_checkpoint(path, kind="my-app")
    >>> ckpt.extra["epoch"]
    3
    >>> ckpt.restore(flow)  # the weights, with every check of flowkit.load_model
"""

from .format import (
    FORMAT_VERSION,
    CheckpointError,
    CheckpointWriteError,
    LegacyFormatWarning,
    write_bytes_atomic,
)
from .lock import LOCK_NAME, RunLockedError, StaleLockWarning, run_lock
from .models import Checkpoint, load_checkpoint, load_model, save_checkpoint, save_model
from .registry import BuildWarning, InvalidBuffer, register_check, register_model

__all__ = [
    "BuildWarning",
    "FORMAT_VERSION",
    "LOCK_NAME",
    "Checkpoint",
    "CheckpointError",
    "CheckpointWriteError",
    "InvalidBuffer",
    "LegacyFormatWarning",
    "RunLockedError",
    "StaleLockWarning",
    "load_checkpoint",
    "load_model",
    "register_check",
    "register_model",
    "run_lock",
    "save_checkpoint",
    "save_model",
    "write_bytes_atomic",
]
