"""Device choice and the thin layer over :mod:`torch.distributed` that the fit loop uses.

Under ``torchrun`` every process gets the environment variables ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK``; :func:`setup` reads them and joins the process group (``nccl`` on CUDA, ``gloo``
on CPU). Outside ``torchrun`` everything here is a no-op and training is single-process.

The group is created once per process and kept for later ``fit`` calls; it is destroyed at
exit. Destroying and re-creating it on ``torchrun``'s rendezvous store between two calls can
race (a process may pick up the previous group's addresses) and hang.
"""

from __future__ import annotations

import atexit
import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ..validation import ArgumentError


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def is_main_process() -> bool:
    """Whether this process is rank 0 of a ``torchrun`` job, or not under ``torchrun`` at all."""
    return _env_int("RANK", 0) == 0


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Turn a device request into a :class:`torch.device`.

    ``"auto"`` means CUDA when available, else CPU. A bare ``"cuda"`` (or ``"auto"`` resolving to
    CUDA) becomes ``cuda:LOCAL_RANK`` under ``torchrun``, so each process drives its own GPU.

    Raises:
        ArgumentError: not a device name or :class:`torch.device`, or CUDA was requested but is
            not available (a ``ValueError``).
    """
    if not isinstance(device, str | torch.device):
        raise ArgumentError(
            "device", f"should be a string such as 'cpu' or a torch.device, got {device!r}"
        )
    if isinstance(device, str) and device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise ArgumentError(
            "device", f"should be 'auto', 'cpu', 'cuda', 'cuda:N' or another torch device, "
            f"got {device!r}"
        ) from e
    if device.type == "meta":
        raise ArgumentError("device", "is 'meta', which holds no values; use 'cpu' or 'cuda'")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(
                "device", f"is {str(device)!r} but CUDA is not available; use 'cpu'"
            )
        if device.index is None:
            device = torch.device("cuda", _env_int("LOCAL_RANK", 0))
    return device


@dataclass(frozen=True)
class Dist:
    """Who this process is in a (possibly trivial) process group."""

    rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_mean(self, t: Tensor) -> Tensor:
        """Average ``t`` over processes (returns ``t`` itself when single-process)."""
        if self.enabled:
            t = t.clone()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t /= self.world_size
        return t

    def all_sum(self, t: Tensor) -> Tensor:
        """Sum ``t`` over processes (returns ``t`` itself when single-process)."""
        if self.enabled:
            t = t.clone()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, indexed by rank (a collective: all ranks must call it)."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process (a collective)."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def wrap(self, module: nn.Module, device: torch.device) -> nn.Module:
        """Wrap ``module`` in :class:`DistributedDataParallel` when running distributed.

        DDP broadcasts rank 0's parameters and buffers at construction, and during
        ``backward()`` averages gradients over processes. Its hooks are tied to ``forward``, so
        ``module.forward`` must compute the whole loss (see
        :class:`flowkit.train.objectives.Objective`).
        """
        if not self.enabled:
            return module
        return DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None
        )


def setup(device: torch.device) -> Dist:
    """Join the ``torchrun`` process group if there is one (``WORLD_SIZE`` > 1).

    Uses the default group if there is one (created by the caller or by an earlier call);
    otherwise initialises it with ``nccl`` for CUDA devices and ``gloo`` for CPU, reading the
    rendezvous address from the environment as ``torchrun`` sets it, and destroys it at exit.
    """
    if dist.is_available() and dist.is_initialized():
        return Dist(dist.get_rank(), dist.get_world_size())
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1:
        return Dist()
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    atexit.register(_destroy_group)
    return Dist(dist.get_rank(), dist.get_world_size())


TEARDOWN_TIMEOUT = 30.0
"""Seconds each process waits at exit for the others (gloo) before closing the group."""


def _destroy_group() -> None:
    """At exit: with gloo, wait until every process has reached its end (a process closing its
    connections while another still holds them open could abort that one, "terminate called
    without an active exception", seen in 2 of about 30 test runs); then close the group. A
    process that does not arrive within :data:`TEARDOWN_TIMEOUT` (it failed) ends the wait."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "gloo":
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=TEARDOWN_TIMEOUT))
        except RuntimeError:
            pass  # another process failed or left: nothing to wait for
    dist.destroy_process_group()
