"""What can go wrong in a training run, and how it is found: the errors a run ends with
(:class:`NonFiniteLossError`, :class:`DivergenceError`), the divergence statistic
(:class:`Divergence`) and the finiteness check of the weights (:func:`first_nonfinite`).

* **Divergence.** The loss smoothed over steps, :math:`m_t = m_{t-1} + 0.1 (\\ell_t - m_{t-1})`
  (:math:`m_1 = \\ell_1`), is compared with its lowest value so far :math:`m^*`: the run stops
  when :math:`m_t - m^* > \\tau \\max(1, |m^*|)`, :math:`\\tau` = ``divergence_threshold``. The
  state is a function of the recorded losses, so a resumed run rebuilds it from its history.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..validation import Mention, WordedError
from .distributed import Dist


class NonFiniteLossError(WordedError, FloatingPointError):
    """The training loss, or the weights, became NaN or infinite.

    The model holds the weights of the last recording at which everything was finite, or, in a
    run that keeps its best validation's weights (``restore_best``, ``early_stopping_patience``),
    those (see ``docs/training.md``); the last checkpoint is kept.

    Attributes:
        step: the first step (1-based) whose loss was not finite, or the step at which
            non-finite weights were found.
        value: that loss, or the first non-finite value of those weights.
    """

    def __init__(self, *parts: str | Mention, step: int, value: float):
        super().__init__(*parts)
        self.step, self.value = step, value


class DivergenceError(WordedError, FloatingPointError):
    """The smoothed training loss rose far above its best value (``divergence_threshold``).

    The model holds the weights of the last recording before (or of the best validation, as
    for :class:`NonFiniteLossError`), and the last checkpoint is kept.

    Attributes:
        step: the step at which the smoothed loss crossed the threshold.
        value: the smoothed loss at that step.
        best: its lowest value before.
    """

    def __init__(self, *parts: str | Mention, step: int, value: float, best: float):
        super().__init__(*parts)
        self.step, self.value, self.best = step, value, best


class Divergence:
    """The smoothed loss ``m_t`` and its minimum (module notes, "Divergence")."""

    SMOOTHING = 0.1

    def __init__(self, threshold: float | None):
        self.threshold, self.mean, self.best = threshold, math.nan, math.inf

    def update(self, loss: float) -> bool:
        """Add the next step's (finite) loss; whether the run has diverged."""
        if self.threshold is None:
            return False
        self.mean = loss if math.isnan(self.mean) else self.mean + self.SMOOTHING * (
            loss - self.mean
        )
        self.best = min(self.best, self.mean)
        return self.mean - self.best > self.threshold * max(1.0, abs(self.best))


def first_nonfinite(model: nn.Module, dist: Dist) -> tuple[str, float] | None:
    """The name and first bad value of the first parameter or floating buffer of ``model`` that
    holds NaN or Inf on any process, or None when all are finite. One host copy when all are."""
    named = [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]
    if not named:
        return None
    flags = dist.all_sum(torch.stack([(~torch.isfinite(v)).any() for _, v in named]).int())
    first = next((i for i, flag in enumerate(flags.tolist()) if flag), None)
    if first is None:
        return None
    name, v = named[first]
    bad = v[~torch.isfinite(v)]  # empty on the processes whose copy is finite
    return name, bad[0].item() if bad.numel() else math.nan
