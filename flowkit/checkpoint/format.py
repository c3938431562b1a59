"""The bytes of a flowkit file: a torch payload inside a container with a SHA-256 checksum,
written atomically.

A file of format 2 is, with integers little-endian::

    offset 0        9 bytes   magic b"\\x89flowkit\\n"
    offset 9        4 bytes   format version (uint32): 2
    offset 13       n bytes   payload: torch.save of tensors and plain containers
    offset 13 + n   8 bytes   payload length n (uint64)
    offset 21 + n  32 bytes   SHA-256 of the 21 + n bytes before it

The digest covers every byte before it, and the length must be what the file's size gives, so any
change to a file (a flipped bit anywhere, the digest's own bits included, a cut or an appended
tail) is detected before the payload is unpickled: a digest that matched by chance would need a
SHA-256 collision. Only then is the payload read, with ``torch.load(..., weights_only=True)``
(tensors and plain containers, never arbitrary objects); an error at that point (an unavailable
``map_location``) is therefore never reported as a damaged file. The length and digest come last
so that the payload streams to disk as :func:`torch.save` writes it, and is read into memory once.

Files of format 1 (flowkit before format 2) are bare :func:`torch.save` files (zip archives)
holding a dict with ``"flowkit_format": 1``. They are still read, with a
:class:`LegacyFormatWarning`: they carry no checksum, only the CRC-32 that a zip archive records
for each of its records (checked, with :meth:`zipfile.ZipFile.testzip`, before anything is
unpickled: a flipped bit inside a record is a :class:`CheckpointError` naming it), so some damage
may go unnoticed; their contents get every other check. Saving again writes format 2.

Writes go to a temporary file ``.<name>.<16 hex digits>.tmp`` in the target's folder, which is
flushed, ``fsync``-ed and renamed over the target with :func:`os.replace`; the folder entry is
then synced. A failed write (disk full, permission denied, read-only folder) removes the
temporary file, leaves an existing target untouched and raises :class:`CheckpointWriteError`
(an ``OSError``) whose one-line message names the target. A writer killed mid-write can leave a
temporary file behind; :func:`flowkit.checkpoint.run_lock` removes those of its folder, and the
next write of the same target those older than :data:`STALE_TMP_S`. A target that is a symbolic
link is written through: the file it points to is replaced, and the link stays (as
:func:`torch.save` does).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import os
import re
import secrets
import struct
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

__all__ = [
    "CheckpointError",
    "CheckpointWriteError",
    "FORMAT_VERSION",
    "LegacyFormatWarning",
    "atomic_write",
    "check_map_location",
    "check_path_to_read",
    "check_path_to_write",
    "read_file",
    "remove_temporary_files",
    "write_bytes_atomic",
    "write_file",
]

MAGIC = b"\x89flowkit\n"
FORMAT_VERSION = 2
"""The format this flowkit writes; it reads 1 and 2."""

_VERSION = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
_TRAILER = _LENGTH.size + hashlib.sha256().digest_size
_TMP = re.compile(r"^\..+\.[0-9a-f]{16}\.tmp$")
"""Names of the temporary files that :func:`atomic_write` creates."""


class CheckpointError(ValueError):
    """A checkpoint file is missing, damaged, not a flowkit file or not of the expected kind, or a
    run folder cannot be used. The message names the file."""


class CheckpointWriteError(OSError):
    """Writing a file failed (disk full, permission denied, read-only folder, ...).

    The message is one line naming the file; the previous file at that path, if any, is intact
    and no temporary file is left. ``errno`` and ``filename`` are set as for the ``OSError`` that
    caused it.
    """

    def __init__(self, message: str, errno_: int | None = None, filename: str | None = None):
        super().__init__(message)
        self.errno, self.filename = errno_, filename

    def __str__(self) -> str:
        return str(self.args[0])


class LegacyFormatWarning(UserWarning):
    """A file of format 1 was read: it has no checksum (only its zip records' CRC-32s, which were
    checked), so some damage to it may go unnoticed."""


def check_path_to_read(path: object, argument: str = "path") -> Path:
    """``path`` as a :class:`~pathlib.Path` to read a file from: a ``str`` or ``os.PathLike``,
    not empty (the first checks of :func:`check_path_to_write` too), with a leading ``~``
    expanded to the home folder (as a shell would; it used to make a folder named ``~``).

    Raises:
        TypeError: ``path`` is not a ``str`` or ``os.PathLike`` (``None``, a number, bytes).
        ValueError: ``path`` is empty.
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"'{argument}' should be a file path (str or os.PathLike), got "
            f"{type(path).__name__} {path!r}"
        )
    text = os.fsdecode(os.fspath(path))
    if text == "":
        raise ValueError(f"'{argument}' should be a file path, got an empty string")
    return Path(os.path.expanduser(text))


def check_path_to_write(path: object, argument: str = "path") -> Path:
    """``path`` as a :class:`~pathlib.Path` to write a file to.

    Raises:
        TypeError: ``path`` is not a ``str`` or ``os.PathLike`` (``None``, a number, ...).
        ValueError: ``path`` is empty, an existing folder, or names a folder by its form: it
            ends with a separator (``"out/"``: a file ``out`` would be written otherwise), or
            with ``.`` or ``..``.
    """
    check_path_to_read(path, argument)  # a str or os.PathLike, not empty
    text = os.path.expanduser(os.fsdecode(os.fspath(path)))  # Path() would drop a final "/"
    if os.path.basename(text) in ("", ".", ".."):
        raise ValueError(
            f"'{argument}' should be a file path, but '{text}' names a folder (it ends with "
            f"{'a separator' if os.path.basename(text) == '' else repr(os.path.basename(text))});"
            f" pass a file inside it, e.g. '{os.path.join(text, 'model.pt')}'"
        )
    path = Path(text)
    if path.is_dir():
        raise ValueError(
            f"'{argument}' should be a file path, but '{path}' is a folder; pass a file inside "
            f"it, e.g. '{path / 'model.pt'}'"
        )
    return path


def atomic_write(path: str | os.PathLike, fill: Callable[[IO[bytes]], None]) -> None:
    """Create or replace the file ``path`` with the bytes that ``fill(f)`` writes to ``f``, so
    that ``path`` is never half-written (see the module docstring). Missing parent folders are
    created.

    Raises:
        CheckpointWriteError: an ``OSError`` while writing (disk full, permission denied,
            read-only folder); the previous file at ``path`` is intact and no temporary file is
            left. Other errors of ``fill`` propagate unchanged, with the same guarantees.
    """
    path = check_path_to_write(path)
    if path.is_symlink():  # write through a link (latest.pt -> run7/model.pt), as torch.save
        path = Path(os.path.realpath(path))
    # a fresh name in the same folder (os.replace is only atomic within a file system); "xb"
    # refuses to reuse an existing file and, unlike mkstemp, gives the umask's permissions
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        blocker = next(p for p in (path.parent, *path.parent.parents) if p.exists())
        raise CheckpointWriteError(
            f"could not write '{path}': '{blocker}' is a file, not a folder (nothing was written)",
            e.errno,
            str(path),
        ) from e
    except OSError as e:
        raise CheckpointWriteError(
            f"could not write '{path}': cannot create its folder: {e.strerror or e}",
            e.errno,
            str(path),
        ) from e
    try:
        with open(tmp, "xb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):  # missing, or a read-only folder that never had it
            tmp.unlink()
        if isinstance(e, OSError) and not isinstance(e, CheckpointWriteError):
            kept = "the previous file was kept" if path.is_file() else "nothing was written"
            raise CheckpointWriteError(
                f"could not write '{path}': {e.strerror or e} ({kept})", e.errno, str(path)
            ) from e
        raise
    try:
        _fsync_dir(path.parent)
    except OSError as e:
        raise CheckpointWriteError(
            f"wrote '{path}' but could not sync its folder to disk: {e.strerror or e}",
            e.errno,
            str(path),
        ) from e
    _remove_stale_temporary_files(path)


STALE_TMP_S = 3600.0
"""Age in seconds from which a temporary file of the same target that a killed writer left
is removed by the next write of that target (a writer alive writes for seconds, not hours)."""


def _remove_stale_temporary_files(path: Path) -> None:
    """Remove ``path``'s temporary files older than :data:`STALE_TMP_S` (every
    write killed mid-way left one beside the file for good)."""
    now = time.time()
    for entry in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            if _TMP.match(entry.name) and now - entry.stat().st_mtime > STALE_TMP_S:
                entry.unlink()


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to the file ``path`` atomically (for JSON and text files next to a
    checkpoint); errors as :func:`atomic_write`."""
    atomic_write(path, lambda f: f.write(data))


def _fsync_dir(folder: Path) -> None:
    """Persist a rename on POSIX by syncing the folder entry (not possible on Windows)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temporary_files(folder: Path) -> list[Path]:
    """Remove the temporary files that writers killed mid-write left in ``folder``; returns
    them. Call only while no other process writes to ``folder`` (under its run lock)."""
    removed = []
    for entry in folder.iterdir():
        if _TMP.match(entry.name) and entry.is_file():
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


class _Hashing:
    """A write-only file object that hashes and counts what passes through it. It keeps the
    first ``OSError`` of a write: :func:`torch.save` reports one as a ``RuntimeError`` of its
    own that names no file."""

    def __init__(self, f: IO[bytes]):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.f.flush()


def write_file(obj: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``obj`` (tensors and plain containers) to ``path`` as a file of format 2, atomically.

    Raises:
        TypeError, ValueError: ``path`` is not a file path (see :func:`check_path_to_write`).
        CheckpointWriteError: see :func:`atomic_write`.
    """

    def fill(f: IO[bytes]) -> None:
        out = _Hashing(f)
        out.write(MAGIC + _VERSION.pack(FORMAT_VERSION))
        start = out.size
        try:
            torch.save(obj, out)  # type: ignore[arg-type]  # a file object with write and flush
        except RuntimeError as e:
            if out.error is not None:  # the disk, not the payload: a CheckpointWriteError
                raise out.error from e
            raise
        out.write(_LENGTH.pack(out.size - start))
        f.write(out.sha.digest())

    atomic_write(path, fill)


def read_file(path: str | os.PathLike, map_location: Any = None) -> tuple[int, Any]:
    """Read a file of format 1 or 2: its format version and its verified, unpickled payload.

    Args:
        path: the file.
        map_location: see :func:`check_map_location`.

    Raises:
        CheckpointError: ``path`` is not a file, is truncated, fails its checksum, is not a flowkit
            file, is of a format this flowkit does not read, or (format 1 only) fails a zip
            record's CRC-32 or cannot be unpickled as tensors and plain containers.
        ValueError, TypeError: a ``map_location`` that is not a usable device.
        OSError: the file cannot be read (permission denied, ...).
    """
    check_map_location(map_location)
    path = check_path_to_read(path)
    if not path.is_file():
        what = "a folder" if path.is_dir() else "no file"
        raise CheckpointError(f"no checkpoint file at '{path}' ({what} there)")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(len(MAGIC) + _VERSION.size)
        if not head.startswith(MAGIC):
            if head.startswith(b"PK\x03\x04"):  # a zip archive: torch.save, as format 1 was
                return 1, _read_legacy(path, head + f.read(), map_location)
            if MAGIC.startswith(head):
                raise CheckpointError(f"'{path}' is truncated: {size} bytes, no payload")
            raise CheckpointError(
                f"'{path}' is not a flowkit file (it does not start with flowkit's marker; "
                "expected a file written by flowkit.save_model or flowkit.train.fit)"
            )
        if size < len(head) + _TRAILER:
            raise CheckpointError(
                f"'{path}' is truncated: {size} bytes, shorter than any flowkit file"
            )
        (version,) = _VERSION.unpack_from(head, len(MAGIC))
        if version != FORMAT_VERSION:
            raise CheckpointError(
                f"'{path}' is a flowkit file of format {version}; this flowkit reads formats 1 "
                f"and {FORMAT_VERSION} (a newer flowkit wrote it, or the file is damaged)"
            )
        payload = f.read(size - len(head) - _TRAILER)  # bytes: BytesIO below shares, not copies
        trailer = f.read()
    (length,) = _LENGTH.unpack_from(trailer)
    if length != len(payload) or len(trailer) != _TRAILER:
        # a length beyond the file's size is no length: the last bytes are from the middle
        said = (f"its length field says {length} payload bytes but the file has "
                f"{len(payload)}" if length <= size else
                f"its last bytes are not a length field (the file has {size} bytes)")
        raise CheckpointError(
            f"'{path}' is damaged: {said} (the file was truncated or extended, or its end is "
            "corrupt)"
        )
    digest = hashlib.sha256(head)
    digest.update(payload)
    digest.update(trailer[: _LENGTH.size])
    if digest.digest() != trailer[_LENGTH.size :]:
        raise CheckpointError(
            f"'{path}' is damaged: its SHA-256 checksum does not match its contents (the file "
            "changed after it was written: a disk or transfer error, or an edit)"
        )
    try:
        obj = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as e:  # the bytes are intact: the payload is not one flowkit writes
        raise CheckpointError(
            f"'{path}' passed its checksum but its contents could not be loaded: "
            f"{_load_error(e)}"
        ) from e
    return version, obj


def _read_legacy(path: Path, data: bytes, map_location: Any) -> Any:
    _check_zip(path, data)
    try:
        obj = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError, ... here
        raise CheckpointError(
            f"'{path}' could not be read as a flowkit checkpoint of format 1: {_load_error(e)}"
        ) from e
    if not isinstance(obj, dict) or obj.get("flowkit_format") != 1:
        got = (
            f"a dict with keys {sorted(map(str, obj))[:6]}"
            if isinstance(obj, dict)
            else type(obj).__name__
        )
        raise CheckpointError(
            f"'{path}' is not a flowkit checkpoint: expected a flowkit file, or a torch file "
            f"holding a dict with 'flowkit_format': 1, got {got}"
        )
    warnings.warn(
        f"'{path}' was written by an older flowkit (format 1) without a checksum: only the "
        "CRC-32 of each of its zip records was checked, which misses some damage. Save it again "
        "(flowkit.save_model, or resume the run) to add one.",
        LegacyFormatWarning,
        stacklevel=4,
    )
    return obj


def _check_zip(path: Path, data: bytes) -> None:
    """Check the CRC-32 that the zip archive ``data`` (a format-1 file, as :func:`torch.save`
    writes it) records for each of its records; torch's loader does not. A flipped bit inside a
    record is found; a damaged zip directory makes the archive unreadable.

    Raises:
        CheckpointError: naming the file and the first damaged record.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            damaged = archive.testzip()
    except Exception as e:  # BadZipFile, EOFError, NotImplementedError (a damaged method), ...
        raise CheckpointError(
            f"'{path}' starts as a zip archive (a torch file, as flowkit files of format 1 are) "
            f"but cannot be read as one: it is truncated or damaged ({type(e).__name__}: "
            f"{first_line(e)})"
        ) from e
    if damaged is not None:
        raise CheckpointError(
            f"'{path}' is damaged: its zip record {damaged!r} does not match the CRC-32 stored "
            "with it (the file changed after it was written: a disk or transfer error, or an "
            "edit)"
        )


_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
"""Terminal escapes (torch's messages print parts in bold)."""
_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)")


def _load_error(e: BaseException) -> str:
    """What :func:`torch.load` refused, for a message naming a file: one line without terminal
    escapes. For the objects that ``weights_only=True`` does not unpickle, a flowkit sentence
    replaces torch's advice to load with ``weights_only=False`` (which would run code from the
    file, and which a caller of :func:`flowkit.load_model` cannot pass)."""
    text = _ESCAPES.sub("", str(e)).strip()
    if "Weights only load failed" in text:
        found = _GLOBAL.search(text)
        what = f"an object of type {found.group(1)}" if found else "Python objects"
        return (
            f"it holds {what}, which flowkit does not read (its files hold tensors and plain "
            "containers only): the file is not a flowkit file, or holds objects flowkit does not "
            "read"
        )
    return f"{type(e).__name__}: {text.splitlines()[0] if text else '(no message)'}"


def check_map_location(map_location: Any) -> None:
    """Refuse a ``map_location`` that :func:`torch.load` could not use, before any file is read.

    Accepted: ``None`` (where the tensors were saved), a device (``"cpu"``, ``"cuda:0"``, a
    :class:`torch.device`) that exists on this machine, a dict or a callable (passed to
    :func:`torch.load` as they are).

    Raises:
        ValueError: a string that is not a device, the ``meta`` device (it holds no values), or
            a CUDA device this machine lacks.
        TypeError: any other type.
    """
    if map_location is None or callable(map_location) or isinstance(map_location, dict):
        return
    if not isinstance(map_location, str | torch.device):
        raise TypeError(
            "'map_location' should be None, a device (e.g. 'cpu' or torch.device('cuda:0')), a "
            f"dict or a callable, got {type(map_location).__name__} {map_location!r}"
        )
    try:
        device = torch.device(map_location)
    except (RuntimeError, ValueError) as e:
        raise ValueError(
            f"'map_location' should be a device such as 'cpu' or 'cuda:0', got {map_location!r}"
        ) from e
    if device.type == "meta":
        raise ValueError(
            f"'map_location' is {map_location!r}, which holds no values (weights loaded there "
            "would be lost); pass a device such as 'cpu'"
        )
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if device.index is not None and device.index >= count or count == 0:
            raise ValueError(
                f"'map_location' is {map_location!r} but this machine has {count} CUDA "
                "device(s); pass map_location='cpu'"
            )


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (torch's are often long)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


