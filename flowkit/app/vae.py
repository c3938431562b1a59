"""A variational auto-encoder on binarized MNIST with a flow posterior (flowkit vae).

The model (Kingma & Welling 2014) has a Bernoulli decoder p(x | z), a prior p(z) and an
approximate posterior q(z | x), with MLPs of the same sizes whatever the posterior:

  encoder    x -> 300 -> 300 -> (mu, log sigma, h) (ELU), z of 32 dimensions
  decoder    z -> 300 -> 300 -> 784 Bernoulli logits
  posterior  "gaussian": z = mu + sigma * eps, eps ~ N(0, I)
             "iaf" (Kingma et al. 2016): the same z_0, then T inverse autoregressive layers
             conditioned on the encoder's context h, z_t = f_t(z_(t-1); h); the density of the
             sample comes from the same pass:
             log q(z_T | x) = log N(z_0; mu, sigma^2) - sum_t log|det dz_t / dz_(t-1)|
  prior      "normal" (N(0, I)) or "maf" (a MAF, whose density at the posterior's samples is
             one pass)

Training maximises the one-sample ELBO, E_q[log p(x|z) + log p(z) - log q(z|x)] <= log p(x),
with flowkit.train.fit (a checkpoint every epoch, --resume). Evaluation reports, on the
validation split, the ELBO and the importance-weighted bound of Burda et al. (2016),
L_k(x) = log (1/k) sum_i p(x, z_i) / q(z_i | x) with z_i ~ q(z | x), which increases with k
towards log p(x); both from the same k samples.

References:
  Kingma & Welling, "Auto-Encoding Variational Bayes", ICLR 2014.
  Kingma, Salimans, Jozefowicz, Chen, Sutskever & Welling, "Improved Variational Inference
  with Inverse Autoregressive Flow", NeurIPS 2016.
  Burda, Grosse & Salakhutdinov, "Importance Weighted Autoencoders", ICLR 2016.
  Rezende & Mohamed, "Variational Inference with Normalizing Flows", ICML 2015.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from flowkit.checkpoint import load_checkpoint, save_checkpoint, write_bytes_atomic
from flowkit.data import binarized_mnist, data_root
from flowkit.train import CHECKPOINT_NAME, Callbacks, Progress, resolve_device

from .common import (
    add_epoch_options,
    add_threads_option,
    check_same_settings,
    markdown_table,
    mean_se,
    refuse_to_replace,
    use_threads,
)
from .options import positive_int
from .vae_model import VAE, Posterior, Prior, evaluate, train

__all__ = ["VARIANTS", "add_arguments", "run"]

VARIANTS: dict[str, tuple[Posterior, Prior]] = {
    "gaussian": ("gaussian", "normal"),
    "iaf": ("iaf", "normal"),
    "gaussian+maf": ("gaussian", "maf"),
    "iaf+maf": ("iaf", "maf"),
}
"""Named (posterior, prior) pairs that ``--variants`` accepts."""

SCORES_NAME = "scores.pt"
"""Per-variant file of per-image validation scores, reused while weights, ``k`` and images
are unchanged (so ``--resume`` of a finished run only prints its results)."""

SCORES_KIND = "vae-scores"
"""The ``kind`` of the scores files (see :func:`flowkit.checkpoint.save_checkpoint`)."""

EPOCHS, IW_SAMPLES = 20, 1000
"""Defaults of ``--epochs`` and ``--iw-samples``."""

QUICK_EPOCHS, QUICK_IW_SAMPLES = 2, 20
"""``--epochs`` and ``--iw-samples`` of ``--quick`` (when they are not given)."""

SETTINGS_NAME = "settings.json"
"""The options of a run (``OUT/settings.json``): ``--resume`` checks them."""

_FIXED_ON_RESUME = ("quick", "latent", "hidden", "flow_layers", "flow_hidden", "context",
                    "batch_size", "lr", "lr_schedule", "seed")
"""Options (as ``args`` names) that a resumed run must share with the run it continues; with
the cosine schedule, ``epochs`` too (:func:`~flowkit.app.common.check_same_settings`)."""


def _fingerprint(tensors: Iterable[Tensor]) -> str:
    """SHA-256 of the tensors' bytes."""
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _scores(
    vae: VAE, x: Tensor, k: int, seed: int, path: Path
) -> tuple[dict[str, Tensor], float]:
    """:func:`evaluate` with a cache: per-image scores and their run time are kept in ``path``
    and reused while the model weights, ``k`` and the images are the same."""
    key = {
        "k": k, "seed": seed, "images": int(x.shape[0]),
        "data": _fingerprint([x]), "weights": _fingerprint(vae.state_dict().values()),
    }
    if path.is_file():
        cached = load_checkpoint(path, kind=SCORES_KIND).extra
        if cached["key"] == key:
            return cached["scores"], cached["seconds"]
    device = next(vae.parameters()).device
    t0 = time.perf_counter()
    scores = evaluate(vae, x, k, generator=torch.Generator(device).manual_seed(seed))
    seconds = time.perf_counter() - t0
    save_checkpoint(path, SCORES_KIND, extra={"key": key, "scores": scores, "seconds": seconds})
    return scores, seconds


# ----------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``flowkit vae`` (the CLI adds ``--device``, ``--seed``, ``--out``
    and ``--quiet``)."""
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS),
                        default=["gaussian", "iaf"],
                        help="(posterior, prior) pairs to compare (default: gaussian iaf)")
    parser.add_argument("--latent", type=positive_int, default=32,
                        help="latent dimensions (default: 32)")
    parser.add_argument("--hidden", type=positive_int, nargs="+", default=[300, 300],
                        help="encoder hidden sizes; the decoder mirrors them (default: 300 300)")
    parser.add_argument("--flow-layers", type=positive_int, default=2,
                        help="IAF layers of the posterior / MAF layers of the prior (default: 2)")
    parser.add_argument("--flow-hidden", type=positive_int, nargs="+", default=[300, 300],
                        help="hidden sizes of each flow layer's MADE (default: 300 300)")
    parser.add_argument("--context", type=positive_int, default=100,
                        help="width of the encoder context h read by the IAF (default: 100)")
    add_epoch_options(parser, epochs=EPOCHS, schedule="cosine", quick_epochs=QUICK_EPOCHS)
    parser.add_argument("--iw-samples", type=positive_int, default=None,
                        help=f"k of the importance-weighted log p(x) estimate (default: "
                             f"{IW_SAMPLES}; {QUICK_IW_SAMPLES} with --quick)")
    parser.add_argument("--eval-images", type=positive_int, default=None,
                        help="score the first N validation images (default: all 10000)")
    parser.add_argument("--root", default=None,
                        help="data directory holding binarized_mnist.npz or the "
                             "binarized_mnist_{train,valid}.amat files (default: $FLOWKIT_DATA, "
                             "else ~/.cache/flowkit); never downloads: 'flowkit mnist' does")
    parser.add_argument("--resume", action="store_true",
                        help="continue each variant from OUT/VARIANT/checkpoint.pt")
    add_threads_option(parser)
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: 300 train / 100 valid images, {QUICK_EPOCHS} epochs, "
                             f"k={QUICK_IW_SAMPLES}; --epochs and --iw-samples, when given, win")


def _load(args: argparse.Namespace) -> tuple[Tensor, Tensor]:
    try:
        x_train = binarized_mnist("train", root=args.root, download=False)
        x_valid = binarized_mnist("valid", root=args.root, download=False)
    except FileNotFoundError as e:
        folder = data_root(args.root)
        raise FileNotFoundError(
            f"binarized MNIST is missing from {folder} ('flowkit vae' needs its train and valid "
            "splits and never downloads): pass '--root' a folder holding binarized_mnist.npz or "
            "binarized_mnist_{train,valid}.amat, or download them there first with "
            f"flowkit.data.binarized_mnist('train', root='{folder}') and "
            f"binarized_mnist('valid', root='{folder}') (or 'flowkit mnist --root {folder}', "
            "which downloads before it trains)"
        ) from e
    if args.quick:
        return x_train[:300], x_valid[:100]
    return x_train, x_valid


def _log_epoch(path: Path, p: Progress) -> None:
    """After each epoch: its line in ``path`` (and on the terminal), ``-ELBO`` in nats."""
    h = p.history
    line = (f"epoch {p.epoch}: -ELBO train {h.epoch_loss[-1]:.3f}, valid {h.valid_loss[-1]:.3f} "
            f"nats; {h.wall_time:.0f} s so far")
    tqdm.write(line)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as log:
        log.write(line + "\n")


def _format_table(results: dict[str, dict[str, Any]]) -> str:
    head = ["variant", "params", "epochs", "train s", "-ELBO (all valid)", "-ELBO", "-log p(x)",
            "gain vs first", "eval s"]
    rows = []
    for name, r in results.items():
        gain = r.get("log_px_gain")
        rows.append([
            name, f"{r['parameters']:,}", f"{r['epochs']}", f"{r['train_seconds']:.0f}",
            f"{r['neg_elbo_full_valid']:.2f}", f"{r['neg_elbo']:.2f} ± {r['neg_elbo_se']:.2f}",
            f"{r['nll']:.2f} ± {r['nll_se']:.2f}",
            "" if gain is None else f"{gain:.2f} ± {r['log_px_gain_se']:.2f}",
            f"{r['eval_seconds']:.0f}",
        ])
    return markdown_table(head, rows, right=range(1, len(head)))


def _check_or_write_settings(args: argparse.Namespace, epochs: int, path: Path) -> None:
    """Given a ``path`` of an earlier run in the same folder (a resumed run, or another variant
    of the same table), refuse options that differ from its, naming the first; then write this
    run's options there."""
    now = {key: getattr(args, key) for key in _FIXED_ON_RESUME}
    now["epochs"] = epochs
    prefix = "--resume: " if args.resume else ""
    if path.is_file():
        check_same_settings(json.loads(path.read_text()), now, _FIXED_ON_RESUME, path.parent,
                            prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, (json.dumps(now, indent=2) + "\n").encode())


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train and score each ``--variants`` entry with the same encoder/decoder sizes, data order
    and seed; writes ``OUT/VARIANT/checkpoint.pt``, ``OUT/VARIANT/scores.pt``,
    ``OUT/VARIANT/log.txt`` (a line per epoch, from a callback of ``fit``),
    ``OUT/results.json`` and ``OUT/results.md``; returns ``{variant: metrics}`` (nats per
    image; ``nll`` is the ``L_k`` estimate of ``-log p(x)``, ``log_px_gain`` the paired mean
    improvement over the first variant on the same images).

    Every model is built right after ``torch.manual_seed(seed)``. Variants with the same
    posterior start from identical encoder and decoder weights; an IAF posterior's encoder has a
    larger output layer (it also gives ``h``), which draws more random numbers, so against a
    Gaussian posterior only the encoder's first two layers (``x -> 300 -> 300`` by default)
    start equal: its output layer and the decoder are other draws of the same initialisation."""
    use_threads(args.threads)
    epochs = args.epochs or (QUICK_EPOCHS if args.quick else EPOCHS)
    k = args.iw_samples or (QUICK_IW_SAMPLES if args.quick else IW_SAMPLES)
    device = resolve_device(args.device)
    x_train, x_valid = _load(args)
    x_eval = x_valid[: args.eval_images]
    out = Path(args.out)
    for name in args.variants:  # before any training
        refuse_to_replace(out / name / CHECKPOINT_NAME, args.resume)
    _check_or_write_settings(args, epochs, out / SETTINGS_NAME)
    results: dict[str, dict[str, Any]] = {}
    first: Tensor | None = None
    for name in args.variants:
        posterior, prior = VARIANTS[name]
        torch.manual_seed(args.seed)  # initial weights: see the docstring for what is shared
        vae = VAE(
            data_features=x_train.shape[1], latent_features=args.latent,
            hidden_features=args.hidden, posterior=posterior, prior=prior,
            flow_layers=args.flow_layers, flow_hidden_features=args.flow_hidden,
            context_features=args.context, seed=args.seed,
        ).to(device)  # where train leaves it, and where it is scored
        history = train(
            vae, x_train, x_valid, epochs=epochs, batch_size=args.batch_size, lr=args.lr,
            lr_schedule=None if args.lr_schedule == "constant" else args.lr_schedule,
            seed=args.seed, device=device, checkpoint_dir=out / name, resume=args.resume,
            progress=not args.quiet,
            callbacks=Callbacks(after_epoch=functools.partial(_log_epoch, out / name / "log.txt")),
        )
        scores, eval_seconds = _scores(vae, x_eval, k, args.seed, out / name / SCORES_NAME)
        neg_elbo, neg_elbo_se = mean_se(-scores["elbo"])
        nll, nll_se = mean_se(-scores["log_px"])
        r = results[name] = {
            "posterior": posterior, "prior": prior,
            "parameters": sum(p.numel() for p in vae.parameters()),
            "epochs": epochs, "steps": len(history.train_loss),
            "train_seconds": history.wall_time, "eval_seconds": eval_seconds,
            "neg_elbo_full_valid": history.valid_loss[-1], "valid_images": x_valid.shape[0],
            "eval_images": x_eval.shape[0], "k": k,
            "neg_elbo": neg_elbo, "neg_elbo_se": neg_elbo_se, "nll": nll, "nll_se": nll_se,
            "neg_elbo_full_valid_per_epoch": history.valid_loss,
            "threads": torch.get_num_threads(), "device": str(device),
        }
        if first is None:
            first = scores["log_px"]
        else:
            r["log_px_gain"], r["log_px_gain_se"] = mean_se(scores["log_px"] - first)
        print(f"{name}: -ELBO {neg_elbo:.2f}, -log p(x) ~ {nll:.2f} (k={k}) on "
              f"{x_eval.shape[0]} valid images; {history.wall_time:.0f} s training, "
              f"{eval_seconds:.0f} s scoring")
    out.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out / "results.json", json.dumps(results, indent=2).encode())
    table = _format_table(results)
    write_bytes_atomic(out / "results.md", (table + "\n").encode())
    print(table)
    return results
