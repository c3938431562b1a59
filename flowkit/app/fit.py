"""Fit a MAF or IAF by maximum likelihood to a 2-D toy dataset or to samples from a file.

Toy datasets (--data moons, ...) are sampled afresh at every step from a seeded generator; a fixed
validation set of --valid-size points is drawn once. A .npy file holds an (N, D) array, a .npz
file an array named by --key (default 'x', or its only array), a .csv file rows of numbers
separated by commas (the first line is a header of column names when a field is neither a number
nor empty, or the '#' line just above the rows when it holds as many names); a random
--valid-fraction of its rows is held out for validation (by default a tenth, at least
min(20, N // 5) of its N rows, as fit's valid='auto'). --context names what the flow is
conditioned on: columns of the array (--context 2 3: the flow models the other columns given
these; in a CSV file with a header, also by name: --context age income), or another array of
the .npz with one row per sample (--context y). The default --batch-size is fit's: 256 for toy
datasets, and for a file N // 16 of its N training rows, between 16 and 256; a --batch-size above
the number of training rows is lowered to it, with a note.

The flow standardizes its data and context (flowkit.MAF's standardize=True, set from the training
rows before the first step), so data in any units can be passed as they are; --no-standardize
turns that off.

Writes to --out: checkpoint.pt (a training checkpoint: `flowkit.load_model` reads it, --resume
continues from it, a run without --resume refuses to replace it), options.json (the options
that define the model and data, which --resume must repeat), history.json (losses per step,
and per epoch for files), loss.png and metrics.json. A file's rows and columns as read are
printed before the run (and rows is in metrics.json). metrics.json holds valid_nll, the saved
flow's validation NLL (the best validation's weights, which the run ends with), and
train_nll_last_100, the mean training NLL of the last 100 steps (of all steps in a run of fewer).
For toy datasets with an exact density, it also holds the entropy H(p) and the estimate
KL(p || q) = valid_nll - H(p). samples.png shows samples of the flow over the data: the first
5000 rows of a file (training and validation rows alike) or of a toy dataset's validation points,
one sample per row (for a conditional flow, given that row's context): two columns side by
side, data and samples; other numbers of columns, a grid of the first six columns' histograms
and pairwise plots (samples as points under the data's contours). loss.png marks the best
validation, the weights the run ends with. The result is printed as well: the validation NLL
and, for toy datasets, the KL estimate.

examples:
  flowkit fit --data moons --steps 2000 --out runs/moons
  flowkit fit samples.npy --flow iaf --layers 3 --hidden 32 32 --out runs/file
  flowkit fit --data table.npz --key x --context y --transformer spline --out runs/conditional
  flowkit fit --data table.npy --context 0 --out runs/columns
  flowkit fit --data table.csv --context age --transformer spline --out runs/csv
  flowkit fit --data table.csv --bounds income=0: share=0:1 --transformer spline --out runs/b
  flowkit fit --data moons --steps 500 --hidden 16 --threads 1 --out runs/small
  torchrun --standalone --nproc_per_node 2 -m flowkit fit --data moons --out runs/moons-2p
"""

from __future__ import annotations

import argparse
import json
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flowkit.checkpoint import write_bytes_atomic
from flowkit.train import (
    CHECKPOINT_NAME,
    DEFAULTS,
    Callbacks,
    History,
    PrecisionWarning,
    default_batch_size,
    fit,
    held_out_rows,
    is_main_process,
    warn_if_degenerate,
    warn_if_duplicated,
    warn_if_outlying,
    warn_if_rounded,
    warn_if_skewed,
)
from flowkit.validation import Mention

from .common import FLOW_OPTIONS_ADDED, add_threads_option, as_options, count, use_threads
from .fit_data import load_file, load_toy
from .options import positive_int

VALID_SIZE = 4096
"""Validation points drawn from a toy dataset when --valid-size is not given."""

DEFAULT_STEPS = 2000
"""Optimizer steps when neither --steps nor --epochs is given."""

AUTO_VALID = "a tenth of the rows, at least min(20, N // 5): fit's valid='auto'"
"""The rows of a file held out for validation when --valid-fraction is not given."""

OPTIONS = {
    "lr": "--lr",
    "lr_schedule": "--lr-schedule",
    "clip_grad_norm": "--clip-grad-norm",
    "divergence_threshold": "--divergence-threshold",
    "steps": "--steps",
    "epochs": "--epochs",
    "batch_size": "--batch-size",
    "valid_every": "--valid-every",
    "early_stopping_patience": "--patience",
    "checkpoint_every": "--checkpoint-every",
    "checkpoint_dir": "--out",
    "resume": "--resume",
    "seed": "--seed",
    "device": "--device",
    "data": "--data",
    "valid": "--valid-fraction",
    "transformer": "--transformer",
    "bounds": "--bounds",
    "dtype": "--dtype",
    "standardize": "--standardize",
}
"""The option of this command that sets each argument of :func:`~flowkit.train.fit` (and the
builders' ``transformer`` and ``bounds``, the model's ``dtype``): errors and warnings of ``fit``
are spelled with them (:func:`~flowkit.app.common.as_options`)."""

NONES = {"lr_schedule": "none", "divergence_threshold": "off"}
"""The values of this command's options that pass ``None`` to :func:`~flowkit.train.fit`."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from flowkit.data import TOY_DATASETS

    data = parser.add_argument_group("data")
    data.add_argument(
        "--data",
        metavar="NAME|FILE",
        help=f"toy dataset ({', '.join(TOY_DATASETS)}) or a .npy, .npz or .csv file of samples "
        "(default: moons)",
    )
    data.add_argument("data_file", nargs="?", metavar="FILE", help="the same as --data FILE")
    data.add_argument(
        "--valid-size",
        type=positive_int,
        default=None,
        help=f"validation points of a toy dataset (default: {VALID_SIZE})",
    )
    data.add_argument(
        "--valid-fraction",
        type=float,
        default=None,
        help=f"share of a file's rows held out for validation, 0 for none (default: "
        f"{AUTO_VALID})",
    )
    data.add_argument(
        "--key",
        default=None,
        metavar="NAME",
        help="the array of a .npz file to model (default: 'x', or the file's only array)",
    )
    data.add_argument(
        "--context",
        nargs="+",
        action="extend",  # --context a --context b: both, checked for repeats
        default=None,
        metavar="COL|NAME",
        help="condition on these columns of the data (integers, e.g. --context 2 3, or a CSV "
        "header's names) or on this array of the .npz file (one row per sample) (default: no "
        "context)",
    )
    model = parser.add_argument_group("model")
    model.add_argument("--flow", choices=("maf", "iaf"), default="maf", help="(default: maf)")
    model.add_argument(
        "--layers",
        type=positive_int,
        default=5,
        help="autoregressive layers (default: %(default)s)",
    )
    model.add_argument(
        "--hidden",
        type=positive_int,
        nargs="+",
        default=[64, 64],
        metavar="H",
        help="hidden layer sizes of each MADE (default: 64 64)",
    )
    model.add_argument(
        "--transformer",
        choices=("affine", "spline"),
        default="affine",
        help="elementwise map of each layer (default: %(default)s)",
    )
    model.add_argument("--batch-norm", action="store_true", help="batch norm between layers")
    model.add_argument(
        "--lu-linear", action=argparse.BooleanOptionalAction, default=None,
        help="a learned LU-linear map after each permutation (default: the library's, on for "
        "a MAF, off for an IAF; docs/defaults.md)",
    )
    model.add_argument(
        "--bounds",
        nargs="+",
        default=None,
        metavar="COL=LOW:HIGH",
        help="the range of some modelled columns: COL a CSV header's name or the column's "
        "position in the file (as in --context), LOW or HIGH empty where the range is open (e.g. "
        "--bounds income=0: share=0:1); the flow then has no mass outside and samples inside "
        "(flowkit.MAF's bounds=). Default: every column on the whole real line",
    )
    model.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default=None,
        help="the flow's floating type (default: float32). float64 keeps columns whose spread "
        "is small next to their values (timestamps, a large offset), which float32 rounds to "
        "a few steps (a PrecisionWarning names them), at about twice the time per step",
    )
    standardization = model.add_mutually_exclusive_group()
    standardization.add_argument(
        "--standardize",
        choices=("diagonal", "full", "robust"),
        default=None,
        help="how the flow standardizes its data: each column by its mean and standard "
        "deviation (diagonal), also dividing out the correlations between columns (full), or "
        "by its median and interquartile range (robust: a few gross outliers in a column); "
        "default: the library's (flowkit.MAF's standardize=True). full suits many correlated, "
        "roughly Gaussian columns and loses on nearly collinear real ones (docs/defaults.md, "
        "'Full-covariance standardization'). The context is standardized per column either way "
        "(robustly with robust)",
    )
    standardization.add_argument(
        "--no-standardize",
        action="store_true",
        help="do not standardize the data and context (the flow sees them as given)",
    )
    train = parser.add_argument_group("training")
    length = train.add_mutually_exclusive_group()
    length.add_argument(
        "--steps", type=int, default=None,
        help=f"optimizer steps (default: {DEFAULT_STEPS}, unless --epochs is given)",
    )
    length.add_argument(
        "--epochs", type=int, default=None,
        help="passes over a file's training rows, instead of --steps (N // batch size steps "
        "each)",
    )
    train.add_argument("--batch-size", type=int, default=None,
                       help="(default: 256 for a toy dataset; for a file, N // 16 of its N "
                            "training rows, between 16 and 256)")
    train.add_argument("--lr", type=float, default=3e-3, help="(default: %(default)s)")
    train.add_argument(
        "--lr-schedule",
        choices=("none", "cosine", "linear"),
        default="cosine",
        help="(default: %(default)s)",
    )
    train.add_argument(
        "--clip-grad-norm",
        type=float,
        default=None,
        metavar="NORM",
        help="clip the global gradient norm to NORM at every step (default: off)",
    )
    train.add_argument(
        "--divergence-threshold",
        type=number_or_off,
        default=DEFAULTS["divergence_threshold"],
        metavar="T",
        help="stop when the running median of the last 11 training losses rises more than "
        "T x max(1, |best|) above its lowest value; 'off' turns the check off "
        "(default: %(default)s)",
    )
    train.add_argument(
        "--valid-every",
        type=int,
        default=None,
        metavar="STEPS",
        help="(default: every 100 steps for toy data, every epoch for files)",
    )
    train.add_argument(
        "--patience",
        type=int,
        default=None,
        metavar="N",
        help="early stopping after N validations without improvement (default: off)",
    )
    train.add_argument(
        "--checkpoint-every", type=int, default=500, metavar="STEPS", help="(default: 500)"
    )
    train.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint.pt")
    add_threads_option(train, why="1 is often fastest for small models on a busy machine")


RUN_OPTIONS = {
    "data": "--data", "key": "--key", "context": "--context", "valid_size": "--valid-size",
    "valid_fraction": "--valid-fraction", "flow": "--flow", "layers": "--layers",
    "hidden": "--hidden", "transformer": "--transformer", "batch_norm": "--batch-norm",
    "lu_linear": "--lu-linear",
    "standardize": "--standardize", "no_standardize": "--no-standardize", "seed": "--seed",
    "batch_size": "--batch-size", "bounds": "--bounds", "dtype": "--dtype",
}
"""The options that define a run's model and data, as typed: a ``--resume`` must repeat them
(the training options, ``--lr`` and ``--steps`` among them, may change)."""

NEGATABLE = {"--lu-linear"}
"""Options that take a ``--no-`` form (``False``: given so; ``None``: not given)."""


def _check_same_run(
    args: argparse.Namespace, typed: dict[str, Any]
) -> Callable[[Any], None] | None:
    """On ``--resume``, fail naming each run-defining option (:data:`RUN_OPTIONS`; ``typed``:
    their values before any default was filled in) that differs from those recorded in
    ``<out>/options.json`` (an option that changes the data's split or the model would
    otherwise surface as a mismatch of something derived from it: the batch size, the rows,
    the model's arguments); an option that the record predates
    (:data:`flowkit.app.common.FLOW_OPTIONS_ADDED`) takes the value the run was built with, in
    ``args`` too when it was not given. Sets ``args.valid_default``, the holdout of a file
    without --valid-fraction: the run's (:data:`VALID_DEFAULT_BEFORE` where it recorded none),
    or ``"auto"`` for a new run. Otherwise return the ``on_checkpoint`` callback that records
    them there, beside the run's first checkpoint."""
    path = args.out / "options.json"
    if args.resume and path.exists():
        try:
            started = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"'{path}' cannot be read ({e}): it records the options of the "
                             "run to resume") from None
        typed = json.loads(json.dumps(typed))  # tuples as lists, as stored
        args.valid_default = started.get("valid_default", VALID_DEFAULT_BEFORE)
        for name, value in FLOW_OPTIONS_ADDED.items():  # a run started before the option existed
            if name not in started:  # built what the value gives: resume it so
                started[name] = value
                if typed.get(name) is None:
                    typed[name] = value
                    setattr(args, name, value)
        changed = [f"{_typed(option, typed.get(name))} (started with "
                   f"{_typed(option, started.get(name))})" for name, option in RUN_OPTIONS.items()
                   if typed.get(name) != started.get(name)]
        if changed:
            raise ValueError("--resume continues a run with the options it was started with; "
                             f"these differ: {'; '.join(changed)}")
        args.started_lr = started.get("lr")  # said by _note_resumed once the run goes on
        return None
    if args.resume and (args.out / CHECKPOINT_NAME).exists():
        raise ValueError(
            f"--resume: '{args.out / CHECKPOINT_NAME}' exists but '{path}' is missing, so the "
            "options the run was started with cannot be checked against these: restore the "
            "file, or start a new run in another --out folder")
    if args.resume and is_main_process():
        print(f"flowkit fit: note: nothing to resume in '{args.out}' (no options.json): starting "
              "a new run", flush=True)
    args.valid_default = "auto"

    def record(progress: Any) -> None:  # beside the first checkpoint (a run that fails
        if is_main_process() and not path.exists():  # before it leaves no folder behind)
            recorded = {**typed, "valid_default": "auto", "lr": args.lr}  # VALID_DEFAULT_BEFORE
            write_bytes_atomic(path, (json.dumps(recorded, indent=2) + "\n").encode())

    return record


VALID_DEFAULT_BEFORE = 0.1
"""The share of a file's rows held out without --valid-fraction by runs whose ``options.json``
predates fit's ``valid="auto"`` (they record no ``valid_default``)."""


def _file_validation(args: argparse.Namespace, rows: int) -> float | str | None:
    """fit's ``valid`` for a file of ``rows`` rows: ``--valid-fraction`` (0: none), or without it
    ``args.valid_default`` (``"auto"``; :data:`VALID_DEFAULT_BEFORE` for a ``--resume`` of a run
    that recorded none, set by :func:`_check_same_run`). A ``--batch-size`` above the rows it
    leaves to train on is lowered to them, with a note (fit chooses the default batch size from
    those rows itself; whole groups of equal rows held out may leave it a few rows more)."""
    valid = args.valid_default if args.valid_fraction is None else args.valid_fraction or None
    train = rows - held_out_rows(valid, rows)
    if args.batch_size is not None and args.batch_size > train:
        print(f"flowkit fit: note: --batch-size {args.batch_size} is more than the {train} "
              f"training rows; using {train}", flush=True)
        args.batch_size = train
    return valid


def _typed(option: str, value: Any) -> str:
    """An option as typed on the command line (``no --hidden`` when it was not given)."""
    if option in NEGATABLE and value is not True:
        return f"--no-{option[2:]}" if value is False else f"neither {option} nor --no-{option[2:]}"
    if value is None or value is False:
        return f"no {option}"
    if value is True:
        return option
    return f"{option} {' '.join(map(str, value)) if isinstance(value, list) else value}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    import flowkit
    from flowkit.data import TOY_DATASETS, has_exact_density, toy_entropy

    use_threads(args.threads)
    if args.data_file is not None and args.data is not None:
        raise ValueError(f"the data were named twice, '{args.data_file}' and --data "
                         f"'{args.data}': give one")
    args.data = args.__dict__.pop("data_file") or args.data or "moons"
    if args.data not in TOY_DATASETS:
        args.data = os.path.expanduser(args.data)  # a '~' the shell left (quoted, --data=~/x)
    typed = {name: getattr(args, name) for name in RUN_OPTIONS}
    if args.data in TOY_DATASETS:
        if args.context is not None or args.key is not None:
            raise ValueError(
                f"'--context' and '--key' are options of file data; toy dataset {args.data!r} "
                "has neither"
            )
        if args.valid_fraction is not None:
            raise ValueError(
                "'--valid-fraction' applies to file data; for toy dataset "
                f"{args.data!r}, --valid-size sets the validation points (default: {VALID_SIZE})"
            )
        if args.epochs is not None:
            raise ValueError(f"'--epochs' applies to file data; toy dataset {args.data!r} is "
                             "sampled afresh at every step: set the length with --steps")
        if args.valid_size is None:
            args.valid_size = VALID_SIZE
        data, valid, features = load_toy(args.data, args.valid_size, args.seed)
        if args.batch_size is None:
            args.batch_size = default_batch_size(None)  # fresh samples: fit's 256
        shown = valid  # the rows the samples are plotted over
        context_features, labels, positions, rows = 0, None, list(range(features)), None
        bounds = _bounds(args.bounds, positions, labels)
    else:
        if args.valid_size is not None:
            raise ValueError(
                "'--valid-size' applies to toy datasets; for a file, --valid-fraction sets the "
                f"share of its rows held out for validation (default: {AUTO_VALID})"
            )
        if args.valid_fraction is not None and not 0.0 <= args.valid_fraction < 1.0:
            raise ValueError(
                f"'--valid-fraction' should be in [0, 1), got {args.valid_fraction}"
            )
        data, positions, context_features, labels = load_file(
            Path(args.data), args.key, args.context
        )
        features = len(positions)
        rows = len(data[0]) if isinstance(data, tuple) else len(data)
        print(f"flowkit fit: read {count(rows, 'row')} from '{args.data}': "
              f"{_columns(features, labels, context_features)}", flush=True)
        bounds = _bounds(args.bounds, positions, labels)
        bounded = [] if bounds is None else [
            j for j, ends in enumerate(zip(*bounds, strict=True)) if ends != (None, None)]
        with as_options(OPTIONS):  # the advice names --dtype, --bounds, --transformer
            _warn_about_rows(data, labels, positions,
                             torch.float64 if args.dtype == "float64" else torch.float32,
                             None if args.transformer != "affine" else bounded,
                             _standardize(args) in (True, "diagonal", "full"), bounded)
        shown = data
    if args.steps is None and args.epochs is None:
        args.steps = DEFAULT_STEPS
    if bounds is not None:  # recorded as the bounds, however the columns were named
        typed["bounds"] = [list(bounds[0]), list(bounds[1])]
        if args.data in TOY_DATASETS:
            _check_toy_inside(args.data, shown, bounds)
    record_options = _check_same_run(args, typed)
    if args.data not in TOY_DATASETS:
        valid = _file_validation(args, rows)
    resumed = _ResumeNote(args) if args.resume and (args.out / CHECKPOINT_NAME).exists() else None
    build = flowkit.MAF if args.flow == "maf" else flowkit.IAF
    # a toy dataset's validation set is --valid-size points, a file's a --valid-fraction
    options = {**OPTIONS, "valid": "--valid-size"} if args.data in TOY_DATASETS else OPTIONS
    with as_options(options, NONES):
        torch.manual_seed(args.seed)  # initial weights
        flow = build(
            features,
            layers=args.layers,
            hidden_features=tuple(args.hidden),
            context_features=context_features,
            transformer=args.transformer,
            batch_norm=args.batch_norm,
            **({} if args.lu_linear is None else {"lu_linear": args.lu_linear}),
            standardize=_standardize(args),
            bounds=bounds,
            seed=args.seed,
        )
        if args.dtype == "float64":
            flow = flow.double()
        with warnings.catch_warnings():
            if args.data not in TOY_DATASETS:  # said by _warn_about_rows, in the file's terms
                warnings.filterwarnings("ignore", category=PrecisionWarning)
            history = fit(
                flow,
                data,
                valid=valid,
                steps=args.steps,
                epochs=args.epochs,
                batch_size=args.batch_size,
                lr=args.lr,
                lr_schedule=None if args.lr_schedule == "none" else args.lr_schedule,
                clip_grad_norm=args.clip_grad_norm,
                divergence_threshold=args.divergence_threshold,
                valid_every=args.valid_every,
                early_stopping_patience=args.patience,
                seed=args.seed,
                device=args.device,
                checkpoint_dir=args.out,
                checkpoint_every=args.checkpoint_every,
                resume=args.resume,
                progress=not args.quiet,
                callbacks=Callbacks(after_step=resumed, on_checkpoint=record_options),
                data_warnings=args.data in TOY_DATASETS,  # a file's rows: warned about by name
            )
    if resumed is not None and not resumed.said and is_main_process():
        print(f"flowkit fit: '{args.out / CHECKPOINT_NAME}' had run all its "
              f"{len(history.train_loss)} steps: nothing was left to train", flush=True)
    metrics: dict[str, Any] = {
        "data": args.data,
        "flow": args.flow,
        "transformer": args.transformer,
        "features": features,
        "context_features": context_features,
        "rows": rows,  # a file's rows as read (None for a toy dataset)
        "standardize": flow.config["kwargs"]["standardize"],  # the kind, or False
        "dtype": args.dtype or "float32",
        "batch_size": history.batch_size,  # as given or as fit chose it
        "parameters": sum(p.numel() for p in flow.parameters()),
        "steps": len(history.train_loss),
        # passes over a file's training rows, fit's N // batch_size steps each (None for a toy
        # dataset, sampled afresh)
        "epochs": (None if history.train_rows is None else
                   len(history.train_loss) / max(1, history.train_rows // history.batch_size)),
        "train_nll_last_100": float(np.mean(history.train_loss[-100:])),  # of all, if fewer
        # fit ends with the best validation's weights: the saved flow's NLL is the best one
        "valid_nll": history.best_valid_loss,
        "last_valid_nll": history.valid_loss[-1] if history.valid_loss else None,
        "best_step": history.best_step,
        "stopped_early": history.stopped_early,
        "diverged_step": history.diverged_step,  # the run ended there with its best weights
        "patience": args.patience,
        "wall_time_s": history.wall_time,
        "steps_per_s": len(history.train_loss) / max(history.wall_time, 1e-9),
        "checkpoint": str(args.out / CHECKPOINT_NAME),
    }
    if args.data in TOY_DATASETS and has_exact_density(args.data) and history.valid_loss:
        metrics["entropy"] = toy_entropy(args.data)
        metrics["kl_estimate"] = metrics["valid_nll"] - metrics["entropy"]
    if is_main_process():
        text = json.dumps(history.to_dict()) + "\n"
        write_bytes_atomic(args.out / "history.json", text.encode())
        title = f"{args.flow.upper()} on {args.data}"
        plot_losses(history, args.out / "loss.png", title, entropy=metrics.get("entropy"))
        plot_samples(flow, shown, args.out / "samples.png", title, labels)
        print(_summary(metrics), flush=True)
    return metrics


class _ResumeNote:
    """``after_step`` of a ``--resume``: says once, at its first step, where the run resumed
    (``said`` stays False when no step was left to run)."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.said = args, False

    def __call__(self, progress: Any) -> None:
        if self.said or not is_main_process():
            return
        self.said, args = True, self.args
        print(f"flowkit fit: resumed '{args.out / CHECKPOINT_NAME}' at step "
              f"{progress.step - 1}", flush=True)
        started = getattr(args, "started_lr", None)
        if started is not None and started != args.lr:
            print(f"flowkit fit: note: --lr {args.lr} differs from the {started} the run "
                  "started with: the steps from here on use it", flush=True)


def _summary(metrics: dict[str, Any]) -> str:
    """The result in one line: the saved flow's validation NLL (and the KL estimate of a toy
    dataset), or the training NLL of a run without validation; the passes over a file's rows,
    with a second line when the run did not finish one."""
    steps = f"{count(metrics['steps'], 'step')}"
    epochs = metrics["epochs"]
    if epochs is not None:
        steps += f" ({epochs:.3g} epoch{'' if epochs == 1 else 's'})"
    steps += f", {metrics['wall_time_s']:.1f} s"
    if metrics["valid_nll"] is None:
        last = count(min(100, metrics["steps"]), "step")
        text = (f"flowkit fit: training NLL {metrics['train_nll_last_100']:.4f} nats (mean of "
                f"the last {last}; no validation); {steps}")
    else:
        text = (f"flowkit fit: validation NLL {metrics['valid_nll']:.4f} nats (best, at step "
                f"{metrics['best_step']}; the saved flow's)")
        if "kl_estimate" in metrics:
            text += f", KL estimate {metrics['kl_estimate']:.4f} nats"
        text += f"; {steps}"
        if metrics.get("diverged_step") is not None:
            text += (f" (the training loss diverged at step {metrics['diverged_step']}: the run "
                     "stopped there)")
        elif metrics["stopped_early"]:
            text += (f" (stopped early: no better validation in {metrics['patience']} "
                     "validations, --patience)")
    if epochs is not None and epochs < 1:
        text += ("\nflowkit fit: note: the run saw less than one pass over the training rows; "
                 "validations come once per epoch by default: pass --epochs, more --steps, or "
                 "--valid-every")
    return text


def _columns(features: int, labels: list[str] | None, context_features: int) -> str:
    """The columns read from a file, for the line that says what was read: the modelled ones
    (named by a CSV header) and the context's."""
    shown = labels if labels is None or len(labels) <= 8 else [*labels[:6], "..."]
    names = "" if shown is None else f" ({', '.join(shown)})"
    context = f" and {count(context_features, 'context column')}" if context_features else ""
    return f"{count(features, 'modelled column')}{names}{context}"


def _standardize(args: argparse.Namespace) -> bool | str:
    """The builders' ``standardize`` for --standardize / --no-standardize."""
    if args.no_standardize:
        return False
    return True if args.standardize is None else args.standardize


def _warn_about_rows(
    data: Any, labels: list[str] | None, positions: list[int], dtype: torch.dtype,
    skewed_unless: list[int] | None, by_moments: bool, bounded: list[int],
) -> None:
    """fit's data warnings about a file's rows (columns that the cast to the flow's ``dtype``
    rounds, constant or discrete columns, point masses, repeated rows; for an affine flow,
    ``skewed_unless`` not None, skewed positive columns other than those ``--bounds`` bounds;
    for a flow standardized by mean and deviation, ``by_moments``, unbounded columns with gross
    outliers), naming
    the option and the columns by their positions in the file (``positions``, of the modelled
    columns) and their header's names (fit's own are off for a file's rows, or filtered:
    PrecisionWarning)."""
    x, c = data if isinstance(data, tuple) else (data, None)
    rows = torch.as_tensor(x, dtype=torch.float64)
    context = None if c is None else torch.as_tensor(c, dtype=torch.float64)
    warn_if_rounded((Mention("--data"),), rows, dtype, labels, positions, stacklevel=3)
    if context is not None:
        warn_if_rounded(("the context of ", Mention("--data")), context, dtype, stacklevel=3)
    warn_if_degenerate("--data", rows, stacklevel=3, labels=labels, numbers=positions)
    if skewed_unless is not None:
        warn_if_skewed("--data", rows, skip=skewed_unless, stacklevel=3, labels=labels,
                       numbers=positions)
    if by_moments:
        warn_if_outlying("--data", rows, skip=bounded, stacklevel=3, labels=labels,
                         numbers=positions)
    warn_if_duplicated("--data", rows, context, stacklevel=3)


TOY_BOUNDS_CHECK = 100_000
"""Fresh samples of a toy dataset that ``--bounds`` must contain besides its validation points
(training samples are drawn afresh at every step)."""


def _check_toy_inside(
    name: str, valid: torch.Tensor, bounds: tuple[list[float | None], list[float | None]]
) -> None:
    """Refuse ``--bounds`` that leave points of toy dataset ``name`` outside: its validation
    points ``(N, 2)`` (fit would name them as its validation data, review 39) and
    :data:`TOY_BOUNDS_CHECK` fresh samples (those a training step draws, review 40)."""
    from flowkit.data import sample_toy
    from flowkit.transforms import Logit

    fresh = sample_toy(name, TOY_BOUNDS_CHECK, generator=torch.Generator().manual_seed(0))
    points = torch.cat([valid.cpu(), fresh.to(valid.dtype)])
    box = Logit(*([side if v is None else v for v in end]  # the flow's own test of its support
                  for end, side in zip(bounds, (-math.inf, math.inf), strict=True)))
    outside = (~box.contains(points)).any(-1)
    if outside.any():
        row = points[int(outside.nonzero()[0])].tolist()
        raise ValueError(
            f"'--bounds' should contain toy dataset {name!r}: {int(outside.sum())} of "
            f"{len(points)} of its points ({len(valid)} validation points and "
            f"{TOY_BOUNDS_CHECK} fresh samples) lie outside (e.g. {row}); give bounds that "
            "contain the data, or none (a toy with Gaussian noise has no finite bounds)"
        )


def _bounds(
    specs: list[str] | None, positions: list[int], labels: list[str] | None
) -> tuple[list[float | None], list[float | None]] | None:
    """The builders' ``bounds=(low, high)`` for ``--bounds COL=LOW:HIGH ...`` (``None`` for an
    open end and for the columns not named), or ``None`` without the option. ``COL`` is a
    column's position in the file (as in ``--context``), or its name; ``positions`` are those
    of the modelled columns, ``labels`` their names."""
    if specs is None:
        return None
    features = len(positions)
    low: list[float | None] = [None] * features
    high: list[float | None] = [None] * features
    given: set[int] = set()
    for spec in specs:
        column, _, interval = spec.partition("=")
        ends = interval.split(":")
        if not column or len(ends) != 2:
            raise ValueError(f"'--bounds' takes COL=LOW:HIGH (LOW or HIGH may be empty), got "
                             f"{spec!r}")
        if column.isdigit() and int(column) in positions:  # a position, as in --context
            j = positions.index(int(column))
        elif labels is not None and column in labels:
            j = labels.index(column)
        else:
            names = "" if labels is None else f" or one of {labels}"
            raise ValueError(f"'--bounds' {spec!r}: the column should be one of the modelled "
                             f"columns, by position {positions}{names} (not a --context one)")
        if j in given:
            raise ValueError(f"'--bounds' names column {column!r} twice")
        given.add(j)
        try:
            low[j], high[j] = (float(end) if end.strip() else None for end in ends)
        except ValueError:
            raise ValueError(f"'--bounds' {spec!r}: LOW and HIGH should be numbers or "
                             "empty") from None
        if any(end is not None and math.isnan(end) for end in (low[j], high[j])):
            raise ValueError(f"'--bounds' {spec!r}: LOW and HIGH should be numbers, not nan")
        if low[j] is not None and high[j] is not None and not low[j] < high[j]:
            raise ValueError(f"'--bounds' {spec!r}: LOW should be below HIGH")
    return low, high


def number_or_off(text: str) -> float | None:
    """``--divergence-threshold``: a number, or ``off`` (no divergence check)."""
    return None if text == "off" else float(text)


def plot_samples(
    flow: torch.nn.Module, data: Any, path: Path, title: str, labels: list[str] | None
) -> None:
    """Samples of the flow over the data they should look like: one sample per row of the
    first 5000 rows of ``data``, given that row's context for a conditional flow. 2-D data: two
    scatter plots side by side on the same scales, the data and the samples; other dimensions: a
    grid of the first six features' histograms and pairs (:func:`flowkit.plot.pairs_figure`),
    ``labels`` naming the features."""
    from matplotlib.figure import Figure

    from flowkit.plot import pairs_figure, save_figure

    x, c = data if isinstance(data, tuple) else (data, None)
    x = np.asarray(torch.as_tensor(x[:5000], dtype=torch.float32).cpu())
    param = next(flow.parameters())
    with torch.no_grad():
        if c is None:
            samples = flow.sample(len(x))
        else:
            context = torch.as_tensor(c[: len(x)], dtype=param.dtype, device=param.device)
            samples = flow.sample(context=context)
    samples = samples.cpu().numpy()
    if x.shape[1] != 2:
        fig = pairs_figure(x, samples, labels=labels, title=title)
        save_figure(fig, path, dpi=100)
        return
    fig = Figure(figsize=(9.0, 4.6), layout="constrained")
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    names = labels or ["column 0", "column 1"]
    for ax, points, color, what in ((axes[0], x, "0.35", f"data ({len(x)} rows)"),
                                    (axes[1], samples, "tab:blue", "flow samples" if c is None
                                     else "flow samples, given each row's context")):
        ax.scatter(points[:, 0], points[:, 1], s=3, color=color, alpha=0.6, linewidths=0)
        ax.set_title(what, fontsize=10)
        ax.set_xlabel(names[0])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(names[1])
    low, high = np.percentile(x, [0.5, 99.5], axis=0)
    pad = 0.1 * (high - low) + 1e-12
    axes[0].set_xlim(low[0] - pad[0], high[0] + pad[0])
    axes[0].set_ylim(low[1] - pad[1], high[1] + pad[1])
    fig.suptitle(title)
    save_figure(fig, path, dpi=120)


def plot_losses(history: History, path: Path, title: str, entropy: float | None = None) -> None:
    """Training loss per step (faint) with its moving average over 2% of the steps, validation
    losses (dots) and, when known, the entropy of the data: the lowest reachable NLL, below the
    loss by KL(p || q)."""
    from flowkit.plot import loss_figure, save_figure

    label = "train, valid (dots)" if history.valid_loss else "train"
    fig = loss_figure(
        {title: {label: history}},
        references=None if entropy is None else {title: ("entropy H(p)", entropy)},
        smooth=max(1, len(history.train_loss) // 50),
        columns=1,
        size=(6.0, 4.0),
    )
    save_figure(fig, path, dpi=120)
