"""The floor a fitted flow should clear: a full-covariance Gaussian fitted to the same rows.

A flow that scores its validation rows worse than a Gaussian fitted to its training rows has
failed at something the simplest density model gets right: a few outlying rows that set the
standardization's scale (the bulk of the data then sits in a sliver of the flow's input),
nearly collinear columns, too few rows for the flow's size, too few steps. :func:`fit`
compares the two on the rows it held out (``valid="auto"`` or a fraction) and says so with a
:class:`BaselineWarning`; the numbers are in nats per row, in the data's units.

The Gaussian is the maximum-likelihood one, in float64. With a context it is the Gaussian of
``x`` given the context that a joint Gaussian of ``(x, context)`` implies (a linear regression
with Gaussian noise): its log-density is the joint's minus the context's marginal.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from ..validation import Mention, Worded
from .history import History

GAUSSIAN_MARGIN = 0.1
"""How much worse, in nats per validation row, the flow's best validation loss must be than the
Gaussian's for :func:`fit` to warn (the two are scored on the same rows, so this is not noise
of the rows drawn)."""

MAX_BASELINE_COLUMNS = 2000
"""Columns (features and context) above which no Gaussian is fitted (its covariance would cost
more than a check should)."""


class BaselineWarning(Worded, UserWarning):
    """The flow :func:`fit` returns scores its validation rows worse than a full-covariance
    Gaussian fitted to its training rows (see :mod:`flowkit.train.baseline`)."""


def gaussian_nll(
    train: tuple[Tensor, Tensor | None], valid: tuple[Tensor, Tensor | None]
) -> float | None:
    """Mean negative log-density, nats per row, of the validation rows ``valid = (x, c)``
    (``x`` ``(M, D)``, ``c`` ``(M, C)`` or None) under the full-covariance Gaussian fitted by
    maximum likelihood to ``train`` (the same form, ``N`` rows): ``-log N(x | mu, S)``, or
    with a context ``-log N((x, c)) + log N(c)`` under the joint Gaussian. None where the
    training covariance is singular (fewer rows than columns, a constant column)."""
    joint_train, joint_valid = (
        torch.cat([v.double() for v in pair if v is not None], dim=1) for pair in (train, valid))
    if joint_train.shape[1] > MAX_BASELINE_COLUMNS:
        return None
    nll = _nll(joint_train, joint_valid)
    if nll is None or train[1] is None:
        return nll
    c = train[1].shape[1]
    context_nll = _nll(joint_train[:, -c:], joint_valid[:, -c:])
    return None if context_nll is None else nll - context_nll


def _nll(train: Tensor, valid: Tensor) -> float | None:
    """:func:`gaussian_nll` of the columns as given (one Gaussian over all of them)."""
    rows, k = train.shape
    if rows <= k:
        return None
    mean = train.mean(0)
    centred = train - mean
    cov = centred.T @ centred / rows
    chol, info = torch.linalg.cholesky_ex(cov)
    if info != 0 or not bool(torch.isfinite(chol).all()):
        return None
    white = torch.linalg.solve_triangular(chol, (valid - mean).T, upper=False)
    log_det = 2 * chol.diagonal().log().sum()
    nll = 0.5 * (white.square().sum(0) + log_det + k * math.log(2 * math.pi))
    value = float(nll.mean())
    return value if math.isfinite(value) else None


def warn_if_worse_than_gaussian(
    history: History,
    train: tuple[Tensor, Tensor | None],
    valid: tuple[Tensor, Tensor | None],
    stacklevel: int,
) -> None:
    """A :class:`BaselineWarning` when the best validation loss of ``history`` (the weights
    ``fit`` returns) is more than :data:`GAUSSIAN_MARGIN` above :func:`gaussian_nll` on the same
    rows."""
    best = history.best_valid_loss
    if best is None or not math.isfinite(best):
        return
    gaussian = gaussian_nll(train, valid)
    if gaussian is None or best <= gaussian + GAUSSIAN_MARGIN:
        return
    warnings.warn(BaselineWarning(
        f"the flow's best validation loss, {best:.4g} nats per row, is worse than that of a "
        f"full-covariance Gaussian fitted to the same training rows, {gaussian:.4g}, on the "
        f"same {valid[0].shape[0]} validation rows. Common causes: a few outlying rows that "
        "set the standardization's scale (the bulk of the data then fills a sliver of it: "
        "look for extreme rows, drop them, or pass ", Mention("standardize", "robust"),
        " to the builder), nearly collinear columns (", Mention("standardize", "full"),
        "), too few steps for the data, or too few rows for the flow's size (a smaller flow, "
        "the spline). A Gaussian may also simply be the better model of these data",
    ), stacklevel=stacklevel)
