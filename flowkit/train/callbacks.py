"""Hooks into the training loop: code that :func:`~flowkit.train.fit` and
:func:`~flowkit.train.fit_reverse_kl` run after each step, after each epoch and after each
checkpoint (see ``docs/training.md``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor, nn

from ..validation import ArgumentError
from .history import History


@dataclass(frozen=True)
class Progress:
    """Where a run is, as the :class:`Callbacks` see it.

    Attributes:
        model: the model being trained (in training mode; a callback may change its state,
            e.g. the active mask set, but should leave it in training mode).
        step: optimizer steps done so far (1 after the first step).
        steps: the length of the run in steps.
        epoch: completed epochs, for data that has epochs (arrays, DataLoaders with a length);
            ``None`` for sampling functions and reverse KL.
        history: the run's :class:`~flowkit.train.History`. Its ``train_loss`` holds the
            losses copied to the host so far: up to ``step`` in ``after_epoch`` and
            ``on_checkpoint``, possibly fewer in ``after_step`` (the loop copies them every
            ``log_every`` steps, not at every step).
        loss: ``after_step`` only: the loss of this step, a detached 0-dim tensor on the
            training device (``loss.item()`` waits for the device); else ``None``.
        checkpoint: ``on_checkpoint`` only: the path of the checkpoint just written; else
            ``None``.
    """

    model: nn.Module
    step: int
    steps: int
    epoch: int | None
    history: History
    loss: Tensor | None = None
    checkpoint: Path | None = None


Callback = Callable[[Progress], None]
"""A function of the run's :class:`Progress`; what it returns is ignored."""


@dataclass(frozen=True)
class Callbacks:
    """Code to run at three points of the training loop; each is optional.

    The order within a step is: optimizer and scheduler step, ``after_step``; then, at the
    steps where they happen, validation, ``after_epoch``, checkpoint and ``on_checkpoint``.
    Under ``torchrun`` every process runs them (test
    :func:`~flowkit.train.is_main_process` before writing files). A callback's own state is
    not saved in checkpoints: on ``resume=True`` it starts afresh, with ``history`` restored.

    Attributes:
        after_step: after every optimizer step, e.g. ``lambda p: p.model.next_mask()`` (the
            mask cycling of order-agnostic training). Keep it cheap: it runs every step.
        after_epoch: after each completed epoch (data with epochs only), after that step's
            validation, with ``history.epoch_loss`` and ``history.valid_loss`` up to date.
        on_checkpoint: after each checkpoint written to ``checkpoint_dir`` (every
            ``checkpoint_every`` steps and at the end).

    Example:
        >>> import torch, flowkit
        >>> from flowkit.train import Callbacks, fit
        >>> flow = flowkit.MAF(2, hidden_features=(8,), layers=1)
        >>> seen = []
        >>> log = Callbacks(after_epoch=lambda p: seen.append((p.epoch, p.step)))
        >>> _ = fit(flow, torch.randn(64, 2), valid=None, epochs=2, batch_size=32, callbacks=log,
        ...         progress=False)
        >>> seen
        [(1, 2), (2, 4)]
    """

    after_step: Callback | None = None
    after_epoch: Callback | None = None
    on_checkpoint: Callback | None = None

    def __post_init__(self) -> None:
        for name in ("after_step", "after_epoch", "on_checkpoint"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ArgumentError(
                    f"callbacks.{name}",
                    f"should be None or a function of a Progress, got {value!r}",
                )
