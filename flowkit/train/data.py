"""Batch sources for the fit loop: in-memory arrays, DataLoaders and sampling functions.

Each source hands out the batch of *this process* for a given step and can save and restore its
position, so that a resumed run sees exactly the batches an uninterrupted run would have seen.

* :class:`TensorSource`: the dataset lives on the training device. Epoch ``e`` visits the rows in
  the order ``randperm(N)`` drawn from a generator seeded by ``(seed, e)``; step ``t`` of the
  epoch takes the ``t``-th block of ``batch_size`` rows (the last ``N % batch_size`` rows of the
  permutation are skipped). Under ``torchrun`` process ``r`` of ``W`` takes the ``r``-th
  ``1/W`` of that block, so the global batch is the same for any number of processes. The
  position is a function of the step, so there is no state to save.
* :class:`LoaderSource`: a user's :class:`~torch.utils.data.DataLoader`. To resume mid-epoch it
  records the random state at the start of each epoch, re-creates the epoch's iterator from it and
  skips the batches already used.
* :class:`SamplerSource`: a function ``sample(n, generator) -> x`` or ``-> (x, context)`` that
  draws fresh data every step from a per-process :class:`torch.Generator` on the training device.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from ..data.arrays import native_byte_order
from ..validation import ArgumentError, Mention, nonfinite_row_mask
from .distributed import Dist

Batch = tuple[Tensor, Tensor | None]


def derive_seed(*keys: int) -> int:
    """A well-mixed 63-bit seed from integer keys (e.g. ``(seed, epoch)`` or ``(seed, rank)``)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1, np.uint64)[0] >> np.uint64(1))


def local_batch_size(batch_size: int, dist: Dist) -> int:
    """This process's share of the global ``batch_size``."""
    if batch_size % dist.world_size:
        raise ValueError(
            f"'batch_size' ({batch_size}) should be divisible by the number of processes "
            f"({dist.world_size})"
        )
    return batch_size // dist.world_size


def as_tensor(
    name: str, value: Any, device: torch.device, dtype: torch.dtype, keep_discrete: bool = False
) -> Tensor:
    """``value`` (tensor or numpy array) as a tensor on ``device``, cast to ``dtype``.

    With ``keep_discrete=True`` integer and bool values keep their dtype (the class indices of a
    :class:`~flowkit.CategoricalMADE`, binary pixels stored as ``uint8``); only floating values
    are cast. Data ``x`` is loaded that way, contexts always become ``dtype``.
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
    return t.to(device=device, dtype=cast)


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
    the numpy array of its values, column by column (exact: the array numpy makes of those
    columns, of integers if every column holds integers); anything else as it is.

    A data frame is anything with ``to_numpy`` and ``columns`` (pandas, polars), or a pandas
    ``Series`` (``to_numpy`` and ``dtype``), so a table is taken as users hold it; its columns
    must hold numbers: one of strings, categories or missing values of a nullable type is
    refused, named, rather than converted to Python objects."""
    if isinstance(value, tuple | list) and len(value) == 2:
        pair = frames_as_arrays(name, value[0]), frames_as_arrays(f"{name} context", value[1])
        changed = any(a is not b for a, b in zip(pair, value, strict=True))
        return (pair if isinstance(value, tuple) else list(pair)) if changed else value
    if isinstance(value, Tensor | np.ndarray) or not hasattr(value, "to_numpy"):
        return value
    if hasattr(value, "columns"):
        columns = {str(c): np.asarray(value[c].to_numpy()) for c in value.columns}
    elif hasattr(value, "dtype"):
        columns = {str(getattr(value, "name", None) or "values"): np.asarray(value.to_numpy())}
    else:
        return value
    not_numbers = [name for name, column in columns.items() if column.dtype.kind not in "biuf"]
    if not_numbers:
        raise ValueError(
            f"'{name}' is a {type(value).__name__} whose columns {not_numbers} do not hold "
            "numbers (text, categories, or missing values of a nullable type): encode or drop "
            "them, and drop or fill the rows with missing values, before fitting"
        )
    if not hasattr(value, "columns"):
        return next(iter(columns.values()))
    if not columns:
        return np.empty((len(value), 0))
    return np.column_stack(list(columns.values()))


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


def load_arrays(
    name: str, value: Any, device: torch.device, dtype: torch.dtype, density: bool = False
) -> Batch:
    """Validate and move an in-memory dataset ``x`` or ``(x, context)`` to ``device`` once.

    Warns (:class:`PrecisionWarning`) when casting to ``dtype`` leaves a column with fewer than
    :data:`MIN_LEVELS` representable steps per standard deviation (data far from zero compared
    with their spread, such as timestamps in seconds or a measurement with a large offset):
    the model would see them coarsely rounded, before its standardization could help. With
    ``density=True`` (training data of a continuous density, a :class:`~flowkit.Flow`), also
    warns (:class:`DataWarning`) when a column of ``x`` is constant or takes few distinct values
    (:func:`warn_if_degenerate`)."""
    x, c = split_pair(name, value)
    raw = readable(name, x), None if c is None else readable(f"{name} context", c)
    rounded = []  # (a loop, not a comprehension: the warnings' stack level counts frames)
    for label, t in zip((f"'{name}'", f"the context of '{name}'"), raw, strict=True):
        rounded.append(_warn_if_rounded(label, t, dtype))
    x, c = as_batch(name, *raw, device, dtype)
    check_pair_shapes(name, x, c)
    check_finite(name, x, c)
    if density:
        warn_if_degenerate(name, x, skip=rounded[0])  # columns the cast made constant: warned
    return x, c


def check_pair_shapes(name: str, x: Tensor, context: Tensor | None, batch: bool = False) -> None:
    """Fail unless ``x`` has shape ``(N, ...)``, ``N >= 1``, and ``context``, if any, ``(N, C)``:
    the shapes any model needs of the data ``name`` (its first batch, with ``batch``); the widths
    the model needs are checked against the model."""
    what = f"the first batch of '{name}'" if batch else f"'{name}'"
    if x.dim() < 2:
        raise ValueError(f"{what} should have shape (N, features), got {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"{what} should have at least one row, got shape {tuple(x.shape)}")
    if context is not None and (context.dim() != 2 or context.shape[0] != x.shape[0]):
        raise ValueError(
            f"the context of {what} should have shape ({x.shape[0]}, context_features) to pair "
            f"with x of shape {tuple(x.shape)}, got {tuple(context.shape)}"
        )


def check_finite(name: str, x: Tensor, context: Tensor | None, batch: bool = False) -> None:
    """Fail if a floating ``x`` ``(N, ...)`` or ``context`` ``(N, C)`` holds NaN or Inf,
    naming ``name`` (the first batch of it, with ``batch``) and the first such row."""
    for part, t in (("x", x), ("context", context)):
        if t is not None and t.is_floating_point() and not torch.isfinite(t).all():
            row = int(nonfinite_row_mask(t).nonzero()[0])
            if batch:
                raise ValueError(f"the first batch of '{name}' holds NaN or Inf values in "
                                 f"{part} (row {row} of the batch)")
            raise ValueError(f"'{name}' {part} contains NaN or Inf values (first at row {row})")


MIN_LEVELS = 1000
"""Fewest representable steps per standard deviation of a column that :func:`load_arrays`
accepts without a :class:`PrecisionWarning` (about 10 bits of the spread)."""


class DataWarning(UserWarning):
    """Training data that a density model cannot fit as given (see :func:`load_arrays`)."""


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
    name: str, x: Tensor, stacklevel: int = 6, skip: Sequence[int] = ()
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
    default 6, fit's caller)."""
    if not x.is_floating_point() or x.dim() != 2:
        return
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
        j = constant[0]
        _data_warning(
            f"'{name}', column {j}, holds a single value ({x[0, j].item():.6g}) in all "
            f"{n} rows ({len(constant)} constant column(s): {constant[:10]}): a density "
            "over it is a point mass, so the training NLL falls without bound while the model "
            "contracts that column; drop constant columns before fitting", stacklevel=stacklevel
        )
    few_mask = (distinct > 1) & (distinct <= max(FEW_VALUES * n, 10)) & (distinct <= n / 2)
    if few := few_mask.nonzero().flatten().tolist():
        j = few[0]
        _data_warning(
            f"'{name}', column {j}, takes only {int(distinct[j])} distinct values in "
            f"{n} rows ({len(few)} column(s) like it: {few[:10]}): a continuous density "
            "concentrates on such values as it trains, so its log-density there grows and "
            "means little; add uniform noise of one quantization step to the column "
            "(dequantization), or model it with a discrete distribution", stacklevel=stacklevel
        )
    has_run[list(skip)] = False
    if massed := (has_run & (distinct > 1) & ~few_mask).nonzero().flatten().tolist():
        j = massed[0]
        values, counts = x[:, j].unique(return_counts=True)
        count, k = counts.max(dim=0)
        _data_warning(
            f"'{name}', column {j}, holds the value {values[k].item():.6g} in "
            f"{int(count)} of its {n} rows ({len(massed)} column(s) like it: "
            f"{massed[:10]}): a point mass inside a continuous column, which a flow approaches "
            "by contracting the column there, so the training NLL falls without bound; model "
            "that value apart (e.g. a mixture of the point mass and a density of the other "
            "rows) or add noise of the measurement's resolution", stacklevel=stacklevel
        )


def _data_warning(
    message: str, category: type[DataWarning] = DataWarning, stacklevel: int = 6
) -> None:
    """A warning pointing at the caller of ``fit`` by default, whose checks of array data all
    run at one depth: fit -> _make_source (or _make_validation) -> load_arrays -> the check ->
    here."""
    warnings.warn(message, category, stacklevel=stacklevel)


def _warn_if_rounded(label: str, t: Any, dtype: torch.dtype) -> list[int]:
    """Warn if casting the floating array ``t`` ``(N, D)`` to ``dtype`` keeps fewer than
    :data:`MIN_LEVELS` steps per standard deviation in some column (the step near ``v`` is about
    ``eps(dtype) |v|``); return those columns."""
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
        _data_warning(
            f"{label}, column {j}, has a standard deviation of {spread[j].item():.3g} at values "
            f"up to {size[j].item():.3g}: cast to {dtype} it keeps about "
            f"{levels[j].item():.3g} steps per standard deviation ({len(coarse)} column(s) "
            "like it). Subtract a typical value first (e.g. x - x.mean(0), in float64), or "
            "train a float64 model (model.double())",
            PrecisionWarning,
        )
    return coarse


class TensorSource:
    """Shuffled mini-batches of an in-memory dataset (see the module docstring)."""

    def __init__(self, data: Batch, batch_size: int, seed: int, dist: Dist,
                 holdout: float | None = None):
        self.x, self.c = data
        self.holdout = holdout  # the fraction of the rows passed held out for validation
        n = self.x.shape[0]
        if batch_size > n:
            raise ValueError(
                f"'batch_size' ({batch_size}) exceeds the number of training rows ({n}); "
                f"use batch_size <= {n}"
            )
        self.batch_size, self.seed, self.dist = batch_size, seed, dist
        self.batches_per_epoch = n // batch_size
        self.local = local_batch_size(batch_size, dist)
        self._epoch, self._perm = -1, self.x.new_empty(0, dtype=torch.long)
        self._fingerprint: Tensor | None = None

    def next_batch(self, step: int) -> Batch:
        epoch, i = divmod(step, self.batches_per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
            self._perm = torch.randperm(self.x.shape[0], generator=g).to(self.x.device)
            self._epoch = epoch
        start = i * self.batch_size + self.dist.rank * self.local
        idx = self._perm[start : start + self.local]
        return self.x[idx], None if self.c is None else self.c[idx]

    def state_dict(self) -> dict[str, Any]:
        """No position to keep (the order follows from the seed and step), but what identifies
        the data, for a resumed run to check against: rows, batch size, a fingerprint and the
        fraction held out for validation."""
        if self._fingerprint is None:
            self._fingerprint = _fingerprint(self.x, self.c)
        return {"rows": self.x.shape[0], "batch_size": self.batch_size,
                "fingerprint": self._fingerprint, "holdout": self.holdout}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        if "rows" not in state:  # written before these were recorded
            return
        check_same_batch_size(state, self.batch_size)
        if state.get("holdout", self.holdout) != self.holdout:  # (recorded since review 19)
            raise ArgumentError(
                "valid", "the checkpoint was trained on ", *_held_out(state["holdout"]),
                ", this run on ", *_held_out(self.holdout), ": other rows train; pass ",
                *((Mention("valid", state["holdout"]),) if state["holdout"] is not None else
                  ("no fraction as ", Mention("valid"))),
                " to resume it",
            )
        rows = self.x.shape[0]
        if state["rows"] != rows or not torch.allclose(
            state["fingerprint"], self.state_dict()["fingerprint"], rtol=1e-6, atol=1e-9
        ):
            raise ArgumentError(
                "data", Mention("data"), f" ({rows} rows) is not the data the checkpoint was "
                f"trained on ({state['rows']} rows"
                + (")" if state["rows"] != rows else ", other values)")
                + ": resume with the same data, or start a new run in another ",
                Mention("checkpoint_dir"),
            )


def _held_out(fraction: float | None) -> tuple[str | Mention, ...]:
    """Which rows of ``data`` train, for a message: ``'data' less valid=0.1``, or all."""
    if fraction is None:
        return ("all of ", Mention("data"))
    return (Mention("data"), " less ", Mention("valid", fraction))


def _fingerprint(x: Tensor, c: Tensor | None) -> Tensor:
    """Per-column sums and sums of squares of ``x`` (and of ``c``), in float64 on the CPU: the
    same for the same rows in any order, different for other values. By chunks of rows, so
    no float64 copy of the whole data is made."""
    sums = []
    for t in (x, c):
        if t is not None:
            chunks = [(d.sum(0), d.square().sum(0))
                      for d in (b.double() for b in t.split(8192))]
            sums += [sum(a for a, _ in chunks), sum(q for _, q in chunks)]
    return torch.cat(sums).cpu()


def check_same_batch_size(state: dict[str, Any], batch_size: int) -> None:
    """Refuse to resume a run written with another batch size (recorded as ``batch_size``; a
    state without it, written before it was recorded, passes)."""
    if state.get("batch_size", batch_size) != batch_size:
        raise ArgumentError(
            "batch_size", Mention("batch_size"), f" is {batch_size} but the checkpoint was "
            f"trained with batches of {state['batch_size']}; pass ",
            Mention("batch_size", state["batch_size"]), " to resume it",
        )


class SamplerSource:
    """Fresh samples every step from ``sample(n, generator)`` (see the module docstring)."""

    batches_per_epoch = None

    def __init__(
        self,
        sample: Callable[[int, torch.Generator], Any],
        batch_size: int,
        seed: int,
        dist: Dist,
        device: torch.device,
        dtype: torch.dtype,
    ):
        try:
            signature = inspect.signature(sample)
        except (TypeError, ValueError):  # no signature to read (a builtin): let the call decide
            signature = None
        if signature is not None:
            try:
                signature.bind(batch_size, None)
            except TypeError:
                raise TypeError(
                    f"'data', a sampling function, should have the signature sample(n, "
                    f"generator): it is called with the number of rows and a torch.Generator "
                    f"to draw them from, but its signature is {signature}"
                ) from None
        self.sample, self.device, self.dtype = sample, device, dtype
        self.batch_size, self.local = batch_size, local_batch_size(batch_size, dist)
        self.generator = torch.Generator(device=device).manual_seed(derive_seed(seed, dist.rank))

    def next_batch(self, step: int) -> Batch:
        x, c = as_batch("data", *split_pair("data", self.sample(self.local, self.generator)),
                        self.device, self.dtype)
        if x.dim() == 0 or x.shape[0] != self.local:
            raise ValueError(
                f"'data', a sampling function, should return {self.local} rows when asked for "
                f"n={self.local}, got shape {tuple(x.shape)}"
            )
        return x, c

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        check_same_batch_size(state, self.batch_size)
        self.generator.set_state(state["generator"])


def _generators(loader: DataLoader) -> list[torch.Generator]:
    """The generators a DataLoader's iterator draws from, besides torch's global one."""
    gens = [loader.generator, getattr(loader.sampler, "generator", None)]
    return [g for i, g in enumerate(gens) if g is not None and g not in gens[:i]]


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


def first_batch(name: str, loader: DataLoader, device: torch.device, dtype: torch.dtype) -> Batch:
    """The first batch of ``loader`` as :func:`as_batch` makes it, for checks before training.

    Every random state the iterator draws from (torch's global generators, the loader's own) is
    put back afterwards, so that drawing it changes no result of the run.
    """
    states = [g.get_state() for g in _generators(loader)]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        batch = next(iter(loader), None)
    for g, state in zip(_generators(loader), states, strict=True):
        g.set_state(state)
    if batch is None:
        raise ValueError(f"the DataLoader passed as '{name}' yields no batches")
    return loader_batch(name, batch, device, dtype)


class LoaderSource:
    """Batches of a :class:`~torch.utils.data.DataLoader`, resumable mid-epoch.

    Under ``torchrun`` the loader must use a :class:`~torch.utils.data.DistributedSampler`
    (``set_epoch`` is called for you); its batch size is then per process.
    """

    def __init__(self, loader: DataLoader, dist: Dist, device: torch.device, dtype: torch.dtype):
        sampler = getattr(loader, "sampler", None)
        if dist.enabled and not isinstance(sampler, torch.utils.data.DistributedSampler):
            raise ValueError(
                "under torchrun a DataLoader passed as 'data' must use a DistributedSampler so "
                "that each process sees its own shard (DataLoader(ds, batch_size=b, "
                "sampler=DistributedSampler(ds))), or pass the data as a tensor"
            )
        self.loader, self.device, self.dtype = loader, device, dtype
        try:
            self.batches_per_epoch: int | None = len(loader)
        except TypeError:  # IterableDataset without __len__
            self.batches_per_epoch = None
        self._iter: Iterator[Any] | None = None
        self._epoch, self._position, self._epoch_rng = -1, 0, {}

    def _start_epoch(self, epoch: int) -> None:
        self._epoch, self._position = epoch, 0
        self._epoch_rng = {
            "torch": torch.get_rng_state(),
            "generators": [g.get_state() for g in _generators(self.loader)],
        }
        if hasattr(self.loader.sampler, "set_epoch"):
            self.loader.sampler.set_epoch(epoch)
        self._iter = iter(self.loader)

    def next_batch(self, step: int) -> Batch:
        if self._iter is None:
            self._start_epoch(0)
        assert self._iter is not None
        try:
            batch = next(self._iter)
        except StopIteration:
            if self._position == 0:
                raise ValueError("the DataLoader passed as 'data' yields no batches") from None
            self._start_epoch(self._epoch + 1)
            batch = next(self._iter)
        self._position += 1
        return loader_batch("data", batch, self.device, self.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "position": self._position, "epoch_rng": self._epoch_rng}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Re-create the saved epoch's iterator from its starting random state and skip the
        batches already used. The caller restores the current random state afterwards."""
        if state["epoch"] < 0:
            return
        torch.set_rng_state(state["epoch_rng"]["torch"])
        for g, s in zip(_generators(self.loader), state["epoch_rng"]["generators"], strict=True):
            g.set_state(s)
        self._start_epoch(state["epoch"])
        assert self._iter is not None
        for _ in range(state["position"]):
            next(self._iter)
        self._position = state["position"]
