"""Test log-likelihood of a MAF (flowkit.sklearn.FlowDensity) against scikit-learn's
GaussianMixture and KernelDensity, on the 2-D toy datasets and on the bundled digits.

Data:
  toy datasets  --n-train rows to fit, --n-test fresh rows to score (seeds SEED and SEED + 1);
  digits        sklearn.datasets.load_digits (1797 images of 8 x 8 pixels in 0..16, bundled,
                no download), dequantized with U[0, 1) noise per pixel, so 64 continuous
                dimensions; a seeded random split keeps --digits-test images for scoring.

Models, each fitted to the training rows only:
  gmm   GaussianMixture (full covariances), n_components chosen by 3-fold cross-validation of
        the mean log-likelihood over 1, 2, 4, ... up to 64 (toy) or 16 (digits), and at most
        a tenth of the training rows;
  kde   KernelDensity (Gaussian kernel), bandwidth chosen by 5-fold cross-validation over 17
        values, log-spaced around Scott's rule;
  maf   FlowDensity: a MAF with --layers affine layers and hidden sizes --hidden (default:
        two layers of max(64, 4 D) units), standardized inputs, Adam, early stopping on a
        10% validation split of the training rows;
  maf-spline  the same with rational-quadratic spline transformers (8 bins; slower).

Reported: mean test log-likelihood in nats per row (higher is better) with its standard error,
the exact value where the toy density is known, fit times and the chosen hyper-parameters.
Writes OUT/table.md (the table of docs/sklearn.md) and, through the CLI, OUT/metrics.json.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.datasets import load_digits
from sklearn.mixture import GaussianMixture
from sklearn.model_selection import GridSearchCV
from sklearn.neighbors import KernelDensity
from threadpoolctl import threadpool_limits

from flowkit.data import TOY_DATASETS, has_exact_density, sample_toy, toy_log_prob
from flowkit.sklearn import FlowDensity

from .common import add_threads_option, markdown_table, mean_se, use_threads
from .options import positive_int

__all__ = ["add_arguments", "run", "load_dataset", "fit_model", "scores_table"]

DATASETS = (*TOY_DATASETS, "digits")
MODELS = ("gmm", "kde", "maf", "maf-spline")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``flowkit sklearn-compare``."""
    data = parser.add_argument_group("data")
    data.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS),
                      metavar="NAME", help=f"any of {', '.join(DATASETS)} (default: all)")
    data.add_argument("--n-train", type=int, default=5000, help="training rows per toy dataset")
    data.add_argument("--n-test", type=int, default=5000, help="test rows per toy dataset")
    data.add_argument("--digits-test", type=int, default=500,
                      help="digits images held out for scoring")
    models = parser.add_argument_group("models")
    models.add_argument("--models", nargs="+", choices=MODELS, default=["gmm", "kde", "maf"],
                        help="models to compare")
    models.add_argument("--layers", type=int, default=5, help="MAF layers")
    models.add_argument("--hidden", type=positive_int, nargs="+", default=None,
                        help="MADE hidden sizes (default: two layers of max(64, 4 D))")
    models.add_argument("--epochs", type=int, default=100, help="most epochs of MAF training")
    models.add_argument("--patience", type=int, default=10,
                        help="epochs without a better validation score before stopping")
    add_threads_option(parser, default=1, also="numpy's BLAS",
                       why="these small models gain little from more, and lose much when the "
                           "cores are shared")


def load_dataset(
    name: str, n_train: int, n_test: int, digits_test: int, seed: int
) -> tuple[np.ndarray, np.ndarray, float | None]:
    """Training rows, test rows (float64) and the exact mean test log-density (or None)."""
    if name == "digits":
        rng = np.random.default_rng(seed)
        x = load_digits().data
        x = x + rng.uniform(size=x.shape)  # dequantize: a density on [0, 17)^64
        perm = rng.permutation(len(x))
        return x[perm[digits_test:]], x[perm[:digits_test]], None
    train = sample_toy(name, n_train, seed=seed, dtype=torch.float64)
    test = sample_toy(name, n_test, seed=seed + 1, dtype=torch.float64)
    exact = toy_log_prob(name, test).mean().item() if has_exact_density(name) else None
    return train.numpy(), test.numpy(), exact


def _gmm(x: np.ndarray, seed: int) -> tuple[BaseEstimator, dict[str, Any]]:
    most = min(64 if x.shape[1] <= 2 else 16, max(1, len(x) // 10))
    grid = {"n_components": [2**k for k in range(int(math.log2(most)) + 1)]}
    search = GridSearchCV(GaussianMixture(covariance_type="full", random_state=seed), grid, cv=3)
    search.fit(x)
    return search.best_estimator_, {"n_components": search.best_params_["n_components"]}


def _kde(x: np.ndarray) -> tuple[BaseEstimator, dict[str, Any]]:
    n, d = x.shape
    scott = n ** (-1.0 / (d + 4)) * x.std(axis=0).mean()
    grid = {"bandwidth": scott * np.logspace(-1.5, 0.5, 17)}
    search = GridSearchCV(KernelDensity(kernel="gaussian"), grid, cv=5).fit(x)
    return search.best_estimator_, {"bandwidth": round(float(search.best_params_["bandwidth"]), 4)}


def _maf(
    x: np.ndarray, seed: int, args: argparse.Namespace, spline: bool
) -> tuple[BaseEstimator, dict[str, Any]]:
    hidden = tuple(args.hidden) if args.hidden else (max(64, 4 * x.shape[1]),) * 2
    options: dict[str, Any] = {}
    if spline:
        options = {"transformer": "spline", "transformer_kwargs": {"bins": 8, "bound": 4.0}}
    est = FlowDensity(
        layers=args.layers,
        hidden_features=hidden,
        max_epochs=args.epochs,
        n_iter_no_change=args.patience,
        batch_size=256,
        device=args.device,
        random_state=seed,
        verbose=not args.quiet,
        **options,
    ).fit(x)
    h = est.history_
    return est, {"hidden": list(hidden), "steps": len(h.train_loss), "best_step": h.best_step}


def fit_model(
    model: str, x: np.ndarray, seed: int, args: argparse.Namespace
) -> tuple[BaseEstimator, dict[str, Any]]:
    """Fit one of :data:`MODELS` to ``x``; returns the estimator and its chosen settings."""
    if model == "gmm":
        return _gmm(x, seed)
    if model == "kde":
        return _kde(x)
    return _maf(x, seed, args, spline=model == "maf-spline")


def scores_table(results: dict[str, dict[str, Any]], models: list[str]) -> str:
    """The results as a Markdown table: mean test log-likelihood +- standard error."""
    rows = []
    for name, r in results.items():
        scores = {m: r[m]["test_log_likelihood"] for m in models}
        best = max(scores.values())
        cells = [name, str(r["features"])]
        for m in models:
            cell = f"{scores[m]:.3f} ± {r[m]['stderr']:.3f}"
            cells.append(f"**{cell}**" if scores[m] == best else cell)
        cells.append("—" if r["exact"] is None else f"{r['exact']:.3f}")
        rows.append(cells)
    return markdown_table(["dataset", "D", *models, "exact"], rows) + "\n"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Fit every model to every dataset, print and write the table; returns the metrics."""
    for flag in ("n_train", "n_test", "digits_test", "epochs", "patience", "layers"):
        if getattr(args, flag) < 1:
            raise ValueError(f"'--{flag.replace('_', '-')}' should be a positive integer")
    if "digits" in args.datasets and args.digits_test >= len(load_digits().data):
        raise ValueError(f"'--digits-test' should be below 1797, got {args.digits_test}")
    threads = torch.get_num_threads()
    use_threads(args.threads)
    try:
        with threadpool_limits(args.threads):
            results = {name: _evaluate(name, args) for name in args.datasets}
    finally:
        torch.set_num_threads(threads)
    table = scores_table(results, list(args.models))
    print(table)
    Path(args.out, "table.md").write_text(table)
    return {"results": results, "table": table}


def _evaluate(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Fit and score every model of ``args.models`` on dataset ``name``."""
    train, test, exact = load_dataset(name, args.n_train, args.n_test, args.digits_test, args.seed)
    r: dict[str, Any] = {
        "features": train.shape[1], "n_train": len(train), "n_test": len(test), "exact": exact
    }
    for model in args.models:
        start = time.perf_counter()
        est, chosen = fit_model(model, train, args.seed, args)
        seconds = time.perf_counter() - start
        scores = est.score_samples(test)
        mean, stderr = mean_se(torch.from_numpy(scores))
        r[model] = {
            "test_log_likelihood": mean,
            "stderr": stderr,
            "fit_seconds": round(seconds, 1),
            **chosen,
        }
        print(f"{name:>12} {model:>10}: {scores.mean():9.3f} nats/row, fit {seconds:6.1f} s, "
              f"{chosen}", flush=True)
    return r
