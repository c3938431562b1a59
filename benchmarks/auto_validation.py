"""``fit``'s default ``valid="auto"`` against ``valid=0.1`` where the two hold out different
numbers of rows (data sets of fewer than 200 rows), for the affine and the spline MAF: test NLL
in nats per row, paired by seed (same data, split and initial weights).

Data: review 32's 4-D curved density in mixed units ("banana", 80 and 150 rows to fit, 4000
fresh rows to score) and scikit-learn's iris, wine and linnerud (a quarter of the rows for the
test). Everything else is ``flowkit.fit``'s defaults:
``fit(MAF(D, transformer=...), x, valid=..., steps=1000, seed=s)``. The table in
docs/defaults.md ("Validation by default") has these rows.

    OMP_NUM_THREADS=1 python benchmarks/auto_validation.py --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable

import numpy as np
import torch
from sklearn.datasets import load_iris, load_linnerud, load_wine

import flowkit

STEPS = 1000
TEST_SHARE = 0.25


def banana(rows: int, rng: np.random.Generator) -> np.ndarray:
    """Review 32's curved 4-D density: a parabola in the first two columns, a sine in the
    third, a noisy copy of it in the fourth, each in other units."""
    a = rng.normal(size=rows)
    b = 0.5 * a**2 + 0.3 * rng.normal(size=rows)
    c = rng.normal(size=rows) + np.sin(2 * a)
    return np.column_stack([a * 10, b + 100, c * 1e-2, 0.5 * c + 0.5 * rng.normal(size=rows)])


def split(x: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)``: a quarter of the rows, drawn from ``seed``, for the test."""
    order = np.random.default_rng(1000 + seed).permutation(len(x))
    test = int(round(TEST_SHARE * len(x)))
    return x[order[test:]], x[order[:test]]


SETS: dict[str, Callable[[int], tuple[np.ndarray, np.ndarray]]] = {
    "banana (80)": lambda s: (banana(80, np.random.default_rng(80 + s)),
                              banana(4000, np.random.default_rng(99))),
    "banana (150)": lambda s: (banana(150, np.random.default_rng(150 + s)),
                               banana(4000, np.random.default_rng(99))),
    "iris": lambda s: split(load_iris().data, s),
    "wine": lambda s: split(load_wine().data, s),
    "linnerud": lambda s: split(np.hstack([load_linnerud().data, load_linnerud().target]), s),
}


def test_nll(train: np.ndarray, test: np.ndarray, transformer: str, valid: float | str,
             seed: int) -> float:
    torch.manual_seed(seed)
    flow = flowkit.MAF(train.shape[1], transformer=transformer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small-data warnings: the point of the measurement
        try:
            flowkit.fit(flow, train, valid=valid, steps=STEPS, seed=seed, progress=False)
        except FloatingPointError:  # Divergence/NonFiniteLoss: the best validation's weights
            flow.eval()
    with torch.no_grad():
        return float(-flow.log_prob(torch.as_tensor(test, dtype=torch.float32)).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--sets", nargs="+", choices=list(SETS), default=list(SETS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| data (training rows) | transformer | valid=0.1 | valid='auto' "
          "| per seed (0.1; auto) |")
    print("|---|---|---:|---:|---|")
    for name in args.sets:
        for transformer in ("affine", "spline"):
            scores: dict[float | str, list[float]] = {0.1: [], "auto": []}
            for seed in args.seeds:
                train, test = SETS[name](seed)
                for valid in scores:
                    scores[valid].append(test_nll(train, test, transformer, valid, seed))
            rows = len(SETS[name](args.seeds[0])[0])
            per_seed = "; ".join(", ".join(f"{v:.4g}" for v in s) for s in scores.values())
            print(f"| {name.split(' (')[0]} ({rows}) | {transformer} | "
                  f"{np.mean(scores[0.1]):.4g} | {np.mean(scores['auto']):.4g} | {per_seed} |")


if __name__ == "__main__":
    main()
