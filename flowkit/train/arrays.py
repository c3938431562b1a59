"""Data as the fit loop takes it: conversion, checks and warnings.

* conversion: :func:`as_tensor` and :func:`as_batch` (tensors and numpy arrays on the training
  device, in the model's dtype; :func:`readable` for what torch cannot read as given),
  :func:`frames_as_arrays` (data frames as the arrays of their columns), :func:`split_pair`
  (``x`` or ``(x, context)``), :func:`loader_batch` (a DataLoader's batch);
* checks: :func:`load_arrays` (in-memory data, checked whole as it loads),
  :func:`check_pair_shapes` and :func:`check_finite` (also run on the first batch of a loader or
  a sampling function);
* warnings: :class:`DataWarning` (:func:`warn_if_degenerate`: constant columns, few values,
  point masses; :func:`warn_if_duplicated`: repeated rows) and :class:`PrecisionWarning` (a
  cast that rounds a column coarsely);
* repeated rows: :func:`equal_row_groups` and :func:`split_rows`, the hold-out of whole groups
  of equal rows.

The batch sources that hand the data to the loop are in :mod:`flowkit.train.sources`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..data.arrays import native_byte_order
from ..transforms.standardize import IQR_OF_NORMAL
from ..validation import Mention, Worded, nonfinite_row_mask

Batch = tuple[Tensor, Tensor | None]
"""A batch ``(x, context)``, the context None for unconditional data."""


def as_tensor(
    name: str, value: Any, device: torch.device, dtype: torch.dtype, keep_discrete: bool = False
) -> Tensor:
    """``value`` (tensor or numpy array) as a tensor on ``device``, cast to ``dtype``.

    With ``keep_discrete=True`` integer and bool values keep their dtype (the class indices of a
    :class:`~flowkit.CategoricalMADE`, binary pixels stored as ``uint8``); only floating values
    are cast. Data ``x`` is loaded that way, contexts always become ``dtype``. A tensor that
    requires grad is taken as its values (detached): training reads data, it never
    differentiates with respect to them (a graph of them failed the second backward, and a leaf
    had gradients written into its ``.grad``).
    """
    if not isinstance(value, Tensor | np.ndarray):
        raise TypeError(
            f"'{name}' should be a torch.Tensor or numpy array, got {type(value).__name__}"
        )
    value = readable(name, value)
    try:
        t = torch.as_tensor(value)
    except TypeError as e:  # numpy arrays of objects or strings
        raise ValueError(
            f"'{name}' should hold numbers, got a numpy array of dtype {value.dtype}"
        ) from e
    if t.is_complex():
        raise ValueError(
            f"'{name}' should hold real values, got dtype {t.dtype} (complex values are refused, "
            "not cast: casting would drop the imaginary part)"
        )
    cast = dtype if t.is_floating_point() or not keep_discrete else None
    return t.detach().to(device=device, dtype=cast)


def readable(name: str, value: Any) -> Any:
    """``value`` as torch reads it without an error or a warning: a meta tensor is refused
    (it holds no values), numpy ``longdouble`` too (torch has no such type); a numpy array of
    the other byte order is converted to the native one, and a read-only one (a memory map
    opened with ``mode="r"``) copied, which torch would share and warn about. Anything else is
    returned as it is (a copy only where needed; the values are unchanged)."""
    if isinstance(value, Tensor) and value.is_meta:
        raise ValueError(f"'{name}' is on the meta device, which holds no values: pass data on "
                         "a device that holds them, such as 'cpu'")
    if not isinstance(value, np.ndarray):
        return value
    kind, size = value.dtype.kind, value.dtype.itemsize
    if (kind == "f" and size > 8) or (kind == "c" and size > 16):
        raise ValueError(
            f"'{name}' holds numpy {value.dtype} values (long double), which torch cannot hold: "
            "cast them to float64 first (x.astype(np.float64))"
        )
    if not value.dtype.isnative:  # big-endian data, as FITS files and some instruments write
        return native_byte_order(value)
    return value if value.flags.writeable else value.copy()


def as_batch(
    name: str, x: Any, c: Any, device: torch.device, dtype: torch.dtype
) -> tuple[Tensor, Tensor | None]:
    """A batch ``(x, context)`` on ``device``: floating ``x`` and the context cast to ``dtype``,
    integer and bool ``x`` kept as they are (see :func:`as_tensor`)."""
    x = as_tensor(name, x, device, dtype, keep_discrete=True)
    return x, None if c is None else as_tensor(f"{name} context", c, device, dtype)


def frames_as_arrays(name: str, value: Any) -> Any:
    """``value`` with a data frame, or each data frame of a pair ``(x, context)``, replaced by
    the numpy array of its values, column by column in their order (exact: the array numpy
    makes of those columns, of integers if every column holds integers); anything else as it
    is.

    A data frame is anything with ``to_numpy`` and ``columns`` (pandas, polars); a pandas
    ``Series`` (``to_numpy`` and ``dtype``) is one column, ``(N, 1)``. Its columns must hold
    numbers: a column of text, dates or categories (or of anything numpy holds as Python
    objects) is refused, named with its dtype;
    missing values become NaN, which the checks of the data then refuse with their row."""
    if isinstance(value, tuple | list) and len(value) == 2:
        pair = frames_as_arrays(name, value[0]), frames_as_arrays(f"{name} context", value[1])
        changed = any(a is not b for a, b in zip(pair, value, strict=True))
        return (pair if isinstance(value, tuple) else list(pair)) if changed else value
    if isinstance(value, Tensor | np.ndarray) or not hasattr(value, "to_numpy"):
        return value
    if hasattr(value, "columns"):  # by position: names may repeat, or differ only in type
        sources = [(str(c), _column(value, j, c)) for j, c in enumerate(value.columns)]
    elif hasattr(value, "dtype"):  # a Series: one column
        sources = [(str(getattr(value, "name", None) or "values"), value)]
    else:
        return value
    columns = [(label, np.asarray(source.to_numpy())) for label, source in sources]
    not_numbers = [f"{label!r} ({getattr(source, 'dtype', column.dtype)})"
                   for (label, source), (_, column) in zip(sources, columns, strict=True)
                   if column.dtype.kind not in "biuf"]
    if not_numbers:
        raise ValueError(
            f"'{name}' is a {type(value).__name__} whose columns {', '.join(not_numbers)} do "
            "not hold numbers (text, dates, categories, or values numpy holds as Python "
            "objects): encode them as numbers or drop them before fitting"
        )
    if not columns:
        return np.empty((len(value), 0))
    return np.column_stack([column for _, column in columns])


def frame_labels(value: Any) -> list[str] | None:
    """The column names of a data frame given as data ``x``, or as the ``x`` of a pair
    ``(x, context)``; ``None`` for anything else."""
    if isinstance(value, tuple | list) and len(value) == 2:
        value = value[0]
    columns = getattr(value, "columns", None)
    if columns is None or isinstance(value, Tensor | np.ndarray):
        return None
    return [str(c) for c in columns]


def _column(frame: Any, j: int, label: Any) -> Any:
    """Column ``j`` of a data frame, by position: pandas' ``iloc``, polars' ``to_series``."""
    if hasattr(frame, "iloc"):
        return frame.iloc[:, j]
    if hasattr(frame, "to_series"):
        return frame.to_series(j)
    return frame[label]


def split_pair(name: str, value: Any) -> tuple[Any, Any]:
    """``(x, context)`` from a pair, ``(value, None)`` from anything else."""
    if isinstance(value, tuple | list) and not isinstance(value, Tensor):
        if len(value) == 2:
            return value[0], value[1]
        if len(value) == 1:
            return value[0], None
        raise ValueError(
            f"'{name}' should be x or a pair (x, context), got a sequence of {len(value)} items"
        )
    return value, None


def loader_batch(name: str, batch: Any, device: torch.device, dtype: torch.dtype) -> Batch:
    """A batch that the DataLoader passed as ``name`` yielded, as :func:`as_batch` makes it;
    one that is not ``x`` or ``(x, context)`` of tensors or arrays (a dict, say) is refused
    naming the loader."""
    x, c = split_pair(name, batch)
    if not all(isinstance(t, Tensor | np.ndarray) for t in (x, c) if t is not None):
        got = type(batch).__name__
        if isinstance(batch, tuple | list):
            got += " of " + ", ".join(type(t).__name__ for t in batch)
        raise TypeError(
            f"the DataLoader passed as '{name}' should yield batches x or (x, context) of "
            f"tensors or numpy arrays, got a {got}"
        )
    return as_batch(name, x, c, device, dtype)


def load_arrays(
    name: str, value: Any, device: torch.device, dtype: torch.dtype, density: bool = False,
    labels: Sequence[str] | None = None,
) -> Batch:
    """Validate and move an in-memory dataset ``x`` or ``(x, context)`` to ``device`` once.

    Warns (:class:`PrecisionWarning`) when casting to ``dtype`` leaves a column with fewer than
    :data:`MIN_LEVELS` representable steps per standard deviation (data far from zero compared
    with their spread, such as timestamps in seconds or a measurement with a large offset):
    the model would see them coarsely rounded, before its standardization could help. With
    ``density=True`` (training data of a continuous density, a :class:`~flowkit.Flow`), also
    warns (:class:`DataWarning`) when a column of ``x`` is constant or takes few distinct values
    (:func:`warn_if_degenerate`; ``labels``: the names of ``x``'s columns, a data frame's)."""
    x, c = split_pair(name, value)
    raw = readable(name, x), None if c is None else readable(f"{name} context", c)
    rounded = []  # (a loop, not a comprehension: the warnings' stack level counts frames)
    for label, t, names in zip(((Mention(name),), ("the context of ", Mention(name))), raw,
                               (labels, None), strict=True):
        rounded.append(warn_if_rounded(label, t, dtype, names))
    x, c = as_batch(name, *raw, device, dtype)
    check_pair_shapes(name, x, c)
    check_finite(name, x, c, given=raw)
    if density and x.is_floating_point():  # (integers: the model refuses them, not a warning)
        # columns the cast made constant: warned already
        warn_if_degenerate(name, x, skip=rounded[0], labels=labels)
    return x, c


def check_pair_shapes(name: str, x: Tensor, context: Tensor | None, batch: bool = False) -> None:
    """Fail unless ``x`` has shape ``(N, ...)``, ``N >= 1``, and ``context``, if any, ``(N, C)``:
    the shapes any model needs of the data ``name`` (its first batch, with ``batch``); the widths
    the model needs are checked against the model."""
    what = f"the first batch of '{name}'" if batch else f"'{name}'"
    if x.dim() < 2:
        hint = "; one feature per row is x.reshape(-1, 1)" if x.dim() == 1 else ""
        raise ValueError(f"{what} should have shape (N, features), got {tuple(x.shape)}{hint}")
    if x.shape[0] == 0:
        raise ValueError(f"{what} should have at least one row, got shape {tuple(x.shape)}")
    if context is not None and (context.dim() != 2 or context.shape[0] != x.shape[0]):
        hint = ("; one context feature per row is context.reshape(-1, 1)"
                if context.dim() == 1 and context.shape[0] == x.shape[0] else "")
        raise ValueError(
            f"the context of {what} should have shape ({x.shape[0]}, C), one row of C context "
            f"features per row of x (shape {tuple(x.shape)}), got {tuple(context.shape)}{hint}"
        )


def check_finite(
    name: str, x: Tensor, context: Tensor | None, batch: bool = False,
    given: tuple[Any, Any] | None = None,
) -> None:
    """Fail if a floating ``x`` ``(N, ...)`` or ``context`` ``(N, C)`` holds NaN or Inf,
    naming ``name`` (the first batch of it, with ``batch``) and the first such row (and column
    of an ``(N, D)`` array). ``given``: the arrays as passed, before the cast to the model's
    dtype, to tell values beyond that dtype's range (finite as given) from NaN and Inf."""
    for i, (part, t) in enumerate((("x", x), ("context", context))):
        if t is None or not t.is_floating_point() or torch.isfinite(t).all():
            continue
        row = int(nonfinite_row_mask(t).nonzero()[0])
        if batch:
            raise ValueError(f"the first batch of '{name}' holds NaN or Inf values in "
                             f"{part} (row {row} of the batch)")
        what = f"'{name}'" if part == "x" else f"the context of '{name}'"
        where = f"row {row}"
        if t.dim() == 2:
            where += f", column {int((~torch.isfinite(t[row])).nonzero()[0])}"
        original = None if given is None else given[i]
        if original is not None and bool(torch.isfinite(torch.as_tensor(original)).all()):
            raise ValueError(
                f"{what} has values beyond the range of {t.dtype}, the model's dtype (first at "
                f"{where}): they became infinite when cast to it; rescale the data, or use a "
                f"float64 model (model.double()) for float64 data"
            )
        raise ValueError(f"{what} holds NaN or Inf values (first at {where}); drop or fill "
                         "those rows")


MIN_LEVELS = 10
"""Fewest representable steps per standard deviation (``spread / (eps * |value|)``, about half
the true float spacing) of a column that :func:`load_arrays` accepts without a
:class:`PrecisionWarning`. Measured (``MAF(2, transformer="spline")``, 4000 rows of
``1000 + s * N(0, 1)`` beside a free normal column, 500 steps, float32 against float64 and the
exact density): at 1000 down to 3 of these steps the three agree within 0.004 nats per row; at
1 the float32 flow learns the grid, -7.91 against -6.21 exact (it used to be 1000, which warned
of data that fit exactly)."""


class DataWarning(Worded, UserWarning):
    """Training data that a density model cannot fit as given (see :func:`load_arrays`). Its
    message may name arguments as :class:`~flowkit.validation.Mention` parts (a command line
    re-spells them as its options, as it does errors)."""


class PrecisionWarning(DataWarning):
    """Casting the data to the model's dtype rounds a column to a few steps of its spread."""


FEW_VALUES = 0.05
"""A floating training column with at most ``max(FEW_VALUES * N, 10)`` distinct values among
its ``N`` rows (and at least two, and at most ``N / 2``) raises a :class:`DataWarning` (see
:func:`warn_if_degenerate`)."""


POINT_MASS = 0.2
"""A floating training column in which one value holds at least this share of the rows (and
at least 10 rows), among more distinct values than :data:`FEW_VALUES` flags, raises a
:class:`DataWarning`: a point mass inside a continuous column (zero-inflated data)."""


_SORTED_ELEMENTS = 2**22
"""How many elements :func:`warn_if_degenerate` sorts at a time (a block of columns), which
bounds its temporaries (the sort's int64 indices among them) whatever the data's size."""


def warn_if_degenerate(
    name: str, x: Tensor, stacklevel: int = 6, skip: Sequence[int] = (),
    labels: Sequence[str] | None = None, numbers: Sequence[int] | None = None,
) -> None:
    """Warn if a floating column of ``x`` ``(N, D)`` (other than those in ``skip``) holds one
    value; few distinct values (at least two, at most ``max(FEW_VALUES * N, 10)`` and at most
    ``N / 2``: a discrete column); or, among more, one value in at least
    ``T = max(10, ceil(POINT_MASS * N))`` rows. A density over such a column concentrates on those
    values (a point mass for a constant column), which a flow approaches by contracting the
    column at every layer: the training NLL falls without bound and the log-density of a value
    between or outside them means nothing. A column of sorted values ``v`` holds a value in ``T``
    rows when ``v[i] == v[i + T - 1]`` for some ``i``. ``stacklevel`` as
    :func:`warnings.warn` counts it from the helper this calls (2: this function's caller; the
    default 6, fit's caller). ``labels``: the columns' names (a data frame's), which the
    messages give beside their numbers; ``numbers``: the columns' numbers as the user counts
    them (a file's, of which some columns are the context), by default their positions in
    ``x``."""
    if not x.is_floating_point() or x.dim() != 2:
        return

    def named(js: list[int]) -> str:
        return _column_names(js, labels, numbers)

    n = x.shape[0]
    if n == 1:
        _data_warning(
            f"'{name}' has a single row: a density fitted to one point is a point mass, so the "
            "training NLL falls without bound; fit a density to many rows", stacklevel=stacklevel
        )
        return
    run = max(10, math.ceil(POINT_MASS * n))
    distinct = torch.empty(x.shape[1], dtype=torch.long, device=x.device)
    has_run = torch.zeros(x.shape[1], dtype=torch.bool, device=x.device)
    block = max(1, _SORTED_ELEMENTS // n)
    for start in range(0, x.shape[1], block):
        ordered = x[:, start : start + block].sort(dim=0).values
        distinct[start : start + block] = 1 + (ordered[1:] != ordered[:-1]).sum(dim=0)
        if run <= n:
            has_run[start : start + block] = (ordered[run - 1 :] == ordered[: n - run + 1]).any(0)
    distinct[list(skip)] = n
    constant = (distinct == 1).nonzero().flatten().tolist()
    if constant:
        one = len(constant) == 1
        values = _and([f"{x[0, j].item():.6g}" for j in constant[:10]])
        _data_warning(
            f"'{name}', {named(constant)}, hold{'s' if one else ''} a single value "
            f"({values}) in all {n} rows: a density "
            "over it is a point mass, so the training NLL falls without bound while the model "
            "contracts that column; drop constant columns before fitting", stacklevel=stacklevel
        )
    few_mask = (distinct > 1) & (distinct <= max(FEW_VALUES * n, 10)) & (distinct <= n / 2)
    if few := few_mask.nonzero().flatten().tolist():
        one = len(few) == 1
        counts = _and([str(int(distinct[j])) for j in few[:10]])
        _data_warning(
            f"'{name}', {named(few)}, take{'s' if one else ''} only {counts} distinct "
            f"values in {n} rows: a continuous density "
            "concentrates on such values as it trains, so its log-density there grows and "
            "means little; add uniform noise of one quantization step to the column "
            "(dequantization), or model it with a discrete distribution", stacklevel=stacklevel
        )
    has_run[list(skip)] = False
    continuous = (distinct > 1) & ~few_mask
    continuous[list(skip)] = False
    if columns := linearly_dependent(x, continuous.nonzero().flatten().tolist()):
        _data_warning(
            f"'{name}', {named(columns)}, are linearly dependent (a combination of them is "
            f"constant, to within {COLLINEAR_SPREAD:g} of their spread): the rows lie on a "
            "hyperplane, where a density is infinite, so the training NLL falls without bound "
            "while the model contracts across it; drop one of these columns (the others "
            "determine it)",
            stacklevel=stacklevel,
        )
    if massed := (has_run & continuous).nonzero().flatten().tolist():
        heavy = []
        for j in massed[:10]:
            values, counts = x[:, j].unique(return_counts=True)
            count, k = counts.max(dim=0)
            heavy.append(f"{values[k].item():.6g} in {int(count)}")
        one = len(massed) == 1
        _data_warning(
            f"'{name}', {named(massed)}, hold{'s' if one else ''} one value in many of "
            f"the {n} rows ({'; '.join(heavy)} rows): a point mass inside a continuous column, "
            "which a flow "
            "approaches by contracting the column there, so the training NLL falls without "
            "bound; model "
            "that value apart (e.g. a mixture of the point mass and a density of the other "
            "rows) or add noise of the measurement's resolution", stacklevel=stacklevel
        )


COLLINEAR_SPREAD = 1e-6
"""A combination of standardized columns whose standard deviation is at most this share of
theirs makes them linearly dependent for :func:`linearly_dependent`: exact dependence in float32
data leaves about ``1e-7`` times the ratio of the columns' magnitude to their spread, while an
ill-conditioned but full-rank data set (a 30-D Gaussian of condition number 3e9) keeps 8e-5."""

_COLLINEAR_ROWS, _COLLINEAR_COLUMNS = 20_000, 1024
"""At most this many rows (evenly spaced) enter :func:`linearly_dependent`; more columns than
this are not checked (the check's ``O(D^3)`` eigendecomposition)."""


def linearly_dependent(x: Tensor, columns: Sequence[int] | None = None) -> list[int]:
    """The columns of ``x`` ``(N, D)`` among ``columns`` (all of them by default; none of them
    constant) that take part in a linear dependence, by their numbers in ``x``: a combination of the
    standardized columns whose spread is at most :data:`COLLINEAR_SPREAD` of theirs. Those
    combinations are the eigenvectors of the columns' correlation matrix whose eigenvalues are
    at most ``COLLINEAR_SPREAD ** 2``; a column takes part when its projection on them is at
    least a tenth of the largest column's. ``[]`` when there is none, and unchecked (``[]``)
    with more than 1024 columns or no more rows than columns (rows that are always dependent).
    At most 20,000 evenly spaced rows are read.

    Example:
        >>> a, b = torch.randn(100, 1), torch.randn(100, 1)
        >>> linearly_dependent(torch.cat([a, b, 2 * a - b + 1], dim=1))
        [0, 1, 2]
        >>> linearly_dependent(torch.randn(100, 3))
        []
    """
    n = x.shape[0]
    columns = list(range(x.shape[1])) if columns is None else list(columns)
    d = len(columns)
    if d < 2 or d > _COLLINEAR_COLUMNS or n <= d:
        return []
    rows = x[:: -(-n // _COLLINEAR_ROWS)][:, columns].detach().to("cpu", torch.float64)
    rows = rows - rows.mean(0)
    spread = rows.norm(dim=0)
    if not (spread > 0).all():  # a column constant over the rows taken: not these columns' case
        return []
    values, vectors = torch.linalg.eigh((rows / spread).T @ (rows / spread))
    null = vectors[:, values <= COLLINEAR_SPREAD**2]
    if null.shape[1] == 0:
        return []
    weights = null.norm(dim=1)
    return [columns[j] for j in (weights >= 0.1 * weights.max()).nonzero().flatten().tolist()]


DUPLICATE_ROWS = 0.05
"""A share of a flow's training rows that repeat an earlier row (with its context) from which
:func:`warn_if_duplicated` raises a :class:`DataWarning`."""


def equal_row_groups(x: Tensor, context: Tensor | None = None) -> Tensor | None:
    """For each row of ``x`` ``(N, ...)`` with its ``context``, the index of its group of equal
    rows, ``(N,)`` on the CPU; ``None`` when every row is distinct. Rows are compared by their
    bytes (one sort of the rows, about 0.4 s for 10^6 rows of 10 columns)."""
    parts = [x.flatten(1)] + ([] if context is None else [context.to(x.dtype)])
    if x.shape[0] < 2:
        return None
    # the bytes of each row (+ 0.0 makes -0.0 into 0.0, equal by ==), as numpy sees uint8: it
    # has no bfloat16
    table = (torch.cat(parts, 1).detach() + 0.0).contiguous().cpu()
    rows = table.view(torch.uint8).numpy().reshape(table.shape[0], -1)
    keys = rows.view(np.dtype((np.void, rows.shape[1]))).ravel()
    _, groups = np.unique(keys, return_inverse=True)
    return None if groups.max() + 1 == len(groups) else torch.from_numpy(groups.ravel())


def warn_if_duplicated(
    name: str, x: Tensor, context: Tensor | None = None, stacklevel: int = 6
) -> Tensor | None:
    """Warn if at least :data:`DUPLICATE_ROWS` of the rows of ``x`` (with their ``context``)
    repeat an earlier row: a continuous density has no mass on single points, and one fitted to
    repeated rows concentrates on them (a table appended to itself once gave a test
    NLL of 160 against 4.5, with a validation NLL of 4.4 from held-out rows that had copies
    among the training rows). Returns the groups of :func:`equal_row_groups`."""
    groups = equal_row_groups(x, context)
    if groups is None:
        return None
    n, distinct = len(groups), int(groups.max()) + 1
    if n - distinct >= DUPLICATE_ROWS * n:
        _data_warning(
            f"'{name}' has {n - distinct} rows that repeat an earlier row ({n - distinct} of "
            f"{n}; {distinct} distinct): a continuous density has no mass on single points, and "
            "one fitted to repeated rows concentrates on them, so the training NLL falls while "
            "the density elsewhere gets worse; drop the duplicates (np.unique(x, axis=0), "
            "df.drop_duplicates()) unless they are real repeated measurements (valid=<fraction> "
            "holds out whole groups of equal rows, so that validation still sees new rows)",
            stacklevel=stacklevel,
        )
    return groups


def split_rows(
    order: Tensor, k: int, groups: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``(kept, held_out)`` row indices: the first ``k`` rows of the permutation ``order`` held
    out; or, with ``groups`` (:func:`equal_row_groups`), whole groups of equal rows, taken in
    the order in which ``order`` first meets them, each one that still fits in ``k`` rows (so
    that no held-out row has a copy among the kept ones, and a large group, a point mass, stays
    with the kept rows rather than taking the place of many held-out ones). When no group fits,
    the smallest one is held out."""
    if groups is None:
        return order[k:], order[:k]
    n = len(order)
    position = torch.empty(n, dtype=torch.long)
    position[order.cpu()] = torch.arange(n)
    first = torch.full((int(groups.max()) + 1,), n, dtype=torch.long).scatter_reduce(
        0, groups, position, "amin")  # where the permutation first meets each group
    key = first[groups]
    by_group = (key * n + position).argsort()  # group by group, in the permutation's order
    starts = torch.cat([torch.tensor([0]), (key[by_group].diff() != 0).nonzero().flatten() + 1])
    sizes = torch.diff(starts, append=torch.tensor([n]))
    fitting = int((sizes.cumsum(0) <= k).sum())  # the first groups, which all fit: at once
    held = int(sizes[:fitting].sum())
    taken = [by_group[:held]]
    for start, size in zip(starts[fitting:].tolist(), sizes[fitting:].tolist(), strict=True):
        if held == k:
            break
        if held + size <= k:  # a later group that still fits, after one that did not
            taken.append(by_group[start : start + size])
            held += size
    if held == 0:  # every group is larger than k: the smallest one
        j = int(sizes.argmin())
        taken = [by_group[int(starts[j]) : int(starts[j]) + int(sizes[j])]]
    held_rows = torch.cat(taken)
    kept = torch.ones(n, dtype=torch.bool)
    kept[held_rows] = False
    return kept.nonzero().flatten().to(order.device), held_rows.to(order.device)


SKEWED = 30.0
"""A column of only positive values whose 99th percentile is more than ``SKEWED`` times its
median draws a :class:`DataWarning` for affine flows (see :func:`warn_if_skewed`)."""

_QUANTILE_ROWS = 100_000
"""About how many rows, spread evenly, :func:`warn_if_skewed` reads the percentiles from
(torch.quantile takes at most 16 million elements)."""


def _quantiles(x: Tensor, levels: list[float]) -> Tensor:
    """The ``levels`` quantiles of each column of ``x`` ``(N, D)``, ``(len(levels), D)`` in
    float64, read from about :data:`_QUANTILE_ROWS` rows spread evenly over all of them."""
    rows = x[:: max(1, x.shape[0] // _QUANTILE_ROWS)].double()
    return torch.quantile(rows, torch.tensor(levels, dtype=rows.dtype, device=rows.device), dim=0)


def warn_if_skewed(
    name: str, x: Tensor, skip: Sequence[int] = (), stacklevel: int = 6,
    labels: Sequence[str] | None = None, numbers: Sequence[int] | None = None,
    remedy: tuple[str | Mention, ...] | None = None,
) -> list[int]:
    """Warn if a floating column of ``x`` ``(N, D)`` (other than those in ``skip``) holds only
    positive values spread over orders of magnitude: its 99th percentile above :data:`SKEWED`
    times its median (a log-normal of sigma 1.5 or more, incomes, concentrations, counts of
    rare events). An affine autoregressive layer shapes such a tail with shifts and scales that
    its MADE extrapolates linearly: beyond and even between the training rows some held-out rows
    then score thousands of nats or more, however well the flow validates (one row of
    3-D log-normal data at 2.65e8 nats, mean 132,707, where a lower bound of 0 gives 5.98 and
    the exact density 5.97). Returns the columns warned of. ``stacklevel``, ``labels`` and
    ``numbers`` as in :func:`warn_if_degenerate`; ``remedy``, the advice that ends the message
    where the model has no ``bounds`` (default: those, or the spline)."""
    if not x.is_floating_point() or x.dim() != 2 or x.shape[0] < 20:
        return []
    median, high = _quantiles(x, [0.5, 0.99])
    skewed = (x > 0).all(0) & (high > SKEWED * median)  # positive in every row
    skewed[list(skip)] = False
    columns = skewed.nonzero().flatten().tolist()
    if not columns:
        return columns
    one = len(columns) == 1
    ratios = _and([f"{float(high[j] / median[j]):.3g}" for j in columns[:10]])
    _data_warning(DataWarning(
        f"'{name}', {_column_names(columns, labels, numbers)}, hold{'s' if one else ''} only "
        f"positive values whose 99th percentile is {ratios} times their median: affine "
        "autoregressive layers stretch such a tail "
        "linearly beyond the training rows, and some held-out rows can score thousands of nats "
        "or more however well the flow validates. ",
        *(remedy or ("Give those columns a lower bound of 0 (", Mention("bounds"), ": the flow "
                     "then models their logarithm) or use the spline (",
                     Mention("transformer", "spline"), ")"))), stacklevel=stacklevel)
    return columns


OUTLIER_RATIO = 1000.0
"""A column whose standard deviation is more than ``OUTLIER_RATIO`` times its robust scale
(interquartile range / 1.349) draws a :class:`DataWarning` for flows that standardize by the
mean and standard deviation (see :func:`warn_if_outlying`)."""


def warn_if_outlying(
    name: str, x: Tensor, skip: Sequence[int] = (), stacklevel: int = 6,
    labels: Sequence[str] | None = None, numbers: Sequence[int] | None = None,
) -> list[int]:
    """Warn if a floating column of ``x`` ``(N, D)`` (other than those in ``skip``) has a
    standard deviation above :data:`OUTLIER_RATIO` times its interquartile range / 1.349: a few
    gross outliers (data-entry errors, a sensor's overflow value) set the scale of a
    standardization by the mean and standard deviation, which then squeezes the other rows into
    a sliver of the flow's input (two rows at 10^6 among 2400 of unit spread: a ratio of
    3 * 10^4, and 17.5 nats per clean row where 2.83 is exact). Names the columns and the most
    extreme row of each, and advises ``standardize="robust"``. Returns the columns warned of.
    ``stacklevel``, ``labels`` and ``numbers`` as in :func:`warn_if_degenerate`."""
    if not x.is_floating_point() or x.dim() != 2 or x.shape[0] < 20:
        return []
    low, median, high = _quantiles(x, [0.25, 0.5, 0.75])
    robust = (high - low) / IQR_OF_NORMAL
    std = x.std(dim=0, correction=0).double()  # (no float64 copy of all the rows)
    outlying = (robust > 0) & (std > OUTLIER_RATIO * robust)
    outlying[list(skip)] = False
    columns = outlying.nonzero().flatten().tolist()
    if not columns:
        return columns
    one = len(columns) == 1
    ratios = _and([f"{float(std[j] / robust[j]):.3g}" for j in columns[:10]])
    extreme = []
    for j in columns[:10]:
        i = int((x[:, j].double() - median[j]).abs().argmax())
        extreme.append(f"row {i}: {x[i, j].item():.6g}")
    _data_warning(DataWarning(
        f"'{name}', {_column_names(columns, labels, numbers)}, ha{'s' if one else 've'} a "
        f"standard deviation {ratios} times {'its' if one else 'their'} interquartile range "
        f"/ 1.349 (most extreme: {'; '.join(extreme)}): a few gross outliers, or a very heavy "
        "tail, set the scale of the standardization, which squeezes the other rows into a "
        "sliver of the flow's input. Check those rows, or build the flow with ",
        Mention("standardize", "robust"), " (median and interquartile range)"),
        stacklevel=stacklevel)
    return columns


def _column_name(j: int, names: Sequence[str] | None, numbers: Sequence[int] | None) -> str:
    """Column ``j`` of an array as the data warnings name it: its number as the user counts it
    (``numbers[j]``, else ``j``) and its name, if the columns have names."""
    name = "" if names is None else f" ({names[j]!r})"
    return f"column {j if numbers is None else numbers[j]}{name}"


def _and(items: list[str]) -> str:
    """``"3"``, ``"3 and 4"``, ``"3, 4 and 5"``: values listed column by column in a message
    (after :func:`_column_names`, in the same order)."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _column_names(
    js: list[int], names: Sequence[str] | None, numbers: Sequence[int] | None
) -> str:
    """Columns ``js`` as the data warnings name them (:func:`_column_name`): ``column 0
    ('age')``, ``columns 0 ('age') and 2 ('kids')``; the first 10, then how many more."""
    if len(js) == 1:
        return _column_name(js[0], names, numbers)
    named = [_column_name(j, names, numbers).removeprefix("column ") for j in js[:10]]
    more = f" and {len(js) - 10} more" if len(js) > 10 else ""
    last = "" if more else f" and {named.pop()}"
    return f"columns {', '.join(named)}{last}{more}"


def _data_warning(message: str | DataWarning, stacklevel: int = 6) -> None:
    """A :class:`DataWarning` (of ``message``'s text, or ``message`` itself) pointing at the
    caller of ``fit`` by default, whose checks of array data all run at one depth: fit ->
    _make_source (or held_out.held_out_loss) -> load_arrays -> the check -> here."""
    warnings.warn(message, DataWarning, stacklevel=stacklevel)


def warn_if_rounded(
    label: tuple[str | Mention, ...], t: Any, dtype: torch.dtype,
    names: Sequence[str] | None = None, numbers: Sequence[int] | None = None,
    stacklevel: int = 6,
) -> list[int]:
    """Warn (:class:`PrecisionWarning`) if casting the floating array ``t`` ``(N, D)`` to
    ``dtype`` keeps fewer than :data:`MIN_LEVELS` steps per standard deviation in some column
    (the step near ``v`` is about ``eps(dtype) |v|``); return those columns (positions in
    ``t``). ``label``: the message parts that name ``t``; ``names``: its columns' names, if any;
    ``numbers``: the columns' numbers as the user counts them (default: their positions);
    ``stacklevel`` as in :func:`warn_if_degenerate`."""
    if isinstance(t, np.ndarray) and t.dtype.kind == "f":
        t = torch.from_numpy(t)
    if not (isinstance(t, Tensor) and t.is_floating_point() and t.dim() == 2 and len(t) > 1):
        return []
    if torch.finfo(t.dtype).eps >= torch.finfo(dtype).eps:
        return []  # not a cast to a coarser type
    t = t.detach().double()
    spread, size = t.std(dim=0), t.abs().amax(dim=0)
    levels = spread / (torch.finfo(dtype).eps * size).clamp_min(torch.finfo(dtype).tiny)
    coarse = ((levels < MIN_LEVELS) & (spread > 0)).nonzero().flatten().tolist()
    if coarse:
        j = coarse[0]
        one = len(coarse) == 1
        tiny = size[j] < torch.finfo(dtype).tiny / torch.finfo(dtype).eps  # below normal floats
        remedy = (f"Multiply {'it' if one else 'them'} by a power of ten first (in float64): "
                  f"values this small are below {dtype}'s normal range, where its steps are "
                  "coarse whatever the offset"
                  if tiny else "Subtract a typical value first (e.g. x - x.mean(0), in float64)")
        _data_warning(PrecisionWarning(
            *label, f", {_column_names(coarse, names, numbers)}, ha{'s' if one else 've'} "
            f"{'a ' if one else ''}standard deviation{'' if one else 's'} of "
            + _and([f"{spread[k].item():.3g}" for k in coarse[:10]])
            + " at values up to " + _and([f"{size[k].item():.3g}" for k in coarse[:10]])
            + f": cast to {dtype} {'it keeps' if one else 'they keep'} about "
            + _and([f"{levels[k].item():.3g}" for k in coarse[:10]])
            + f" steps per standard deviation. {remedy}, or train a float64 model (",
            Mention("dtype", "float64", "model.double()"), ")",
        ), stacklevel=stacklevel)
    return coarse
