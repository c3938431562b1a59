"""Memory that a thread reuses between calls (:class:`Scratch`), for the hidden values of the
staircase's forward pass (:mod:`flowkit.nn.staircase`) and the solver's buffers
(:mod:`flowkit.nn.inversion`)."""

from __future__ import annotations

import threading

import torch
from torch import Tensor


class Scratch:
    """Memory that one thread reuses between calls for values that nothing holds after the
    call (hidden values of a forward pass, the solver's buffers). Large fresh tensors are new
    memory from the system at every call, and the page faults of writing them were about a
    fifth of a D=64 ``log_prob`` on this machine. :meth:`take` the scratch of a caller (a
    nested call gets its own), then :meth:`release` it; used without autograd on the CPU only
    (:meth:`applies`), for tensors of up to :attr:`LIMIT` elements (16 MB in float32)."""

    _threads = threading.local()

    def __init__(self) -> None:
        self.pool: dict[tuple, Tensor] = {}

    @staticmethod
    def applies(like: Tensor) -> bool:
        """Whether a call on ``like`` uses scratch memory: no autograd, on the CPU, outside
        ``torch.func`` transforms (whose tensors have no storage and take no ``out=``)."""
        return not torch.is_grad_enabled() and like.device.type == "cpu" and has_storage(like)

    @classmethod
    def take(cls, owner: str) -> Scratch:
        """This thread's scratch of ``owner``, which no one else uses until released."""
        found = cls._threads.__dict__.setdefault("scratch", {}).pop(owner, None)
        return cls() if found is None else found

    def release(self, owner: str) -> None:
        """Give it back for the next call (its tensors are then no longer ours)."""
        self._threads.__dict__.setdefault("scratch", {})[owner] = self

    LIMIT = 1 << 22
    """Larger tensors (elements) are allocated afresh and not kept, so that evaluating one huge
    batch does not hold its memory for the rest of the thread's life. Below it a thread keeps
    what its largest calls used, per slot and per dtype, device and inference mode: for the
    solver, up to two units x batch tensors per stage of the MADE (pre-activations and
    values), e.g. 5.75 MB for hidden (1000, 1000) at batch 500 in float32 (twice that after
    calls both under ``no_grad`` and under ``inference_mode``)."""

    def tensor(self, slot: object, rows: int, cols: int, like: Tensor) -> Tensor:
        """A ``(rows, cols)`` tensor of ``like``'s dtype and device, one per ``slot``, with
        any values."""
        if rows * cols > self.LIMIT:
            return like.new_empty(rows, cols)
        key = (slot, like.dtype, like.device, torch.is_inference_mode_enabled())
        flat = self.pool.get(key)
        if flat is None or flat.numel() < rows * cols:
            flat = self.pool[key] = torch.empty(rows * cols, dtype=like.dtype,
                                                device=like.device)
        return flat[: rows * cols].view(rows, cols)


def has_storage(t: Tensor) -> bool:
    """Whether ``t`` is a tensor with memory of its own, which ``out=`` arguments accept (not
    a ``torch.func`` transform's wrapper)."""
    try:
        t.data_ptr()
    except RuntimeError:
        return False
    return True
