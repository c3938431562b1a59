"""Binarized MNIST with the standard fixed binarization (Larochelle & Murray, 2011).

The splits are Hugo Larochelle's ``binarized_mnist_{train,valid,test}.amat`` files: 50000,
10000 and 10000 rows of 784 whitespace-separated 0/1 integers (28 x 28 images, row-major), the
benchmark of the NADE, MADE and MAF papers. They are read from a data directory, in this order:

1. ``binarized_mnist.npz`` with arrays named after the splits (``train``, ``valid``,
   ``test``), if the directory holds one and it has the requested split;
2. ``binarized_mnist_{split}.amat``, downloaded into the directory first if missing and
   ``download=True`` (the download is checked against the file's published SHA-256 before it
   is kept).

Whichever is read, the split is then checked against the published SHA-256 of its ``.amat``
file: the digest of the images written out in that file's layout (rows of 784 digits separated
by single spaces), so a cached file that was damaged or replaced since (one flipped pixel, other
images of the same shape), in the ``.npz`` or the ``.amat``, is refused with a ``ValueError``
naming the file, to be deleted and downloaded again. This costs about 0.4 s for the training
split; :func:`load_split_file`, for files of any other images, checks no digest.

The data directory is ``root`` if given, else ``$FLOWKIT_DATA``, else ``~/.cache/flowkit``.

Data are returned as ``torch.uint8`` tensors of 0s and 1s, shape ``(n, 784)``: the training
split takes 39 MB instead of 157 MB in float32, and a model casts each batch
(``x.float()``) on its own device, which costs nothing next to the forward pass.

References:
    Larochelle & Murray, "The Neural Autoregressive Distribution Estimator", AISTATS 2011.
    Germain et al., "MADE: Masked Autoencoder for Distribution Estimation", ICML 2015.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from flowkit.data.arrays import DAMAGED_NPZ

SPLITS: tuple[str, ...] = ("train", "valid", "test")
PIXELS = 784
URL = (
    "http://www.cs.toronto.edu/~larocheh/public/datasets/binarized_mnist/"
    "binarized_mnist_{split}.amat"
)
NPZ_NAME = "binarized_mnist.npz"


class _Remote(NamedTuple):
    rows: int
    nbytes: int
    sha256: str


# Sizes and SHA-256 digests as published in TensorFlow Datasets'
# ``url_checksums/binarized_mnist.txt``. Each file is ``rows`` lines of 784 digits separated by
# single spaces, so ``nbytes = rows * 1568``. The train and valid digests were also checked
# here: rewriting the arrays of a copy of the data in that layout reproduces them exactly. The
# test digest could not be checked (no copy of the test split was at hand).
_FILES: dict[str, _Remote] = {
    "train": _Remote(
        50_000, 78_400_000, "ad693b29f94c14277b095f5238ddefbbdaaae0939789dd2f4f0205278cee3e4d"
    ),
    "valid": _Remote(
        10_000, 15_680_000, "1de3d397c40fe8eeb33dafd4099a1f665ec01e96d9be234aaeeac8a34930e2e2"
    ),
    "test": _Remote(
        10_000, 15_680_000, "e6687bfea3f820c174f33b7865140b2a2dd2930ef786f35d45795fc193b5ab2c"
    ),
}


def data_root(root: str | Path | None = None) -> Path:
    """The data directory: ``root``, else ``$FLOWKIT_DATA``, else ``~/.cache/flowkit``."""
    if root is None:
        root = os.environ.get("FLOWKIT_DATA") or Path.home() / ".cache" / "flowkit"
    return Path(root).expanduser()


def download_file(url: str, dest: str | Path, sha256: str) -> Path:
    """Download ``url`` to ``dest`` if its SHA-256 is ``sha256``.

    The data stream into a temporary file next to ``dest``, which is renamed onto ``dest`` (an
    atomic replace) only once the digest matches; on any failure it is deleted, so ``dest``
    either is absent or holds the verified file.

    Raises:
        OSError: the download failed or the digest differs.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha256:
            raise OSError(
                f"checksum mismatch for {url}: expected sha256 {sha256}, "
                f"got {digest.hexdigest()}; the download was discarded"
            )
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def _read_amat(path: Path) -> np.ndarray:
    """Parse an ``.amat`` file of 0/1 rows into a ``(n, 784)`` uint8 array, strictly."""
    rows = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            tokens = line.split()
            if len(tokens) != PIXELS:
                raise ValueError(
                    f"{path}, line {lineno}: expected {PIXELS} values, got {len(tokens)}"
                )
            row = b"".join(tokens)
            if len(row) != PIXELS:  # a token longer than one character
                token = next(t for t in tokens if len(t) != 1)
                value = token.decode(errors="replace")
                raise ValueError(f"{path}, line {lineno}: values should be 0 or 1, got {value!r}")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no rows")
    chars = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(-1, PIXELS)
    bad = (chars != ord("0")) & (chars != ord("1"))
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise ValueError(f"{path}, line {r + 1}: values should be 0 or 1, got {chr(chars[r, c])!r}")
    return chars - ord("0")


def _open_npz(path: Path) -> np.lib.npyio.NpzFile:
    """Open an ``.npz`` archive; anything else (an empty or text file, a bare ``.npy``) is a
    ValueError naming the file."""
    if not path.is_file():
        raise ValueError(f"{path} does not exist" if not path.exists() else
                         f"{path} is not a file")
    try:
        archive = np.load(path)
    except DAMAGED_NPZ as error:
        raise ValueError(
            f"{path} is not a readable .npz archive (truncated or corrupted?): {error}"
        ) from error
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} is not an .npz archive but a single .npy array")
    return archive


def _read_npz(path: Path, key: str | None) -> np.ndarray:
    with _open_npz(path) as archive:
        keys = archive.files
        if key is None:
            if len(keys) != 1:
                raise ValueError(f"{path} holds arrays {', '.join(keys)}; pass 'key' to pick one")
            key = keys[0]
        if key not in keys:
            raise ValueError(f"{path} has no array {key!r}; it holds {', '.join(keys)}")
        where = f"{path}[{key!r}]"
        try:
            array = archive[key]
        except DAMAGED_NPZ as error:
            raise ValueError(f"{where} cannot be read (corrupted?): {error}") from error
    if array.ndim != 2 or array.shape[1] != PIXELS:
        raise ValueError(f"{where} should have shape (n, {PIXELS}), got {array.shape}")
    if not ((array == 0) | (array == 1)).all():
        raise ValueError(f"{where} should hold only 0 and 1")
    return array.astype(np.uint8, copy=False)


def load_split_file(path: str | Path, key: str | None = None) -> Tensor:
    """Read binarized images from an ``.npz`` array or an ``.amat`` text file.

    Args:
        path: an ``.npz`` file, or an ``.amat`` file of whitespace-separated 0/1 rows.
        key: the array to read from an ``.npz`` (optional when it holds a single array); must
            be None for ``.amat``.

    Returns:
        A ``(n, 784)`` uint8 tensor of 0s and 1s.

    Raises:
        ValueError: unknown suffix, missing key (the message lists the keys), wrong width or
            values other than 0/1 (the message names the file and, for ``.amat``, the line).
    """
    path = Path(path)
    if path.suffix == ".npz":
        return torch.from_numpy(_read_npz(path, key))
    if path.suffix == ".amat":
        if key is not None:
            raise ValueError(f"'key' applies to .npz files only, got key={key!r} for {path}")
        return torch.from_numpy(_read_amat(path))
    raise ValueError(f"'path' should be an .npz or .amat file, got {path}")


def binarized_mnist(
    split: str, *, root: str | Path | None = None, download: bool = True
) -> Tensor:
    """One split of binarized MNIST, from ``root``'s ``.npz`` or ``.amat`` files (module doc).

    Args:
        split: ``"train"`` (50000 images), ``"valid"`` (10000) or ``"test"`` (10000).
        root: the data directory; defaults to ``$FLOWKIT_DATA``, else ``~/.cache/flowkit``.
        download: fetch the ``.amat`` file into the data directory when no local copy exists.

    Returns:
        A ``(n, 784)`` uint8 tensor of 0s and 1s.

    Raises:
        ValueError: an unknown split, or a file whose split has another shape or is not the
            published data (its SHA-256, see the module doc): the message names the file.
        FileNotFoundError: the split is missing and ``download`` is False.
        OSError: the download failed or did not match its SHA-256 (nothing is kept).
    """
    if split not in SPLITS:
        raise ValueError(f"'split' should be one of {', '.join(SPLITS)}; got {split!r}")
    directory = data_root(root)
    npz, amat = directory / NPZ_NAME, directory / f"binarized_mnist_{split}.amat"
    npz_keys: list[str] = []
    if npz.is_file():
        with _open_npz(npz) as archive:
            npz_keys = archive.files
    if split in npz_keys:
        source, data = npz, load_split_file(npz, split)
    else:
        if not amat.is_file():
            if not download:
                found = f"{npz} holds only {', '.join(npz_keys)}; " if npz_keys else ""
                raise FileNotFoundError(
                    f"no {split!r} split: {found}{amat} does not exist; pass download=True"
                )
            download_file(URL.format(split=split), amat, _FILES[split].sha256)
        source, data = amat, load_split_file(amat)
    expected, shape = (_FILES[split].rows, PIXELS), tuple(data.shape)
    if shape != expected:
        raise ValueError(f"{source}: split {split!r} should have shape {expected}, got {shape}")
    digest = hashlib.sha256(_amat_layout(data.numpy())).hexdigest()
    if digest != _FILES[split].sha256:
        others = (" (and its other splits, read from .amat files after that)"
                  if source == npz else "")
        call = f"binarized_mnist({split!r}{'' if root is None else f', root={str(root)!r}'})"
        raise ValueError(
            f"{source}: split {split!r} is not the published binarized MNIST (SHA-256 "
            f"{digest[:16]}... of its images in the .amat layout, expected "
            f"{_FILES[split].sha256[:16]}...): the file was damaged or replaced since it was "
            f"saved; delete {source}{others} and call {call} again to download a verified copy"
        )
    return data


def _amat_layout(images: np.ndarray) -> bytes:
    """``(n, 784)`` 0/1 images as the bytes of Larochelle's ``.amat`` files: each row its 784
    digits separated by single spaces, then a newline (``2 * 784`` bytes a row)."""
    out = np.full((len(images), 2 * PIXELS), ord(" "), dtype=np.uint8)
    out[:, 0::2] = images + ord("0")
    out[:, -1] = ord("\n")
    return out.tobytes()
