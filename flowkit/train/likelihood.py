r"""Maximum likelihood: :func:`fit`, and what it checks and builds before the first step.

:func:`fit` checks its settings, turns ``data`` into a batch source
(:mod:`flowkit.train.sources`) and ``valid`` into a validation function, checks the first batch
against the model, sets the model's standardization from the data, and hands the loss
(:class:`~flowkit.train.objectives.NegLogLikelihood`) to the shared engine in
:mod:`flowkit.train.loop`.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Iterator
from numbers import Real
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from ..flows import Flow
from ..nn.modes import evaluating
from ..transforms import BatchNorm
from ..transforms.standardize import set_from_data, standardizations_to_set
from ..validation import ArgumentError, Mention, check_bool, check_int, is_int, reference
from .arrays import (
    DataWarning,
    check_finite,
    check_pair_shapes,
    frames_as_arrays,
    load_arrays,
    loader_batch,
)
from .history import History
from .loop import RunPlan, Trainer
from .objectives import (
    NegLogLikelihood,
    Objective,
    count_nonfinite_rows,
    is_bounded,
    log_prob,
    outside_support,
    require_method,
    rows_outside,
)
from .options import TrainOptions, Unpack, resolve
from .session import Session, session
from .sources import LoaderSource, SamplerSource, TensorSource, derive_seed, first_batch


def fit(
    model: nn.Module,
    data: Any,
    *,
    valid: Any = None,
    steps: int | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    valid_every: int | None = None,
    early_stopping_patience: int | None = None,
    restore_best: bool | None = None,
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
            indices), the first batch of ``data`` and of ``valid`` goes through it.
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
            (counts, pixels, coarse rounding), or one in which a single value holds 20% of the
            rows (a point mass), raises a :class:`~flowkit.train.DataWarning`.

            Before the first step, the model's :class:`~flowkit.transforms.Standardize`
            modules (the builders' default ``standardize=True``) that are not set, or set only
            provisionally by an earlier call such as a look at samples, are set from the whole
            of array ``data`` (a pass that stops at them); with a DataLoader or a sampling
            function, from the first batch. Loaded or resumed models keep theirs.
        valid: validation data as a tensor, array, pair or DataLoader, whose mean negative
            log-likelihood is the validation loss; a fraction in (0, 1) of array ``data`` to
            hold out for it (e.g. ``valid=0.1``: a random tenth of the rows, drawn from
            ``seed``, validates and the rest trains); or a function ``valid(model) -> float``
            returning the validation loss itself (called in evaluation mode without gradients,
            e.g. to score a MADE with one fixed mask set). Computed every ``valid_every`` steps
            and at the end.
        steps: number of optimizer steps. Exactly one of ``steps`` and ``epochs`` is required.
        epochs: number of passes over finite ``data`` (``len(data) // batch_size`` steps each for
            arrays, ``len(loader)`` for DataLoaders).
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
            whenever ``valid`` is given (and implied by ``early_stopping_patience``), so that a
            small data set, which a flow overfits within an epoch or two, ends with the weights
            of its best validation rather than the last ones. ``False`` keeps the last step's
            weights; ``True`` needs ``valid``.
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
    if early_stopping_patience is not None and valid is None:
        raise ArgumentError("early_stopping_patience", Mention("early_stopping_patience"),
                            " needs validation data: pass ", Mention("valid"))
    if restore_best and valid is None:
        raise ArgumentError("restore_best", Mention("restore_best", True),
                            " needs validation data: pass ", Mention("valid"))
    holdout = _holdout_fraction(valid)
    with session(model, o["device"], o["seed"], o["checkpoint_dir"], o["resume"], "nll") as s:
        ref = reference(model)
        dtype = torch.get_default_dtype() if ref is None else ref.dtype
        source, held_out = _make_source(model, data, batch_size, s, dtype, holdout)
        if held_out is not None:
            valid = held_out
        if any(isinstance(m, BatchNorm) for m in model.modules()):
            _check_batches_for_batch_norm(source)
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
            validate = _make_validation(model, valid, batch_size or DEFAULT_BATCH_SIZE, s, dtype)
            valid_every = valid_every or source.batches_per_epoch or 100
        keep_best = valid is not None if restore_best is None else restore_best
        plan = RunPlan(steps, valid_every, early_stopping_patience, keep_best)
        trainer = Trainer(s, model, Objective(model, NegLogLikelihood()), source, o, plan, validate)
        history = trainer.run(lambda args: _check_first_batch_and_standardize(model, source, *args))
    if keep_best:
        _warn_if_never_improved(history)
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


def _check_batches_for_batch_norm(source: TensorSource | LoaderSource | SamplerSource) -> None:
    """Refuse, before the first step, batches of one row for a model with BatchNorm layers
    (their training-mode statistics need at least 2): ``batch_size`` 1, or a DataLoader whose
    epochs end with a batch of one row."""
    why = ("but the model has BatchNorm layers, whose training-mode statistics need at least 2 "
           "rows")
    if isinstance(source, TensorSource | SamplerSource) and source.local < 2:
        raise ArgumentError("batch_size", Mention("batch_size"), " gives batches of one row (per "
                            f"process), {why}: pass a larger one")
    if isinstance(source, LoaderSource):
        loader = source.loader
        size = loader.batch_size
        try:
            rows = len(loader.dataset)  # type: ignore[arg-type]
        except TypeError:  # an iterable dataset: its batches show up only while training
            return
        sharded = isinstance(loader.sampler, torch.utils.data.DistributedSampler)
        if size is not None and not loader.drop_last and not sharded and rows % size == 1:
            raise ArgumentError(
                "data", "the DataLoader passed as ", Mention("data"), " ends every epoch with a "
                f"batch of one row ({rows} rows in batches of {size}), {why}: pass "
                "drop_last=True to the DataLoader, or another batch size",
            )


def _takes_context(model: nn.Module) -> bool:
    """Whether ``model.log_prob`` accepts ``context=`` (by name or through ``**kwargs``)."""
    try:
        parameters = inspect.signature(model.log_prob).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): let the call decide
        return True
    return any(p.name == "context" or p.kind is p.VAR_KEYWORD for p in parameters)


DEFAULT_BATCH_SIZE = 256
""":func:`fit`'s batch size when none is passed, for large arrays and for sampling functions."""

MIN_DEFAULT_BATCH_SIZE = 16
"""The smallest batch :func:`default_batch_size` chooses (unless the data has fewer rows)."""


def default_batch_size(rows: int | None) -> int:
    """:func:`fit`'s batch size when none is passed: about 16 steps per epoch for array data of
    ``rows`` rows, between :data:`MIN_DEFAULT_BATCH_SIZE` (16) and :data:`DEFAULT_BATCH_SIZE`
    (256) rows, and never more than ``rows``; 256 for data without a length (``None``).

    Small data sets overfit within a few dozen full-batch steps; smaller batches take more,
    noisier steps per epoch before the validation loss turns, and reach better held-out
    log-likelihoods (docs/defaults.md, "Batch size").

    Example:
        >>> [default_batch_size(n) for n in (10, 150, 1000, 4096, 10**6, None)]
        [10, 16, 62, 256, 256, 256]
    """
    if rows is None:
        return DEFAULT_BATCH_SIZE
    return min(rows, max(MIN_DEFAULT_BATCH_SIZE, min(DEFAULT_BATCH_SIZE, rows // 16)))


def _holdout_fraction(valid: Any) -> float | None:
    """``valid`` as the fraction of array data to hold out, or ``None`` if it is data."""
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
    holdout: float | None,
) -> tuple[TensorSource | LoaderSource | SamplerSource, tuple[Tensor, Tensor | None] | None]:
    """The batch source of ``data``, and the rows held out for validation when ``holdout`` (a
    fraction) is given: a random subset of array data, drawn from the run's seed. Array data
    is checked whole against ``model`` here (:func:`_check_first_batch`), before rows are held
    out, so that a message numbers the rows as they were passed; for a
    :class:`~flowkit.Flow`, also for degenerate columns."""
    data = frames_as_arrays("data", data)
    if isinstance(data, list) and len(data) == 2 and all(
        isinstance(v, Tensor | np.ndarray) for v in data
    ):
        data = tuple(data)  # a pair [x, context], as ``valid`` accepts it
    if holdout is not None and not isinstance(data, Tensor | np.ndarray | tuple):
        raise ArgumentError("valid", Mention("valid", holdout), " holds out a fraction of array "
                            f"data, but 'data' is a {type(data).__name__}: pass validation data")
    if isinstance(data, DataLoader):
        return LoaderSource(data, s.dist, s.device, dtype), None
    if callable(data) and not isinstance(data, Tensor | np.ndarray):
        source = SamplerSource(data, batch_size or DEFAULT_BATCH_SIZE, s.seed, s.dist,
                               s.device, dtype)
        return source, None
    if isinstance(data, Tensor | np.ndarray | tuple):
        arrays = load_arrays("data", data, s.device, dtype, density=isinstance(model, Flow))
        _check_first_batch(model, *arrays, batch=False)
        held_out = None
        if holdout is not None:
            arrays, held_out = _hold_out(arrays, holdout, s.seed)
        if batch_size is None:
            batch_size = default_batch_size(arrays[0].shape[0])
        return TensorSource(arrays, batch_size, s.seed, s.dist, holdout), held_out
    raise TypeError(
        "'data' should be a tensor, a numpy array, a pair (x, context), a DataLoader or a "
        f"function sample(n, generator); got {type(data).__name__}"
    )


MIN_VALID_ROWS = 20
"""Fewest rows that ``valid=<fraction>`` holds out without a :class:`DataWarning`."""


def _hold_out(
    arrays: tuple[Tensor, Tensor | None], fraction: float, seed: int
) -> tuple[tuple[Tensor, Tensor | None], tuple[Tensor, Tensor | None]]:
    """``(training, held_out)``: a random ``fraction`` of the rows (drawn from ``seed``) held
    out of ``arrays`` ``(x, context)``."""
    x, c = arrays
    n, k = x.shape[0], round(fraction * x.shape[0])
    if not 1 <= k < n:
        raise ArgumentError("valid", Mention("valid", fraction), f" of {n} rows holds out {k}; "
                            "at least one row should validate and one train")
    if k < MIN_VALID_ROWS:
        warnings.warn(
            f"holding out a fraction {fraction!r} of the {n} rows for validation leaves {k}: a "
            "validation loss over so few rows is noisy, and it chooses the weights returned "
            "and when early stopping ends the run; hold out a larger fraction or pass "
            "validation data of your own", DataWarning, stacklevel=4,
        )
    g = torch.Generator().manual_seed(derive_seed(seed, HOLDOUT_SEED_KEY))
    rows = torch.randperm(n, generator=g).to(x.device)

    def take(r: Tensor) -> tuple[Tensor, Tensor | None]:
        return x[r], None if c is None else c[r]

    return take(rows[k:]), take(rows[:k])


def _check_first_batch(
    model: nn.Module, x: Tensor, context: Tensor | None, name: str = "data", batch: bool = True
) -> None:
    """Fail before the first optimizer step if the data does not fit the model: ``x`` and
    ``context`` are the first batch (``batch``), or all of array data, whose every value a
    discrete model then checks, and whose every row a bounded flow scores (one pass without
    gradients, by chunks: a row outside its box is named now, rather than at the step whose
    batch holds it)."""
    check_pair_shapes(name, x, context, batch)
    features = getattr(model, "features", None)
    if features is not None and (x.dim() != 2 or x.shape[1] != features):
        raise ValueError(
            f"'{name}' should have {features} features to match the model "
            f"(model.features={features}), got shape {tuple(x.shape)}"
        )
    width = getattr(model, "context_features", None)
    if width and context is None:
        raise ValueError(
            f"the model is conditional (context_features={width}) but '{name}' has no context; "
            f"pass {name}=(x, context)"
        )
    if width == 0 and context is not None:
        raise ValueError(f"'{name}' carries a context but the model has context_features=0")
    if width is None and context is not None and not _takes_context(model):
        raise ValueError(
            f"'{name}' carries a context but {type(model).__name__}.log_prob takes no "
            "'context' argument: pass the data alone"
        )
    if width and context.shape[1] != width:
        raise ValueError(
            f"the context of '{name}' should have {width} features to match the model "
            f"(model.context_features={width}), got shape {tuple(context.shape)}"
        )
    if batch:  # (arrays were checked whole as they loaded)
        check_finite(name, x, context, batch=True)
    check_data = getattr(model, "check_data", None)
    if check_data is not None:  # a model that knows its data's domain (binary, categories)
        check_data(x, name)
    try:
        with evaluating(model):
            out = log_prob(model, x[:2], None if context is None else context[:2])
    except TypeError as e:
        if x.is_floating_point():
            raise
        raise TypeError(
            f"'{name}' holds {x.dtype} values, which {type(model).__name__}.log_prob refuses "
            f"({e}). A flow is a density over real values: pass floating data (x.float()); "
            "for integer-valued data, add uniform noise in [0, 1) to each value "
            "(dequantization), or a density on them grows without bound"
        ) from e
    if not isinstance(out, Tensor) or out.shape != (min(2, x.shape[0]),):
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"model.log_prob should return shape (N,), got {got} for N=2")
    if not batch and is_bounded(model):
        count, rows = rows_outside(model, _chunks(x, context))
        if count:
            raise ArgumentError(name, *outside_support((Mention(name),), count, rows))


def _check_first_batch_and_standardize(
    model: nn.Module, source: Any, x: Tensor, context: Tensor | None
) -> None:
    """Before the first step (after every setting was checked, so a refused call leaves the
    model as it was): check the first batch (a training array was checked whole as it
    loaded), then set the model's :class:`~flowkit.transforms.Standardize` modules that are
    not set yet, or only provisionally by an earlier call (a look at samples), from the whole
    training set when it is an array, else from the first batch. A resumed model has them set
    already."""
    if isinstance(source, TensorSource):
        x, context = source.x, source.c
    else:
        _check_first_batch(model, x, context)
    if not standardizations_to_set(model):
        return
    with warnings.catch_warnings():  # a single row: the DataWarning of the data said so
        warnings.filterwarnings("ignore", message="'batches' hold a single row")
        set_from_data(model, _chunks(x, context), lambda x, c: log_prob(model, x, c))


_CHUNK = 8192
"""Rows per forward pass over a whole array (setting the standardization, scoring the rows)."""


def _chunks(x: Tensor, context: Tensor | None) -> list[tuple[Tensor, Tensor | None]]:
    """``(x, context)`` in blocks of :data:`_CHUNK` rows."""
    chunks = x.split(_CHUNK)
    contexts = context.split(_CHUNK) if context is not None else [None] * len(chunks)
    return list(zip(chunks, contexts, strict=True))


def _make_validation(
    model: nn.Module, valid: Any, batch_size: int, s: Session, dtype: torch.dtype
) -> _DataValidation | _UserValidation:
    """The validation: the mean NLL over the whole validation set (all processes), or what the
    user's ``valid(model)`` returns (averaged over processes)."""
    valid = frames_as_arrays("valid", valid)
    if callable(valid) and not isinstance(valid, DataLoader | Tensor | np.ndarray):
        return _UserValidation(model, valid, s)
    if isinstance(valid, DataLoader):
        _check_first_batch(model, *first_batch("valid", valid, s.device, dtype), "valid")

        def batches(every: bool = False) -> Iterator[tuple[Tensor, Tensor | None]]:
            for b in valid:
                yield loader_batch("valid", b, s.device, dtype)
    else:
        x, c = load_arrays("valid", valid, s.device, dtype)
        _check_first_batch(model, x, c, "valid", batch=False)
        chunk = max(batch_size, 1024)

        def batches(every: bool = False) -> Iterator[tuple[Tensor, Tensor | None]]:
            # each process evaluates every world_size-th row (the sums are then added up), or
            # ``every`` row, to number them as the caller passed them
            r, w = (0, 1) if every else (s.dist.rank, s.dist.world_size)
            xs, cs = x[r::w], None if c is None else c[r::w]
            for i in range(0, xs.shape[0], chunk):
                yield xs[i : i + chunk], None if cs is None else cs[i : i + chunk]

    return _DataValidation(model, batches, s)


class _DataValidation:
    """The mean NLL of the validation batches (``batches()``), summed over all processes; NaN
    when a row holds NaN or Inf (:meth:`cause` then says which)."""

    def __init__(self, model: nn.Module, batches: Callable[..., Iterator[tuple[Tensor, Any]]],
                 s: Session):
        self.model, self.batches, self.s = model, batches, s
        self.counts = (0, 0, 0)  # rows, rows holding NaN/Inf, rows of log-density -inf

    def __call__(self) -> float:
        model, s = self.model, self.s
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


class _UserValidation:
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
