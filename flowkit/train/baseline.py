"""The floor a fitted flow should clear: a full-covariance Gaussian fitted to the same rows.

A flow that scores its validation rows worse than a Gaussian fitted to its training rows has
failed at something the simplest density model gets right: a few outlying rows that set the
standardization's scale (the bulk of the data then sits in a sliver of the flow's input),
nearly collinear columns, too few rows for the flow's size, too few steps. :func:`fit`
compares the two on the rows it held out (``valid="auto"`` or a fraction) and says so with a
:class:`BaselineWarning`; the numbers are in nats per row, in the data's units.

The Gaussian is the maximum-likelihood one, in float64. With a context it is the Gaussian of
``x`` given the context that a joint Gaussian of ``(x, context)`` implies: a linear regression
of ``x`` on the context with Gaussian noise, fitted by least squares (so that contexts whose
covariance is singular, one-hot labels, need no inverse of it).
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from ..validation import Mention, Worded
from .history import History

GAUSSIAN_MARGIN = 0.05
"""How much worse, in nats per validation row, the flow's best validation loss must be than the
Gaussian's for :func:`fit` to warn. The two are scored on the same rows, and the flow's loss is
the best of its validations on them, which favours the flow: in review 60's audit (90 runs of
23 data sets, 300 to 3000 steps, a separate test split) every flow that validated worse than the
Gaussian was at least as much worse on the test rows, and no warning at 0.05 or 0.1 was a false
alarm; at 0.1, 10 warnings and 20 flows worse on test by more than 0.1 nats left unwarned; at
0.05, 16 and 15. A flow that validates better on a few dozen rows and is worse on test (small
data sets) is not caught."""

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
    maximum likelihood to ``train`` (the same form, ``N`` rows): ``-log N(x | mu, S)``, or with
    a context ``-log N(x | A [1, c], S)``, ``A`` the least-squares regression of ``x`` on the
    context and ``S`` its residuals' covariance (the conditional of the joint Gaussian). None
    where that covariance is singular (fewer rows than columns, a constant column)."""
    (x, c), (x_valid, c_valid) = train, valid
    x, x_valid = x.double(), x_valid.double()
    if x.shape[1] + (0 if c is None else c.shape[1]) > MAX_BASELINE_COLUMNS:
        return None
    if c is None or c_valid is None:
        mean = x.mean(0)
        residuals, residuals_valid = x - mean, x_valid - mean
    else:
        design, design_valid = (torch.cat([torch.ones_like(v[:, :1]), v], 1)
                                for v in (c.double(), c_valid.double()))
        coefficients = torch.linalg.lstsq(design, x, driver="gelsd").solution
        residuals = x - design @ coefficients
        residuals_valid = x_valid - design_valid @ coefficients
    rows, k = residuals.shape
    if rows <= k:
        return None
    chol, info = torch.linalg.cholesky_ex(residuals.T @ residuals / rows)
    if info != 0 or not bool(torch.isfinite(chol).all()):
        return None
    white = torch.linalg.solve_triangular(chol, residuals_valid.T, upper=False)
    log_det = 2 * chol.diagonal().log().sum()
    value = float((0.5 * (white.square().sum(0) + log_det + k * math.log(2 * math.pi))).mean())
    return value if math.isfinite(value) else None


def warn_if_worse_than_gaussian(
    history: History,
    train: tuple[Tensor, Tensor | None],
    valid: tuple[Tensor, Tensor | None],
    stacklevel: int,
    advice: tuple[str | Mention, ...] | None = None,
) -> None:
    """A :class:`BaselineWarning` when the best validation loss of ``history`` (the weights
    ``fit`` returns) is more than :data:`GAUSSIAN_MARGIN` above :func:`gaussian_nll` on the same
    rows. ``advice``: what the message suggests (default: the builders' options)."""
    best = history.best_valid_loss
    if best is None or not math.isfinite(best):
        return
    gaussian = gaussian_nll(train, valid)
    if gaussian is None or best <= gaussian + GAUSSIAN_MARGIN:
        return
    warnings.warn(BaselineWarning(
        f"the flow's best validation loss, {best:.4g} nats per row, is worse than that of a "
        f"full-covariance Gaussian fitted to the same training rows, {gaussian:.4g}, on the "
        f"same {valid[0].shape[0]} validation rows. ",
        *(advice or ("Common causes: a few outlying rows that set the standardization's scale "
                     "(the bulk of the data then fills a sliver of it: look for extreme rows "
                     "and drop them, or use ", Mention("standardize", "robust"), "), nearly "
                     "collinear columns (drop one; ", Mention("standardize", "full"),
                     " helps), too few steps for the data, or too few rows for the flow's size "
                     "(a smaller flow, the spline)")),
        ". A Gaussian may also simply be the better model of these data",
    ), stacklevel=stacklevel)
