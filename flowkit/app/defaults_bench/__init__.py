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
Every flow gets the same budget and the same stopping rule: --steps (toys, moons|y) or
--real-steps optimizer steps of the batch size flowkit.fit chooses (flowkit.train.
default_batch_size: N // 16 of the N training rows, between 16 and 256), or --batch-size (capped
by the rows), each epoch the training rows in a
fresh random order; the validation loss after every epoch (fit's default; --valid-every N: every
N steps) and at the last step; a stop after --patience validations without a new best; the
weights of the best validation at the end. scikit-learn fits
the training and validation rows (its cross-validation is its validation). zuko is optional
(pip install zuko==1.6.0); its columns are left out without it.

Also the checkerboard target: flowkit.MAF(2, transformer="spline") trained by flowkit.fit with
nothing but its defaults for --target-steps steps on fresh samples, KL(data || model) in nats, in
own units and after x100+1000.

Reported: held-out NLL in nats per row (lower is better), the mean over --seeds seeds (seed
--seed, --seed + 1, ...; each seed its own split, initialisation and data order) +- its standard
error over the seeds (one seed: over the test rows); on "x100+1000" rows the NLL minus log 100,
i.e. in the data's original units, which a unit-invariant model leaves unchanged. Each finished
(task, model, seed) cell is saved at once in OUT/cells/seed<S>/ with the settings it depends on
(a rerun with the same --out skips the cells it finds, so an interrupted run resumes; a cell
computed with other settings is an error, not a result); OUT/table.md is rebuilt at the end
from the cells of the seeds run (--table-only: from every cell, without fitting).

examples:
  flowkit bench-defaults --out runs/defaults
  flowkit bench-defaults --models flowkit-spline --flow-options '{"layers": 8}' --out runs/l8
  flowkit bench-defaults --quick --out runs/defaults-quick       # seconds: a smoke test
  flowkit bench-defaults --tasks iris:raw iris:std --models flowkit-maf gmm --out runs/d
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch
from threadpoolctl import threadpool_limits

from flowkit.checkpoint import write_bytes_atomic

from ..common import FLOW_OPTIONS_ADDED
from .runners import MODELS, cell, settings, target
from .suite import Task, make_tasks
from .table import (
    cell_path,
    cells_table,
    format_cell,
    read_cells,
    summarize,
    verdicts,
    write_cell,
)

__all__ = ["add_arguments", "run"]

QUICK_TASKS = ("moons:own", "moons:x100+1000", "iris:raw", "moons|y:own")
_QUICK = {"steps": 20, "real_steps": 20, "n_train": 600, "n_test": 600, "valid_every": 10,
          "target_steps": 0}
"""The budget of ``--quick``, for the options not given."""
_TARGET_STEPS = 3000
TARGET = "checkerboard-target"
_BUDGET = (  # (option, default, what it counts)
    ("--steps", 3000, "optimizer steps of every flow on the toys and moons|y"),
    ("--real-steps", 3000, "optimizer steps of every flow on the real data sets"),
    ("--batch-size", None, "rows per step of every flow, capped by the training rows; None: "
     "flowkit.fit's default for the training rows"),
    ("--n-train", 10000, "rows to fit per toy task, validation included"),
    ("--n-test", 10000, "rows to score per toy task"),
    ("--seeds", 1, "seeds per cell, from --seed on"),
    ("--threads", 1, "torch and BLAS threads"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``flowkit bench-defaults``."""
    parser.add_argument("--quick", action="store_true",
                        help=f"tasks {', '.join(QUICK_TASKS)}, 20 steps, 600 rows: a smoke test")
    parser.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                        help="task names as in the table, e.g. checkerboard:own iris:std "
                        f"moons|y:x100+1000, or {TARGET} (default: all)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        metavar="MODEL", help=f"any of {', '.join(MODELS)} (default: all)")
    for option, default, meaning in _BUDGET:
        quick = _QUICK.get(option[2:].replace("-", "_"))
        parser.add_argument(option, type=int, default=None,
                            help=f"{meaning} (default: {default}"
                            + ("" if quick is None else f"; {quick} with --quick") + ")")
    parser.add_argument("--target-steps", type=int, default=None,
                        help="steps of the checkerboard target; 0 leaves it out (default: "
                        f"{_TARGET_STEPS}; 0 with --quick)")
    parser.add_argument("--valid-every", type=int, default=None,
                        help="steps between validations (default: once per epoch of the "
                        "training rows, fit's default; 10 with --quick)")
    parser.add_argument("--patience", type=int, default=100,
                        help="validations without a new best after which a flow stops, the "
                        "same for every library; 0: never (default: %(default)s)")
    parser.add_argument("--flow-options", type=_json_object, default={},
                        metavar="JSON", help="keyword arguments of flowkit.MAF for the "
                        "flowkit-maf and flowkit-spline cells, e.g. '{\"layers\": 8}' (not the "
                        "checkerboard target, which measures the defaults; default: none)")
    parser.add_argument("--fit-options", type=_json_object, default={},
                        metavar="JSON", help="keyword arguments of flowkit.fit for those cells, "
                        "e.g. '{\"lr\": 0.001}' (default: none)")
    parser.add_argument("--table-only", action="store_true",
                        help="rebuild OUT/table.md from the cells in OUT/cells, fit nothing")


def _json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object (keyword arguments); argparse names the option."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"should be a JSON object: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"should be a JSON object such as '{{\"layers\": 8}}', got {text!r}")
    return value


def _settings(args: argparse.Namespace) -> argparse.Namespace:
    """The options' values: those given, else ``--quick``'s (when given), else the defaults."""
    if args.quick:
        args.tasks = args.tasks or list(QUICK_TASKS)
    defaults = {option[2:].replace("-", "_"): default for option, default, _ in _BUDGET}
    for name, default in {**defaults, "target_steps": _TARGET_STEPS, "valid_every": None}.items():
        if getattr(args, name) is None:
            setattr(args, name, _QUICK.get(name, default) if args.quick else default)
    for option, _, _ in _BUDGET:
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None and value < 1:
            raise ValueError(f"'{option}' should be a positive integer")
    if args.valid_every is not None and args.valid_every < 1:
        raise ValueError("'--valid-every' should be a positive integer")
    for option in ("target_steps", "patience"):
        if getattr(args, option) < 0:
            raise ValueError(f"'--{option.replace('_', '-')}' should be 0 or a positive integer")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Fit every model on every task for every seed (skipping cells already in OUT/cells with
    the same settings), write the table."""
    args = _settings(args)
    seeds = list(range(args.seed, args.seed + args.seeds))
    names = [t.name for t in make_tasks(args.n_train, args.n_test, args.seed)]
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
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        with threadpool_limits(args.threads):
            for seed in seeds if not args.table_only else []:
                tasks = make_tasks(args.n_train, args.n_test, seed)
                _fit_all([t for t in tasks if t.name in wanted], models, seed, folder, args)
                if TARGET in wanted and args.target_steps:
                    _fit_target(seed, folder, args)
    finally:
        torch.set_num_threads(threads)
    found = read_cells(folder, None if args.table_only else seeds)
    cells = {t: {m: summarize(r) for m, r in row.items()} for t, row in found.items()}
    shown = [n for n in names if n in wanted]
    text = cells_table(cells, shown, models) + "\n" + "\n".join(verdicts(cells, shown)) + "\n"
    if TARGET in found:
        text += "\ncheckerboard target (MAF(2, transformer='spline'), fit defaults, fresh "
        text += "samples): " + ", ".join(
            f"{k}: KL {s['kl']:.3f} ± {s['se']:.3f} ({s['seeds']} seed(s))"
            for k, s in sorted((k, summarize(r, "kl")) for k, r in found[TARGET].items())
        ) + "\n"
    text += f"\nhardware: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
    text += f"visible, {args.threads} thread(s); torch {torch.__version__}\n"
    print(text, flush=True)
    write_bytes_atomic(Path(args.out, "table.md"), text.encode())
    return {"cells": cells, "table": text}


def _fit_all(tasks: list[Task], models: list[str], seed: int, folder: Path,
             args: argparse.Namespace) -> None:
    for task in tasks:
        for model in models:
            path = cell_path(folder, task.name, model, seed)
            wanted = settings(task, model, args)
            if _done(path, wanted):
                continue
            record = cell(task, model, seed, args)
            write_cell(path, {"task": task.name, "model": model, "seed": seed,
                              "settings": wanted, **record})
            print(f"seed {seed} {task.name:>22} {model:>15}: {format_cell(record):>18}  "
                  f"{record['seconds']:7.1f} s", flush=True)


def _done(path: Path, wanted: dict[str, Any]) -> bool:
    """Whether the cell at ``path`` exists and was computed with the settings ``wanted`` (a
    cell written before settings were recorded is taken as it is); a cell of other settings is
    an error, not a result to reuse or to overwrite."""
    if not path.exists():
        return False
    recorded = json.loads(path.read_text()).get("settings")
    if recorded is not None and "flow_options" in wanted:  # options a flowkit cell predates
        recorded = {**recorded, "flow_options": {
            **FLOW_OPTIONS_ADDED, **recorded.get("flow_options", {})}}
    if recorded is None or recorded == wanted:
        return True
    differ = ", ".join(
        f"{'--' + k.replace('_', '-')} {recorded.get(k)} (now {wanted.get(k)})"
        for k in sorted({*recorded, *wanted}) if recorded.get(k) != wanted.get(k)
    )
    raise ValueError(
        f"'{path}' was computed with {differ}: run with the same settings, or write to "
        "another --out"
    )


def _fit_target(seed: int, folder: Path, args: argparse.Namespace) -> None:
    for units in (False, True):
        name = "x100+1000" if units else "own"
        path = cell_path(folder, TARGET, name, seed)
        wanted = settings(None, name, args)
        if not _done(path, wanted):
            record = target(units, seed, args)
            write_cell(path, {"task": TARGET, "model": name, "seed": seed, "settings": wanted,
                              **record})
            print(f"seed {seed} {TARGET} {name}: KL {record['kl']:.3f}", flush=True)
