"""Fit a MAF or IAF by maximum likelihood to a 2-D toy dataset or to samples from a file.

Toy datasets (--data moons, ...) are sampled afresh at every step from a seeded generator; a fixed
validation set of --valid-size points is drawn once. A .npy file holds an (N, D) array, a .npz
file an array named 'x' (or its only array); a random --valid-fraction of its rows is held out
for validation.

Writes to --out: checkpoint.pt (a training checkpoint: `flowkit.load_model` reads it, --resume
continues from it, a run without --resume refuses to replace it), history.json (losses per step,
and per epoch for files), loss.png and metrics.json. For toy datasets with an exact density,
metrics.json also holds the entropy H(p) and the estimate KL(p || q) = valid_nll - H(p).

examples:
  flowkit fit --data moons --steps 2000 --out runs/moons
  flowkit fit --data samples.npy --flow iaf --layers 3 --hidden 32 32 --out runs/file
  flowkit fit --data moons --steps 500 --hidden 16 --threads 1 --out runs/small
  torchrun --standalone --nproc_per_node 2 -m flowkit fit --data moons --out runs/moons-2p
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flowkit.checkpoint import write_bytes_atomic
from flowkit.train import CHECKPOINT_NAME, DEFAULTS, History, fit, is_main_process

from .common import as_options

OPTIONS = {
    "lr": "--lr",
    "lr_schedule": "--lr-schedule",
    "clip_grad_norm": "--clip-grad-norm",
    "divergence_threshold": "--divergence-threshold",
    "steps": "--steps",
    "batch_size": "--batch-size",
    "valid_every": "--valid-every",
    "early_stopping_patience": "--patience",
    "checkpoint_every": "--checkpoint-every",
    "checkpoint_dir": "--out",
    "resume": "--resume",
    "seed": "--seed",
    "device": "--device",
    "data": "--data",
}
"""The option of this command that sets each argument of :func:`~flowkit.train.fit`: errors
of ``fit`` are spelled with them (:func:`~flowkit.app.common.as_options`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from flowkit.data import TOY_DATASETS

    data = parser.add_argument_group("data")
    data.add_argument(
        "--data",
        default="moons",
        metavar="NAME|FILE",
        help=f"toy dataset ({', '.join(TOY_DATASETS)}) or a .npy/.npz file of samples "
        "(default: %(default)s)",
    )
    data.add_argument(
        "--valid-size", type=int, default=4096, help="toy validation points (default: %(default)s)"
    )
    data.add_argument(
        "--valid-fraction",
        type=float,
        default=0.1,
        help="share of a file's rows held out for validation (default: %(default)s)",
    )
    model = parser.add_argument_group("model")
    model.add_argument("--flow", choices=("maf", "iaf"), default="maf", help="(default: maf)")
    model.add_argument(
        "--layers", type=int, default=5, help="autoregressive layers (default: %(default)s)"
    )
    model.add_argument(
        "--hidden",
        type=int,
        nargs="+",
        default=[64, 64],
        metavar="H",
        help="hidden layer sizes of each MADE (default: 64 64)",
    )
    model.add_argument("--batch-norm", action="store_true", help="batch norm between layers")
    train = parser.add_argument_group("training")
    train.add_argument(
        "--steps", type=int, default=2000, help="optimizer steps (default: %(default)s)"
    )
    train.add_argument("--batch-size", type=int, default=256, help="(default: %(default)s)")
    train.add_argument("--lr", type=float, default=1e-3, help="(default: %(default)s)")
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
        help="stop when the smoothed training loss rises more than T x max(1, |best|) above its "
        "best; 'off' turns the check off (default: %(default)s)",
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
    train.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads for torch (default: torch's default); 1 is often fastest for small "
        "models on a busy machine",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    import flowkit
    from flowkit.data import TOY_DATASETS, has_exact_density, toy_entropy

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"'--threads' should be a positive integer, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.data in TOY_DATASETS:
        data, valid, features = _toy(args.data, args.valid_size, args.seed)
    else:
        data, valid, features = _file(Path(args.data), args.valid_fraction, args.seed)
    build = flowkit.MAF if args.flow == "maf" else flowkit.IAF
    torch.manual_seed(args.seed)  # initial weights
    flow = build(
        features,
        layers=args.layers,
        hidden_features=tuple(args.hidden),
        batch_norm=args.batch_norm,
        seed=args.seed,
    )
    with as_options(OPTIONS):
        history = fit(
            flow,
            data,
            valid=valid,
            steps=args.steps,
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
        )
    metrics: dict[str, Any] = {
        "data": args.data,
        "flow": args.flow,
        "features": features,
        "parameters": sum(p.numel() for p in flow.parameters()),
        "steps": len(history.train_loss),
        "train_nll_last_100": float(np.mean(history.train_loss[-100:])),
        "valid_nll": history.valid_loss[-1] if history.valid_loss else None,
        "best_valid_nll": history.best_valid_loss,
        "best_step": history.best_step,
        "stopped_early": history.stopped_early,
        "wall_time_s": history.wall_time,
        "steps_per_s": len(history.train_loss) / max(history.wall_time, 1e-9),
        "checkpoint": str(args.out / CHECKPOINT_NAME),
    }
    if args.data in TOY_DATASETS and has_exact_density(args.data) and history.valid_loss:
        metrics["entropy"] = toy_entropy(args.data)
        metrics["kl_estimate"] = history.valid_loss[-1] - metrics["entropy"]
    if is_main_process():
        text = json.dumps(history.to_dict()) + "\n"
        write_bytes_atomic(args.out / "history.json", text.encode())
        title = f"{args.flow.upper()} on {args.data}"
        plot_losses(history, args.out / "loss.png", title, entropy=metrics.get("entropy"))
    return metrics


def number_or_off(text: str) -> float | None:
    """``--divergence-threshold``: a number, or ``off`` (no divergence check)."""
    return None if text == "off" else float(text)


def _toy(name: str, valid_size: int, seed: int) -> tuple[Any, torch.Tensor, int]:
    from flowkit.data import sample_toy

    def sample(n: int, generator: torch.Generator) -> torch.Tensor:
        return sample_toy(name, n, generator=generator)

    return sample, sample_toy(name, valid_size, seed=seed), 2


def _file(path: Path, valid_fraction: float, seed: int) -> tuple[Any, Any, int]:
    if path.suffix not in (".npy", ".npz") or not path.is_file():
        from flowkit.data import TOY_DATASETS

        raise ValueError(
            f"'--data' should be a toy dataset ({', '.join(TOY_DATASETS)}) or an existing .npy "
            f"or .npz file, got '{path}'"
        )
    if not 0.0 <= valid_fraction < 1.0:
        raise ValueError(f"'--valid-fraction' should be in [0, 1), got {valid_fraction}")
    if path.suffix == ".npy":
        loaded = np.load(path)  # allow_pickle=False: arrays only
    else:
        with np.load(path) as archive:
            names = archive.files
            if "x" not in names and len(names) != 1:
                raise ValueError(
                    f"'{path}' should hold an array named 'x' or a single array: {names}"
                )
            loaded = archive["x" if "x" in names else names[0]]
    if loaded.ndim != 2:
        raise ValueError(f"'{path}' should hold an array of shape (N, D), got {loaded.shape}")
    rows = np.random.default_rng(seed).permutation(loaded.shape[0])
    n_valid = round(valid_fraction * loaded.shape[0])
    valid = loaded[rows[:n_valid]] if n_valid else None
    return loaded[rows[n_valid:]], valid, loaded.shape[1]


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
