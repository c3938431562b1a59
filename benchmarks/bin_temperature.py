"""The spline's bin temperature ``T`` on data sets outside the defaults benchmark: the builders'
spline MAF with ``T = 1`` (the default), ``T = sqrt(D)`` (a rule by the number of features) and
``T = 8`` (the square root of the MADEs' hidden width, as nflows and sbi's NSF), test NLL in nats
per row, paired by seed (same data, split, initial weights and batches).

Data (a quarter of the rows, drawn by seed, for the test): correlated Gaussians of 30 features
(450 rows, condition number about 3e9; 2000 rows, AR(1) with rho = 0.9 in units from 0.1 to
100), exponential and log-normal columns in mixed units, a correlated Student t(3) in 4-D,
scikit-learn's 3-D swiss roll and S curve, 16 features driven by 4 latent ones through a tanh,
a mixture of 5 Gaussians in 8-D, and three noisy parabolas in 6-D (600 rows). Everything else is
``flowkit.fit``'s defaults: ``fit(MAF(D, transformer="spline",
transformer_kwargs={"bin_temperature": T}), x, steps=1000, seed=s)``. docs/defaults.md ("The
spline's bin temperature") has the table.

    OMP_NUM_THREADS=1 python benchmarks/bin_temperature.py --seeds 0 1
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Callable

import numpy as np
import torch
from sklearn.datasets import make_s_curve, make_swiss_roll

import flowkit

STEPS = 1000
TEST_SHARE = 0.25


def split(x: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)``: a quarter of the rows, drawn from ``seed``, for the test."""
    order = np.random.default_rng(1000 + seed).permutation(len(x))
    test = int(round(TEST_SHARE * len(x)))
    return x[order[test:]], x[order[:test]]


def gaussian_30(rows: int) -> np.ndarray:
    """A Gaussian of 30 features with a random lower-triangular factor (ill-conditioned)."""
    rng = np.random.default_rng(3)
    factor = np.tril(rng.normal(size=(30, 30)))
    factor[np.diag_indices(30)] = np.abs(factor[np.diag_indices(30)]) + 0.5
    return rng.normal(size=(rows, 30)) @ factor.T


def ar1_30(rows: int) -> np.ndarray:
    """An AR(1) Gaussian of 30 features, rho = 0.9, each feature in its own units."""
    scale = np.logspace(-1, 2, 30)
    lags = np.abs(np.subtract.outer(np.arange(30), np.arange(30)))
    cov = 0.9**lags * np.outer(scale, scale)
    return np.random.default_rng(11).multivariate_normal(10 * scale, cov, size=rows)


def skewed_3(rows: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    return np.column_stack([rng.exponential(1.0, rows), rng.exponential(5e3, rows),
                            rng.lognormal(0.0, 1.0, rows) * 1e-2])


def student_4(rows: int) -> np.ndarray:
    rng = np.random.default_rng(2)
    return rng.standard_t(3, size=(rows, 4)) @ rng.normal(size=(4, 4))


def latent_16(rows: int) -> np.ndarray:
    """16 features driven by 4 Gaussian latents through a tanh, plus a little noise."""
    rng = np.random.default_rng(5)
    z, mixing = rng.normal(size=(rows, 4)), rng.normal(size=(4, 16))
    return np.tanh(z @ mixing) + 0.05 * rng.normal(size=(rows, 16))


def mixture_8(rows: int) -> np.ndarray:
    """5 Gaussian components in 8-D with their own diagonal scales."""
    rng = np.random.default_rng(6)
    means, labels = rng.normal(scale=3.0, size=(5, 8)), rng.integers(0, 5, rows)
    scales = rng.uniform(0.3, 1.0, size=(5, 8))
    return means[labels] + rng.normal(size=(rows, 8)) * scales[labels]


def parabolas_6(rows: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    a = rng.normal(size=(rows, 3))
    return np.column_stack([a, 0.5 * a**2 + 0.3 * rng.normal(size=(rows, 3))])


SETS: dict[str, Callable[[], np.ndarray]] = {
    "gaussian 30-D (450)": lambda: gaussian_30(450),
    "AR(1) 30-D (2000)": lambda: ar1_30(2000),
    "exponential/log-normal 3-D (2000)": lambda: skewed_3(2000),
    "Student t(3) 4-D (1500)": lambda: student_4(1500),
    "swiss roll 3-D (3000)": lambda: make_swiss_roll(3000, noise=0.3, random_state=0)[0],
    "S curve 3-D (3000)": lambda: make_s_curve(3000, noise=0.1, random_state=0)[0],
    "tanh of 4 latents 16-D (3000)": lambda: latent_16(3000),
    "mixture 8-D (4000)": lambda: mixture_8(4000),
    "parabolas 6-D (600)": lambda: parabolas_6(600),
}


def test_nll(train: np.ndarray, test: np.ndarray, temperature: float, seed: int) -> float:
    torch.manual_seed(seed)
    flow = flowkit.MAF(train.shape[1], transformer="spline",
                       transformer_kwargs={"bin_temperature": temperature})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # data warnings (skewed columns): not measured here
        flowkit.fit(flow, train, steps=STEPS, seed=seed, progress=False)
    with torch.no_grad():
        return float(-flow.log_prob(torch.as_tensor(test, dtype=torch.float32)).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--sets", nargs="+", choices=list(SETS), default=list(SETS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| data (rows) | D | T = 1 | T = sqrt(D) - T = 1, by seed | T = 8 - T = 1, by seed |")
    print("|---|---:|---:|---|---|")
    for name in args.sets:
        x = SETS[name]()
        features = x.shape[1]
        temperatures = (1.0, math.sqrt(features), 8.0)
        scores: list[list[float]] = [[] for _ in temperatures]
        for seed in args.seeds:
            train, test = split(x, seed)
            for temperature, nlls in zip(temperatures, scores, strict=True):
                nlls.append(test_nll(train, test, temperature, seed))
        base, by_rule, by_hidden = scores
        print(f"| {name} | {features} | {np.mean(base):.3f} | "
              + " | ".join(", ".join(f"{t - b:+.3f}" for t, b in zip(s, base, strict=True))
                           for s in (by_rule, by_hidden)) + " |", flush=True)


if __name__ == "__main__":
    main()
