"""What :func:`~flowkit.train.fit` checks before its first step, and the model's standardization
it sets there.

* :func:`check_first_batch`: the data (all of an array, or the first batch of a loader or a
  sampling function) against the model: shapes and widths, context or none, values (NaN/Inf, a
  discrete model's domain, rows outside a flow's ``bounds``: an error; rows exactly on a finite
  bound: a :class:`~flowkit.train.DataWarning`), and that ``log_prob`` takes it;
* :func:`check_batches_for_batch_norm`: no batch of one row for a model with BatchNorm layers;
* :func:`check_first_batch_and_standardize`: the first check of a run, then the model's
  :class:`~flowkit.transforms.Standardize` modules set from the training data.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.modes import evaluating
from ..transforms.bounded import Logit
from ..transforms.standardize import SingleRowWarning, set_from_data, standardizations_to_set
from ..validation import ArgumentError, Mention
from .arrays import DataWarning, check_finite, check_pair_shapes
from .objectives import is_bounded, log_prob, outside_support, rows_outside
from .sources import LoaderSource, SamplerSource, TensorSource


def check_batches_for_batch_norm(source: TensorSource | LoaderSource | SamplerSource) -> None:
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


def takes_context(model: nn.Module) -> bool:
    """Whether ``model.log_prob`` accepts ``context=`` (by name or through ``**kwargs``)."""
    try:
        parameters = inspect.signature(model.log_prob).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): let the call decide
        return True
    return any(p.name == "context" or p.kind is p.VAR_KEYWORD for p in parameters)


def check_first_batch(
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
    if width is None and context is not None and not takes_context(model):
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
        count, rows = rows_outside(model, chunks(x, context))
        box = input_bounds(model)
        if count:
            where = "" if box is None else _first_outside(x[rows[0]], box)
            raise ArgumentError(name, *outside_support((Mention(name),), count, rows), where)
        if box is not None:
            warn_if_on_bounds(name, x, box)


def input_bounds(model: nn.Module) -> Logit | None:
    """The :class:`~flowkit.transforms.Logit` that reads ``model``'s data as given (the first
    transform of a flow built with ``bounds``, or the flow's only transform), or None."""
    transform = getattr(model, "transform", None)
    first = next(iter(getattr(transform, "transforms", [transform])), None)
    return first if isinstance(first, Logit) else None


def _first_outside(row: Tensor, box: Logit) -> str:
    """Where ``row`` leaves ``box``: its first column outside, with the value and the bounds."""
    outside = (~box.contains(row)).nonzero()
    if len(outside) == 0:  # inside these bounds, outside a later transform's support
        return ""
    j = int(outside[0])
    return (f" The first of them has column {j} = {row[j].item():.6g}, outside "
            f"[{box.low[j].item():.6g}, {box.high[j].item():.6g}].")


def warn_if_on_bounds(name: str, x: Tensor, box: Logit, stacklevel: int = 5) -> None:
    """Warn if rows of ``x`` lie exactly on a finite bound of ``box``: an open interval has no
    mass on its ends, and such a row is scored one rounding step inside, where the interval's
    map (a logit, or the log of the distance to the end) is extreme (``log`` of 1e-38 for a
    float32 end at 0), which also skews the standardization after it (10% zero
    incomes on ``bounds`` from 0 gave a validation NLL of 8.2 where the positive rows scored
    18.5 against 14.9 without them)."""
    low, high = box.low.to(x.dtype), box.high.to(x.dtype)
    on = (x == low) | (x == high)
    if not on.any():
        return
    rows = on.any(1)
    j = int(on.any(0).nonzero()[0])
    value = x[on[:, j].nonzero()[0, 0], j].item()
    warnings.warn(
        f"'{name}' has {int(rows.sum())} of its {x.shape[0]} rows exactly on a bound (column "
        f"{j} = {value:.6g}, for one): a density on the open interval has no mass there, and "
        "such a row is scored one rounding step inside, where the log-density is extreme; "
        "move the bound past the data (a little below the smallest value), or model the values "
        "on the bound apart (a point mass)", DataWarning, stacklevel=stacklevel,
    )


def check_first_batch_and_standardize(
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
        check_first_batch(model, x, context)
    if not standardizations_to_set(model):
        return
    def set_all() -> None:
        set_from_data(model, chunks(x, context), lambda x, c: log_prob(model, x, c))

    if x.shape[0] > 1:
        set_all()  # (no catch_warnings: a change of the filters shows every warning again)
        return
    with warnings.catch_warnings():  # a single row: the DataWarning of the data said so
        warnings.simplefilter("ignore", SingleRowWarning)
        set_all()


CHUNK = 8192
"""Rows per forward pass over a whole array (setting the standardization, scoring the rows)."""


def chunks(x: Tensor, context: Tensor | None) -> list[tuple[Tensor, Tensor | None]]:
    """``(x, context)`` in blocks of :data:`CHUNK` rows."""
    chunks = x.split(CHUNK)
    contexts = context.split(CHUNK) if context is not None else [None] * len(chunks)
    return list(zip(chunks, contexts, strict=True))


