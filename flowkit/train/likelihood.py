r"""Maximum likelihood: :func:`fit`, and the batch source it builds before the first step.

:func:`fit` checks its settings, turns ``data`` into a batch source
(:mod:`flowkit.train.sources`, holding out rows for ``valid=<fraction>``) and ``valid`` into a
validation loss (:mod:`flowkit.train.held_out`), checks the first batch against the model and
sets the model's standardization from the data (:mod:`flowkit.train.preflight`), and hands the
loss (:class:`~flowkit.train.objectives.NegLogLikelihood`) to the shared engine in
:mod:`flowkit.train.loop`.
"""

from __future__ import annotations

import warnings
from numbers import Real
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from ..flows import Flow
from ..transforms import Affine, BatchNorm, MaskedAutoregressive, Standardize
from ..validation import ArgumentError, Mention, check_bool, check_int, is_int, reference
from .arrays import (
    DataWarning,
    equal_row_groups,
    frame_labels,
    frames_as_arrays,
    load_arrays,
    split_rows,
    warn_if_duplicated,
    warn_if_outlying,
    warn_if_skewed,
)
from .baseline import warn_if_worse_than_gaussian
from .held_out import held_out_loss
from .history import History
from .loop import RunPlan, Trainer
from .objectives import NegLogLikelihood, Objective, require_method
from .options import TrainOptions, Unpack, resolve
from .preflight import (
    check_batches_for_batch_norm,
    check_first_batch,
    check_first_batch_and_standardize,
    input_bounds,
)
from .session import Session, session
from .sources import LoaderSource, SamplerSource, TensorSource, derive_seed


def fit(
    model: nn.Module,
    data: Any,
    *,
    valid: Any = "auto",
    steps: int | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    valid_every: int | None = None,
    early_stopping_patience: int | None = None,
    restore_best: bool | None = None,
    data_warnings: bool = True,
    **options: Unpack[TrainOptions],
) -> History:
    r"""Fit ``model`` to data by maximum likelihood.

    Minimises the mean negative log-likelihood of mini-batches,
    :math:`\mathcal{L}(\theta) = -\frac{1}{B}\sum_{i=1}^{B} \log p_\theta(x_i \mid c_i)`, in nats
    per sample. ``model`` is moved to ``device``, trained in place and left in evaluation mode.

    Args:
        model: any ``nn.Module`` with ``log_prob(x) -> (N,)`` or ``log_prob(x, context) -> (N,)``
            (flows, discrete MADE models, your own). If it has a ``features`` attribute, data must
            have shape ``(N, features)``; otherwise any ``(N, ...)`` its ``log_prob`` accepts. If
            it has a ``check_data(x, name)`` method (the discrete MADEs: binary values, category
            indices), the whole of array ``data`` and ``valid`` goes through it (the first batch
            of a DataLoader or sampling function).
        data: the training data, one of

            * a tensor or numpy array ``x`` of shape ``(N, D)``, or a pair ``(x, context)`` (a
              tuple, or a list of the two arrays) with ``context`` of shape ``(N, C)``; copied
              to ``device`` once, reshuffled every epoch; a data frame (pandas, polars) in
              place of an array is taken as the array of its values, if every column holds
              numbers;
            * a :class:`~torch.utils.data.DataLoader` yielding ``x`` or ``(x, context)`` batches
              (under ``torchrun`` it must use a ``DistributedSampler``);
            * a function ``sample(n, generator) -> x`` or ``-> (x, context)`` drawing ``n`` fresh
              samples from a :class:`torch.Generator` on ``device`` at every step.

            Floating ``x`` and every context are cast to the model's floating dtype; integer and
            bool ``x`` (class indices for a :class:`~flowkit.CategoricalMADE`) keep their dtype.
            Complex values are refused. Array data that the cast rounds to fewer than 1000 steps
            per standard deviation in some column raise a
            :class:`~flowkit.train.PrecisionWarning`; for a :class:`~flowkit.Flow`, a single
            row, a constant column, one with at most 5% as many distinct values as rows
            (counts, pixels, coarse rounding), one in which a single value holds 20% of the
            rows (a point mass), or 5% of the rows repeating earlier ones, raises a
            :class:`~flowkit.train.DataWarning` (``data_warnings=False`` turns these off);
            so do rows exactly on a finite end of a flow's ``bounds``. Fewer than 150 training
            rows for a flow with affine autoregressive layers (which extrapolate without
            bound: prefer the spline on small data) raise one whatever ``data_warnings``.

            Before the first step, the model's :class:`~flowkit.transforms.Standardize`
            modules (the builders' default ``standardize=True``) that are not set, or set only
            provisionally by an earlier call such as a look at samples, are set from the whole
            of array ``data`` (a pass that stops at them); with a DataLoader or a sampling
            function, from the first batch. Loaded or resumed models keep theirs.
        valid: validation data as a tensor, array, pair or DataLoader, whose mean negative
            log-likelihood is the validation loss; a fraction in (0, 1) of array ``data`` to
            hold out for it (e.g. ``valid=0.1``: a random tenth of the rows, drawn from
            ``seed``, validates and the rest trains; for a flow, whole groups of equal rows,
            so that no validation row has a copy among the training rows); or a function
            ``valid(model) -> float`` returning the validation loss itself (called in
            evaluation mode without gradients, e.g. to score a MADE with one fixed mask set).
            Computed every ``valid_every`` steps and at the end. Default ``"auto"``: array
            ``data`` of ``N`` rows has rows held out as a fraction does,
            :func:`auto_valid_rows` of them (a tenth, at least ``min(20, N // 5)``; none below
            5 rows), and the run ends with the weights of the best validation: a flow trained
            on a few hundred rows for many epochs overfits them by orders of magnitude in
            held-out nats, silently without validation (docs/defaults.md, "Validation by
            default"). A DataLoader or a sampling function gets no validation. ``None``
            trains on every row without validation.
        steps: number of optimizer steps. Exactly one of ``steps`` and ``epochs`` is required.
        epochs: number of passes over finite ``data`` (for arrays, the rows left to train on
            after the validation rows are held out, ``// batch_size`` steps each;
            ``len(loader)`` for DataLoaders).
        batch_size: global batch size (split evenly over ``torchrun`` processes, so results do
            not depend on the number of processes). Default ``None``: for array ``data`` of
            ``N`` rows, ``N // 16`` rows between 16 and 256 (all rows when there are fewer than
            16; :func:`default_batch_size`), so a small data set gets several steps per epoch;
            256 for a sampling function. A ``batch_size`` you pass that exceeds the rows is an
            error. Ignored for DataLoaders, which batch themselves.
        valid_every: steps between validations; default once per epoch for arrays and
            DataLoaders with a length, else every 100 steps.
        early_stopping_patience: stop after this many validations without a new best validation
            loss, and in any case end with the best weights restored. Needs ``valid``.
        restore_best: end with the weights of the best validation. Default ``None``: yes
            whenever the run validates (``valid`` given, or rows held out by ``"auto"``; and
            implied by ``early_stopping_patience``), so that a small data set, which a flow
            overfits within an epoch or two, ends with the weights of its best validation
            rather than the last ones. ``False`` keeps the last step's weights; ``True`` needs
            validation.
        data_warnings: raise the :class:`~flowkit.train.DataWarning`\ s about array ``data``
            of a flow (constant or discrete columns, point masses, repeated rows). ``False``
            when you have checked the rows yourself, as :class:`~flowkit.sklearn.FlowDensity`
            does on the rows it was given before it standardizes them: the same warning is
            then not raised twice, and no warnings filter is changed (a change of the filters
            makes Python show every warning again). Not about the data, and raised either
            way: a :class:`~flowkit.train.BaselineWarning` when the flow returned scores the rows
            held out (``valid="auto"`` or a fraction) worse than a full-covariance Gaussian of
            the training rows (:mod:`flowkit.train.baseline`).
        **options: the options shared with :func:`~flowkit.train.fit_reverse_kl`, described in
            :class:`~flowkit.train.TrainOptions`: ``lr``, ``optimizer``, ``lr_schedule``,
            ``clip_grad_norm``, ``divergence_threshold``, ``seed``, ``device``,
            ``checkpoint_dir``, ``checkpoint_every``, ``resume``, ``progress``, ``log_every``,
            ``callbacks``.

    Returns:
        The :class:`~flowkit.train.History` of the run (including resumed segments).

    Raises:
        TypeError: ``model`` has no ``log_prob``, ``data`` is of an unsupported kind, or an
            unknown option.
        ValueError: bad settings or data that does not fit the model (checked before training;
            :class:`~flowkit.validation.ArgumentError` names the argument).
        NonFiniteLossError: the loss or the weights became NaN/Inf; the model keeps its last
            finite weights (its best validation's, when the run keeps them) and the last
            checkpoint is kept.
        DivergenceError: the loss rose far above its best (``divergence_threshold``); likewise.
            A run that keeps its best validation's weights (``restore_best``) ends there
            instead, returning them with a :class:`~flowkit.train.DivergenceWarning`
            (``History.diverged_step``).

    Example:
        >>> import torch, flowkit
        >>> flow = flowkit.MAF(2, hidden_features=(16,), layers=2)
        >>> x = torch.randn(512, 2) * torch.tensor([2.0, 0.5])
        >>> history = fit(flow, x, steps=50, batch_size=128, seed=0, progress=False)
        >>> len(history.train_loss)
        50
    """
    require_method(model, "log_prob", "fit")
    o = resolve("fit", options)
    if (steps is None) == (epochs is None):
        raise ArgumentError(
            "steps", "pass exactly one of ", Mention("steps"), " and ", Mention("epochs"),
            f", got steps={steps!r} and epochs={epochs!r}",
        )
    steps, epochs, valid_every, early_stopping_patience, batch_size = (  # Python ints
        None if value is None else check_int(name, value, minimum=1) for name, value in (
            ("steps", steps), ("epochs", epochs), ("valid_every", valid_every),
            ("early_stopping_patience", early_stopping_patience), ("batch_size", batch_size)))
    if restore_best is not None:
        check_bool("restore_best", restore_best)
    check_bool("data_warnings", data_warnings)
    _check_validation_needs(valid, early_stopping_patience, restore_best)
    holdout = _holdout_fraction(valid)
    with session(model, o["device"], o["seed"], o["checkpoint_dir"], o["resume"], "nll") as s:
        ref = reference(model)
        dtype = torch.get_default_dtype() if ref is None else ref.dtype
        source, held_out = _make_source(model, data, batch_size, s, dtype, holdout,
                                        data_warnings)
        if holdout is not None:
            valid = held_out  # None where valid="auto" held nothing out
            _check_validation_needs(valid, early_stopping_patience, restore_best, auto=True)
        if any(isinstance(m, BatchNorm) for m in model.modules()):
            check_batches_for_batch_norm(source)
        if epochs is not None:
            if source.batches_per_epoch is None:
                raise ArgumentError(
                    "epochs", Mention("epochs"), " needs data of known length (an array or a "
                    "DataLoader with len()); pass ", Mention("steps"), " instead",
                )
            steps = epochs * source.batches_per_epoch
            if steps == 0:  # an empty DataLoader: the message of one passed with steps
                raise ValueError("the DataLoader passed as 'data' yields no batches")
        assert steps is not None
        validate = None
        if valid is not None:
            validate = held_out_loss(model, valid, batch_size or DEFAULT_BATCH_SIZE, s, dtype)
            valid_every = valid_every or source.batches_per_epoch or 100
        keep_best = valid is not None if restore_best is None else restore_best
        plan = RunPlan(steps, valid_every, early_stopping_patience, keep_best)
        trainer = Trainer(s, model, Objective(model, NegLogLikelihood()), source, o, plan, validate)
        history = trainer.run(lambda args: check_first_batch_and_standardize(model, source, *args))
    if not isinstance(source, LoaderSource):
        history.batch_size = source.batch_size
    if isinstance(source, TensorSource):
        history.train_rows = source.x.shape[0]
    if keep_best:
        _warn_if_never_improved(history)
    if (held_out is not None and valid is held_out and keep_best
            and isinstance(model, Flow) and isinstance(source, TensorSource)):
        warn_if_worse_than_gaussian(history, (source.x, source.c), held_out, stacklevel=2)
    return history


WORSENED = 0.05
"""How much worse than the first validation loss the last must be, relative to
``max(1, |first|)``, for :func:`fit` to warn that it returns the weights of that first
validation (a flat validation loss means the early weights are as good as any)."""


def _warn_if_never_improved(history: History) -> None:
    """Warn when the first of several validations was the best and the validation loss then
    grew: the weights returned are those of that early step (``restore_best``), and the
    training after it only fitted the training rows."""
    losses = history.valid_loss
    if len(losses) < 3 or history.best_step != history.valid_steps[0]:
        return
    first, last = losses[0], losses[-1]
    if last - first <= WORSENED * max(1.0, abs(first)):
        return
    warnings.warn(
        f"the first validation (step {history.best_step}) had the lowest validation loss of "
        f"the {len(losses)}, and it grew from {first:.4g} to {last:.4g}: the weights returned "
        f"are those of step {history.best_step} (restore_best), and the training after it only "
        "fitted the training data. That is expected when the model starts close to the data's "
        "density (a bounded flow on near-uniform data); otherwise, with few validation rows, "
        "validate on more, or lower the learning rate, or check that the training and "
        "validation data come from the same distribution", UserWarning, stacklevel=3,
    )


DEFAULT_BATCH_SIZE = 256
""":func:`fit`'s batch size when none is passed, for large arrays and for sampling functions."""

MIN_DEFAULT_BATCH_SIZE = 16
"""The smallest batch :func:`default_batch_size` chooses (unless the data has fewer rows)."""


def default_batch_size(rows: int | None, processes: int = 1) -> int:
    """:func:`fit`'s batch size when none is passed: about 16 steps per epoch for array data of
    ``rows`` rows, between :data:`MIN_DEFAULT_BATCH_SIZE` (16) and :data:`DEFAULT_BATCH_SIZE`
    (256) rows, and never more than ``rows``; 256 for data without a length (``None``). Under
    ``torchrun``, rounded down to a multiple of the number of ``processes`` (each takes an
    equal share; at least one row each).

    Small data sets overfit within a few dozen full-batch steps; smaller batches take more,
    noisier steps per epoch before the validation loss turns, and reach better held-out
    log-likelihoods (docs/defaults.md, "Batch size").

    Example:
        >>> [default_batch_size(n) for n in (10, 150, 1000, 4096, 10**6, None)]
        [10, 16, 62, 256, 256, 256]
        >>> [default_batch_size(n, processes=3) for n in (10, 1000, None)]
        [9, 60, 255]
    """
    size = DEFAULT_BATCH_SIZE if rows is None else min(
        rows, max(MIN_DEFAULT_BATCH_SIZE, min(DEFAULT_BATCH_SIZE, rows // 16)))
    return max(processes, size - size % processes)


def _check_validation_needs(
    valid: Any, patience: int | None, restore_best: bool | None, auto: bool = False
) -> None:
    """Refuse ``early_stopping_patience`` and ``restore_best=True`` without validation data
    (``auto``: ``valid="auto"`` held no rows out, of data that are no array or too few)."""
    if valid is not None:
        return
    why = ("; valid='auto' holds out rows of array data only (of 5 rows or more)" if auto
           else "")
    if patience is not None:
        raise ArgumentError("early_stopping_patience", Mention("early_stopping_patience"),
                            " needs validation data: pass ", Mention("valid"), why)
    if restore_best:
        raise ArgumentError("restore_best", Mention("restore_best", True),
                            " needs validation data: pass ", Mention("valid"), why)


AUTO_VALID_FRACTION = 0.1
"""The share of array data that :func:`fit`'s default ``valid="auto"`` holds out."""


def auto_valid_rows(rows: int) -> int:
    """How many of ``rows`` rows of array data :func:`fit`'s default ``valid="auto"`` holds
    out for validation: a tenth (:data:`AUTO_VALID_FRACTION`), but at least
    ``min(MIN_VALID_ROWS, rows // 5)``, so that a data set of a few hundred rows or fewer is
    validated on up to 20 rows, not on a handful; none below 5 rows.

    Example:
        >>> [auto_valid_rows(n) for n in (4, 15, 50, 100, 150, 300, 10_000)]
        [0, 3, 10, 20, 20, 30, 1000]
    """
    return max(round(AUTO_VALID_FRACTION * rows), min(MIN_VALID_ROWS, rows // 5))


def held_out_rows(valid: float | str | None, rows: int) -> int:
    """How many of ``rows`` rows of array data :func:`fit` sets out to hold out for ``valid``
    (a fraction, ``"auto"`` or ``None``): ``round(valid * rows)``, :func:`auto_valid_rows`, or
    none. (Whole groups of equal rows may make it more, see ``valid``.)

    Example:
        >>> [held_out_rows(v, 150) for v in (0.1, "auto", None)]
        [15, 20, 0]
    """
    if valid is None:
        return 0
    return auto_valid_rows(rows) if valid == "auto" else round(valid * rows)


def _holdout_fraction(valid: Any) -> float | str | None:
    """``valid`` as the fraction of array data to hold out, ``"auto"``, or ``None`` if it is
    data."""
    if isinstance(valid, str):
        if valid != "auto":
            raise ArgumentError("valid", "should be validation data, a fraction in (0, 1), "
                                f"'auto' or None, got the string {valid!r}")
        return valid
    if isinstance(valid, bool) or not isinstance(valid, Real):
        return None
    if is_int(valid):
        raise ArgumentError("valid", "as a fraction of the data to hold out should be a float "
                            f"in (0, 1), got the integer {valid!r}")
    if not 0 < valid < 1:
        raise ArgumentError("valid", "as a fraction of the data to hold out should be in "
                            f"(0, 1), got {valid!r}")
    return float(valid)


HOLDOUT_SEED_KEY = 7
"""Mixed with the run's seed to draw the rows that ``valid=<fraction>`` holds out."""


def _make_source(
    model: nn.Module,
    data: Any,
    batch_size: int | None,
    s: Session,
    dtype: torch.dtype,
    holdout: float | str | None,
    data_warnings: bool,
) -> tuple[TensorSource | LoaderSource | SamplerSource, tuple[Tensor, Tensor | None] | None]:
    """The batch source of ``data``, and the rows held out for validation when ``holdout`` (a
    fraction, or ``"auto"``; none of data that are no array) is given: :func:`held_out_rows`
    random rows of array data, drawn from the run's seed. Array data
    is checked whole against ``model`` here
    (:func:`~flowkit.train.preflight.check_first_batch`), before rows are held out, so that a
    message numbers the rows as they were passed; for a :class:`~flowkit.Flow`, also for
    degenerate columns and repeated rows (with ``data_warnings``)."""
    labels = frame_labels(data)  # for the data warnings
    data = frames_as_arrays("data", data)
    if isinstance(data, list) and len(data) == 2 and all(
        isinstance(v, Tensor | np.ndarray) for v in data
    ):
        data = tuple(data)  # a pair [x, context], as ``valid`` accepts it
    auto = holdout == "auto"
    if auto and not isinstance(data, Tensor | np.ndarray | tuple):
        holdout = None
    if holdout is not None and not isinstance(data, Tensor | np.ndarray | tuple):
        raise ArgumentError("valid", Mention("valid", holdout), " holds out a fraction of array "
                            f"data, but 'data' is a {type(data).__name__}: pass validation data")
    if isinstance(data, DataLoader):
        return LoaderSource(data, s.dist, s.device, dtype), None
    if callable(data) and not isinstance(data, Tensor | np.ndarray):
        source = SamplerSource(data, batch_size or default_batch_size(None, s.dist.world_size),
                               s.seed, s.dist,
                               s.device, dtype)
        return source, None
    if isinstance(data, Tensor | np.ndarray | tuple):
        density = isinstance(model, Flow)  # a density of real values: no mass on points
        arrays = load_arrays("data", data, s.device, dtype, density=density and data_warnings,
                             labels=labels)
        check_first_batch(model, *arrays, batch=False)  # (refused data get no warnings)
        groups = None  # of equal rows, from one sort of the rows
        if density and data_warnings:
            groups = warn_if_duplicated("data", *arrays, stacklevel=5)
            if _standardizes_by_moments(model):  # rows numbered as passed: before the holdout
                warn_if_outlying("data", arrays[0], skip=_bounded_columns(model),
                                 stacklevel=5, labels=labels)
        elif density and holdout is not None:
            groups = equal_row_groups(*arrays)
        held_out, rows = None, arrays[0].shape[0]
        k = held_out_rows(holdout, rows)
        if holdout is not None and (k or not auto):  # a fraction that holds out 0 is an error
            # a flow's validation rows without copies among its training rows
            arrays, held_out = _hold_out(arrays, k, holdout, s.seed, groups)
            _check_batch_fits(batch_size, arrays[0].shape[0], rows, holdout)
        if density:  # about the model and the number of rows, not their values
            _warn_if_affine_on_few_rows(model, arrays[0].shape[0])
        if density and data_warnings and _has_affine_layers(model):
            warn_if_skewed("data", arrays[0], skip=_bounded_columns(model), stacklevel=5,
                           labels=labels)

        if batch_size is None:
            batch_size = default_batch_size(arrays[0].shape[0], s.dist.world_size)
        return TensorSource(arrays, batch_size, s.seed, s.dist, holdout), held_out
    raise TypeError(
        "'data' should be a tensor, a numpy array, a pair (x, context), a DataLoader or a "
        f"function sample(n, generator); got {type(data).__name__}"
    )


FEW_ROWS_FOR_AFFINE = 150
"""Training rows below which :func:`fit` warns that a flow with affine autoregressive layers
extrapolates badly (docs/defaults.md, "Validation by default")."""


def _has_affine_layers(model: nn.Module) -> bool:
    return any(isinstance(m, MaskedAutoregressive) and isinstance(m.transformer, Affine)
               for m in model.modules())


def _standardizes_by_moments(model: nn.Module) -> bool:
    """Whether ``model`` standardizes its data by their mean and standard deviation."""
    return any(isinstance(m, Standardize) and m.role == "data" and not m.robust
               for m in model.modules())


def _bounded_columns(flow: nn.Module) -> list[int]:
    """The columns a :class:`~flowkit.transforms.Logit` first in ``flow`` gives a finite bound."""
    box = input_bounds(flow)
    if box is None:
        return []
    return (torch.isfinite(box.low) | torch.isfinite(box.high)).nonzero().flatten().tolist()


def _warn_if_affine_on_few_rows(model: nn.Module, rows: int) -> None:
    """A :class:`DataWarning` when a flow with affine autoregressive layers is to be trained on
    fewer than :data:`FEW_ROWS_FOR_AFFINE` rows."""
    if rows >= FEW_ROWS_FOR_AFFINE or not _has_affine_layers(model):
        return
    warnings.warn(DataWarning(
        Mention("data"), f" leaves {rows} rows to train a flow with affine autoregressive "
        "layers, whose shifts and scales grow without bound beyond the training rows: on data "
        "this small some held-out rows score hundreds to millions of nats, however well it "
        "validates (docs/defaults.md, 'Validation by default'). The spline (",
        Mention("transformer", "spline"), ") does not",
    ), stacklevel=4)


def _check_batch_fits(batch_size: int | None, train: int, rows: int, given: float | str) -> None:
    """A ``batch_size`` passed that exceeds the rows left to train on after the holdout
    ``given`` (``valid``) is refused, naming both."""
    if batch_size is not None and batch_size > train:
        raise ArgumentError(
            "batch_size", Mention("batch_size"), f" ({batch_size}) exceeds the {train} training "
            f"rows left after ", Mention("valid", given), f" held out {rows - train} of the "
            f"{rows} rows passed; pass batch_size <= {train}, or ", Mention("valid", None),
            " to train on every row",
        )


MIN_VALID_ROWS = 20
"""Fewest rows that ``valid=<fraction>`` holds out without a :class:`DataWarning`."""


def _hold_out(
    arrays: tuple[Tensor, Tensor | None],
    k: int,
    valid: float | str,
    seed: int,
    groups: Tensor | None,
) -> tuple[tuple[Tensor, Tensor | None], tuple[Tensor, Tensor | None] | None]:
    """``(training, held_out)``: ``k`` random rows (drawn from ``seed``) held out of
    ``arrays`` ``(x, context)`` for ``valid`` (a fraction, or ``"auto"``:
    :func:`held_out_rows`); with ``groups`` of equal rows
    (:func:`~flowkit.train.arrays.equal_row_groups`), whole groups, at least that many rows.
    A :class:`DataWarning` when fewer than :data:`MIN_VALID_ROWS` are held out of a fraction
    the user chose. With ``"auto"``, which chose ``k``, nothing is held out (``held_out`` is
    ``None``, with a :class:`DataWarning`) where the groups would make it more than twice ``k``
    rows, or every row."""
    x, c = arrays
    n, auto = x.shape[0], valid == "auto"
    if not 1 <= k < n:
        raise ArgumentError("valid", Mention("valid", valid), f" of {n} rows holds out {k}; "
                            "at least one row should validate and one train")
    g = torch.Generator().manual_seed(derive_seed(seed, HOLDOUT_SEED_KEY))
    kept, held = split_rows(torch.randperm(n, generator=g).to(x.device), k, groups)
    if auto and (len(kept) == 0 or len(held) > 2 * k):
        warnings.warn(DataWarning(
            Mention("data"), f" repeats its rows in groups too large to hold {k} of its {n} "
            "rows out for validation without a copy among the training rows (the default "
            f"holdout would take {len(held)}): it trains on every row without validation; "
            "pass validation data of your own",
        ), stacklevel=4)
        return arrays, None
    if len(kept) == 0:
        raise ArgumentError("valid", Mention("valid", valid), f" of {n} rows holds out "
                            "every row: they are all copies of one another")
    if not auto and len(held) < MIN_VALID_ROWS:
        warnings.warn(DataWarning(
            Mention("valid", valid), f" holds out {len(held)} of the {n} rows for validation: "
            "a validation loss over so few rows is noisy, and it chooses the weights returned "
            "and when early stopping ends the run; hold out a larger fraction or pass "
            "validation data of your own",
        ), stacklevel=4)

    def take(r: Tensor) -> tuple[Tensor, Tensor | None]:
        return x[r], None if c is None else c[r]

    return take(kept), take(held)


