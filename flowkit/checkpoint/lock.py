"""One writer per run folder: an exclusive lock held for a whole run.

:func:`run_lock` holds ``<folder>/flowkit.lock`` (:data:`LOCK_NAME`) while a run writes to the
folder: :func:`flowkit.train.fit` takes it when given a ``checkpoint_dir`` (also to resume), the
``flowkit`` command for its ``--out`` folder. The file holds its holder's PID, host, start time
and command line as JSON, and the holder keeps an exclusive :func:`fcntl.flock` on it. The kernel
drops that lock when the holder ends, however it ends (``kill -9`` included), so:

* a lock that a live process holds refuses the new run with :class:`RunLockedError` naming the
  holder (a second run, or ``--resume`` of a run that is still going);
* a lock file that nobody holds was left by a process that died before removing it (a stale
  lock): on the same host it is taken over with a :class:`StaleLockWarning` naming the dead
  holder. A stale-looking lock of another host is refused instead (whether a process on another
  host still runs cannot be told from here, and ``flock`` over network file systems varies):
  the message says to delete the file once that run is known to have ended;
* on file systems without ``flock``, the lock file is created exclusively (``O_EXCL``) and the
  holder's PID decides on the same host: running, refused; gone, stale.

A lock is re-entrant within a process (``fit(checkpoint_dir=out)`` called inside the command's
``run_lock(out)`` proceeds). When it takes a lock, :func:`run_lock` removes the temporary files
that writers killed mid-write left in the folder (see :mod:`flowkit.checkpoint.format`). Linux and
macOS; on Windows (no ``fcntl``) the PID rule applies.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .format import CheckpointError, CheckpointWriteError, remove_temporary_files

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "RunLockedError", "StaleLockWarning", "run_lock"]

LOCK_NAME = "flowkit.lock"
"""File name of the lock inside a run folder."""

_HELD: dict[str, int] = {}
"""The folders this process holds (real paths), with how many nested :func:`run_lock` hold
each."""


class RunLockedError(CheckpointError):
    """Another process holds the run folder's lock (a second run on the same folder)."""


class StaleLockWarning(UserWarning):
    """A lock left by a process that died was taken over."""


@contextmanager
def run_lock(folder: str | os.PathLike) -> Iterator[Path]:
    """Hold the exclusive lock of the run folder ``folder`` for the ``with`` block.

    Creates ``folder`` (and missing parents) if needed and removes the folders it created if they
    are empty when the block ends (a run that failed before writing anything leaves no folder).

    Example:
        >>> import tempfile
        >>> with run_lock(tempfile.mkdtemp()) as folder:
        ...     (folder / LOCK_NAME).is_file()
        True

    Raises:
        RunLockedError: another process holds the lock, or holds a lock of another host that
            looks stale (the message names the holder and the lock file).
        CheckpointWriteError: the folder or the lock file cannot be created (permission denied,
            read-only or full file system); the message names the path.
        ValueError, TypeError: ``folder`` is an existing file, or not a path.
    """
    if not isinstance(folder, str | os.PathLike):
        raise TypeError(f"'folder' should be a path, got {type(folder).__name__} {folder!r}")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"'{folder}' should be a run folder but is a file")
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _remove_empty(created)
        raise CheckpointWriteError(
            f"cannot create the run folder '{folder}': {e.strerror or e}", e.errno, str(folder)
        ) from e
    key = os.path.realpath(folder)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield folder
        finally:
            _HELD[key] -= 1
        return
    try:
        fd = _acquire(folder / LOCK_NAME)
    except BaseException:
        _remove_empty(created)
        raise
    _HELD[key] = 1
    try:
        remove_temporary_files(folder)
        yield folder
    finally:
        del _HELD[key]
        _release(folder / LOCK_NAME, fd)
        _remove_empty(created)


def _acquire(path: Path) -> int:
    """Take the lock file ``path``: its file descriptor, flocked, holding this process's info."""
    for _ in range(20):  # a lock released while we look at it is retried
        opened = _open(path)
        if opened is None:
            continue
        fd, created = opened
        try:
            if _take(fd, path, created):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise RunLockedError(f"the lock '{path}' changed hands too often to be taken; try again")


def _open(path: Path) -> tuple[int, bool] | None:
    """Open the lock file, creating it exclusively if missing: its descriptor and whether it was
    created; None if it vanished meanwhile."""
    try:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            return os.open(path, os.O_RDWR), False
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointWriteError(
            f"cannot create the lock file '{path}' of the run folder: {e.strerror or e}",
            e.errno,
            str(path),
        ) from e


def _take(fd: int, path: Path, created: bool) -> bool:
    """Lock ``fd``, the open lock file ``path`` (``created`` by this call or left by an earlier
    holder), and write this process's info into it; False if the file was removed or replaced
    meanwhile (try again)."""
    locked = _flock(fd)
    holder = _read(fd)
    if locked is False:
        raise RunLockedError(_in_use(path, holder))
    if not _is_current(fd, path):
        return False
    if not created:
        _take_over(path, holder, flocked=locked is True)
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv,
    }
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(me).encode())
        os.fsync(fd)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise CheckpointWriteError(
            f"cannot write the lock file '{path}': {e.strerror or e}", e.errno, str(path)
        ) from e
    return True


def _take_over(path: Path, holder: dict[str, Any] | None, flocked: bool) -> None:
    """Decide about a lock file that nobody flocks (or on a file system without flock): warn and
    go on if its holder is gone, raise :class:`RunLockedError` if it runs or cannot be told."""
    if holder is None:
        if flocked:  # nobody holds it: a holder died between creating and filling it
            warnings.warn(f"'{path}': replacing an empty stale lock", StaleLockWarning, 4)
            return
        raise RunLockedError(
            f"'{path}' holds no readable holder and this file system has no flock to tell "
            "whether a run uses the folder; delete the file if none does"
        )
    if holder["host"] != socket.gethostname():
        raise RunLockedError(
            _in_use(path, holder) + "; flowkit cannot tell whether a process on another host "
            "still runs: delete the lock file if that run has ended"
        )
    if not flocked and _alive(holder["pid"]):
        raise RunLockedError(_in_use(path, holder))
    warnings.warn(
        f"'{path}': taking over the stale lock of process {holder['pid']} on {holder['host']} "
        f"(started {holder['started']}), which ended without releasing it",
        StaleLockWarning,
        4,
    )


def _in_use(path: Path, holder: dict[str, Any] | None) -> str:
    who = (
        "another process"
        if holder is None
        else f"process {holder['pid']} on host {holder['host']} (started {holder['started']}: "
        f"{' '.join(map(str, holder['argv']))})"
    )
    return (
        f"the run folder '{path.parent}' is in use by {who}, which holds '{path}': one run "
        "writes to a folder at a time (wait for it to end or stop it first, or pick another "
        "folder)"
    )


def _flock(fd: int) -> bool | None:
    """Try to flock ``fd`` exclusively: True, False if another holds it, None if the file system
    (or the platform) has no flock."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
            return None
        raise
    return True


def _read(fd: int) -> dict[str, Any] | None:
    """The holder info in the lock file, None if empty or unreadable."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 1 << 16))
    except (OSError, ValueError):
        return None
    keys = {"pid": int, "host": str, "started": str, "argv": list}
    if not isinstance(info, dict) or not all(isinstance(info.get(k), t) for k, t in keys.items()):
        return None
    return info


def _is_current(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (True when that cannot be told)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _release(path: Path, fd: int) -> None:
    """Remove the lock file (while still holding it, so nobody takes a file being removed), then
    drop the flock by closing it."""
    try:
        if _is_current(fd, path):
            path.unlink()
    except OSError:
        pass  # a read-only or vanished folder: the flock still goes with the close
    finally:
        os.close(fd)


def _remove_empty(created: list[Path]) -> None:
    """Remove the folders that :func:`run_lock` created, deepest first, while they are empty."""
    for folder in created:
        try:
            folder.rmdir()
        except FileNotFoundError:  # never made (a failed mkdir)
            continue
        except OSError:  # not empty
            return
