"""The builders' standardization (column mean and standard deviation) against a robust one
(median and interquartile range / 1.349, the standard deviation of a Gaussian), and, on data
with outliers in a positive column, against ``bounds`` with an open upper end (the log of that
column). Test NLL in nats per row, in the data's own units, for each seed.

The robust standardization is the builders' ``standardize="robust"`` (until 2026-11-27 this
script did it in float64 outside a flow built with ``standardize=False``: the same map); everything
else is ``flowkit.fit``'s defaults: ``fit(MAF(D, transformer=...), x, valid=0.1, steps=STEPS)``.
Results go to a JSON-lines file, one line per run; a rerun skips the runs it holds. The
``symmetric-outliers`` task (review 54) scores its clean test rows only. ``--ratios`` prints,
instead, each task's largest ratio of a column's standard deviation to its robust scale, which
``flowkit.train.warn_if_outlying`` compares with ``OUTLIER_RATIO``.

    OMP_NUM_THREADS=1 python benchmarks/standardization.py --out runs/standardization.jsonl
    python benchmarks/standardization.py --ratios
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn import datasets

import flowkit

REAL = {
    "wine": datasets.load_wine,
    "breast_cancer": datasets.load_breast_cancer,
    "iris": datasets.load_iris,
    "diabetes": lambda: datasets.load_diabetes(scaled=False),
    "digits": datasets.load_digits,
}
SYNTHETIC = ("income-outliers", "symmetric-outliers", "t2", "lognormal", "cauchy-mix", "gamma",
             "moons")
OUTLIERS = (1e9, 5e9, 2e10)
"""Data-entry errors put into the income column of three training rows of income-outliers."""


def synthetic(task: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if task == "income-outliers":  # age, and a log-normal income that grows with it
        age = rng.uniform(20, 70, n)
        return np.column_stack([age, np.exp(rng.normal(10, 0.6, n)) * (age / 40)])
    if task == "t2":
        return rng.standard_t(2, size=(n, 2))
    if task == "lognormal":
        mix = np.array([[1, 0.5, 0], [0, 1, 0.3], [0, 0, 0.8]])
        return np.exp(rng.normal(size=(n, 3)) @ mix)
    if task == "cauchy-mix":
        return np.column_stack([rng.standard_cauchy(n), rng.normal(size=n)])
    if task == "gamma":
        return rng.gamma(0.5, size=(n, 2))
    if task == "symmetric-outliers":  # a correlated Gaussian (outliers: see split)
        return rng.normal(size=(n, 2)) @ np.array([[1.0, 0.5], [0.0, 1.0]])
    if task == "moons":
        return flowkit.data.sample_toy("moons", n, seed=int(rng.integers(2**30))).double().numpy()
    raise KeyError(task)


def split(task: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Training and test rows: 4000 and 4000 for the synthetic tasks (outliers in the training
    rows only: three incomes, or two rows of 10^6 N(0, I) among symmetric-outliers' 4000), 80%
    and 20% of scikit-learn's sets (digits dequantized with uniform noise)."""
    rng = np.random.default_rng(seed)
    if task in REAL:
        x = REAL[task]().data.astype(np.float64)
        if task == "digits":
            x = x + rng.uniform(size=x.shape)
        order = rng.permutation(len(x))
        k = len(x) // 5
        return x[order[k:]], x[order[:k]]
    train, test = synthetic(task, 4000, rng), synthetic(task, 4000, rng)
    if task == "income-outliers":
        train[: len(OUTLIERS), 1] = OUTLIERS
    if task == "symmetric-outliers":
        train[:2] = 1e6 * rng.normal(size=(2, 2))
    return train, test


def outlier_ratio(x: np.ndarray) -> float:
    """The largest ratio over the columns of ``x`` of the standard deviation to the
    interquartile range / 1.349 (columns whose range is 0 left out)."""
    q1, q3 = np.percentile(x, [25, 75], axis=0)
    robust = (q3 - q1) / 1.3489795003921634
    return float((x.std(axis=0)[robust > 0] / robust[robust > 0]).max())


def run(task: str, seed: int, transformer: str, mode: str, steps: int) -> dict:
    train, test = split(task, seed)
    features = train.shape[1]
    torch.manual_seed(seed)
    if mode == "mean-std":
        flow = flowkit.MAF(features, transformer=transformer)
    elif mode == "robust":
        flow = flowkit.MAF(features, transformer=transformer, standardize="robust")
    else:  # "log-income": income > 0, as bounds with an open upper end
        flow = flowkit.MAF(features, transformer=transformer, bounds=([None, 0.0], [None, None]))
    start, error = time.time(), None
    try:
        flowkit.fit(flow, train, valid=0.1, steps=steps, seed=seed, progress=False)
    except (flowkit.train.DivergenceError, flowkit.train.NonFiniteLossError) as e:
        error = type(e).__name__  # the flow keeps its best validation's weights
    with torch.no_grad():
        log_p = flow.eval().log_prob(torch.as_tensor(test, dtype=torch.float32)).double().numpy()
    return {"task": task, "seed": seed, "transformer": transformer, "mode": mode,
            "nll": float(-log_p.mean()), "error": error, "seconds": time.time() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="JSON-lines results file")
    parser.add_argument("--ratios", action="store_true",
                        help="print each task's outlier ratio (see the notes) and stop")
    parser.add_argument("--tasks", nargs="+", default=[*SYNTHETIC, *REAL])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    if args.ratios:
        for task in args.tasks:
            ratios = [outlier_ratio(split(task, seed)[0]) for seed in range(args.seeds)]
            print(f"{task}: " + ", ".join(f"{r:.3g}" for r in ratios))
        return
    if args.out is None:
        parser.error("--out is required (or --ratios)")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # the data warnings (digits' pixels, ...) are expected
    done = set()
    if args.out.exists():
        done = {tuple(json.loads(line)[k] for k in ("task", "seed", "transformer", "mode"))
                for line in args.out.read_text().splitlines()}
    for task in args.tasks:
        modes = ["mean-std", "robust"] + (["log-income"] if task == "income-outliers" else [])
        for seed in range(args.seeds):
            for transformer in ("spline", "affine"):
                for mode in modes:
                    if (task, seed, transformer, mode) in done:
                        continue
                    result = run(task, seed, transformer, mode, args.steps)
                    print(json.dumps(result), flush=True)
                    with args.out.open("a") as f:
                        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
