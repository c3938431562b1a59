"""Neural posterior estimation on sbibm tasks: flowkit flows beside sbi's own MAF and NSF.

For each task and seed, --simulations pairs (theta_i, x_i) are drawn from the prior and the
simulator once; every model is trained on them by the same sbi NPE trainer (its defaults:
batches of 200, Adam at 5e-4, 10% validation, stop after 20 epochs without improvement, and
--max-epochs if given), so the models differ only in the density estimator. sbi's models come
from sbi.neural_nets.posterior_nn, flowkit's from flowkit.integrations.sbi.posterior_nn.

For each observation, --samples posterior samples (rejected outside the prior's support, as sbi
does by default) are compared with as many of the task's reference posterior samples by the
classifier two-sample test of sbibm (C2ST accuracy: 0.5 means indistinguishable, 1.0 fully
separable). Time per epoch is sbi's own record (training and validation pass).

Every (task, seed, model) writes OUT/TASK/seedS/MODEL.json as soon as it is done and is skipped
when that file exists, so an interrupted run continues where it stopped (a file of another
budget or of the model's earlier settings is an error: pick another --out); the table
OUT/results.md and OUT/results.json are written after each model.

Needs the packages sbi and sbibm: pip install "flowkit-made[sbi]", then
pip install --no-deps sbibm==1.1.0 pandas pyro-ppl opt_einsum future autograd.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from flowkit.checkpoint import write_bytes_atomic

from .common import FLOW_OPTIONS_ADDED, add_threads_option, markdown_table, use_threads
from .options import positive_int

__all__ = ["MODELS", "add_arguments", "epoch_times", "run", "train_and_score"]

_SPLINE_RES: dict[str, Any] = {
    "library": "flowkit", "model": "maf", "layers": 5, "hidden_features": [50] * 5,
    "residual": True, "transformer": "spline",
    "transformer_kwargs": {"bins": 10, "bound": 3.0, "tails": "identity", "bin_temperature": 1.0},
    "lu_linear": False,
}
_T1 = {"transformer_kwargs": {"bin_temperature": 1.0}}  # the builders' spline, as it is
_LU_T8: dict[str, Any] = {"library": "flowkit", "model": "maf", "transformer": "spline",
                          "lu_linear": True, "transformer_kwargs": {"bin_temperature": 8.0}}

MODELS: dict[str, dict[str, Any]] = {
    "sbi-maf": {"library": "sbi", "model": "maf"},
    "sbi-nsf": {"library": "sbi", "model": "nsf"},
    "flowkit-maf": {"library": "flowkit", "model": "maf", "layers": 5,
                    "hidden_features": [64, 64], "lu_linear": False},
    "flowkit-spline": {"library": "flowkit", "model": "maf", "layers": 5,
                       "hidden_features": [64, 64], "transformer": "spline",
                       "transformer_kwargs": {"bins": 8, "bound": 4.0, "tails": "identity",
                                              "bin_temperature": 1.0},
                       "lu_linear": False},
    "flowkit-spline-defaults": {"library": "flowkit", "model": "maf",
                                "transformer": "spline", "lu_linear": False, **_T1},
    "flowkit-spline-defaults-lu": {"library": "flowkit", "model": "maf",
                                   "transformer": "spline", "lu_linear": True, **_T1},
    "flowkit-spline-defaults-box": {"library": "flowkit", "model": "maf",
                                    "transformer": "spline", "bounds": "prior",
                                    "lu_linear": False, **_T1},
    "flowkit-spline-defaults-lu-t8": _LU_T8,
    "flowkit-spline-defaults-lu-t8-noclip": {**_LU_T8, "train": {"clip_max_norm": None}},
    "flowkit-spline-res": _SPLINE_RES,
    "flowkit-spline-res-cb": {**_SPLINE_RES, "conditional_base": True},
    "flowkit-spline-res-cb-noclip": {**_SPLINE_RES, "conditional_base": True,
                                     "train": {"clip_max_norm": None}},
}
"""The density estimators compared: sbi's defaults (5 transforms, 50 hidden units) and flowkit
MAFs (5 layers, MADEs with two hidden layers of 64, affine or rational-quadratic spline with 8
bins on [-4, 4]; ``flowkit-spline-defaults`` is ``flowkit.MAF(D, transformer="spline")`` with
every other setting the builders' default as measured in docs/sbi.md, before ``lu_linear``
became the MAF's default (it is pinned off in these models, so that their rows reproduce), and
``-lu`` / ``-box`` add a learned LU-linear map after each permutation (``lu_linear=True``,
what ``MAF(D, transformer="spline")`` builds now) / the prior's box (``bounds=(low, high)`` of
a uniform prior), ``-lu-t8`` divides the raw bin widths and heights by 8, the square root of
the hidden width, as sbi's NSF does (``bin_temperature=8``; ``-t8-noclip``: trained without
sbi's gradient clipping); ``flowkit-spline-res`` has the
sizes of sbi's NSF: splines with 10 bins on [-3, 3], and MADEs of width 50 with as many linear
maps as sbi's residual network of 2 blocks of 2 layers, the first hidden layer followed by 4
residual blocks); ``flowkit-spline-res-cb`` is that flow on a conditional Gaussian base (mean
and scale linear in the standardized observation), and ``flowkit-spline-res-cb-noclip`` the
same trained without sbi's gradient clipping (``train``: keywords of sbi's ``train()``,
otherwise sbi's defaults for every model). All flowkit splines except the
``flowkit-spline-defaults`` family keep the identity tails (as sbi's NSF) with which
docs/sbi.md was first measured, and all but the ``-t8`` ones pin ``bin_temperature=1.0``, the
builders' default, which ``posterior_nn``'s spline no longer takes (their records from before,
which name no temperature, were run with it)."""


def _sbibm() -> Any:
    """The sbibm package, with its metrics. It is no extra of flowkit's: it declares sbi<0.22
    but works with current sbi, so it is installed by hand without its dependencies."""
    try:
        import sbibm
        import sbibm.metrics  # noqa: F401 (c2st)
    except ImportError as e:
        raise ImportError(
            "'flowkit sbibm' needs the package sbibm, installed without its declared "
            "dependencies: pip install --no-deps sbibm==1.1.0 pandas pyro-ppl opt_einsum future "
            "autograd "
            f"(importing it failed with: {e})"
        ) from e
    return sbibm


class _NoTracker:
    """sbi's tracker protocol, recording nothing (sbi's default writes TensorBoard files into
    the working directory)."""

    log_dir = None

    def log_metric(self, name: str, value: float, step: int | None = None) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def add_figure(self, name: str, figure: Any, step: int | None = None) -> None:
        pass

    def flush(self) -> None:
        pass


def _builder(name: str, seed: int, prior: Any) -> Callable:
    spec = dict(MODELS[name])
    library, model = spec.pop("library"), spec.pop("model")
    spec.pop("train", None)
    if spec.get("bounds") == "prior":
        spec["bounds"] = _prior_box(prior, name)
    if library == "sbi":
        from sbi.neural_nets import posterior_nn

        return posterior_nn(model=model)
    from flowkit.integrations.sbi import posterior_nn

    return posterior_nn(model, seed=seed, **spec)


def _prior_box(prior: Any, model: str) -> tuple[Tensor, Tensor]:
    """``(low, high)`` of a uniform prior on a box (sbibm's ``Independent(Uniform)``)."""
    support = getattr(prior.support, "base_constraint", None)
    low, high = getattr(support, "lower_bound", None), getattr(support, "upper_bound", None)
    if not (isinstance(low, Tensor) and isinstance(high, Tensor)):
        raise ValueError(f"model {model!r} fits the prior's box, but this task's prior "
                         f"({type(prior).__name__}, support {prior.support}) is not on a box")
    return low, high


def _train(inference: Any, model: str, max_epochs: int | None) -> Any:
    """``inference.train()`` with the model's ``train`` keywords, for at most ``max_epochs``
    epochs (None: sbi's early stopping only; else at least 2); returns the estimator. sbi's
    ``max_num_epochs=n`` (``n >= 1``) allows ``n + 1`` epochs (it counts from 0), hence the
    ``- 1``."""
    options = dict(MODELS[model].get("train", {}))
    if max_epochs is not None:
        options["max_num_epochs"] = max_epochs - 1
    return inference.train(**options)


def train_and_score(
    task_name: str,
    model: str,
    seed: int,
    simulations: int,
    observations: list[int],
    samples: int,
    max_epochs: int | None = None,
) -> dict[str, Any]:
    """Train one model by NPE on ``simulations`` simulations of ``task_name`` (drawn with
    ``seed``) and score it by C2ST on each of ``observations``.

    Returns:
        ``{"c2st": {obs: accuracy}, "epochs", "epoch_seconds" (median), "train_seconds",
        "sample_seconds", ...}``.
    """
    from sbi.inference import NPE

    sbibm = _sbibm()
    task = sbibm.get_task(task_name)
    prior, simulator = task.get_prior_dist(), task.get_simulator()
    torch.manual_seed(seed)
    theta = prior.sample((simulations,))
    x = simulator(theta)
    torch.manual_seed(seed + 1)  # the same weights/data split stream for every model
    inference = NPE(prior, density_estimator=_builder(model, seed, prior),
                    show_progress_bars=False,
                    tracker=_NoTracker())
    t0 = time.perf_counter()
    estimator = _train(inference.append_simulations(theta, x), model, max_epochs)
    train_seconds = time.perf_counter() - t0
    posterior = inference.build_posterior(estimator)
    durations = inference._summary["epoch_durations_sec"]
    scores, sample_seconds = {}, 0.0
    for obs in observations:
        t0 = time.perf_counter()
        drawn = posterior.sample((samples,), x=task.get_observation(obs),
                                 show_progress_bars=False)
        sample_seconds += time.perf_counter() - t0
        reference = task.get_reference_posterior_samples(obs)[:samples]
        scores[str(obs)] = float(sbibm.metrics.c2st(drawn, reference, seed=seed)[0])
    return {
        "task": task_name, "model": model, "seed": seed, "simulations": simulations,
        "samples": samples, "max_epochs": max_epochs,
        "c2st": scores, "epochs": len(durations),
        "epoch_seconds": statistics.median(durations), "train_seconds": train_seconds,
        "sample_seconds": sample_seconds,
        "parameters": sum(p.numel() for p in estimator.parameters()),
        "threads": torch.get_num_threads(), "spec": MODELS[model],
    }


def epoch_times(
    task_name: str, models: list[str], simulations: int, epochs: int, rounds: int, seed: int
) -> dict[str, list[float]]:
    """Seconds per epoch of each model on the same simulations, measured in one process with
    the models interleaved (``rounds`` rounds, each training every model for ``epochs`` epochs
    from scratch), so that all see the same machine load. Returns every epoch's duration."""
    from sbi.inference import NPE

    task = _sbibm().get_task(task_name)
    prior = task.get_prior_dist()
    torch.manual_seed(seed)
    theta = prior.sample((simulations,))
    x = task.get_simulator()(theta)
    times: dict[str, list[float]] = {m: [] for m in models}
    for _ in range(rounds):
        for model in models:
            inference = NPE(prior, density_estimator=_builder(model, seed, prior),
                            show_progress_bars=False, tracker=_NoTracker())
            _train(inference.append_simulations(theta, x), model, epochs)
            times[model] += inference._summary["epoch_durations_sec"]
    return times


def _summary(results: list[dict[str, Any]], tasks: list[str], models: list[str]) -> dict:
    """Per task and model: mean and sample standard deviation of C2ST over all (seed,
    observation) pairs, their number, and the median seconds per epoch."""
    table: dict[str, dict[str, Any]] = {}
    for task in tasks:
        for model in models:
            rows = [r for r in results if r["task"] == task and r["model"] == model]
            if not rows:
                continue
            values = [v for r in rows for v in r["c2st"].values()]
            table.setdefault(task, {})[model] = {
                "c2st_mean": statistics.fmean(values),
                "c2st_sd": statistics.stdev(values) if len(values) > 1 else math.nan,
                "n": len(values),
                "epoch_seconds": statistics.median(r["epoch_seconds"] for r in rows),
                "epochs": statistics.median(r["epochs"] for r in rows),
            }
    return table


def _format(table: dict, models: list[str]) -> str:
    def rows(cell: Callable[[dict], str]) -> list[list[str]]:
        return [[task, *("" if row.get(m) is None else cell(row[m]) for m in models)]
                for task, row in table.items()]

    right = range(1, len(models) + 1)
    return "\n".join([
        markdown_table(["task", *models], rows(
            lambda s: f"{s['c2st_mean']:.3f}"
            + (f" ± {s['c2st_sd']:.3f}" if s["n"] > 1 else "") + f" (n={s['n']})"), right),
        "", "Seconds per epoch (median) and epochs trained (median):", "",
        markdown_table(["task", *models], rows(
            lambda s: f"{s['epoch_seconds']:.2f} s, {s['epochs']:.0f}"), right),
    ])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``flowkit sbibm`` (the CLI adds ``--device``, ``--seed``, ``--out``,
    ``--quiet``; ``--seed`` is the first of ``--seeds`` seeds)."""
    parser.add_argument("--tasks", nargs="+",
                        default=["two_moons", "slcp", "gaussian_mixture"],
                        help="sbibm task names")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS),
                        help="density estimators to compare")
    parser.add_argument("--simulations", type=int, default=10_000,
                        help="simulation budget per task and seed")
    parser.add_argument("--observations", type=int, nargs="+", default=[1, 2, 3],
                        help="sbibm observation numbers, 1-10")
    parser.add_argument("--seeds", type=int, default=1,
                        help="number of seeds: --seed, --seed+1, ...")
    parser.add_argument("--samples", type=int, default=10_000,
                        help="posterior (and reference) samples per observation for C2ST")
    parser.add_argument("--max-epochs", type=positive_int, default=None,
                        help="cap on training epochs, 2 or more (default: none, sbi's early "
                             "stopping only)")
    parser.add_argument("--timing", type=int, default=None, metavar="EPOCHS",
                        help="only measure seconds per epoch: every model EPOCHS epochs, "
                             "interleaved, 3 rounds, in this process; writes OUT/timing.json")
    add_threads_option(parser, also="the C2ST classifier")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train and score every (task, seed, model) not yet in ``--out``; write the table."""
    from threadpoolctl import threadpool_limits

    if args.device not in ("auto", "cpu"):
        raise ValueError("'flowkit sbibm' runs on the CPU: pass --device cpu or leave it auto")
    for name, value, low in (("--simulations", args.simulations, 10),
                             ("--samples", args.samples, 10), ("--seeds", args.seeds, 1)):
        if value < low:
            raise ValueError(f"'{name}' should be >= {low}, got {value}")
    if args.max_epochs is not None and args.max_epochs < 2:
        raise ValueError(
            f"'--max-epochs' should be >= 2 (sbi trains at least 2 epochs), got {args.max_epochs}"
        )
    if any(not 1 <= o <= 10 for o in args.observations):
        raise ValueError(f"'--observations' should be in 1-10, got {args.observations}")
    use_threads(args.threads)
    out = Path(args.out)
    if args.timing is not None:
        if args.timing < 2:
            raise ValueError(f"'--timing' should be >= 2 epochs, got {args.timing}")
        with threadpool_limits(args.threads):
            timing = {
                task: {m: statistics.median(t) for m, t in epoch_times(
                    task, args.models, args.simulations, args.timing, 3, args.seed).items()}
                for task in args.tasks
            }
        _write_text(out / "timing.json", json.dumps(timing, indent=2))
        if not args.quiet:
            print(json.dumps(timing, indent=2))
        return timing
    results: list[dict[str, Any]] = []
    with threadpool_limits(args.threads):
        for task in args.tasks:
            for seed in range(args.seed, args.seed + args.seeds):
                for model in args.models:
                    path = out / task / f"seed{seed}" / f"{model}.json"
                    if path.is_file():
                        results.append(_reuse(path, args))
                        continue
                    r = train_and_score(task, model, seed, args.simulations,
                                        args.observations, args.samples, args.max_epochs)
                    _write_text(path, json.dumps(r, indent=2))
                    results.append(r)
                    if not args.quiet:
                        c2st = ", ".join(f"{v:.3f}" for v in r["c2st"].values())
                        print(f"{task} seed {seed} {model}: C2ST {c2st} (observations "
                              f"{', '.join(r['c2st'])}), {r['epochs']} epochs of "
                              f"{r['epoch_seconds']:.2f} s", flush=True)
                    _write(out, results, args.tasks, args.models)
    return _write(out, results, args.tasks, args.models)


def _reuse(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A finished (task, seed, model) result, if it was run with this budget and this
    model's current settings."""
    r = json.loads(path.read_text())
    wanted = {"simulations": args.simulations, "samples": args.samples,
              "max_epochs": args.max_epochs,
              "observations": [str(o) for o in args.observations],
              "spec": json.loads(json.dumps(MODELS[r["model"]]))}
    spec = r.get("spec")
    if isinstance(spec, dict) and spec.get("library") == "flowkit":  # options it predates
        spec = {**FLOW_OPTIONS_ADDED, **spec}
        if spec.get("transformer") == "spline":  # run before posterior_nn's bin temperature
            spec["transformer_kwargs"] = {"bin_temperature": 1.0,
                                          **spec.get("transformer_kwargs", {})}
    found = {"simulations": r["simulations"], "samples": r.get("samples"),
             "max_epochs": r.get("max_epochs"), "observations": list(r["c2st"]),
             "spec": spec}
    if found != wanted:
        raise ValueError(f"'{path}' was run with {found}, not {wanted}: pick another --out")
    if args.max_epochs is not None and r["epochs"] > args.max_epochs:
        raise ValueError(
            f"'{path}' trained {r['epochs']} epochs under --max-epochs {args.max_epochs} (an "
            "earlier version trained one epoch more than asked): pick another --out"
        )
    return r


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, text.encode())


def _write(out: Path, results: list[dict], tasks: list[str], models: list[str]) -> dict:
    table = _summary(results, tasks, models)
    _write_text(out / "results.json", json.dumps({"table": table, "runs": results}, indent=2))
    _write_text(out / "results.md", _format(table, models) + "\n")
    return table
