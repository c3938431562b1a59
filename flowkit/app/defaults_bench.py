"""Defaults benchmark: flowkit's defaults against zuko's and scikit-learn's, on data nobody
tuned for, in its own units and after a change of units.

Tasks (each with one seeded train / validation / test split that every model shares):
  toys      every 2-D dataset of flowkit.data: --n-train rows to fit (a tenth of them held out
            for validation), --n-test fresh rows to score; at its own scale, and with the units
            of the first axis changed, x -> 100 x + 1000 ("x100+1000");
  real      scikit-learn's bundled wine, breast_cancer, digits, iris and diabetes (features only,
            no download): raw, as loaded (diabetes with scaled=False), and standardized by the
            mean and deviation of the training rows ("std"); 20% of the rows are the test set,
            10% of the rest the validation set;
  moons|y   a conditional task: sklearn's two moons (noise 0.1) with the moon's label as the
            context, own units and x100+1000.

Models:
  flowkit-maf     flowkit.MAF(D, context_features=C), trained by flowkit.fit with its defaults
  flowkit-spline  flowkit.MAF(D, context_features=C, transformer="spline"), likewise
  zuko-maf        zuko.flows.MAF(D, context=C) (zuko's defaults), Adam lr 1e-3, constant
  zuko-nsf        zuko.flows.NSF(D, context=C), likewise
  gmm             GaussianMixture (full covariances), n_components by 3-fold cross-validation
  kde             KernelDensity, bandwidth by 5-fold cross-validation (as flowkit
                  sklearn-compare); conditional tasks fit one GMM / KDE per label.
Every flow gets the same budget: --steps (toys, moons|y) or --real-steps optimizer steps of
min(--batch-size, rows) rows, a validation every --valid-every steps and the weights of the best
validation at the end. scikit-learn fits the training and validation rows (its cross-validation
is its validation). zuko is optional (pip install zuko==1.6.0); its columns are left out without it.

Also the checkerboard target: flowkit.MAF(2, transformer="spline") trained by flowkit.fit with
nothing but its defaults for --target-steps steps on fresh samples, KL(data || model) in nats, in
own units and after x100+1000.

Reported: held-out NLL in nats per row (lower is better) +- its standard error; on "x100+1000" rows
the NLL minus log 100, i.e. in the data's original units, which a unit-invariant model leaves
unchanged. Each finished (task, model) cell is saved at once in OUT/cells/ (a rerun with the same
--out skips the cells it finds, so an interrupted run resumes); OUT/table.md is rebuilt from all
cells at the end (--table-only rebuilds it without fitting).

examples:
  flowkit bench-defaults --out runs/defaults
  flowkit bench-defaults --quick --out runs/defaults-quick       # seconds: a smoke test
  flowkit bench-defaults --tasks iris:raw iris:std --models flowkit-maf gmm --out runs/d
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn import datasets as sk_datasets
from threadpoolctl import threadpool_limits

import flowkit
from flowkit.data import TOY_DATASETS, has_exact_density, sample_toy, toy_entropy
from flowkit.train import NonFiniteLossError

from .common import mean_se
from .sklearn_compare import fit_model as fit_sklearn

__all__ = ["add_arguments", "run", "make_tasks", "markdown_table", "Task"]

REAL = ("wine", "breast_cancer", "digits", "iris", "diabetes")
FLOWS = ("flowkit-maf", "flowkit-spline", "zuko-maf", "zuko-nsf")
MODELS = (*FLOWS, "gmm", "kde")
UNIT_SCALE, UNIT_SHIFT = 100.0, 1000.0
QUICK_TASKS = ("moons:own", "moons:x100+1000", "iris:raw", "moons|y:own")
TARGET = "checkerboard-target"


@dataclass
class Task:
    """One dataset split, shared by every model. Arrays are float32 ``(N, D)``; contexts
    ``(N, C)`` or None. ``log_jacobian`` is ``log|det|`` of the change of units applied to the
    data (subtracted from NLLs to report them in the original units); ``entropy`` the exact
    differential entropy in the original units where known."""

    name: str
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    context: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    log_jacobian: float = 0.0
    entropy: float | None = None
    real: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``flowkit bench-defaults``."""
    parser.add_argument("--quick", action="store_true",
                        help=f"tasks {', '.join(QUICK_TASKS)}, 20 steps, 600 rows: a smoke test")
    parser.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                        help="task names as in the table, e.g. checkerboard:own iris:std "
                        f"moons|y:x100+1000, or {TARGET} (default: all)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        metavar="MODEL", help=f"any of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--steps", type=int, default=3000,
                        help="optimizer steps of every flow on the toys and moons|y "
                        "(default: %(default)s)")
    parser.add_argument("--real-steps", type=int, default=3000,
                        help="optimizer steps of every flow on the real data sets "
                        "(default: %(default)s)")
    parser.add_argument("--target-steps", type=int, default=3000,
                        help="steps of the checkerboard target; 0 leaves it out "
                        "(default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="rows per step, capped by the training rows (default: %(default)s)")
    parser.add_argument("--valid-every", type=int, default=100,
                        help="steps between validations (default: %(default)s)")
    parser.add_argument("--n-train", type=int, default=10000,
                        help="rows to fit per toy task, validation included "
                        "(default: %(default)s)")
    parser.add_argument("--n-test", type=int, default=10000,
                        help="rows to score per toy task (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch and BLAS threads (default: %(default)s)")
    parser.add_argument("--table-only", action="store_true",
                        help="rebuild OUT/table.md from the cells in OUT/cells, fit nothing")


# ----------------------------------------------------------------------------------- tasks


def _units(x: np.ndarray) -> np.ndarray:
    y = x.copy()
    y[:, 0] = y[:, 0] * UNIT_SCALE + UNIT_SHIFT
    return y


def _toy_tasks(name: str, n_train: int, n_test: int, seed: int) -> list[Task]:
    data = sample_toy(name, n_train, seed=seed).numpy()
    test = sample_toy(name, n_test, seed=seed + 1).numpy()
    n_valid = max(1, n_train // 10)
    entropy = toy_entropy(name) if has_exact_density(name) else None
    own = Task(f"{name}:own", data[n_valid:], data[:n_valid], test, entropy=entropy)
    units = Task(f"{name}:x100+1000", _units(own.train), _units(own.valid), _units(test),
                 log_jacobian=math.log(UNIT_SCALE), entropy=entropy)
    return [own, units]


def _moons_tasks(n_train: int, n_test: int, seed: int) -> list[Task]:
    x, y = sk_datasets.make_moons(n_train + n_test, noise=0.1, random_state=seed)
    x, y = x.astype(np.float32), y.astype(np.float32)[:, None]
    n_valid = max(1, n_train // 10)
    parts = (slice(n_valid, n_train), slice(0, n_valid), slice(n_train, None))
    xs = tuple(x[p] for p in parts)
    ys = tuple(y[p] for p in parts)
    own = Task("moons|y:own", *xs, context=ys)
    units = Task("moons|y:x100+1000", *(_units(a) for a in xs), context=ys,
                 log_jacobian=math.log(UNIT_SCALE))
    return [own, units]


def _load_real(name: str) -> np.ndarray:
    if name == "diabetes":
        return sk_datasets.load_diabetes(scaled=False).data
    return getattr(sk_datasets, f"load_{name}")().data


def _real_tasks(name: str, seed: int) -> list[Task]:
    x = _load_real(name).astype(np.float64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 5
    n_valid = max(1, (len(x) - n_test) // 10)
    test, valid, train = np.split(x[order], [n_test, n_test + n_valid])
    fitted = np.concatenate([train, valid])
    mean, std = fitted.mean(0), fitted.std(0)
    std[std == 0] = 1.0  # as sklearn's StandardScaler does
    f32 = [a.astype(np.float32) for a in (train, valid, test)]
    scaled = [((a - mean) / std).astype(np.float32) for a in (train, valid, test)]
    return [Task(f"{name}:raw", *f32, real=True), Task(f"{name}:std", *scaled, real=True)]


def make_tasks(n_train: int, n_test: int, seed: int) -> list[Task]:
    """Every task of the benchmark, in table order."""
    tasks: list[Task] = []
    for name in TOY_DATASETS:
        tasks += _toy_tasks(name, n_train, n_test, seed)
    for name in REAL:
        tasks += _real_tasks(name, seed)
    return tasks + _moons_tasks(n_train, n_test, seed)


# ----------------------------------------------------------------------------------- models


def _tensors(task: Task, part: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    x = torch.from_numpy((task.train, task.valid, task.test)[part])
    c = None if task.context is None else torch.from_numpy(task.context[part])
    return x, c


def _fit_flowkit(task: Task, transformer: str, steps: int, args: argparse.Namespace) -> Any:
    x, c = _tensors(task, 0)
    xv, cv = _tensors(task, 1)
    flow = flowkit.MAF(x.shape[1], context_features=0 if c is None else c.shape[1],
                       transformer=transformer)
    flowkit.fit(flow, x if c is None else (x, c), valid=xv if cv is None else (xv, cv),
                steps=steps, batch_size=min(args.batch_size, len(x)),
                valid_every=args.valid_every, restore_best=True, seed=args.seed,
                device="cpu", progress=False)
    return _Scored(flow)


class _Scored:
    """A fitted flowkit flow as the benchmark scores it: ``log_prob(x, c)``, and for splines the
    share of the test points that reach a spline layer outside its interval ``[-B, B]`` (where
    the layer is the identity and cannot shape them), the largest over the layers."""

    def __init__(self, flow: flowkit.Flow):
        self.flow = flow

    def __call__(self, x: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        return self.flow.log_prob(x, c) if c is not None else self.flow.log_prob(x)

    def outside(self, x: torch.Tensor, c: torch.Tensor | None) -> float | None:
        from flowkit.transforms import MaskedAutoregressive, RationalQuadraticSpline

        layers = [m for m in self.flow.modules() if isinstance(m, MaskedAutoregressive)
                  and isinstance(m.transformer, RationalQuadraticSpline)]
        if not layers:
            return None
        shares: list[float] = []

        def record(module: MaskedAutoregressive, inputs: tuple) -> None:
            bound = module.transformer.bound
            shares.append(float((inputs[0].abs() > bound).any(dim=1).double().mean()))

        hooks = [m.register_forward_pre_hook(record) for m in layers]
        try:
            with torch.no_grad():
                self(x, c)
        finally:
            for h in hooks:
                h.remove()
        return max(shares)


def _fit_zuko(task: Task, kind: str, steps: int, args: argparse.Namespace) -> Any:
    import zuko

    x, c = _tensors(task, 0)
    xv, cv = _tensors(task, 1)
    torch.manual_seed(args.seed)
    build = zuko.flows.MAF if kind == "maf" else zuko.flows.NSF
    flow = build(x.shape[1], context=0 if c is None else c.shape[1])

    def log_prob(x: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        return flow(c).log_prob(x)

    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(args.seed)
    batch = min(args.batch_size, len(x))
    best, best_state = math.inf, None
    for step in range(1, steps + 1):
        rows = torch.randint(len(x), (batch,), generator=generator)
        loss = -log_prob(x[rows], None if c is None else c[rows]).mean()
        if not torch.isfinite(loss):
            break  # diverged: keep the best validated weights, as a user's loop would
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.valid_every == 0 or step == steps:
            with torch.no_grad():
                valid = -log_prob(xv, cv).mean().item()
            if valid < best:
                best = valid
                best_state = {k: v.clone() for k, v in flow.state_dict().items()}
    if best_state is not None:
        flow.load_state_dict(best_state)
    return log_prob


def _fit_sklearn(task: Task, kind: str, args: argparse.Namespace) -> Any:
    x = np.concatenate([task.train, task.valid]).astype(np.float64)
    if task.context is None:
        est, _ = fit_sklearn(kind, x, args.seed, args)
        return lambda x, c: torch.from_numpy(est.score_samples(x.double().numpy()))
    labels = np.concatenate(task.context[:2])[:, 0]
    per_label = {y: fit_sklearn(kind, x[labels == y], args.seed, args)[0]
                 for y in np.unique(labels)}

    def log_prob(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        out = np.empty(len(x))
        for y, est in per_label.items():
            rows = (c[:, 0] == y).numpy()
            out[rows] = est.score_samples(x[rows].double().numpy())
        return torch.from_numpy(out)

    return log_prob


def _fit(task: Task, model: str, args: argparse.Namespace) -> Callable:
    steps = args.real_steps if task.real else args.steps
    if model.startswith("flowkit-"):
        return _fit_flowkit(task, "affine" if model == "flowkit-maf" else "spline", steps, args)
    if model.startswith("zuko-"):
        return _fit_zuko(task, model.removeprefix("zuko-"), steps, args)
    return _fit_sklearn(task, model, args)


def _cell(task: Task, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Fit ``model`` on ``task`` and score its test rows."""
    start = time.perf_counter()
    try:
        log_prob = _fit(task, model, args)
    except NonFiniteLossError as e:
        return {"error": f"diverged at step {e.step}", "seconds": time.perf_counter() - start}
    seconds = time.perf_counter() - start
    x, c = _tensors(task, 2)
    with torch.no_grad():
        nll = -torch.cat([log_prob(xb, None if c is None else c[i : i + len(xb)])
                          for i, xb in zip(range(0, len(x), 4096), x.split(4096), strict=True)])
    finite = torch.isfinite(nll)
    mean, se = mean_se(nll[finite] if finite.any() else nll)
    out: dict[str, Any] = {"nll": mean - task.log_jacobian, "se": se, "seconds": seconds}
    if isinstance(log_prob, _Scored) and (share := log_prob.outside(x, c)) is not None:
        out["outside_spline"] = share
    if not finite.all():
        out["error"] = f"{int((~finite).sum())} test rows with infinite NLL"
        out["nll"] = math.inf
    return out


def _target(units: bool, steps: int, args: argparse.Namespace) -> dict[str, Any]:
    """KL of ``MAF(2, transformer="spline")`` trained by ``fit``'s defaults on fresh checkerboard
    samples, in own units or after x100+1000 (then reported back in own units)."""
    shift = torch.tensor([UNIT_SHIFT, 0.0]) if units else torch.zeros(2)
    scale = torch.tensor([UNIT_SCALE, 1.0]) if units else torch.ones(2)

    def sample(n: int, generator: torch.Generator) -> torch.Tensor:
        return sample_toy("checkerboard", n, generator=generator) * scale + shift

    torch.manual_seed(args.seed)
    flow = flowkit.MAF(2, transformer="spline")
    start = time.perf_counter()
    flowkit.fit(flow, sample, steps=steps, seed=args.seed, device="cpu", progress=False)
    seconds = time.perf_counter() - start
    test = sample_toy("checkerboard", args.n_test, seed=args.seed + 1) * scale + shift
    with torch.no_grad():
        mean, se = mean_se(-flow.log_prob(test))
    nll = mean - float(torch.log(scale).sum())
    return {"nll": nll, "se": se, "kl": nll - toy_entropy("checkerboard"), "seconds": seconds}


# ----------------------------------------------------------------------------------- table


def _format(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "—"
    if "error" in cell and not math.isfinite(cell["nll"] if "nll" in cell else math.inf):
        return cell["error"]
    return f"{cell['nll']:.3f} ± {cell['se']:.3f}"


def markdown_table(cells: dict[str, dict[str, dict[str, Any]]], tasks: list[str],
                   models: list[str]) -> str:
    """Held-out NLL per task (rows) and model (columns); the lowest of each row in bold."""
    head = ["task", *models]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task in tasks:
        row = cells.get(task, {})
        values = {m: row[m]["nll"] for m in models if m in row and "nll" in row[m]}
        best = min(values.values(), default=None)
        out = [task.replace("|", "\\|")]  # a bare | would split the Markdown cell
        for m in models:
            text = _format(row.get(m))
            out.append(f"**{text}**" if m in values and values[m] == best else text)
        lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines) + "\n"


def _verdicts(cells: dict[str, dict[str, dict[str, Any]]], tasks: list[str]) -> list[str]:
    """The targets, task by task: flowkit's default against zuko's same kind of flow (within
    one standard error or lower) and against the better scikit-learn model; for the spline, the
    share of test rows that reach some spline layer outside its interval."""
    lines = []
    for task in tasks:
        row = cells.get(task, {})
        ok = []
        for ours, theirs in (("flowkit-maf", "zuko-maf"), ("flowkit-spline", "zuko-nsf")):
            if ours in row and theirs in row and "nll" in row[ours]:
                a, b = row[ours], row[theirs]
                if not math.isfinite(b.get("nll", math.inf)):
                    ok.append(f"{ours} vs {theirs}: yes ({theirs} failed)")
                else:
                    # within the reference's standard error (flowkit's own spread does not
                    # count: a huge one would excuse a huge NLL)
                    good = a["nll"] <= b["nll"] + b["se"]
                    ok.append(f"{ours} vs {theirs}: {'yes' if good else 'NO'}")
        sk = [row[m]["nll"] for m in ("gmm", "kde") if m in row and "nll" in row[m]]
        best_flow = min((row[m]["nll"] for m in ("flowkit-maf", "flowkit-spline")
                         if m in row and "nll" in row[m]), default=None)
        if sk and best_flow is not None:
            ok.append(f"flowkit vs best sklearn: {'yes' if best_flow < min(sk) else 'NO'}")
        share = row.get("flowkit-spline", {}).get("outside_spline")
        if share is not None:
            ok.append(f"spline tails: {100 * share:.2f}% of test rows")
        if ok:
            lines.append(f"- {task}: " + "; ".join(ok))
    return lines


# ----------------------------------------------------------------------------------- run


def _settings(args: argparse.Namespace) -> argparse.Namespace:
    if args.quick:
        args.tasks = args.tasks or list(QUICK_TASKS)
        args.steps = args.real_steps = 20
        args.target_steps = 0
        args.n_train, args.n_test, args.valid_every = 600, 600, 10
    for flag in ("steps", "real_steps", "batch_size", "valid_every", "n_train", "n_test",
                 "threads"):
        if getattr(args, flag) < 1:
            raise ValueError(f"'--{flag.replace('_', '-')}' should be a positive integer")
    if args.target_steps < 0:
        raise ValueError("'--target-steps' should be 0 or a positive integer")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Fit every model on every task (skipping cells already in OUT/cells), write the table."""
    args = _settings(args)
    tasks = make_tasks(args.n_train, args.n_test, args.seed)
    names = [t.name for t in tasks]
    wanted = args.tasks or [*names, TARGET]
    unknown = sorted(set(wanted) - {*names, TARGET})
    if unknown:
        raise ValueError(f"'--tasks': unknown {unknown}; the tasks are {', '.join(names)}")
    models = list(args.models)
    try:
        import zuko  # noqa: F401
    except ImportError:
        if any(m.startswith("zuko-") for m in models):
            print("bench-defaults: zuko is not installed; its columns are left out "
                  "(pip install zuko==1.6.0)", flush=True)
        models = [m for m in models if not m.startswith("zuko-")]
    folder = Path(args.out) / "cells"
    folder.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        with threadpool_limits(args.threads):
            if not args.table_only:
                _fit_all([t for t in tasks if t.name in wanted], models, folder, args)
                if TARGET in wanted and args.target_steps:
                    _fit_target(folder, args)
    finally:
        torch.set_num_threads(threads)
    cells = _read_cells(folder)
    table = markdown_table(cells, [n for n in names if n in wanted], models)
    target = cells.get(TARGET, {})
    text = table + "\n" + "\n".join(_verdicts(cells, [n for n in names if n in wanted])) + "\n"
    if target:
        text += "\ncheckerboard target (MAF(2, transformer='spline'), fit defaults, fresh "
        text += "samples): " + ", ".join(
            f"{k}: KL {v['kl']:.3f} ± {v['se']:.3f}" for k, v in sorted(target.items())
        ) + "\n"
    text += f"\nhardware: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
    text += f"visible, {args.threads} thread(s); torch {torch.__version__}\n"
    print(text, flush=True)
    Path(args.out, "table.md").write_text(text)
    return {"cells": cells, "table": text}


def _fit_all(tasks: list[Task], models: list[str], folder: Path, args: argparse.Namespace) -> None:
    for task in tasks:
        for model in models:
            path = folder / f"{_file_name(task.name)}__{model}.json"
            if path.exists():
                continue
            cell = _cell(task, model, args)
            _write(path, {"task": task.name, "model": model, **cell})
            print(f"{task.name:>22} {model:>15}: {_format(cell):>18}  {cell['seconds']:7.1f} s",
                  flush=True)


def _fit_target(folder: Path, args: argparse.Namespace) -> None:
    for units in (False, True):
        name = "x100+1000" if units else "own"
        path = folder / f"{TARGET}__{name}.json"
        if not path.exists():
            cell = _target(units, args.target_steps, args)
            _write(path, {"task": TARGET, "model": name, **cell})
            print(f"{TARGET} {name}: KL {cell['kl']:.3f}", flush=True)


def _file_name(task: str) -> str:
    return task.replace("|", "_given_").replace(":", "_").replace("+", "p")


def _write(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` as JSON atomically (a temporary file renamed over ``path``)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


def _read_cells(folder: Path) -> dict[str, dict[str, dict[str, Any]]]:
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        cells.setdefault(record.pop("task"), {})[record.pop("model")] = record
    return cells
