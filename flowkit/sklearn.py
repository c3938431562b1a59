r"""A MAF density estimator with the scikit-learn API of ``KernelDensity``/``GaussianMixture``.

:class:`FlowDensity` fits a :func:`flowkit.MAF` to the rows of ``X`` by maximum likelihood
(:func:`flowkit.train.fit`) and scores new rows with their exact log-density. Hyper-parameters
are constructor arguments and nothing happens in ``__init__``, so ``clone``, ``get_params`` /
``set_params``, :class:`~sklearn.model_selection.GridSearchCV` and
:class:`~sklearn.pipeline.Pipeline` work as for any scikit-learn estimator.

Units. ``score_samples(X)`` is :math:`\log p(x)` in nats for each row, in the space of the
``X`` given to it. ``score(X)`` is the *mean* log-likelihood per row (as
:meth:`sklearn.mixture.GaussianMixture.score`; :meth:`sklearn.neighbors.KernelDensity.score`
returns the sum instead), so scores of folds of different sizes compare directly.

Standardization. With ``standardize=True`` (the default) the flow is fitted to
:math:`u = (x - \mu) / s` (column means and standard deviations of the training rows) and the
change of variables is undone in the scores,
:math:`\log p(x) = \log q(u) - \sum_d \log s_d`, so they are densities of ``x`` itself. Placing
a :class:`~sklearn.preprocessing.StandardScaler` before the estimator in a ``Pipeline`` also
works, but the pipeline then reports densities of the *scaled* rows (scikit-learn adds no
Jacobian), which do not compare with models fitted to the raw rows.
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from flowkit.checkpoint import CheckpointError, load_model, save_model
from flowkit.flows import MAF
from flowkit.train import (
    MIN_VALID_ROWS,
    DataWarning,
    resolve_device,
    split_rows,
    warn_if_degenerate,
    warn_if_duplicated,
    warn_if_skewed,
    warn_if_worse_than_gaussian,
)
from flowkit.train import fit as fit_flow
from flowkit.validation import (
    ArgumentError,
    Mention,
    check_bool,
    check_float,
    check_int,
    is_int,
)

_DTYPES = {"float32": torch.float32, "float64": torch.float64}

_BASELINE_ADVICE = (
    "Common causes: too few epochs (", Mention("max_epochs"), "), too few rows for the flow's "
    "size (fewer ", Mention("layers"), ", ", Mention("transformer", "spline"), "), nearly "
    "collinear columns, or a few gross outliers that set a column's standard deviation")
"""What a :class:`flowkit.train.BaselineWarning` of :meth:`FlowDensity.fit` suggests."""


def _seed(random_state: int | np.random.RandomState | None) -> int:
    """A torch seed drawn from a scikit-learn ``random_state``."""
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def _refuse_complex(X: object) -> None:
    """Complex rows are refused by name (casting them would drop the imaginary part)."""
    if np.iscomplexobj(X):
        raise ArgumentError("X", "should hold real values. Complex data not supported")


def _fitted_attributes(estimator: BaseEstimator) -> dict[str, object]:
    """The attributes that ``fit`` sets (scikit-learn's convention: names ending in ``_``,
    ``n_features_in_`` and ``feature_names_in_`` included)."""
    return {k: v for k, v in vars(estimator).items() if k.endswith("_") and not k.startswith("_")}


@contextmanager
def _unchanged_on_error(estimator: BaseEstimator) -> Iterator[None]:
    """Put the fitted attributes back as they were before the block if it raises: a failed
    ``fit`` leaves a fitted estimator as it was and an unfitted one unfitted (``validate_data``
    sets ``n_features_in_`` before training can fail)."""
    before = _fitted_attributes(estimator)
    try:
        yield
    except BaseException:
        for name in _fitted_attributes(estimator):
            delattr(estimator, name)
        for name, value in before.items():
            setattr(estimator, name, value)
        raise


def _standardized(
    X: np.ndarray, mean: np.ndarray, scale: np.ndarray, dtype: torch.dtype
) -> torch.Tensor:
    """``(X - mean) / scale`` computed in float64, as a CPU tensor of the flow's ``dtype``."""
    u = (np.asarray(X, dtype=np.float64) - mean) / scale
    return torch.as_tensor(u, dtype=dtype)


@contextmanager
def _torch_seed(seed: int) -> Iterator[None]:
    """Seed torch's global generators inside the block and restore them after it, so that the
    estimator neither depends on nor disturbs the caller's random state."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


class FlowDensity(DensityMixin, BaseEstimator):
    """Density estimation with a Masked Autoregressive Flow.

    Args:
        layers: autoregressive layers of the MAF.
        hidden_features: hidden sizes of each layer's MADE.
        transformer: ``"affine"`` or ``"spline"`` (rational-quadratic).
        transformer_kwargs: options of the transformer, e.g. ``{"bins": 8, "bound": 4.0}``.
        batch_norm: batch normalization between layers.
        lu_linear: a learned LU-linear map after each permutation, as :func:`flowkit.MAF`'s
            default (``False``: the MAF of flowkit before 2026-11-26, with which the tables of
            ``docs/sklearn.md`` were measured).
        standardize: fit the flow to standardized columns and report densities of the raw
            rows (see the module notes).
        max_epochs: passes over the training rows.
        batch_size: rows per step (capped at the number of training rows); None: ``fit``'s
            default, :func:`flowkit.train.default_batch_size` of the training rows.
        lr: Adam learning rate.
        lr_schedule: ``None`` (constant, with which the comparison in ``docs/sklearn.md`` was
            measured), ``"cosine"`` or ``"linear"`` (decay to 0 over ``max_epochs``; see
            :func:`flowkit.train.fit`, whose own default is ``"cosine"`` at ``lr=3e-3``).
        weight_decay: decoupled weight decay (AdamW) when positive.
        validation_fraction: fraction of the rows held out to choose the epoch whose weights
            are kept and to stop early (whole groups of equal rows, when ``X`` repeats rows); 0
            trains on all rows for ``max_epochs``.
        n_iter_no_change: stop after this many epochs without a better validation
            log-likelihood (None: run all epochs, keep the best).
        dtype: ``"float32"`` or ``"float64"``, the precision of the flow. Inputs of any
            floating dtype are accepted; scores and samples are float64 arrays.
        device: torch device for training and scoring (``"cpu"``, ``"cuda"``, ``"auto"``).
        random_state: seeds the initialisation, the validation split, the batch order and
            the MADE orderings (int, ``RandomState`` or None).
        verbose: show the training progress bar.

    Attributes:
        flow_: the fitted :class:`flowkit.Flow` (in evaluation mode, on ``device``), a density
            of the *standardized* rows ``u = (X - mean_) / scale_`` in the flow's ``dtype``, not
            of ``X``: ``log p(x) = flow_.log_prob(u) - sum(log(scale_))`` and ``x = u * scale_
            + mean_`` for its samples, which is what :meth:`score_samples` and :meth:`sample`
            compute (the standardization is done in float64, outside the flow, so that data far
            from zero are not rounded by the cast to float32).
        mean_, scale_: ``(n_features,)`` standardization applied before the flow (0 and 1
            when ``standardize=False``).
        history_: the :class:`flowkit.train.History` of the training run; its losses are NLLs
            of the standardized rows, ``sum(log(scale_))`` below those of ``X``.
        n_features_in_: number of columns seen by ``fit``.

    Example:
        >>> import numpy as np
        >>> X = np.random.default_rng(0).normal(size=(200, 2))
        >>> est = FlowDensity(layers=2, hidden_features=(16,), max_epochs=5, random_state=0)
        >>> est.fit(X).score_samples(X[:3]).shape
        (3,)
        >>> est.sample(4, random_state=0).shape
        (4, 2)
    """

    def __init__(
        self,
        layers: int = 5,
        hidden_features: Sequence[int] = (64, 64),
        transformer: Literal["affine", "spline"] = "affine",
        transformer_kwargs: dict | None = None,
        batch_norm: bool = False,
        lu_linear: bool = True,
        standardize: bool = True,
        max_epochs: int = 100,
        batch_size: int | None = None,
        lr: float = 1e-3,
        lr_schedule: str | None = None,
        weight_decay: float = 0.0,
        validation_fraction: float = 0.1,
        n_iter_no_change: int | None = 10,
        dtype: str = "float32",
        device: str = "cpu",
        random_state: int | np.random.RandomState | None = None,
        verbose: bool = False,
    ):
        self.layers = layers
        self.hidden_features = hidden_features
        self.transformer = transformer
        self.transformer_kwargs = transformer_kwargs
        self.batch_norm = batch_norm
        self.lu_linear = lu_linear
        self.standardize = standardize
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.lr_schedule = lr_schedule
        self.weight_decay = weight_decay
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.dtype = dtype
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self) -> None:
        """Check the hyper-parameters that the estimator itself uses (the MAF's own are
        checked by :func:`flowkit.MAF`, ``device`` by :func:`flowkit.train.fit`); errors name
        them."""
        check_int("max_epochs", self.max_epochs, minimum=1)
        if not isinstance(self.hidden_features, Sequence | np.ndarray) or isinstance(
            self.hidden_features, str
        ):
            raise ArgumentError(
                "hidden_features",
                f"should be a sequence of layer sizes, e.g. (64, 64), got {self.hidden_features!r}",
            )
        for i, units in enumerate(self.hidden_features):
            check_int(f"hidden_features[{i}]", units, minimum=1)
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, minimum=1)
        if self.n_iter_no_change is not None:
            check_int("n_iter_no_change", self.n_iter_no_change, minimum=1)
        check_float("lr", self.lr, minimum=0, exclusive=True)
        check_float("weight_decay", self.weight_decay, minimum=0)
        if check_float("validation_fraction", self.validation_fraction, minimum=0) >= 1:
            raise ArgumentError(
                "validation_fraction", f"should be in [0, 1), got {self.validation_fraction!r}"
            )
        for name in ("standardize", "verbose"):
            check_bool(name, getattr(self, name))
        if self.dtype not in _DTYPES:
            raise ArgumentError("dtype", f"should be 'float32' or 'float64', got {self.dtype!r}")
        try:
            check_random_state(self.random_state)
        except ValueError as e:
            raise ArgumentError(
                "random_state",
                f"should be None, an integer or a numpy RandomState, got {self.random_state!r}",
            ) from e

    def fit(self, X: np.ndarray, y: None = None) -> FlowDensity:
        """Fit the flow to the rows of ``X``, ``(n_samples, n_features)``; ``y`` is ignored.

        The fitted attributes are set together once training has succeeded: a ``fit`` that
        raises (a refused hyper-parameter, a diverging run) leaves the estimator as it was, a
        previous fit intact and usable, and an estimator never fitted still unfitted."""
        self._check_params()
        _refuse_complex(X)
        with _unchanged_on_error(self):  # validate_data sets n_features_in_ at once
            X = validate_data(self, X, dtype=[np.float64, np.float32], ensure_min_samples=2)
            rng = check_random_state(self.random_state)
            seed = _seed(rng)
            # the checks of fit's data, on the rows the user passed (fit sees standardized ones)
            rows = torch.tensor(X, dtype=torch.float64)
            labels = getattr(self, "feature_names_in_", None)  # a data frame's columns
            warn_if_degenerate("X", rows, stacklevel=4,
                               labels=None if labels is None else [str(v) for v in labels])
            groups = warn_if_duplicated("X", rows, stacklevel=4)
            if self.transformer == "affine":
                warn_if_skewed("X", rows, stacklevel=4, labels=None if labels is None else [
                    str(v) for v in labels], remedy=(
                    "Take the logarithm of those columns before fitting (np.log; then "
                    "log p(x) = log p(log x) - sum(log x) over them), or use the spline (",
                    Mention("transformer", "spline"), ")"))
            if self.standardize:
                mean = X.mean(axis=0).astype(np.float64)
                scale = X.std(axis=0).astype(np.float64)
                scale = np.where(scale > 0, scale, 1.0)  # constant columns: leave as they are
            else:
                mean, scale = np.zeros(X.shape[1]), np.ones(X.shape[1])
            u = _standardized(X, mean, scale, _DTYPES[self.dtype])
            if overflow := torch.isinf(u).any(dim=1).nonzero().flatten()[:5].tolist():
                raise ArgumentError(
                    "X", f"has values beyond the range of {self.dtype} (rows {overflow}, "
                    f"after standardize={self.standardize}): pass standardize=True or "
                    "dtype='float64'")
            u, valid = self._split(u, rng, groups)
            optimizer = "adam"
            if self.weight_decay > 0:
                optimizer = functools.partial(torch.optim.AdamW, weight_decay=self.weight_decay)
            with _torch_seed(seed):
                flow = MAF(
                    X.shape[1],
                    layers=self.layers,
                    hidden_features=tuple(self.hidden_features),
                    transformer=self.transformer,
                    transformer_kwargs=self.transformer_kwargs,
                    batch_norm=self.batch_norm,
                    lu_linear=self.lu_linear,
                    standardize=False,  # done above, in float64 (and not at all when not asked)
                    seed=seed,
                ).to(device=resolve_device(self.device), dtype=_DTYPES[self.dtype])
                history = fit_flow(
                    flow,
                    u,
                    valid=valid,
                    epochs=self.max_epochs,
                    batch_size=None if self.batch_size is None else min(self.batch_size, len(u)),
                    lr=self.lr,
                    lr_schedule=self.lr_schedule,  # checked by fit, by this name
                    optimizer=optimizer,
                    early_stopping_patience=self.n_iter_no_change if valid is not None else None,
                    restore_best=valid is not None,
                    seed=seed,
                    device=self.device,
                    progress=self.verbose,
                    data_warnings=False,  # said above, about X
                )
            if valid is not None:
                warn_if_worse_than_gaussian(history, (u, None), (valid, None), stacklevel=3,
                                            advice=_BASELINE_ADVICE)
        self.mean_, self.scale_, self.flow_, self.history_ = mean, scale, flow, history
        return self

    def _split(
        self, u: torch.Tensor, rng: np.random.RandomState, groups: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The training and validation rows of ``u`` (``validation_fraction`` of them, at least
        one, drawn from ``rng``; whole groups of equal rows when there are ``groups``, as
        ``fit(valid=<fraction>)`` holds them out; no validation rows when it is 0)."""
        n = len(u)
        n_valid = math.ceil(self.validation_fraction * n) if self.validation_fraction else 0
        if not n_valid:
            return u, None
        if n_valid >= n:
            raise ArgumentError(
                "validation_fraction",
                f"({self.validation_fraction}) leaves no training rows out of the {n} rows of "
                "'X'",
            )
        kept, held = split_rows(torch.as_tensor(rng.permutation(n)), n_valid, groups)
        if len(kept) == 0:
            raise ArgumentError("validation_fraction", f"holds out every row of 'X': its {n} "
                                "rows are all copies of one another")
        if self.batch_norm and len(kept) < 2:
            raise ArgumentError(
                "validation_fraction",
                Mention("validation_fraction", self.validation_fraction),
                f" holds out {len(held)} of the {n} rows of 'X', which leaves {len(kept)} to "
                "train on, but ", Mention("batch_norm", True),
                " needs batches of at least 2 rows: pass more rows, or a smaller ",
                Mention("validation_fraction"), " (0 trains on all of them)",
            )
        if len(held) < MIN_VALID_ROWS:
            warnings.warn(
                f"validation_fraction={self.validation_fraction!r} of the {n} rows of 'X' holds "
                f"out {len(held)}: a validation loss over so few rows is noisy, and it chooses "
                "the epoch whose weights are kept and when training stops; pass a larger "
                "validation_fraction, or 0 to train on every row for max_epochs",
                DataWarning, stacklevel=4,
            )
        return u[kept], u[held]

    def __getstate__(self) -> dict:
        """For pickle and joblib: the fitted flow as the bytes of a flowkit file (its config,
        weights and a SHA-256 checksum, :func:`flowkit.save_model`), so that a damaged pickle
        of a fitted estimator fails to load instead of scoring with damaged weights."""
        state = dict(super().__getstate__())  # (object's is the instance's own __dict__)
        flow = state.pop("flow_", None)
        if flow is not None:
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "flow.pt")
                save_model(flow, path)
                with open(path, "rb") as f:
                    state["flow_file_"] = (f.read(), flow.training)
        return state

    def __setstate__(self, state: dict) -> None:
        stored = state.pop("flow_file_", None)
        if stored is not None:
            data, training = stored
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "flow.pt")
                with open(path, "wb") as f:
                    f.write(data)
                try:
                    state["flow_"] = load_model(path).train(training)
                except CheckpointError as e:  # named as what the user loaded, not the file
                    raise CheckpointError(
                        "the flow of this pickled FlowDensity is damaged: "
                        + str(e).replace(f"'{path}'", "its file")) from None
        super().__setstate__(state)

    def score_samples(self, X: np.ndarray) -> np.ndarray:
        """Log-density ``log p(x)`` of each row of ``X``, ``(n_samples,)`` float64, in nats."""
        check_is_fitted(self)
        _refuse_complex(X)
        X = validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        weight = next(self.flow_.parameters())  # the fitted flow's dtype and device
        u = _standardized(X, self.mean_, self.scale_, weight.dtype)
        with torch.no_grad():
            log_q = torch.cat([
                self.flow_.log_prob(chunk.to(weight.device)).cpu() for chunk in u.split(8192)
            ])
        return log_q.double().numpy() - np.log(self.scale_).sum()

    def score(self, X: np.ndarray, y: None = None) -> float:
        """Mean log-likelihood per row of ``X`` (GaussianMixture's convention; multiply by
        ``len(X)`` for KernelDensity's total)."""
        return float(self.score_samples(X).mean())

    def sample(
        self, n_samples: int = 1, random_state: int | np.random.RandomState | None = None
    ) -> np.ndarray:
        """Draw ``n_samples`` rows from the fitted density, ``(n_samples, n_features)`` float64.

        ``random_state`` seeds the draw (the global torch generators are left untouched)."""
        check_is_fitted(self)
        if not is_int(n_samples) or n_samples < 1:
            raise ValueError(f"'n_samples' should be a positive integer, got {n_samples!r}")
        with _torch_seed(_seed(random_state)):
            u = self.flow_.sample(int(n_samples)).cpu().double().numpy()
        return u * self.scale_ + self.mean_
