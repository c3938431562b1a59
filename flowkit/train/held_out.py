"""The validation loss of :func:`~flowkit.train.fit` (a :class:`~flowkit.train.loop.HeldOutLoss`):
the mean NLL of validation data (:class:`HeldOutNLL`), or what the user's ``valid(model)`` returns
(:class:`UserHeldOutLoss`); :func:`held_out_loss` makes the one ``valid`` asks for."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from numbers import Real
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from ..nn.made import MADE
from ..nn.modes import evaluating
from ..validation import ArgumentError, Mention
from .arrays import frames_as_arrays, load_arrays, loader_batch
from .objectives import count_nonfinite_rows, is_bounded, log_prob, outside_support, rows_outside
from .preflight import check_first_batch
from .session import Session
from .sources import first_batch


def held_out_loss(
    model: nn.Module, valid: Any, batch_size: int, s: Session, dtype: torch.dtype
) -> HeldOutNLL | UserHeldOutLoss:
    """The validation: the mean NLL over the whole validation set (all processes), or what the
    user's ``valid(model)`` returns (averaged over processes)."""
    valid = frames_as_arrays("valid", valid)
    if callable(valid) and not isinstance(valid, DataLoader | Tensor | np.ndarray):
        return UserHeldOutLoss(model, valid, s)
    if isinstance(valid, DataLoader):
        check_first_batch(model, *first_batch("valid", valid, s.device, dtype), "valid")

        def batches(every: bool = False) -> Iterator[tuple[Tensor, Tensor | None]]:
            for b in valid:
                yield loader_batch("valid", b, s.device, dtype)
    else:
        x, c = load_arrays("valid", valid, s.device, dtype)
        check_first_batch(model, x, c, "valid", batch=False)
        chunk = max(batch_size, 1024)

        def batches(every: bool = False) -> Iterator[tuple[Tensor, Tensor | None]]:
            # each process evaluates every world_size-th row (the sums are then added up), or
            # ``every`` row, to number them as the caller passed them
            r, w = (0, 1) if every else (s.dist.rank, s.dist.world_size)
            xs, cs = x[r::w], None if c is None else c[r::w]
            for i in range(0, xs.shape[0], chunk):
                yield xs[i : i + chunk], None if cs is None else cs[i : i + chunk]

    return HeldOutNLL(model, batches, s)


class HeldOutNLL:
    """The mean NLL of the validation batches (``batches()``), summed over all processes; NaN
    when a row holds NaN or Inf (:meth:`cause` then says which)."""

    def __init__(self, model: nn.Module, batches: Callable[..., Iterator[tuple[Tensor, Any]]],
                 s: Session):
        self.model, self.batches, self.s = model, batches, s
        self.counts = (0, 0, 0)  # rows, rows holding NaN/Inf, rows of log-density -inf
        self.mask_sets: tuple[int, ...] | None = None  # active sets of MADEs with several
        self.warned_of_mask_sets = False

    def __call__(self) -> float:
        model, s = self.model, self.s
        self._warn_if_mask_sets_changed()
        # NLL sum, rows, rows holding NaN/Inf (a DataLoader's later batches are not checked),
        # rows of log-density -inf
        total = torch.zeros(4, device=s.device, dtype=torch.float64)
        with evaluating(model):
            for xb, cb in self.batches():
                log_p = log_prob(model, xb, cb)
                total[0] -= log_p.sum()
                total[1] += xb.shape[0]
                total[2] += count_nonfinite_rows(xb, xb) + count_nonfinite_rows(cb, xb)
                total[3] += (log_p == -math.inf).sum()
        nll, rows, bad, outside = s.dist.all_sum(total).tolist()
        self.counts = (int(rows), int(bad), int(outside))
        return math.nan if bad else nll / rows

    def _warn_if_mask_sets_changed(self) -> None:
        """Warn (once) when the active mask set of a MADE with several changed since the last
        validation: the scores then belong to different models, which early stopping and
        ``restore_best`` would compare."""
        sets = tuple(m.mask_set_index for m in self.model.modules()
                     if isinstance(m, MADE) and m.num_masks > 1)
        before, self.mask_sets = self.mask_sets, sets
        if before is None or before == sets or self.warned_of_mask_sets:
            return
        self.warned_of_mask_sets = True
        change = (f"{before[0]} then {sets[0]}" if len(sets) == 1 else
                  f"{list(before)} then {list(sets)}, one per MADE")
        warnings.warn(
            f"'valid' is scored with the active mask set, which changed between two "
            f"validations ({change}): the validation losses belong to different models, "
            "which early stopping and restore_best compare; pass 'valid' a function "
            "valid(model) that scores one fixed set (in 'with made.mask_set(0):' for each "
            "MADE, or the model's own mask_set(0)) or the ensemble (docs/discrete.md, "
            "'Validation while the sets cycle')", stacklevel=2)

    def cause(self, step: int, value: float) -> tuple[str | Mention, ...]:
        """Why the validation loss of step ``step`` was ``value``, not finite."""
        rows, bad, outside = self.counts
        if bad:
            return (
                Mention("valid"), f" holds NaN or Inf values in {bad} of its {rows} rows, found "
                f"by the validation at step {step} (a DataLoader is checked for them in its "
                "first batch only, before training).",
            )
        where = (f"the validation at step {step}: ", Mention("valid"))
        if outside:
            count, first = rows_outside(self.model, self.batches(every=True))
            if is_bounded(self.model):
                return outside_support(where, count, first)
            return (*where, f" holds {count} row(s) (first {first}) that the model gives "
                    "log-density -inf, so the validation loss is infinite.")
        return (*where, f" gives the validation loss {value}: the model's log-density is not "
                "finite on some of its rows.")


class UserHeldOutLoss:
    """What the user's ``valid(model)`` returns, averaged over processes."""

    def __init__(self, model: nn.Module, valid: Callable[[nn.Module], Any], s: Session):
        self.model, self.valid, self.s = model, valid, s

    def __call__(self) -> float:
        with evaluating(self.model) as model:
            loss = self.valid(model)
        if isinstance(loss, Tensor) and loss.numel() == 1 and loss.is_floating_point():
            loss = loss.item()
        if isinstance(loss, bool) or not isinstance(loss, Real):
            raise ArgumentError(
                "valid", f"should return the validation loss as a number, got {loss!r}"
            )
        t = torch.tensor(float(loss), dtype=torch.float64, device=self.s.device)
        return self.s.dist.all_mean(t).item()

    def cause(self, step: int, value: float) -> tuple[str | Mention, ...]:
        """Why the validation loss of step ``step`` was ``value``, not finite."""
        return (
            "the validation function ", Mention("valid"), f" returned {value} at step {step} "
            "(on this or another process): it should return a finite loss (a NaN or infinite "
            "one can never be the best, so early stopping would end the run on it).",
        )
