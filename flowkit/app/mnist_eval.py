"""Score saved BernoulliMADEs (model.pt or checkpoint.pt of flowkit mnist) on a binarized MNIST
split or a split file (an .npz key or an .amat): mean NLL in nats with its standard error, for
mask set 0 and the mask ensemble of each model and, given several models, for their uniform
mixture.

NLLs are in nats per image: the mean over the split of -log p(x), with standard error
std / sqrt(n). flowkit mnist scores its validation set with the same functions.

Writes only metrics.json to --out: the scores printed.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from flowkit.app.common import add_threads_option, check_minimums, count, use_threads
from flowkit.app.common import mean_se as nll_stats
from flowkit.checkpoint import load_model
from flowkit.data import binarized_mnist, load_split_file
from flowkit.distributions import BernoulliMADE
from flowkit.train import resolve_device

__all__ = ["add_arguments", "describe", "evaluate", "mixture_nll", "nll_stats", "run", "score"]


@torch.no_grad()
def evaluate(
    model: BernoulliMADE, x: Tensor, mask_ensemble: int | None = None, batch_size: int = 1000
) -> Tensor:
    """Per-image NLL ``-log p(x)`` in nats, ``(N,)`` float64, computed in batches.

    Args:
        model: the model (scored with its active mask set when ``mask_ensemble`` is None).
        x: ``(N, 784)`` images of 0s and 1s (any dtype ``log_prob`` accepts).
        mask_ensemble: ``None`` or ``K``: see ``log_prob`` of :class:`flowkit.BernoulliMADE`.
        batch_size: images per pass.
    """
    device = next(model.parameters()).device
    return torch.cat([
        -model.log_prob(x[i : i + batch_size].to(device), mask_ensemble).double().cpu()
        for i in range(0, x.shape[0], batch_size)
    ])


def score(
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


def read_split_file(path: str, key: str | None, option: str) -> Tensor:
    """:func:`flowkit.data.load_split_file` with its errors worded for the command line:
    ``option`` (``--data``, ``--file``) for the file and ``--key`` for the array."""
    if Path(path).suffix not in (".npz", ".amat"):
        raise ValueError(f"'{option}' should be an .npz or .amat file, got {path}")
    try:
        return load_split_file(path, key)
    except ValueError as e:
        if "'key'" not in str(e):
            raise
        raise ValueError(str(e).replace("'key'", "'--key'")) from e


def read_split(split: str, root: str | None, no_download: bool) -> Tensor:
    """:func:`flowkit.data.binarized_mnist` with ``--no-download``: a missing split says to
    drop that option (the library's message says ``download=True``)."""
    try:
        return binarized_mnist(split, root=root, download=not no_download)
    except FileNotFoundError as e:
        if not no_download:
            raise
        raise FileNotFoundError(
            str(e).replace("pass download=True", "drop --no-download to download it")
        ) from e


def describe(name: str, r: dict[str, Any]) -> str:
    """One line for the scores ``r`` of :func:`score` on the images called ``name``: the NLL of
    mask set 0 and, when ``r`` has one, of the mask ensemble, each with its standard error."""
    text = f"{name} ({r['images']} images): NLL {r['nll']:.2f} ± {r['nll_se']:.2f} nats (mask 0)"
    if "ensemble" in r:
        text += (
            f", {r['ensemble_nll']:.2f} ± {r['ensemble_nll_se']:.2f} nats "
            f"(ensemble of {count(r['ensemble'], 'mask')})"
        )
    return text


# ----------------------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
    add_threads_option(parser)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Print (and return) the mean NLL ± standard error of each saved model on a split and,
    for several models, of their uniform mixture (:func:`mixture_nll`; each model enters with
    its mask ensemble when it has several mask sets).

    Returns:
        For one model, its scores (``images``, ``nll``, ``nll_se`` and, with several mask sets,
        ``ensemble``, ``ensemble_nll``, ``ensemble_nll_se``) and ``seconds``. For several,
        ``{"models": [those scores, ...], "mixture_nll": ..., "mixture_nll_se": ...,
        "seconds": ...}``.
    """
    check_minimums(args, {"ensemble": 1, "batch-size": 1})
    use_threads(args.threads)
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
        x, name = read_split_file(args.file, args.key, "--file"), f"{args.file}" + (
            f"[{args.key}]" if args.key else "")
    else:
        x, name = read_split(args.split, args.root, args.no_download), args.split
    t0 = time.perf_counter()
    results, nlls = [], []
    for path, model in zip(args.models, models, strict=True):
        result, nll = score(model, x, args.ensemble or model.num_masks, args.batch_size)
        print(describe(f"{path} on {name}", result))
        results.append(result)
        nlls.append(nll)
    if len(models) == 1:
        return {**results[0], "seconds": time.perf_counter() - t0}
    mean, se = nll_stats(mixture_nll(nlls))
    print(f"uniform mixture of the {len(models)} models on {name}: NLL {mean:.2f} ± {se:.2f} nats")
    return {"models": results, "mixture_nll": mean, "mixture_nll_se": se,
            "seconds": time.perf_counter() - t0}
