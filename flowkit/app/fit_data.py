"""The data of ``flowkit fit``: a toy dataset's sampler, or the rows of a .npy, .npz or CSV file.

:func:`load_toy` gives a sampling function, drawn afresh at every step, and a fixed validation
set; :func:`load_file` reads an ``(N, D)`` array of finite real values and splits off its
``--context`` (columns by number or, in a CSV file with a header row, by name; or another array
of the .npz); ``fit(valid=<fraction>)`` then holds out
``--valid-fraction`` of its rows. Arrays of the other byte order are converted to this
machine's (exactly). Bad values are refused here, named by the options. Both
return data in the forms :func:`flowkit.train.fit` accepts: ``x`` or ``(x, context)``.
"""

from __future__ import annotations

import codecs
import csv
import itertools
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flowkit.data import read_arrays
from flowkit.train import DataWarning

__all__ = ["load_file", "load_toy"]


def load_toy(name: str, valid_size: int, seed: int) -> tuple[Any, torch.Tensor, int]:
    """A sampler ``sample(n, generator)`` of toy dataset ``name``, ``valid_size`` validation
    points drawn with ``seed``, and ``D = 2``."""
    from flowkit.data import sample_toy

    def sample(n: int, generator: torch.Generator) -> torch.Tensor:
        return sample_toy(name, n, generator=generator)

    return sample, sample_toy(name, valid_size, seed=seed), 2


def load_file(
    path: Path, key: str | None, context: list[str] | None
) -> tuple[Any, list[int], int, list[str] | None]:
    """The data of a file (``x`` or ``(x, context)``); the positions in the file of the ``D``
    modelled columns (the columns of the array that ``--context`` columns did not take); ``C``;
    and the names of the modelled columns (a CSV file's header; ``None`` for numpy files and
    CSV files without one)."""
    suffix = path.suffix.lower()
    if not path.is_file():
        from flowkit.data import TOY_DATASETS

        what = ("a folder: pass a .npy, .npz or .csv file inside it" if path.is_dir()
                else "no such file")
        raise ValueError(
            f"'--data' should be a toy dataset ({', '.join(TOY_DATASETS)}) or an existing .npy, "
            f".npz or .csv file, got '{path}' ({what})"
        )
    if suffix not in (".npy", ".npz", ".csv"):
        raise ValueError(
            f"'--data' reads .npy and .npz files (numpy's own formats) and .csv files (numbers "
            f"separated by commas, with or without a header row), got '{path}'"
        )
    if suffix in (".npy", ".csv") and key is not None:
        raise ValueError(f"'--key' names an array of a .npz file; '{path}' is a {suffix} file")
    names = None
    if suffix == ".csv":
        table, names = read_csv(path)
        arrays = {"x": table}
    else:
        arrays = _read_arrays(path, suffix)
    if suffix != ".npz":
        key = "x"
    elif key is None:
        others = [n for n in arrays if not (context and n in context)]
        if "x" not in arrays and len(others) != 1:
            raise ValueError(
                f"'{path}' holds the arrays {sorted(arrays)}: name the one to model with "
                "--key (without it, the array 'x' or the only array is used)"
            )
        key = "x" if "x" in arrays else others[0]
    elif key not in arrays:
        raise ValueError(f"'--key' {key!r} is not an array of '{path}': {sorted(arrays)}")
    loaded = arrays[key]
    named = f"'--data' '{path}'" + ("" if suffix != ".npz" else f" (array {key!r})")
    if loaded.ndim != 2:
        hint = ("; one value per row: save it as x.reshape(-1, 1)" if loaded.ndim == 1 else "")
        raise ValueError(f"{named} should hold an array of shape (N, D), got {loaded.shape}{hint}")
    if 0 in loaded.shape:
        raise ValueError(f"{named} is empty: shape {loaded.shape}")
    _check_values(named, loaded, real=True)
    c, kept = None, list(range(loaded.shape[1]))
    if context is not None:
        if repeated := sorted({c for c in context if context.count(c) > 1}):
            raise ValueError(f"'--context' names {', '.join(map(repr, repeated))} more than once")
        numbers = all(c.lstrip("-").isdigit() for c in context)  # positions, as for .npy
        if names is not None and not numbers and all(n in names for n in context):
            context = [str(names.index(n)) for n in context]
        loaded, c, kept = _split_context(loaded, arrays, context, key, path, names)
        names = None if names is None else [names[i] for i in kept]
    data = loaded if c is None else (loaded, c)
    return data, kept, 0 if c is None else c.shape[1], names


def read_csv(path: Path) -> tuple[np.ndarray, list[str] | None]:
    """The ``(N, D)`` float64 table of a CSV file (UTF-8 text, numbers separated by commas,
    each may be quoted; blank lines and lines starting with ``#`` skipped) and its column names:
    the first line is a header when one of its fields is neither a number, nor empty, nor a
    missing value's marker beside numbers (``473,NA,906`` is a row with a missing value), or
    else the comment line just above it when that holds as many names
    (``np.savetxt(..., header="a,b")`` writes ``# a,b``). A field that is not a number (an empty
    one included) is an error naming its line and column; so are empty or repeated names
    (pandas' ``to_csv`` writes its index as a first, unnamed column). A first line of whole
    numbers above rows of decimals (``2019,2020,2021``, a header of numbers) is read as a row,
    with a :class:`~flowkit.train.DataWarning`."""
    _check_utf8(path)
    number, first, comment = _first_line(path)
    if not first:
        raise ValueError(f"'--data' '{path}' is empty: it holds no rows")

    def fields_of(line: str) -> list[str]:
        return [field.strip().strip("\"'") for field in line.rstrip("\r\n").split(",")]

    fields = fields_of(first)
    other = next((sep for sep in (";", "\t", "|") if sep in first), None)
    if len(fields) == 1 and other is not None:
        raise ValueError(f"'--data' '{path}' seems separated by {other!r} (line {number + 1}): "
                         "only commas are read")
    text = [field for field in fields if field and not _is_number(field)]
    header = bool(text) and not (any(_is_number(f) for f in fields)
                                 and all(f.lower() in MISSING_MARKERS for f in text))
    names = fields if header else None
    if header:
        decimals = [f for f in fields if _is_number(f) and not f.lstrip("+-").isdigit()]
        if decimals:  # a row with a missing value written as text, not a header
            raise ValueError(
                f"'--data' '{path}', line {number + 1}, mixes numbers ({decimals[0]}) and text: "
                "a header names every column, a row holds numbers (write missing values as "
                "nan, or drop those rows)")
        _check_names(path, names)
    elif comment is not None:
        above = fields_of(comment.lstrip("#"))
        if (len(above) == len(fields) and all(above) and len(set(above)) == len(above)
                and not any(_is_number(name) for name in above)):
            names = above  # np.savetxt's header; another comment line is only a comment
    try:
        with warnings.catch_warnings():  # a header and no rows: said below, by name
            warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
            table = np.loadtxt(path, delimiter=",", comments="#", ndmin=2, dtype=np.float64,
                               skiprows=number + 1 if header else 0, encoding="utf-8-sig",
                               quotechar='"')
    except ValueError:
        raise ValueError(
            f"'--data' '{path}' should hold numbers separated by commas (a header row of column "
            f"names may come first): {_first_bad_field(path, number + 1 if header else 0)}"
        ) from None
    if header and table.shape[0] == 0:
        raise ValueError(f"'--data' '{path}' has a header but no rows")
    if names is not None and table.size and len(names) != table.shape[1]:
        raise ValueError(f"'--data' '{path}' has a header of {len(names)} names and rows of "
                         f"{table.shape[1]} values")
    if names is None and _numbers_as_names(fields, table):
        warnings.warn(
            f"'--data' '{path}', line {number + 1} ({first.strip()}), holds only whole numbers "
            "where the rows below it hold decimals in most columns: it was read as a row of "
            "data. If it is a header, give the columns names that are not numbers (a header "
            "of numbers cannot be told from a row) or delete it", DataWarning, stacklevel=2,
        )
    return table, names


MISSING_MARKERS = frozenset({"na", "n/a", "#n/a", "<na>", "null", "none", "nil", "missing", "?",
                             "-", "--"})
"""Texts that spreadsheets and pandas write for a missing value (lower-cased): a first line
whose only texts are these, beside numbers, is a row with missing values, not a header."""


def _numbers_as_names(fields: list[str], table: np.ndarray) -> bool:
    """Whether the first row, read as data, looks like a header of numbers: its fields all
    distinct whole numbers of no sign (``2019,2020,2021``, ``0,1,2``), and most columns of the
    rows below it not whole numbers."""
    if (table.shape[0] < 3 or not all(f.isdigit() for f in fields)
            or len(set(map(int, fields))) < len(fields)):
        return False
    below = table[1:]
    return bool((below != np.round(below)).any(axis=0).mean() > 0.5)


def _check_utf8(path: Path) -> None:
    """Refuse a file that is not UTF-8 text (UTF-16, as some spreadsheets save "Unicode text";
    Latin-1 or another 8-bit code), naming the line of the first byte that is not."""
    with path.open("rb") as f:
        start = f.read(4)
        if start.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or b"\x00" in start:
            raise ValueError(f"'--data' '{path}' looks like UTF-16 text: save it as UTF-8 (CSV "
                             "UTF-8 in a spreadsheet's save dialog)")
        f.seek(0)
        decoder, line = codecs.getincrementaldecoder("utf-8")(), 1
        for chunk in itertools.chain(iter(lambda: f.read(1 << 20), b""), [b""]):  # b"": the end
            pending = decoder.getstate()[0]  # bytes of a character cut by the last chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                data = pending + chunk
                line += data[: e.start].count(b"\n")
                raise ValueError(
                    f"'--data' '{path}' is not UTF-8 text: line {line} holds the byte "
                    f"0x{data[e.start]:02x}, which UTF-8 does not allow there (Latin-1 or "
                    "another 8-bit code?); save it as UTF-8"
                ) from None
            line += chunk.count(b"\n")


def _check_names(path: Path, names: list[str]) -> None:
    """Refuse a header with an empty or a repeated name, naming the column."""
    if "" in names:
        j = names.index("")
        index = (" (pandas' to_csv writes the frame's index as an unnamed first column: write "
                 "it with index=False)" if j == 0 else "")
        raise ValueError(f"'--data' '{path}': the header names no column {j}{index}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"'--data' '{path}': the header names several columns {repeated}")


def _first_bad_field(path: Path, skip: int) -> str:
    """Where the first row of ``path`` (after ``skip`` lines) that is not all numbers is."""
    with path.open(encoding="utf-8-sig", errors="replace") as f:
        width = None
        for number, line in enumerate(f, start=1):
            if number <= skip or not line.strip() or line.startswith("#"):
                continue
            fields = next(csv.reader([line.rstrip("\r\n")]))
            if width is not None and len(fields) != width:
                return f"line {number} has {len(fields)} fields, the lines before it {width}"
            width = len(fields)
            for column, field in enumerate(fields, start=1):
                if not field.strip():
                    return (f"line {number}, field {column} is empty (a missing value: drop or "
                            "fill such rows first)")
                if not _is_number(field):
                    other = next((sep for sep in (";", "\t", "|") if sep in field), None)
                    hint = ("" if other is None else
                            f" (the file seems separated by {other!r}: only commas are read)")
                    if other is None and "," in field:  # a quoted "1,234", or a quote left open
                        hint = (" (write numbers without thousands separators)"
                                if line.count('"') % 2 == 0 else " (a quote left open)")
                    if field.strip().lower() in MISSING_MARKERS:
                        hint = " (a missing value: drop or fill such rows first)"
                    return f"line {number}, field {column} is {field.strip()!r}{hint}"
    return "numpy could not read it as such"


def _first_line(path: Path) -> tuple[int, str, str | None]:
    """The 0-based number and the text of the first line of ``path`` that is neither blank nor
    a comment (``(0, "", None)`` for a file without one), and the comment line just above it,
    if any."""
    comment = None
    with path.open(encoding="utf-8-sig", errors="replace") as f:
        for number, line in enumerate(f):
            if line.startswith("#"):
                comment = line
            elif line.strip():
                return number, line, comment
            else:
                comment = None
    return 0, "", None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


_MAGIC = {".npy": b"\x93NUMPY", ".npz": b"PK"}
"""The first bytes of numpy's .npy files and of .npz files (zip archives)."""


def _read_arrays(path: Path, suffix: str) -> dict[str, np.ndarray]:
    """The arrays of a .npy (as ``"x"``) or .npz file, numbers only (no pickles); a file numpy
    cannot read is a ValueError naming it and the option."""
    with path.open("rb") as f:
        head = f.read(6)
    if head[: len(_MAGIC[suffix])] != _MAGIC[suffix]:
        raise ValueError(f"'--data' '{path}' is not a numpy {suffix} file (it does not start "
                         "as one: another format renamed, or a damaged file)")
    try:
        return read_arrays(path)
    except ValueError as e:
        raise ValueError(f"'--data' {e}") from None


def _split_context(
    x: np.ndarray,
    arrays: dict[str, np.ndarray],
    context: list[str],
    key: str,
    path: Path,
    names: list[str] | None,
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """``(x, context)`` from ``--context``: columns of ``x``, or one other array of the file;
    and the columns of ``x`` kept as data."""
    everything = range(x.shape[1])
    if all(c.lstrip("-").isdigit() for c in context):
        columns = [int(c) for c in context]
        if any(not 0 <= c < x.shape[1] for c in columns) or len(set(columns)) != len(columns):
            raise ValueError(
                f"'--context' columns should be distinct integers in [0, {x.shape[1]}) (the "
                f"columns of {key!r}, shape {x.shape}), got {context}"
            )
        if len(columns) == x.shape[1]:
            raise ValueError(f"'--context' {context} takes every column: none is left to model")
        keep = [i for i in everything if i not in columns]
        return x[:, keep], x[:, columns], keep
    if names is not None:
        unknown = [c for c in context if c not in names]
        raise ValueError(
            f"'--context' should name columns of '{path}' ({names}) or give their numbers; "
            f"{unknown} {'is' if len(unknown) == 1 else 'are'} not among them"
        )
    if len(context) != 1 or context[0] not in arrays or context[0] == key:
        raise ValueError(
            f"'--context' should be column numbers of {key!r} or the name of one other array of "
            f"'{path}' ({sorted(set(arrays) - {key})}), got {context}"
        )
    c = arrays[context[0]]
    _check_values(f"the context array {context[0]!r} of '{path}'", c, real=False)
    if c.ndim == 1:
        c = c[:, None]
    if c.ndim != 2 or c.shape[0] != x.shape[0]:
        raise ValueError(
            f"the context array {context[0]!r} should have shape ({x.shape[0]}, C) or "
            f"({x.shape[0]},), one row per row of {key!r}, got {arrays[context[0]].shape}"
        )
    return x, c, list(everything)


def _check_values(named: str, a: np.ndarray, real: bool) -> None:
    """Fail unless ``a`` holds finite numbers: real (floating) ones when ``real`` (the data of a
    density), else integers and booleans too (a context, cast to floating point)."""
    if a.dtype.kind in "biu" and real:
        kind = "boolean" if a.dtype.kind == "b" else "integer"
        raise ValueError(
            f"{named} holds {kind} values ({a.dtype}): a flow is a density over real values; "
            "dequantize them first (add uniform noise in [0, 1) to each value), or a density on "
            "them grows without bound"
        )
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{named} should hold real numbers, got values of dtype {a.dtype}")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        bad = np.argwhere(~np.isfinite(a))[0]
        raise ValueError(
            f"{named} holds NaN or Inf values (first at row {bad[0]}"
            + (f", column {bad[1]})" if a.ndim == 2 else ")")
        )
