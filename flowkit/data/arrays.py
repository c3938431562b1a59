"""Numpy arrays as flowkit reads them: from ``.npy`` and ``.npz`` files (numbers only, no
pickles), in this machine's byte order.

A damaged or truncated ``.npz`` makes numpy and :mod:`zipfile` raise one of several errors (a bad
CRC-32, a damaged header's "compression method" or "encrypted" flag, a cut archive):
:data:`DAMAGED_NPZ` lists them, and the readers turn them into a ``ValueError`` naming the file.
"""

from __future__ import annotations

import os
import zipfile
import zlib

import numpy as np

__all__ = ["DAMAGED_NPZ", "native_byte_order", "read_arrays"]

DAMAGED_NPZ = (
    ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError,
    RuntimeError,
)
"""What numpy and zipfile raise for a truncated or damaged ``.npy`` or ``.npz``."""


def native_byte_order(a: np.ndarray) -> np.ndarray:
    """``a`` in this machine's byte order: the same values, converted exactly (a file of
    ``>f8``, as FITS files and some instruments write, is big-endian, which torch refuses);
    ``a`` itself when it is native already."""
    if a.dtype.kind in "biufc" and not a.dtype.isnative:
        return a.astype(a.dtype.newbyteorder("="))
    return a


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a ``.npy`` file (as ``"x"``) or of a ``.npz`` archive (by name), numbers
    only, in this machine's byte order.

    Raises:
        TypeError: ``path`` is not a file path.
        ValueError: a missing file or a folder; a name that ends neither in ``.npy`` nor in
            ``.npz``; a file numpy cannot read as one (damaged, truncated, another format), or
            one that holds Python objects; the message names the file.
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"'path' should be a file path (str or os.PathLike), got "
                        f"{type(path).__name__}")
    path = os.path.expanduser(os.fspath(path))
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".npy", ".npz"):
        raise ValueError(f"'path' should name a .npy or .npz file, got '{path}'")
    if not os.path.isfile(path):
        raise ValueError(f"'path' should be an existing file, got '{path}' "
                         f"({'a folder' if os.path.isdir(path) else 'no such file'})")
    try:
        if suffix == ".npy":
            return {"x": native_byte_order(np.load(path))}  # allow_pickle=False: arrays only
        with np.load(path) as archive:
            return {name: native_byte_order(archive[name]) for name in archive.files}
    except DAMAGED_NPZ as e:
        what = ("holds Python objects, not an array of numbers" if "allow_pickle" in str(e)
                else f"cannot be read as a numpy {suffix} file ({e}): it is damaged or "
                "truncated")
        raise ValueError(f"'{path}' {what}") from None
