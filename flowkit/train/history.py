"""The record of a training run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class History:
    """Losses of a training run, for printing, plotting and JSON export.

    Attributes:
        objective: what ``train_loss`` measures: ``"nll"`` (mean negative log-likelihood in nats
            per sample, :func:`flowkit.train.fit`) or ``"neg_elbo"`` (minus the evidence lower
            bound, :func:`flowkit.train.fit_reverse_kl`).
        train_loss: one value per optimizer step; ``train_loss[i]`` is the batch loss of step
            ``i + 1`` (averaged over processes in distributed runs).
        epoch_loss: mean of ``train_loss`` over each completed epoch, for data that has epochs
            (arrays and DataLoaders with a length; a last, partial epoch is left out). Empty for
            sampling functions and reverse KL.
        valid_steps: steps after which the validation loss was computed.
        valid_loss: mean loss over the whole validation set at those steps.
        best_step: step with the lowest validation loss (``None`` without validation data).
        best_valid_loss: that loss.
        stopped_early: whether early stopping ended the run (or a divergence after a best
            validation whose weights it returns: ``diverged_step``).
        diverged_step: the step at which the training loss diverged, when the run ended there
            with the weights of its best validation (``restore_best``) instead of raising a
            :class:`~flowkit.train.DivergenceError`; else None.
        wall_time: seconds spent in training, summed over resumed segments (validation
            included).
        valid_time: the part of ``wall_time`` spent computing validation losses.
        seed: the seed the run used (drawn at random when none was given).
        batch_size: rows per step of array data or of a sampling function, as given or as
            :func:`~flowkit.train.default_batch_size` chose it (``None`` for a DataLoader and
            for reverse KL).
        train_rows: rows of array training data, after ``valid=<fraction>`` held out its
            share (``None`` for other data).
    """

    objective: str = "nll"
    train_loss: list[float] = field(default_factory=list)
    epoch_loss: list[float] = field(default_factory=list)
    valid_steps: list[int] = field(default_factory=list)
    valid_loss: list[float] = field(default_factory=list)
    best_step: int | None = None
    best_valid_loss: float | None = None
    stopped_early: bool = False
    diverged_step: int | None = None
    wall_time: float = 0.0
    valid_time: float = 0.0
    seed: int | None = None
    batch_size: int | None = None
    train_rows: int | None = None

    @property
    def steps(self) -> list[int]:
        """Step numbers ``1..len(train_loss)``, the x-axis for ``train_loss``."""
        return list(range(1, len(self.train_loss) + 1))

    @property
    def elbo(self) -> list[float]:
        """Per-step ELBO estimates, ``-train_loss`` (meaningful for ``"neg_elbo"`` runs)."""
        return [-v for v in self.train_loss]

    def to_dict(self) -> dict[str, Any]:
        """Plain ``dict`` of lists and numbers (``json.dumps``-able; stored in checkpoints)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> History:
        """Inverse of :meth:`to_dict`."""
        return cls(**d)

    def __repr__(self) -> str:
        last = f"{self.train_loss[-1]:.4f}" if self.train_loss else "n/a"
        best = (
            f", best_valid_loss={self.best_valid_loss:.4f} at step {self.best_step}"
            if (self.best_valid_loss is not None)
            else ""
        )
        return f"History({self.objective}, steps={len(self.train_loss)}, last={last}{best})"
