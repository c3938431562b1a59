"""A small checkpointed training run for the fault-injection tests (tests/test_file_faults.py),
run in a subprocess to be killed and in the test process as the reference.

    python tests/fault_worker.py FOLDER STEPS [--kill-at-sample K] [--kill-at-fsync K]

``--kill-at-sample K`` sends SIGKILL to the process itself when the K-th batch is drawn (between
checkpoints); ``--kill-at-fsync K`` when the K-th ``os.fsync`` is called (the lock file's is the
first, then each checkpoint makes two: its temporary file's and its folder's), i.e. with a
complete temporary file on disk that was never renamed. The worker prints ``training`` when the
first batch is drawn (for kills from outside at random moments).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch

import flowkit

CHECKPOINT_EVERY = 7


def run(folder: str, steps: int, kill_at_sample: int = 0) -> flowkit.History:
    """Fit a small MAF to a shifted Gaussian for ``steps`` steps, resuming from ``folder``."""
    calls = 0

    def sample(n: int, generator: torch.Generator) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 1:
            print("training", flush=True)
        if calls == kill_at_sample:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.randn(n, 2, generator=generator) * torch.tensor([1.0, 0.5]) + 0.3

    torch.manual_seed(0)  # the initial weights
    flow = flowkit.MAF(2, hidden_features=(8,), layers=2)
    history = flowkit.fit(
        flow, sample, steps=steps, batch_size=32, lr=3e-3, lr_schedule=None, seed=5,
        checkpoint_dir=folder,
        checkpoint_every=CHECKPOINT_EVERY, log_every=3, resume=True, progress=False, device="cpu",
    )
    return history


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("steps", type=int)
    parser.add_argument("--kill-at-sample", type=int, default=0)
    parser.add_argument("--kill-at-fsync", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.kill_at_fsync:
        real, count = os.fsync, 0

        def fsync(fd: int) -> None:
            nonlocal count
            count += 1
            if count == args.kill_at_fsync:
                os.kill(os.getpid(), signal.SIGKILL)
            real(fd)

        os.fsync = fsync
    run(args.folder, args.steps, args.kill_at_sample)
    sys.exit(0)


if __name__ == "__main__":
    main()
