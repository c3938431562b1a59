"""Train a Bernoulli MADE on binarized MNIST (flowkit mnist).

flowkit mnist trains with flowkit.train.fit and writes to --out: checkpoint.pt (fit's
checkpoint, every epoch or every --checkpoint-every epochs, and at the end; --resume continues
from it), settings.json (the options a resumed run must repeat), model.pt (the best weights,
readable by flowkit.load_model), samples.png (100 samples), curves.png (learning curves) and
log.txt; the CLI adds metrics.json. flowkit mnist-eval scores saved models.

NLLs are in nats per image: the mean over the split of -log p(x), with standard error
std / sqrt(n).

Training schedule: AdamW (Adam at the default --weight-decay 0) on mini-batches, one optimizer
step per batch, then model.next_mask() in a callback after each step (order/connectivity-agnostic
training cycles the mask sets 0, 1, ..., K-1, 0, ..., one per step); after each epoch the
validation NLL of mask set 0 decides the best weights (and early stopping with --patience).
Epoch e (from 1) visits the training images in the order torch.randperm draws from a generator
seeded with seed * 100003 + e, so a run resumed from an epoch's checkpoint continues exactly as
the uninterrupted run would have.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from flowkit.app.common import (
    add_epoch_options,
    add_threads_option,
    as_options,
    check_minimums,
    check_same_settings,
    count,
    refuse_to_replace,
    use_threads,
)
from flowkit.app.mnist_eval import (
    describe,
    evaluate,
    read_split,
    read_split_file,
    score,
)
from flowkit.app.options import nonnegative_float, positive_int
from flowkit.checkpoint import save_model, write_bytes_atomic
from flowkit.distributions import BernoulliMADE
from flowkit.plot import save_figure
from flowkit.train import CHECKPOINT_NAME, Callbacks, History, Progress, fit, resolve_device

__all__ = ["add_arguments", "run"]

SETTINGS_NAME = "settings.json"
"""The options of a run, beside its checkpoint: ``--resume`` checks them."""

# Settings that a resumed run must share with the run it continues.
_FIXED_ON_RESUME = (
    "hidden", "masks", "order", "residual", "direct", "seed", "batch_size", "lr", "lr_schedule",
    "weight_decay", "subset", "data",
)


def _label(model: BernoulliMADE) -> str:
    """A short description of a model for figure titles, e.g. ``hidden 500, 8 masks, direct``."""
    kw = model.config["kwargs"]
    parts = [f"hidden {'x'.join(map(str, kw['hidden_features']))}",
             f"{kw['num_masks']} mask{'s' if kw['num_masks'] > 1 else ''}", f"{kw['order']} order"]
    parts += [name for name in ("residual", "direct_connection") if kw[name]]
    return ", ".join(parts)


# ----------------------------------------------------------------------------- figures


def save_sample_grid(x: Tensor, path: str | Path, rows: int = 10) -> None:
    """Save images ``(rows * cols, 784)`` as a grid PNG."""
    cols = x.shape[0] // rows
    grid = x[: rows * cols].reshape(rows, cols, 28, 28).permute(0, 2, 1, 3).reshape(
        rows * 28, cols * 28
    )
    fig = Figure(figsize=(cols * 0.6, rows * 0.6))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(grid.cpu().float().numpy(), cmap="gray_r", interpolation="nearest")
    ax.set_axis_off()
    save_figure(fig, path)


def save_learning_curves(history: dict[str, list], path: str | Path, title: str = "") -> None:
    """Save train and validation NLL per epoch as a PNG."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    ax.plot(history["epoch"], history["train_nll"], label="train (mean over epoch)")
    ax.plot(history["epoch"], history["valid_nll"], label="valid (mask 0)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("NLL (nats per image)")
    finite = [(v, e) for v, e in zip(history["valid_nll"], history["epoch"], strict=True)
              if math.isfinite(v)]
    if finite:
        best, epoch = min(finite)
        ax.plot(epoch, best, "*", ms=10, color="C1", markeredgecolor="k", markeredgewidth=0.5,
                label=f"best valid {best:.2f} (epoch {epoch})")
        # both curves from the second epoch on (the first epoch's mean is far above the rest),
        # and the best validation wherever it is
        shown = [best] + [v for key in ("train_nll", "valid_nll") for v in history[key][1:]
                          if math.isfinite(v)]
        low, high = min(shown), max(shown)
        pad = 0.05 * (high - low) + 0.5
        ax.set_ylim(low - pad, high + pad)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


# ----------------------------------------------------------------------------- training


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``flowkit mnist`` (train a Bernoulli-MADE on binarized MNIST)."""
    data = parser.add_argument_group("data")
    data.add_argument("--root", default=None,
                      help="data directory for flowkit.data.binarized_mnist (default: "
                           "$FLOWKIT_DATA, else ~/.cache/flowkit)")
    data.add_argument("--data", default=None,
                      help="an .npz file with arrays 'train' and 'valid' (instead of --root)")
    data.add_argument("--no-download", action="store_true", help="never download the data")
    data.add_argument("--subset", type=int, default=None,
                      help="use only the first N training and validation images (quick runs)")
    model = parser.add_argument_group("model")
    model.add_argument("--hidden", type=positive_int, nargs="+", default=[500],
                       help="hidden layer sizes (default: 500)")
    model.add_argument("--masks", type=int, default=1,
                       help="number of mask sets, cycled one per training step (default: 1)")
    model.add_argument("--order", choices=["natural", "random"], default="natural",
                       help="'random': a new ordering per mask set (default: natural)")
    model.add_argument("--residual", action="store_true", help="residual masked blocks")
    model.add_argument("--direct", action="store_true",
                       help="direct masked connections from the inputs to the logits")
    train = parser.add_argument_group("training")
    add_epoch_options(train, epochs=100, schedule="constant")
    train.add_argument("--weight-decay", type=nonnegative_float, default=0.0,
                       help="AdamW's decoupled weight decay (default: 0, i.e. Adam)")
    train.add_argument("--patience", type=int, default=None,
                       help="stop after this many epochs without a better validation NLL")
    train.add_argument("--ensemble", type=int, default=None,
                       help="mask sets in the final ensemble score (default: --masks)")
    run_ = parser.add_argument_group("run")
    run_.add_argument("--resume", action="store_true",
                      help=f"continue from OUT/{CHECKPOINT_NAME} (same settings; --epochs may grow "
                           "with the constant schedule)")
    run_.add_argument("--checkpoint-every", type=int, default=1, metavar="E",
                      help=f"write OUT/{CHECKPOINT_NAME} every E epochs and at the end (default: "
                           "1; a large model's checkpoint, with Adam's state, can take longer "
                           "to write than an epoch on a GPU)")
    add_threads_option(run_)


def _load_data(args: argparse.Namespace) -> tuple[Tensor, Tensor]:
    if args.data is not None:
        x_train = read_split_file(args.data, "train", "--data")
        x_valid = read_split_file(args.data, "valid", "--data")
    else:
        x_train = read_split("train", args.root, args.no_download)
        x_valid = read_split("valid", args.root, args.no_download)
    if args.subset is not None:
        x_train, x_valid = x_train[: args.subset], x_valid[: args.subset]
    return x_train, x_valid


def _build(args: argparse.Namespace) -> BernoulliMADE:
    return BernoulliMADE(
        784, hidden_features=args.hidden, num_masks=args.masks, order=args.order,
        residual=args.residual, direct_connection=args.direct, seed=args.seed,
    )


class EpochOrder(Sampler[int]):
    """The order of the training images in each epoch: epoch ``e`` (from 1) visits them in the
    order ``torch.randperm(n)`` draws from a generator seeded with ``seed * 100003 + e``.

    :func:`flowkit.train.fit` calls :meth:`set_epoch` with the 0-based epoch before each epoch
    (as for a ``DistributedSampler``), so the order is a function of the epoch and a resumed run
    sees the batches an uninterrupted one would.
    """

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch + 1)
        return iter(torch.randperm(self.n, generator=generator).tolist())


class _Rows(Dataset):
    """The rows of a tensor, fetched a batch at a time (``x[rows]``, one indexing operation)."""

    def __init__(self, x: Tensor):
        self.x = x

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, row: int) -> Tensor:
        return self.x[row]

    def __getitems__(self, rows: list[int]) -> Tensor:
        return self.x[rows]


def _batch_as_is(batch: Tensor) -> Tensor:
    return batch


_OPTIONS = {
    "lr": "--lr", "resume": "--resume", "checkpoint_dir": "--out", "seed": "--seed",
    "device": "--device", "epochs": "--epochs", "early_stopping_patience": "--patience",
    "weight_decay": "--weight-decay", "batch_size": "--batch-size",
}
"""The option of this command that sets each argument of :func:`flowkit.train.fit`."""


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON-able options of the run (what the CLI adds besides them is left out)."""
    plain = (str, int, float, bool, list, type(None))
    return {k: v for k, v in vars(args).items() if isinstance(v, plain)}


def _check_resume(args: argparse.Namespace, out: Path) -> None:
    """Refuse to resume the run in ``out`` with other settings than it was started with."""
    path = out / SETTINGS_NAME
    if not path.is_file():
        raise ValueError(
            f"--resume: '{out / CHECKPOINT_NAME}' has no '{SETTINGS_NAME}' beside it, so it was "
            "not written by 'flowkit mnist' (or by an older version, whose runs cannot be "
            "resumed); pick another --out"
        )
    check_same_settings(json.loads(path.read_text()), _settings(args), _FIXED_ON_RESUME, out)


def _write_settings(args: argparse.Namespace, path: Path) -> None:
    """Write the run's settings atomically."""
    write_bytes_atomic(path, (json.dumps(_settings(args), indent=2) + "\n").encode())


def _curves(history: History) -> dict[str, list]:
    """Per-epoch train and validation NLL of ``history`` (one validation per epoch)."""
    epochs = len(history.epoch_loss)
    return {"epoch": list(range(1, epochs + 1)), "train_nll": history.epoch_loss,
            "valid_nll": history.valid_loss[:epochs]}


class _Report:
    """The validation and callbacks of a run: the mask cycling after each step; after each
    epoch, its line in ``log.txt`` (and on the terminal) and the learning curves."""

    def __init__(self, say: Callable[[str], None], out: Path, label: str, x_valid: Tensor):
        self.say, self.out, self.label, self.x_valid = say, out, label, x_valid
        self.valid_seconds = 0.0  # of the last validation
        self.epoch_start: float | None = None  # set at the first step, reset after each epoch

    def validate(self, model: BernoulliMADE) -> float:
        """The validation loss: mean NLL of mask set 0 (fit calls it in evaluation mode)."""
        t0 = time.perf_counter()
        with model.made.mask_set(0):
            nll = evaluate(model, self.x_valid).mean().item()
        self.valid_seconds = time.perf_counter() - t0
        return nll

    def after_step(self, p: Progress) -> None:
        p.model.next_mask()
        if self.epoch_start is None:
            self.epoch_start = time.perf_counter()

    def after_epoch(self, p: Progress) -> None:
        """Log the epoch (its time without checkpoints and figures) and draw the curves."""
        h = p.history
        seconds = time.perf_counter() - (self.epoch_start or 0.0)
        per_epoch = p.step // p.epoch
        best_epoch = (h.best_step or 0) // per_epoch
        best = math.nan if h.best_valid_loss is None else h.best_valid_loss
        self.say(f"epoch {p.epoch}: train {h.epoch_loss[-1]:.3f}, valid {h.valid_loss[-1]:.3f} "
                 f"nats (best {best:.3f} at {best_epoch}); {seconds - self.valid_seconds:.1f} s "
                 f"train, {self.valid_seconds:.1f} s valid")
        save_learning_curves(_curves(h), self.out / "curves.png", title=self.label)
        self.epoch_start = time.perf_counter()

    def on_checkpoint(self, p: Progress) -> None:
        self.epoch_start = time.perf_counter()

    def callbacks(self) -> Callbacks:
        return Callbacks(after_step=self.after_step, after_epoch=self.after_epoch,
                         on_checkpoint=self.on_checkpoint)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train a Bernoulli-MADE on binarized MNIST (see the module docstring).

    ``args`` holds the options of :func:`add_arguments` and the CLI's common ``device``,
    ``seed``, ``out`` and ``quiet``. Returns the metrics: validation NLLs, settings and times
    (``train_seconds`` and ``seconds_per_epoch`` are ``fit``'s wall time without validation,
    checkpoints and figures included, over all resumed segments).
    """
    from tqdm.auto import tqdm

    check_minimums(args, {"subset": 1, "masks": 1, "patience": 1, "ensemble": 1,
                          "checkpoint-every": 1})
    if args.data is not None and Path(args.data).suffix != ".npz":
        raise ValueError(
            f"'--data' should be an .npz file with arrays 'train' and 'valid', got {args.data}"
        )
    if args.ensemble is not None and args.ensemble > args.masks:
        raise ValueError(
            f"'--ensemble' should be at most --masks ({args.masks}), got {args.ensemble}"
        )
    use_threads(args.threads)
    device = resolve_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / CHECKPOINT_NAME
    refuse_to_replace(ckpt_path, args.resume)
    resuming = args.resume and ckpt_path.exists()
    if resuming:
        _check_resume(args, out)
    x_train, x_valid = _load_data(args)
    x_train, x_valid = x_train.to(device), x_valid.to(device)
    steps_per_epoch = x_train.shape[0] // args.batch_size
    if steps_per_epoch < 1:
        raise ValueError(
            f"'--batch-size' ({args.batch_size}) is larger than the training set "
            f"({x_train.shape[0]} images)"
        )
    torch.manual_seed(args.seed)  # the weight initialization
    model = _build(args).to(device)
    if not resuming:
        _write_settings(args, out / SETTINGS_NAME)
    loader = DataLoader(_Rows(x_train), batch_size=args.batch_size, drop_last=True,
                        sampler=EpochOrder(x_train.shape[0], args.seed), collate_fn=_batch_as_is)
    log = open(out / "log.txt", "a")  # noqa: SIM115 (closed in finally)

    def say(text: str) -> None:
        tqdm.write(text)
        log.write(text + "\n")
        log.flush()

    report = _Report(say, out, _label(model), x_valid)
    say(f"{'resuming' if resuming else 'starting'} a run of {count(args.epochs, 'epoch')}: "
        f"{x_train.shape[0]} train / {x_valid.shape[0]} valid images on {device}, "
        f"{count(torch.get_num_threads(), 'thread')}; {model.config['kwargs']}")
    try:
        with as_options(_OPTIONS):
            history = fit(
                model, loader, valid=report.validate, epochs=args.epochs,
                early_stopping_patience=args.patience, restore_best=True, lr=args.lr,
                optimizer="adamw", weight_decay=args.weight_decay,
                lr_schedule="cosine" if args.lr_schedule == "cosine" else None, seed=args.seed,
                device=device, checkpoint_dir=out,
                checkpoint_every=args.checkpoint_every * steps_per_epoch, resume=args.resume,
                progress=not args.quiet, callbacks=report.callbacks(),
            )
        best_epoch = (history.best_step or 0) // steps_per_epoch
        if history.stopped_early:
            say(f"early stop: no better validation NLL since epoch {best_epoch}")
        model.set_mask(0)
        model.eval()
        save_model(model, out / "model.pt")
        ensemble = args.ensemble or args.masks
        t0 = time.perf_counter()
        valid, _ = score(model, x_valid, ensemble)
        eval_seconds = time.perf_counter() - t0
        say(describe("valid", valid) + f"; best epoch {best_epoch}")
        samples = model.sample(100, generator=torch.Generator(device).manual_seed(args.seed))
        save_sample_grid(samples, out / "samples.png")
        epochs_run = len(history.epoch_loss)
        train_seconds = history.wall_time - history.valid_time
        return {
            "config": model.config,
            "settings": _settings(args),
            "epochs_run": epochs_run,
            "best_epoch": best_epoch,
            "valid": valid,
            "seconds_per_epoch": train_seconds / max(epochs_run, 1),
            "train_seconds": train_seconds,
            "total_seconds": history.wall_time + eval_seconds,
            "threads": torch.get_num_threads(),
            "device": str(device),
        }
    finally:
        log.close()
