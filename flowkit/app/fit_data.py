"""The data of ``flowkit fit``: a toy dataset's sampler, or the rows of a .npy/.npz file.

:func:`load_toy` gives a sampling function, drawn afresh at every step, and a fixed validation
set; :func:`load_file` reads an ``(N, D)`` array of finite real values and splits off its
``--context`` (columns, or another array of the .npz); ``fit(valid=<fraction>)`` then holds out
``--valid-fraction`` of its rows. Arrays of the other byte order are converted to this
machine's (exactly). Bad values are refused here, named by the options. Both
return data in the forms :func:`flowkit.train.fit` accepts: ``x`` or ``(x, context)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from flowkit.data import read_arrays

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
) -> tuple[Any, int, int]:
    """The data of a file (``x`` or ``(x, context)``), ``D`` and ``C``."""
    suffix = path.suffix.lower()
    if not path.is_file():
        from flowkit.data import TOY_DATASETS

        what = ("a folder: pass a .npy or .npz file inside it" if path.is_dir()
                else "no such file")
        raise ValueError(
            f"'--data' should be a toy dataset ({', '.join(TOY_DATASETS)}) or an existing .npy "
            f"or .npz file, got '{path}' ({what})"
        )
    if suffix not in (".npy", ".npz"):
        raise ValueError(
            f"'--data' reads .npy and .npz files (numpy's own formats), got '{path}'; convert "
            "a table first, e.g. for a CSV file with a header row: python -c \"import numpy as "
            f"np; np.save('{path.with_suffix('.npy')}', np.loadtxt('{path}', delimiter=',', "
            "skiprows=1))\""
        )
    if suffix == ".npy" and key is not None:
        raise ValueError(f"'--key' names an array of a .npz file; '{path}' is a .npy file")
    arrays = _read_arrays(path, suffix)
    if suffix == ".npy":
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
    if loaded.ndim != 2:
        raise ValueError(
            f"'{path}' should hold an array of shape (N, D), got {loaded.shape} ({key!r})"
        )
    named = f"'--data' '{path}'" + ("" if suffix == ".npy" else f" (array {key!r})")
    if 0 in loaded.shape:
        raise ValueError(f"{named} is empty: shape {loaded.shape}")
    _check_values(named, loaded, real=True)
    c = None
    if context is not None:
        loaded, c = _split_context(loaded, arrays, context, key, path)
    data = loaded if c is None else (loaded, c)
    return data, loaded.shape[1], 0 if c is None else c.shape[1]


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
    x: np.ndarray, arrays: dict[str, np.ndarray], context: list[str], key: str, path: Path
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, context)`` from ``--context``: columns of ``x``, or one other array of the file."""
    if all(c.lstrip("-").isdigit() for c in context):
        columns = [int(c) for c in context]
        if any(not 0 <= c < x.shape[1] for c in columns) or len(set(columns)) != len(columns):
            raise ValueError(
                f"'--context' columns should be distinct integers in [0, {x.shape[1]}) (the "
                f"columns of {key!r}, shape {x.shape}), got {context}"
            )
        if len(columns) == x.shape[1]:
            raise ValueError(f"'--context' {context} takes every column: none is left to model")
        keep = [i for i in range(x.shape[1]) if i not in columns]
        return x[:, keep], x[:, columns]
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
    return x, c


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
