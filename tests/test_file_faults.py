"""Fault injection for files and run folders: bit flips and truncation of saved files, tampered
checkpoints on resume, disk full / read-only / permission errors, kill -9 at random points of a
checkpointed run followed by a resume, and two runs on one folder.

CI runs short versions; ``-m slow`` flips every bit and kills at many random moments."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import flowkit
from flowkit.app import cli
from flowkit.checkpoint import (
    LOCK_NAME,
    CheckpointError,
    CheckpointWriteError,
    LegacyFormatWarning,
    RunLockedError,
    StaleLockWarning,
    load_checkpoint,
    load_model,
    run_lock,
    save_model,
    write_bytes_atomic,
)
from flowkit.checkpoint.format import write_file
from flowkit.train import CHECKPOINT_NAME

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("fault_worker.py")
QUIET = dict(progress=False, device="cpu")
DATA = torch.randn(64, 2, generator=torch.Generator().manual_seed(0))
"""The training data of the small runs (a resumed run must get the data its checkpoint had)."""


def _worker_module():
    spec = importlib.util.spec_from_file_location("fault_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


worker = _worker_module()


def _small_run(folder: Path, steps: int = 4) -> flowkit.Flow:
    flow = flowkit.MAF(2, hidden_features=(4,), layers=2)
    flowkit.fit(flow, DATA, valid=None, steps=steps, batch_size=32, seed=0, lr_schedule=None,
                checkpoint_dir=folder, checkpoint_every=2, **QUIET)  # constant: can be extended
    return flow


def _tmp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# ------------------------------------------------------------------------ bit flips, truncation


def _flips_detected(path: Path, positions) -> tuple[int, int]:
    """Flip one bit at each ``(byte, bit)`` of ``path`` in turn (the file restored in between)
    and load it; returns (detected, tried). Detected: a CheckpointError naming the file."""
    data = path.read_bytes()
    detected = tried = 0
    fd = os.open(path, os.O_RDWR)
    try:
        for byte, bit in positions:
            os.pwrite(fd, bytes([data[byte] ^ (1 << bit)]), byte)
            tried += 1
            try:
                load_model(path)
            except CheckpointError as e:
                detected += str(path) in str(e)
            os.pwrite(fd, data[byte : byte + 1], byte)
    finally:
        os.close(fd)
    assert path.read_bytes() == data
    return detected, tried


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    """A small model file and a training checkpoint of fit."""
    flow = flowkit.MAF(2, hidden_features=(4,), layers=2)
    save_model(flow, tmp_path / "model.pt")
    _small_run(tmp_path / "run")
    return {"model": tmp_path / "model.pt", "training": tmp_path / "run" / CHECKPOINT_NAME}


@pytest.mark.parametrize("which", ["model", "training"])
def test_a_bit_flip_at_every_byte_is_detected(files, which):
    """One bit flipped in every byte of the file (bit i mod 8 of byte i): every flip is a
    CheckpointError naming the file (the audit saw 92 of 200 model-file flips and 200 of 200
    checkpoint flips load silently as other weights)."""
    path = files[which]
    size = path.stat().st_size
    detected, tried = _flips_detected(path, ((i, i % 8) for i in range(size)))
    assert (detected, tried) == (size, size)
    assert load_model(path) is not None  # the restored file still loads


@pytest.mark.slow
@pytest.mark.parametrize("which", ["model", "training"])
def test_every_single_bit_flip_is_detected(files, which):
    path = files[which]
    size = path.stat().st_size
    detected, tried = _flips_detected(path, ((i, b) for i in range(size) for b in range(8)))
    assert (detected, tried) == (8 * size, 8 * size)


def test_bit_flips_are_detected_on_resume(files):
    """Resuming reads the checkpoint through the same verification."""
    path = files["training"]
    data = path.read_bytes()
    for byte in random.Random(0).sample(range(len(data)), 12):
        path.write_bytes(data[:byte] + bytes([data[byte] ^ 4]) + data[byte + 1 :])
        with pytest.raises(CheckpointError) as info:
            flowkit.fit(flowkit.MAF(2, hidden_features=(4,), layers=2), DATA,
                        steps=6, batch_size=32, checkpoint_dir=path.parent, resume=True, **QUIET)
        assert str(path) in str(info.value)
    path.write_bytes(data)


@pytest.mark.parametrize("which", ["model", "training"])
def test_truncated_and_extended_files_are_detected(files, which):
    path = files[which]
    data = path.read_bytes()
    ends = 64  # every length in the header and the last 64 bytes, a sample in between
    lengths = {*range(ends), *range(len(data) - ends, len(data)), *range(0, len(data), 97)}
    for length in sorted(lengths):
        path.write_bytes(data[:length])
        with pytest.raises(CheckpointError, match="truncated|damaged|not a flowkit file") as e:
            load_model(path)
        assert str(path) in str(e.value)
    path.write_bytes(data + b"\0")
    with pytest.raises(CheckpointError, match="truncated or extended"):
        load_model(path)


# ---------------------------------------------------------------------- tampered checkpoints


def _rewrite(path: Path, change) -> None:
    """Rewrite the checkpoint at ``path`` with ``change(state_dict)`` applied and a valid
    checksum (an edit by someone who recomputed it)."""
    ckpt = load_checkpoint(path)
    state = dict(ckpt.model["state_dict"])
    change(state)
    write_file({"kind": ckpt.kind, "model": {**ckpt.model, "state_dict": state},
                "extra": ckpt.extra}, path)


MASK = "transform.transforms.1.made.hidden.0.mask"  # 0: the Standardize
RESUME_TAMPERING = {
    "mask": (lambda s: s.update({MASK: 1 - s[MASK]}), r"stored buffer '.*hidden.0.mask' should"),
    "permutation": (
        lambda s: s.update({"transform.transforms.2.permutation": torch.zeros(2).long()}),
        r"stored buffer 'transform.transforms.2.permutation' should be a permutation",
    ),
    "nan-weight": (
        lambda s: s.update({"transform.transforms.1.made.output.bias":
                            s["transform.transforms.1.made.output.bias"] * float("nan")}),
        r"stored weight 'transform.transforms.1.made.output.bias' holds .* NaN",
    ),
}


@pytest.mark.parametrize("case", sorted(RESUME_TAMPERING))
def test_resume_applies_every_check_of_load_model(case, tmp_path):
    """A tampered mask used to train on after resume=True (load_model refused it)."""
    change, message = RESUME_TAMPERING[case]
    _small_run(tmp_path)
    _rewrite(tmp_path / CHECKPOINT_NAME, change)
    for load in (
        lambda: load_model(tmp_path / CHECKPOINT_NAME),
        lambda: flowkit.fit(flowkit.MAF(2, hidden_features=(4,), layers=2), DATA,
                            steps=8, batch_size=32, checkpoint_dir=tmp_path, resume=True, **QUIET),
    ):
        with pytest.raises(CheckpointError, match=message):
            load()


def test_resume_refuses_a_model_of_another_config(tmp_path):
    """MAF and IAF of the same sizes have the same weights: the config tells them apart."""
    _small_run(tmp_path)
    with pytest.raises(CheckpointError, match="written for a MAF.*not for this IAF"):
        flowkit.fit(flowkit.IAF(2, hidden_features=(4,), layers=2), DATA, steps=8,
                    batch_size=32, checkpoint_dir=tmp_path, resume=True, **QUIET)


# --------------------------------------------------------------------------------- I/O faults


def _enospc_on_fsync(monkeypatch, after: int = 0):
    """Make the (after + 1)-th and later os.fsync calls fail as on a full disk."""
    real, calls = os.fsync, [0]

    def fsync(fd):
        calls[0] += 1
        if calls[0] > after:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_disk_full_keeps_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    flow = flowkit.MAF(2, hidden_features=(4,), layers=2)
    save_model(flow, tmp_path / "m.pt")
    (tmp_path / "metrics.json").write_text('{"old": 1}')
    good = (tmp_path / "m.pt").read_bytes()
    _enospc_on_fsync(monkeypatch)
    with pytest.raises(CheckpointWriteError) as info:
        save_model(flow, tmp_path / "m.pt")
    assert str(info.value) == (
        f"could not write '{tmp_path / 'm.pt'}': No space left on device (the previous file was "
        "kept)"
    )
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    with pytest.raises(CheckpointWriteError, match="metrics.json': No space left"):
        write_bytes_atomic(tmp_path / "metrics.json", b'{"new": 2}')
    with pytest.raises(CheckpointWriteError, match=r"new.pt': No space .*nothing was written"):
        save_model(flow, tmp_path / "new.pt")
    assert (tmp_path / "m.pt").read_bytes() == good
    assert (tmp_path / "metrics.json").read_text() == '{"old": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt", "metrics.json"]


def test_a_save_writes_through_a_link_and_removes_stale_temporary_files(tmp_path):
    """Review 41: a save replaced a link (latest.pt -> run7/model.pt) with a file, where
    torch.save writes through it; and the temporary file of a save killed mid-write stayed
    beside the model for good (a fresh one may be another writer's: it stays)."""
    flow = flowkit.MAF(2, hidden_features=(4,), layers=1)
    (tmp_path / "run7").mkdir()
    target = tmp_path / "run7" / "model.pt"
    save_model(flow, target)
    link = tmp_path / "latest.pt"
    link.symlink_to(target)
    with torch.no_grad():
        next(flow.parameters()).add_(1.0)
    save_model(flow, link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    torch.testing.assert_close(next(load_model(target).parameters()), next(flow.parameters()))
    stale = tmp_path / "run7" / ".model.pt.0123456789abcdef.tmp"
    fresh = tmp_path / "run7" / ".model.pt.fedcba9876543210.tmp"
    other = tmp_path / "run7" / ".other.pt.0123456789abcdef.tmp"
    for path in (stale, fresh, other):
        path.write_bytes(b"partial")
    old = time.time() - 2 * flowkit.checkpoint.format.STALE_TMP_S
    for path in (stale, other):
        os.utime(path, (old, old))
    save_model(flow, target)
    assert not stale.exists() and fresh.exists() and other.exists()


def test_disk_full_during_fit_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    """The lock file and the checkpoints of steps 2 and 4 are written (fsync calls 1-5), the one
    of step 6 fails: a one-line OSError naming the file; the step-4 checkpoint stays."""
    _enospc_on_fsync(monkeypatch, after=5)
    path = re.escape(str(tmp_path / CHECKPOINT_NAME))
    with pytest.raises(CheckpointWriteError, match=f"could not write '{path}'"
                       r": No space left on device \(the previous file was kept\)$"):
        _small_run(tmp_path, steps=8)
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME).extra["step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]  # no lock, no .tmp


@contextlib.contextmanager
def _tmpfs(folder: Path, size: str, *options: str):
    """A tmpfs of ``size`` mounted at ``folder`` (needs root: the test is skipped otherwise)."""
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]),
                              "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _fill(folder: Path, leave: int) -> None:
    """Fill the file system of ``folder`` until ``leave`` bytes are free."""
    stat = os.statvfs(folder)
    free = stat.f_bavail * stat.f_frsize
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * max(free - leave, 0))


def test_disk_full_on_a_real_small_file_system(tmp_path, capsys):
    """On a 1 MB tmpfs: a run checkpoints, the disk fills up, the resumed run fails at its next
    checkpoint with a one-line error; the previous checkpoint and no temporary file remain. The
    command line reports it in one line (exit status 2) and leaves no empty folder."""
    with _tmpfs(tmp_path / "small", "1m") as disk:
        _small_run(disk / "run", steps=4)
        size = (disk / "run" / CHECKPOINT_NAME).stat().st_size
        _fill(disk, leave=8192 + size // 2)  # room for the lock file, not for a checkpoint
        with pytest.raises(CheckpointWriteError, match="No space left on device"):
            flowkit.fit(flowkit.MAF(2, hidden_features=(4,), layers=2), DATA, valid=None,
                        steps=8, batch_size=32, checkpoint_dir=disk / "run", checkpoint_every=2,
                        lr_schedule=None, resume=True, **QUIET)
        assert load_checkpoint(disk / "run" / CHECKPOINT_NAME).extra["step"] == 4
        assert sorted(p.name for p in (disk / "run").iterdir()) == [CHECKPOINT_NAME]
        status = cli.main(["fit", "--data", "moons", "--steps", "4", "--checkpoint-every", "2",
                           "--hidden", "4", "--layers", "1", "--quiet", "--out",
                           str(disk / "cli")])
        err = capsys.readouterr().err
        assert status == 2 and err.count("\n") == 1 and "No space left on device" in err
        assert not (disk / "cli").exists()


@pytest.mark.parametrize("fault", ["read-only", "no-permission"])
def test_unwritable_folder_fails_before_the_first_step(fault, tmp_path):
    """A read-only file system (a tmpfs mounted ro, as root) or a folder without write
    permission (chmod, as another user than root): one-line errors naming the path, before any
    training step; reading still works."""
    if fault == "no-permission" and os.geteuid() == 0:
        pytest.skip("root ignores file permissions")
    flow = flowkit.MAF(2, hidden_features=(4,), layers=2)
    if fault == "read-only":
        ctx = _tmpfs(tmp_path / "ro", "1m")
    else:
        ctx = contextlib.nullcontext(tmp_path / "ro")
        (tmp_path / "ro").mkdir()
    with ctx as folder:
        _small_run(folder / "run")
        before = (folder / "run" / CHECKPOINT_NAME).read_bytes()
        if fault == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        else:
            os.chmod(folder / "run", 0o555)
        try:
            calls = []
            lock = re.escape(str(folder / "run" / LOCK_NAME))
            with pytest.raises(CheckpointWriteError, match=f"'{lock}'"):
                flowkit.fit(flow, lambda n, generator: calls.append(n) or torch.randn(n, 2),
                            steps=8, batch_size=32, checkpoint_dir=folder / "run", resume=True,
                            **QUIET)
            assert calls == []  # failed before the first batch
            model = re.escape(str(folder / "run" / "model.pt"))
            with pytest.raises(CheckpointWriteError, match=f"could not write '{model}'"):
                save_model(flow, folder / "run" / "model.pt")
            assert load_checkpoint(folder / "run" / CHECKPOINT_NAME).extra["step"] == 4
            assert (folder / "run" / CHECKPOINT_NAME).read_bytes() == before
        finally:
            if fault == "no-permission":
                os.chmod(folder / "run", 0o755)


def test_checkpoint_paths_are_checked_before_the_first_step(tmp_path):
    """fit(checkpoint_dir=<a file>) used to fail after all its steps, losing them."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "run" / CHECKPOINT_NAME).mkdir(parents=True)
    calls = []

    def data(n, generator):
        calls.append(n)
        return torch.randn(n, 2)

    cases = [
        (tmp_path / "file", ValueError, "'checkpoint_dir' should be a folder, but .* is a file"),
        (tmp_path / "run", ValueError, "checkpoint.pt' is a folder, where 'checkpoint_dir'"),
        (3, TypeError, "'checkpoint_dir' should be a folder path .*got int 3"),
    ]
    for folder, error, message in cases:
        with pytest.raises(error, match=message):
            flowkit.fit(flowkit.MAF(2, hidden_features=(4,), layers=2), data, steps=400,
                        batch_size=32, checkpoint_dir=folder, **QUIET)
    assert calls == []


def test_a_failed_run_leaves_no_folder_it_created(tmp_path):
    def data(n, generator):
        raise RuntimeError("no data today")

    with pytest.raises(RuntimeError, match="no data today"):
        flowkit.fit(flowkit.MAF(2, hidden_features=(4,), layers=2), data, steps=4,
                    batch_size=32, checkpoint_dir=tmp_path / "a" / "b", **QUIET)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------ the lock


def test_run_lock_records_the_holder_is_reentrant_and_cleans_up(tmp_path):
    orphan = tmp_path / "run" / f".{CHECKPOINT_NAME}.0123456789abcdef.tmp"
    orphan.parent.mkdir()
    orphan.write_bytes(b"half a checkpoint")
    keep = tmp_path / "run" / ".hidden.tmp"  # not a name flowkit's writer makes
    keep.write_bytes(b"")
    with run_lock(tmp_path / "run") as folder:
        info = json.loads((folder / LOCK_NAME).read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        assert not orphan.exists() and keep.exists()
        with run_lock(tmp_path / "run"):  # fit inside the command's lock
            pass
        assert (folder / LOCK_NAME).is_file()
    assert not (folder / LOCK_NAME).exists()
    with run_lock(tmp_path / "new" / "deeper"):
        pass
    assert not (tmp_path / "new").exists()  # created, left empty: removed


def _lock_file(folder: Path, **info) -> None:
    folder.mkdir(exist_ok=True)
    holder = {"pid": 1, "host": socket.gethostname(), "started": "2026-01-01T00:00:00Z",
              "argv": ["flowkit", "fit"], **info}
    (folder / LOCK_NAME).write_text(json.dumps(holder))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path):
    _lock_file(tmp_path, pid=_dead_pid())
    with pytest.warns(StaleLockWarning, match=r"taking over the stale lock of process \d+"):
        _small_run(tmp_path)
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_of_another_host_is_refused(tmp_path):
    _lock_file(tmp_path, host="elsewhere")
    with pytest.raises(RunLockedError, match=r"in use by process 1 on host elsewhere .*cannot tell "
                       r"whether a process on another host still runs: delete the lock file"):
        _small_run(tmp_path)
    assert (tmp_path / LOCK_NAME).is_file()


def _start(*argv: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, *argv], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def _wait_for(predicate, process: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(f"the process ended: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_a_second_run_and_a_resume_of_a_running_run_are_refused(tmp_path, capsys):
    """A `flowkit fit` process holds --out; a second `flowkit fit` on it, a --resume of it and
    fit() in Python are refused with one line naming the holder. Killed with SIGKILL, it leaves
    a stale lock and a temporary file, which the next --resume takes over and removes."""
    out = tmp_path / "run"
    holder = _start("-m", "flowkit", "fit", "--data", "moons", "--steps", "100000000",
                    "--hidden", "4", "--layers", "1", "--checkpoint-every", "20", "--threads",
                    "1", "--lr-schedule", "none", "--quiet", "--out", str(out))
    try:
        _wait_for(lambda: (out / CHECKPOINT_NAME).is_file(), holder)
        for extra in ([], ["--resume"]):
            status = cli.main(["fit", "--data", "moons", "--steps", "10", "--quiet", "--out",
                               str(out), *extra])
            err = capsys.readouterr().err
            assert status == 2 and err.count("\n") == 1, err
            assert f"in use by process {holder.pid} on host {socket.gethostname()}" in err
        with pytest.raises(RunLockedError, match=f"process {holder.pid}"):
            flowkit.fit(flowkit.MAF(2, hidden_features=(4,), layers=1), DATA,
                        steps=4, batch_size=32, checkpoint_dir=out, resume=True, **QUIET)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
    orphan = out / f".{CHECKPOINT_NAME}.0123456789abcdef.tmp"
    orphan.write_bytes(b"half")
    step = load_checkpoint(out / CHECKPOINT_NAME).extra["step"]
    with pytest.warns(StaleLockWarning, match=f"stale lock of process {holder.pid}"):
        status = cli.main(["fit", "--data", "moons", "--steps", str(step + 20), "--hidden", "4",
                           "--layers", "1", "--checkpoint-every", "20", "--lr-schedule", "none",
                           "--quiet", "--resume", "--out", str(out)])
    assert status == 0
    assert not orphan.exists() and not (out / LOCK_NAME).exists()
    assert load_checkpoint(out / CHECKPOINT_NAME).extra["step"] == step + 20


@pytest.mark.slow
def test_two_runs_started_together_one_is_refused(tmp_path):
    out = tmp_path / "run"
    argv = ("-m", "flowkit", "fit", "--data", "moons", "--steps", "3000", "--hidden", "4",
            "--layers", "1", "--threads", "1", "--quiet", "--out", str(out))
    runs = [_start(*argv), _start(*argv)]
    results = [(p.wait(timeout=600), p.communicate()[1]) for p in runs]
    assert sorted(status for status, _ in results) == [0, 2], results
    refused = next(err for status, err in results if status == 2)
    # "in use by another process" when the holder had not yet written who it is (a race that
    # a loaded machine makes likely)
    assert "is in use by" in refused or "exists: pass --resume" in refused


# ------------------------------------------------------------------- kill -9, then resume


def _reference(folder: Path, steps: int) -> tuple[dict, list]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        worker.run(str(folder), steps)
    finally:
        torch.set_num_threads(threads)
    ckpt = load_checkpoint(folder / CHECKPOINT_NAME)
    return ckpt.model["state_dict"], ckpt.extra["history"]["train_loss"]


def _kill_then_resume(
    folder: Path, steps: int, *kill: str, delay: float | None = None
) -> tuple[int | None, list[str]]:
    """Run the worker until it is killed (by itself at a point, or from here after ``delay``
    seconds of training), then resume it in this process to the end. Returns the step of the
    checkpoint and the temporary files that the killed run left (None, [] if none)."""
    process = _start(str(WORKER), str(folder), str(steps), *kill)
    if delay is not None:
        _wait_for(lambda: process.stdout.readline() == "training\n", process)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=600)
    assert process.returncode in (-signal.SIGKILL, 0), process.communicate()
    path = folder / CHECKPOINT_NAME
    left = (load_checkpoint(path).extra["step"] if path.is_file() else None), _tmp_files(folder)
    _reference(folder, steps)  # resume=True: from the checkpoint the killed run left
    return left


def _assert_same(folder: Path, reference: tuple[dict, list]) -> None:
    ckpt = load_checkpoint(folder / CHECKPOINT_NAME)
    weights, losses = reference
    assert ckpt.model["state_dict"].keys() == weights.keys()
    for key, value in weights.items():
        assert torch.equal(ckpt.model["state_dict"][key], value), key
    assert ckpt.extra["history"]["train_loss"] == losses
    assert _tmp_files(folder) == [] and not (folder / LOCK_NAME).exists()


def test_kill_9_between_checkpoints_and_during_a_write_then_resume_is_exact(tmp_path):
    """SIGKILL at the 17th batch (between the checkpoints of steps 14 and 21), and during the
    write of the second checkpoint (fsync call 4: a complete temporary file never renamed, left
    behind): the resumed runs end with the weights and losses of an uninterrupted run."""
    steps = 30
    reference = _reference(tmp_path / "whole", steps)
    for name, kill, left in [("sample", "--kill-at-sample=17", (14, 0)),
                             ("write", "--kill-at-fsync=4", (7, 1))]:
        folder = tmp_path / name
        with pytest.warns(StaleLockWarning):
            step, tmp = _kill_then_resume(folder, steps, kill)
        assert (step, len(tmp)) == left
        _assert_same(folder, reference)


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_is_exact(tmp_path):
    steps = 300
    start = time.perf_counter()
    reference = _reference(tmp_path / "whole", steps)
    duration = time.perf_counter() - start
    rng = random.Random(12)
    left = []
    for i in range(12):
        folder = tmp_path / f"kill{i}"
        with warnings.catch_warnings():  # a stale lock, unless the kill came after the end
            warnings.simplefilter("ignore", StaleLockWarning)
            left.append(_kill_then_resume(folder, steps, delay=rng.uniform(0, duration / 2)))
        _assert_same(folder, reference)
    print("checkpoint step and temporary files left by each kill:", left)


def test_a_training_checkpoint_of_format_1_resumes_exactly(tmp_path):
    """A run checkpointed by the flowkit before checksums (format 1) resumes to the weights and
    losses of an uninterrupted run, with a LegacyFormatWarning; its next checkpoint is format 2."""
    reference = _reference(tmp_path / "whole", 20)
    folder = tmp_path / "old"
    _reference(folder, 14)
    ckpt = load_checkpoint(folder / CHECKPOINT_NAME)
    torch.save({"flowkit_format": 1, "kind": "training", "model": ckpt.model, **ckpt.extra},
               folder / CHECKPOINT_NAME)
    with pytest.warns(LegacyFormatWarning, match="format 1"):
        _reference(folder, 20)
    assert load_checkpoint(folder / CHECKPOINT_NAME).version == 2
    _assert_same(folder, reference)
