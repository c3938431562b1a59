"""Train a Bernoulli MADE on binarized MNIST (flowkit mnist) and score saved models
(flowkit mnist-eval).

flowkit mnist writes to --out: checkpoint.pt (atomically, every epoch or every
--checkpoint-every epochs, and at the end; --resume continues from it), model.pt (the best
weights, readable by flowkit.load_model), samples.png (100 samples), curves.png (learning
curves) and log.txt; the CLI adds metrics.json.

flowkit mnist-eval scores saved models on a split and prints the mean NLL with its standard
error, for mask set 0 and for a mask ensemble of each, and for the uniform mixture of several
models.

NLLs are in nats per image: the mean over the split of -log p(x), with standard error
std / sqrt(n).

Training schedule: Adam on mini-batches, one optimizer step per batch, then model.next_mask()
(order/connectivity-agnostic training cycles the mask sets 0, 1, ..., K-1, 0, ..., one per
step); after each epoch the validation NLL of mask set 0 decides the best weights (and early
stopping with --patience). Epoch e visits the training images in an order drawn from a
generator seeded by (seed, e), so a run resumed from an epoch's checkpoint continues exactly as
the uninterrupted run would have.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import Tensor

from flowkit.app.common import mean_se as nll_stats
from flowkit.app.common import refuse_to_replace
from flowkit.checkpoint import (
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    load_model,
    save_checkpoint,
    save_model,
)
from flowkit.data import binarized_mnist, load_split_file
from flowkit.distributions import BernoulliMADE
from flowkit.plot import save_figure
from flowkit.train import CHECKPOINT_NAME, resolve_device

__all__ = [
    "add_arguments", "run", "add_eval_arguments", "run_eval", "evaluate", "nll_stats", "mixture_nll"
]

KIND = "mnist-training"
"""The ``kind`` of this command's checkpoints (see :func:`flowkit.checkpoint.save_checkpoint`)."""

# Settings that a resumed run must share with the run it continues.
_FIXED_ON_RESUME = (
    "hidden", "masks", "order", "residual", "direct", "seed", "batch_size", "lr", "schedule",
    "weight_decay", "subset", "data",
)


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(
    model: BernoulliMADE, x: Tensor, mask_ensemble: int | None = None, batch_size: int = 1000
) -> Tensor:
    """Per-image NLL ``-log p(x)`` in nats, ``(N,)`` float64, computed in batches.

    Args:
        model: the model (scored with its active mask set when ``mask_ensemble`` is None).
        x: ``(N, 784)`` images of 0s and 1s (any dtype ``log_prob`` accepts).
        mask_ensemble: ``None`` or ``K``: see :meth:`BernoulliMADE.log_prob`.
        batch_size: images per pass.
    """
    device = next(model.parameters()).device
    return torch.cat([
        -model.log_prob(x[i : i + batch_size].to(device), mask_ensemble).double().cpu()
        for i in range(0, x.shape[0], batch_size)
    ])


def _score(
    model: BernoulliMADE, x: Tensor, ensemble: int, batch_size: int = 1000
) -> tuple[dict[str, Any], Tensor]:
    """Single-mask (set 0) and, if ``ensemble > 1``, ensemble NLL of ``x``; also the per-image
    NLL ``(N,)`` of the last of the two (the model's best estimate of ``-log p(x)``)."""
    result: dict[str, Any] = {"images": int(x.shape[0])}
    with model.made.mask_set(0):
        nll = evaluate(model, x, None, batch_size)
    result["nll"], result["nll_se"] = nll_stats(nll)
    if ensemble > 1:
        nll = evaluate(model, x, ensemble, batch_size)
        result["ensemble"] = ensemble
        result["ensemble_nll"], result["ensemble_nll_se"] = nll_stats(nll)
    return result, nll


def mixture_nll(nlls: list[Tensor]) -> Tensor:
    r"""Per-image NLL of the uniform mixture of ``M`` models, from each model's per-image NLL:

    .. math:: -\log \frac1M \sum_{i=1}^M p_i(x) = -\operatorname{logsumexp}_i \log p_i(x) + \log M.

    A mixture of normalized densities is normalized, so this is an exact log-likelihood, and
    never worse than the worst model's; it generalizes the mask ensemble of one model to
    independently trained models.

    Args:
        nlls: ``M`` tensors ``(N,)``, ``-log p_i(x)`` for the same ``N`` images.
    """
    log_p = -torch.stack(nlls)
    return -(torch.logsumexp(log_p, dim=0) - math.log(len(nlls)))


def _label(model: BernoulliMADE) -> str:
    """A short description of a model for figure titles, e.g. ``hidden 500, 8 masks, direct``."""
    kw = model.config["kwargs"]
    parts = [f"hidden {'x'.join(map(str, kw['hidden_features']))}",
             f"{kw['num_masks']} mask{'s' if kw['num_masks'] > 1 else ''}", f"{kw['order']} order"]
    parts += [name for name in ("residual", "direct_connection") if kw[name]]
    return ", ".join(parts)


def _describe(name: str, r: dict[str, Any]) -> str:
    text = f"{name} ({r['images']} images): NLL {r['nll']:.2f} ± {r['nll_se']:.2f} nats (mask 0)"
    if "ensemble" in r:
        text += (
            f", {r['ensemble_nll']:.2f} ± {r['ensemble_nll_se']:.2f} nats "
            f"(ensemble of {r['ensemble']} masks)"
        )
    return text


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
    if history["valid_nll"]:
        best = min(history["valid_nll"])
        ax.set_ylim(best - 5, best + 25)
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
    model.add_argument("--hidden", type=int, nargs="+", default=[500],
                       help="hidden layer sizes (default: 500)")
    model.add_argument("--masks", type=int, default=1,
                       help="number of mask sets, cycled one per training step (default: 1)")
    model.add_argument("--order", choices=["natural", "random"], default="natural",
                       help="'random': a new ordering per mask set (default: natural)")
    model.add_argument("--residual", action="store_true", help="residual masked blocks")
    model.add_argument("--direct", action="store_true",
                       help="direct masked connections from the inputs to the logits")
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=int, default=100, help="passes over the training set")
    train.add_argument("--batch-size", type=int, default=100,
                        help="images per optimizer step")
    train.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    train.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                       help="learning-rate schedule over the steps of the run")
    train.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
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
    run_.add_argument("--threads", type=int, default=None, help="CPU threads for torch")


def _load_data(args: argparse.Namespace) -> tuple[Tensor, Tensor]:
    if args.data is not None:
        x_train, x_valid = load_split_file(args.data, "train"), load_split_file(args.data, "valid")
    else:
        download = not args.no_download
        x_train = binarized_mnist("train", root=args.root, download=download)
        x_valid = binarized_mnist("valid", root=args.root, download=download)
    if args.subset is not None:
        x_train, x_valid = x_train[: args.subset], x_valid[: args.subset]
    return x_train, x_valid


def _build(args: argparse.Namespace) -> BernoulliMADE:
    return BernoulliMADE(
        784, hidden_features=args.hidden, num_masks=args.masks, order=args.order,
        residual=args.residual, direct_connection=args.direct, seed=args.seed,
    )


def _optimizer(model: BernoulliMADE, args: argparse.Namespace, steps: int):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = (
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
        if args.schedule == "cosine" else None
    )
    return opt, sched


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON-able options of the run (what the CLI adds besides them is left out)."""
    plain = (str, int, float, bool, list, type(None))
    return {k: v for k, v in vars(args).items() if isinstance(v, plain)}


def _check_resume(saved: dict[str, Any], args: argparse.Namespace, path: Path) -> None:
    now = _settings(args)
    fixed = _FIXED_ON_RESUME + (("epochs",) if args.schedule != "constant" else ())
    for key in fixed:
        if saved.get(key) != now.get(key):
            raise ValueError(
                f"--resume: '{key}' is {now.get(key)!r} but the run in '{path}' used "
                f"{saved.get(key)!r}; pass the same settings or pick another --out"
            )


def _read_checkpoint(path: Path, device: torch.device) -> Checkpoint:
    """This command's checkpoint at ``path``. Files of flowkit's format 1 written before the
    command had its own kind say ``"training"`` (the kind of :func:`flowkit.train.fit`'s
    checkpoints) and are recognised by their ``"settings"``, which fit never writes."""
    ckpt = load_checkpoint(path, map_location=device)
    legacy = ckpt.version == 1 and ckpt.kind == "training" and "settings" in ckpt.extra
    if ckpt.kind != KIND and not legacy:
        raise CheckpointError(
            f"'{path}' is a checkpoint of kind {ckpt.kind!r}, expected kind {KIND!r} (written by "
            "'flowkit mnist'); pick another --out"
        )
    return ckpt


def _check_minimums(args: argparse.Namespace, minimums: dict[str, int]) -> None:
    """Fail early (before any data is read) on an option below its minimum; options left at
    None are not checked."""
    for option, minimum in minimums.items():
        value = getattr(args, option.replace("-", "_"))
        if value is not None and value < minimum:
            raise ValueError(f"'--{option}' should be >= {minimum}, got {value}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train a Bernoulli-MADE on binarized MNIST (see the module docstring).

    ``args`` holds the options of :func:`add_arguments` and the CLI's common ``device``,
    ``seed``, ``out`` and ``quiet``. Returns the metrics (validation NLLs, times, settings).
    """
    from tqdm.auto import tqdm

    _check_minimums(args, {"subset": 1, "masks": 1, "epochs": 1, "batch-size": 1, "patience": 1,
                           "ensemble": 1, "checkpoint-every": 1})
    if args.ensemble is not None and args.ensemble > args.masks:
        raise ValueError(
            f"'--ensemble' should be at most --masks ({args.masks}), got {args.ensemble}"
        )
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # masked-out weights decay into denormals, slow on x86
    device = resolve_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / CHECKPOINT_NAME
    refuse_to_replace(ckpt_path, args.resume)
    x_train, x_valid = _load_data(args)
    x_train, x_valid = x_train.to(device), x_valid.to(device)
    torch.manual_seed(args.seed)  # the weight initialization
    model = _build(args).to(device)
    steps_per_epoch = x_train.shape[0] // args.batch_size
    if steps_per_epoch < 1:
        raise ValueError(
            f"'--batch-size' ({args.batch_size}) is larger than the training set "
            f"({x_train.shape[0]} images)"
        )
    opt, sched = _optimizer(model, args, args.epochs * steps_per_epoch)
    history: dict[str, list] = {
        "epoch": [], "train_nll": [], "valid_nll": [], "train_seconds": [], "valid_seconds": []
    }
    best: dict[str, Any] = {"epoch": 0, "nll": math.inf, "state_dict": None}
    start = 0
    if args.resume and ckpt_path.exists():
        loaded = _read_checkpoint(ckpt_path, device)
        ckpt = loaded.extra
        _check_resume(ckpt["settings"], args, ckpt_path)
        loaded.restore(model)
        opt.load_state_dict(ckpt["optimizer"])
        if sched is not None:
            sched.load_state_dict(ckpt["scheduler"])
        history, best, start = ckpt["history"], ckpt["best"], ckpt["epoch"]
    log = open(out / "log.txt", "a")  # noqa: SIM115 (closed in finally)
    saved = start  # the epoch that the checkpoint on disk ends with

    def checkpoint(epoch: int) -> None:
        save_checkpoint(ckpt_path, KIND, model=model, extra={
            "optimizer": opt.state_dict(),
            "scheduler": None if sched is None else sched.state_dict(),
            "epoch": epoch, "history": history, "best": best, "settings": _settings(args),
        })

    def say(text: str) -> None:
        tqdm.write(text)
        log.write(text + "\n")
        log.flush()

    say(f"{'resuming at' if start else 'starting'} epoch {start + 1}/{args.epochs}: "
        f"{x_train.shape[0]} train / {x_valid.shape[0]} valid images on {device}, "
        f"{torch.get_num_threads()} threads; {model.config['kwargs']}")
    try:
        for epoch in range(start + 1, args.epochs + 1):
            if args.patience is not None and epoch - best["epoch"] > args.patience:
                say(f"early stop: no better validation NLL since epoch {best['epoch']}")
                if saved != epoch - 1:
                    checkpoint(epoch - 1)
                break
            model.train()
            generator = torch.Generator().manual_seed(args.seed * 100_003 + epoch)
            perm = torch.randperm(x_train.shape[0], generator=generator).to(device)
            total = torch.zeros((), device=device, dtype=torch.float64)
            t0 = time.perf_counter()
            bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch}/{args.epochs}",
                       disable=args.quiet, leave=False, dynamic_ncols=True)
            for i in bar:
                batch = x_train[perm[i * args.batch_size : (i + 1) * args.batch_size]]
                loss = -model.log_prob(batch).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if sched is not None:
                    sched.step()
                model.next_mask()
                total += loss.detach()
                if i % 50 == 0:
                    bar.set_postfix(nll=f"{loss.item():.2f}", refresh=False)
            train_nll = (total / steps_per_epoch).item()
            if not math.isfinite(train_nll):
                raise FloatingPointError(
                    f"the training NLL is {train_nll} in epoch {epoch}; lower --lr (now "
                    f"{args.lr:g}) and --resume from the last checkpoint"
                )
            t1 = time.perf_counter()
            model.eval()
            with model.made.mask_set(0):
                valid_nll = evaluate(model, x_valid).mean().item()
            t2 = time.perf_counter()
            for key, value in zip(history, (epoch, train_nll, valid_nll, t1 - t0, t2 - t1),
                                  strict=True):
                history[key].append(value)
            if valid_nll < best["nll"]:
                best = {"epoch": epoch, "nll": valid_nll,
                        "state_dict": copy.deepcopy(model.state_dict())}
            say(f"epoch {epoch}: train {train_nll:.3f}, valid {valid_nll:.3f} nats "
                f"(best {best['nll']:.3f} at {best['epoch']}); {t1 - t0:.1f} s train, "
                f"{t2 - t1:.1f} s valid")
            if epoch % args.checkpoint_every == 0 or epoch == args.epochs:
                checkpoint(epoch)
                saved = epoch
            save_learning_curves(history, out / "curves.png", title=_label(model))

        if best["state_dict"] is not None:
            model.load_state_dict(best["state_dict"])
        model.set_mask(0)
        model.eval()
        save_model(model, out / "model.pt")
        ensemble = args.ensemble or args.masks
        t0 = time.perf_counter()
        valid, _ = _score(model, x_valid, ensemble)
        eval_seconds = time.perf_counter() - t0
        say(_describe("valid", valid) + f"; best epoch {best['epoch']}")
        samples = model.sample(100, generator=torch.Generator(device).manual_seed(args.seed))
        save_sample_grid(samples, out / "samples.png")
        train_times = history["train_seconds"]
        return {
            "config": model.config,
            "settings": _settings(args),
            "epochs_run": len(history["epoch"]),
            "best_epoch": best["epoch"],
            "valid": valid,
            "seconds_per_epoch": sum(train_times) / max(len(train_times), 1),
            "train_seconds": sum(train_times),
            "total_seconds": sum(train_times) + sum(history["valid_seconds"]) + eval_seconds,
            "threads": torch.get_num_threads(),
            "device": str(device),
        }
    finally:
        log.close()


# ----------------------------------------------------------------------------- evaluation CLI


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``flowkit mnist-eval`` (score saved models on a split file)."""
    parser.add_argument("models", nargs="+", metavar="model",
                        help="model.pt or checkpoint.pt written by 'flowkit mnist'; with several, "
                        "also the uniform mixture of the models")
    parser.add_argument("--file", default=None,
                        help="an .npz (with --key) or .amat split file; default: --split")
    parser.add_argument("--key", default=None, help="array name in an .npz --file")
    parser.add_argument("--split", choices=["train", "valid", "test"], default="valid",
                        help="standard split via flowkit.data.binarized_mnist (default: valid)")
    parser.add_argument("--root", default=None, help="data directory for --split")
    parser.add_argument("--no-download", action="store_true", help="never download the data")
    parser.add_argument("--ensemble", type=int, default=None,
                        help="mask sets in each model's ensemble score (default: all of the "
                        "model's)")
    parser.add_argument("--batch-size", type=int, default=1000,
                        help="images per evaluation batch")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    """Print (and return) the mean NLL ± standard error of each saved model on a split and,
    for several models, of their uniform mixture (:func:`mixture_nll`; each model enters with
    its mask ensemble when it has several mask sets).

    Returns:
        For one model, its scores (``images``, ``nll``, ``nll_se`` and, with several mask sets,
        ``ensemble``, ``ensemble_nll``, ``ensemble_nll_se``) and ``seconds``. For several,
        ``{"models": [those scores, ...], "mixture_nll": ..., "mixture_nll_se": ...,
        "seconds": ...}``.
    """
    _check_minimums(args, {"ensemble": 1, "batch-size": 1})
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    device = resolve_device(args.device)
    models = []
    for path in args.models:  # every file is checked before the data is read
        model = load_model(path, map_location=device)
        if not isinstance(model, BernoulliMADE):
            raise ValueError(f"'{path}' holds a {type(model).__name__}, not a BernoulliMADE")
        if args.ensemble is not None and args.ensemble > model.num_masks:
            raise ValueError(
                f"'--ensemble' should be at most the {model.num_masks} mask sets of '{path}', "
                f"got {args.ensemble}"
            )
        models.append(model)
    if args.file is not None:
        x, name = load_split_file(args.file, args.key), f"{args.file}" + (
            f"[{args.key}]" if args.key else "")
    else:
        x = binarized_mnist(args.split, root=args.root, download=not args.no_download)
        name = args.split
    t0 = time.perf_counter()
    results, nlls = [], []
    for path, model in zip(args.models, models, strict=True):
        result, nll = _score(model, x, args.ensemble or model.num_masks, args.batch_size)
        print(_describe(f"{path} on {name}", result))
        results.append(result)
        nlls.append(nll)
    if len(models) == 1:
        return {**results[0], "seconds": time.perf_counter() - t0}
    mean, se = nll_stats(mixture_nll(nlls))
    print(f"uniform mixture of the {len(models)} models on {name}: NLL {mean:.2f} ± {se:.2f} nats")
    return {"models": results, "mixture_nll": mean, "mixture_nll_se": se,
            "seconds": time.perf_counter() - t0}
