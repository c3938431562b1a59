"""What can go wrong in a training run, and how it is found: the errors a run ends with
(:class:`NonFiniteLossError`, :class:`DivergenceError`), the divergence statistic
(:class:`Divergence`) and the finiteness check of the weights (:func:`first_nonfinite`).

* **Divergence.** The median of the last 11 steps' losses (of all of them before step 11),
  :math:`m_t = \\mathrm{median}(\\ell_{t-10}, \\dots, \\ell_t)`, is compared with its lowest
  value so far :math:`m^*` (from the first step) at every step from the third: the run stops when
  :math:`m_t - m^* > \\tau \\max(1, |m^*|)`, :math:`\\tau` = ``divergence_threshold``. A median
  ignores a few far-off batches (heavy-tailed data gives single batch losses of 10^2-10^4 nats
  now and then, in a run that recovers at once), and it rises as soon as more than half of the
  window is high (a run that has diverged). The state is a function of the recorded losses, so
  a resumed run rebuilds it from its history.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import torch
from torch import nn

from ..validation import Mention, Worded, WordedError, invalid_values, open_ends
from .distributed import Dist
from .history import History


class NonFiniteLossError(WordedError, FloatingPointError):
    """The training loss, the validation loss, or the weights, became NaN or infinite.

    The model holds the weights of the last recording at which everything was finite, or, in a
    run that keeps its best validation's weights (``restore_best``, ``early_stopping_patience``),
    those (see ``docs/training.md``); the last checkpoint is kept.

    Attributes:
        step: the first step (1-based) whose loss was not finite, or the step at which
            non-finite weights, or a non-finite validation loss, were found.
        value: that loss, or the first non-finite value of those weights.
        history: the run's :class:`~flowkit.train.History` up to the last recording before
            (None where the error was raised outside a run).
    """

    def __init__(self, *parts: str | Mention, step: int, value: float,
                 history: History | None = None):
        super().__init__(*parts)
        self.step, self.value, self.history = step, value, history


class DivergenceWarning(Worded, UserWarning):
    """The training loss diverged in a run that keeps its best validation's weights
    (``restore_best``): the run ended there and returned them (``History.diverged_step``)
    instead of raising a :class:`DivergenceError`."""


class DivergenceError(WordedError, FloatingPointError):
    """The training loss (its running median) rose far above its best value
    (``divergence_threshold``) in a run without a best validation to return (with one, the
    run ends with a :class:`DivergenceWarning`).

    The model holds the weights of the last recording before (or of the best validation, as
    for :class:`NonFiniteLossError`), and the last checkpoint is kept.

    Attributes:
        step: the step at which the running median of the loss crossed the threshold.
        value: that median.
        best: its lowest value before.
        history: the run's :class:`~flowkit.train.History` up to the last recording before (its
            validations, best step and losses; the model holds the weights it names).
    """

    def __init__(self, *parts: str | Mention, step: int, value: float, best: float,
                 history: History | None = None):
        super().__init__(*parts)
        self.step, self.value, self.best, self.history = step, value, best, history


class Divergence:
    """The running median ``m_t`` of the last :data:`WINDOW` losses and its minimum (module
    notes, "Divergence")."""

    WINDOW = 11
    FIRST = 3  # the first step checked (a median of two losses is their mean)

    def __init__(self, threshold: float | None):
        self.threshold, self.median, self.best = threshold, math.nan, math.inf
        self.recent: deque[float] = deque(maxlen=self.WINDOW)

    def update(self, loss: float) -> bool:
        """Add the next step's (finite) loss; whether the run has diverged."""
        if self.threshold is None:
            return False
        self.recent.append(loss)
        self.median = statistics.median(self.recent)
        self.best = min(self.best, self.median)
        return len(self.recent) >= self.FIRST and (
            self.median - self.best > self.threshold * max(1.0, abs(self.best))
        )


def first_nonfinite(model: nn.Module, dist: Dist) -> tuple[str, float] | None:
    """The name and first bad value of the first parameter or floating buffer of ``model`` that
    holds NaN or Inf on any process, or None when all are finite. One host copy when all are.
    The open ends of a :class:`~flowkit.transforms.Logit` may be infinite (NaN may not: see
    :func:`~flowkit.validation.open_ends`)."""
    infinite_ok = open_ends(model)
    named = [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]
    if not named:
        return None
    flags = dist.all_sum(torch.stack(
        [invalid_values(v, k in infinite_ok).any() for k, v in named]).int())
    first = next((i for i, flag in enumerate(flags.tolist()) if flag), None)
    if first is None:
        return None
    name, v = named[first]
    bad = v[invalid_values(v, name in infinite_ok)]  # empty where this process's copy is finite
    return name, bad[0].item() if bad.numel() else math.nan
