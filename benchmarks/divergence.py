"""How close normal training comes to fit's divergence check (divergence_threshold).

For each run (the check off), prints the largest rise of the median of the last 11 training
losses above its lowest value so far, in units of max(1, |lowest|): the statistic that fit
compares with divergence_threshold (default 10). Runs: MAF on the eight 2-D toy datasets
(learning rate 1e-3, batches of 256, cosine decay; and a ten times larger rate with batches of
64, constant), IAF by reverse KL on the energies U1-U4, Bernoulli MADE on binarized MNIST
(short runs).

    OMP_NUM_THREADS=1 python benchmarks/divergence.py [--mnist PATH.npz] [--steps 2000]
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import numpy as np
import torch

import flowkit
from flowkit.data import ENERGIES, TOY_DATASETS, energy_log_density, sample_toy
from flowkit.distributions import BernoulliMADE
from flowkit.train import DEFAULTS, Callbacks, fit, fit_reverse_kl
from flowkit.train.checks import Divergence


def excursion(losses: list[float]) -> float:
    """max_t (m_t - m*_t) / max(1, |m*_t|) of the running median m (the divergence statistic)."""
    d, worst = Divergence(threshold=math.inf), 0.0
    for loss in losses:
        d.update(loss)
        worst = max(worst, (d.median - d.best) / max(1.0, abs(d.best)))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--mnist", default=None, help="binarized_mnist.npz (train, valid)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []

    def report(name: str, losses: list[float], seconds: float) -> None:
        r = excursion(losses)
        rows.append((name, len(losses), losses[0], min(losses), r))
        print(f"| {name} | {len(losses)} | {losses[0]:.3f} | {min(losses):.3f} | {r:.4f} | "
              f"{DEFAULTS['divergence_threshold'] / max(r, 1e-12):.0f}x | {seconds:.0f} |",
              flush=True)

    print("| run | steps | first loss | lowest loss | max rise / max(1, abs(best)) | "
          "margin to the default | s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    off = {"divergence_threshold": None, "progress": False, "device": "cpu", "seed": 0}
    for lr, batch, schedule in ((1e-3, 256, "cosine"), (1e-2, 64, None)):
        for name in TOY_DATASETS:
            torch.manual_seed(0)
            flow = flowkit.MAF(2, layers=5, hidden_features=(64, 64), seed=0)
            t0 = time.perf_counter()
            h = fit(flow, functools.partial(_toy, name), steps=args.steps, batch_size=batch,
                    lr=lr, lr_schedule=schedule, **off)
            report(f"MAF {name}, lr {lr:g}, batch {batch}, {schedule or 'constant'}",
                   h.train_loss, time.perf_counter() - t0)
    for name in ENERGIES:
        torch.manual_seed(0)
        flow = flowkit.IAF(2, layers=5, hidden_features=(64, 64), seed=0)
        t0 = time.perf_counter()
        h = fit_reverse_kl(flow, functools.partial(energy_log_density, name), steps=args.steps,
                           batch_size=256, **off)
        report(f"IAF reverse KL {name}, lr 1e-3, batch 256", h.train_loss,
               time.perf_counter() - t0)
    if args.mnist is not None:
        with np.load(args.mnist) as f:
            x_train = torch.from_numpy(f["train"][:10000])
            x_valid = torch.from_numpy(f["valid"][:2000])
        for lr, masks in ((1e-3, 1), (1e-3, 8), (1e-2, 8)):
            torch.manual_seed(0)
            model = BernoulliMADE(784, hidden_features=(300,), num_masks=masks, order="random",
                                  seed=0)
            t0 = time.perf_counter()
            h = fit(model, x_train, valid=x_valid, epochs=3, batch_size=100, lr=lr,
                    callbacks=Callbacks(after_step=lambda p: p.model.next_mask()), **off)
            report(f"Bernoulli MADE MNIST 10k, 300 units, {masks} masks, lr {lr:g}",
                   h.train_loss, time.perf_counter() - t0)
    worst = max(rows, key=lambda row: row[-1])
    print(f"\nlargest statistic: {worst[-1]:.4f} ({worst[0]}); default threshold "
          f"{DEFAULTS['divergence_threshold']:g}")


def _toy(name: str, n: int, generator: torch.Generator) -> torch.Tensor:
    return sample_toy(name, n, generator=generator)


if __name__ == "__main__":
    main()
