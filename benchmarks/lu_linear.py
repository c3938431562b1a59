"""The MAF with and without its LU-linear maps (``lu_linear``) on correlated Gaussians, whose
density is known: excess NLL (test NLL minus the true one) in nats per row, paired by seed
(same data, split, initial weights and batches).

Data: ``D`` features with variances 0.01 to 10 in a random orthogonal basis and a random mean,
3000 rows to fit (``valid=0.1`` holds 10% out), 2000 to test; the 16-D set at 1500 steps and the
32-D set at 1000, as reviews 7 and 18 measured them. Everything else is ``flowkit.fit``'s
defaults: ``fit(MAF(D, transformer=..., lu_linear=...), x, valid=0.1, steps=STEPS, seed=s)``.
The table in docs/defaults.md ("A learned linear map between layers") has these rows.

    OMP_NUM_THREADS=1 python benchmarks/lu_linear.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch
from scipy import stats

import flowkit

SETS = {16: 1500, 32: 1000}
"""Dimension of each correlated Gaussian and the optimizer steps it is fitted for."""
ROWS, TEST_ROWS = 3000, 2000


def correlated_gaussian(dim: int, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Training rows, test rows (float32) and the test rows' mean true NLL."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    cov = basis @ np.diag(np.logspace(-2, 1, dim)) @ basis.T
    mean = rng.normal(size=dim)
    x = rng.multivariate_normal(mean, cov, size=ROWS + TEST_ROWS)
    exact = -stats.multivariate_normal(mean, cov).logpdf(x[ROWS:]).mean()
    return x[:ROWS].astype(np.float32), x[ROWS:].astype(np.float32), float(exact)


def excess(dim: int, transformer: str, lu_linear: bool, seed: int) -> float:
    x, test, exact = correlated_gaussian(dim, seed)
    torch.manual_seed(seed)
    flow = flowkit.MAF(dim, transformer=transformer, lu_linear=lu_linear)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flowkit.fit(flow, torch.from_numpy(x), valid=0.1, steps=SETS[dim], seed=seed,
                    progress=False, device="cpu")
    with torch.no_grad():
        return -flow.log_prob(torch.from_numpy(test)).double().mean().item() - exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--dims", type=int, nargs="+", default=sorted(SETS), choices=sorted(SETS))
    parser.add_argument("--transformers", nargs="+", default=["affine", "spline"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("D  transformer  seed  without  with  difference")
    for dim in args.dims:
        for transformer in args.transformers:
            for seed in args.seeds:
                base, lu = (excess(dim, transformer, lu, seed) for lu in (False, True))
                print(f"{dim:<3d}{transformer:<13s}{seed:<6d}{base:<9.3f}{lu:<6.3f}"
                      f"{lu - base:+.3f}", flush=True)


if __name__ == "__main__":
    main()
