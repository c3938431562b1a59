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
import math
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from flowkit.checkpoint import load_checkpoint, save_checkpoint
from flowkit.data import binarized_mnist, data_root
from flowkit.distributions import StandardNormal
from flowkit.flows import IAF, MAF
from flowkit.train import CHECKPOINT_NAME, Callbacks, History, Progress, fit, resolve_device

from .common import mean_se, mlp, refuse_to_replace

__all__ = ["VAE", "VARIANTS", "add_arguments", "evaluate", "run", "train"]

Posterior = Literal["gaussian", "iaf"]
Prior = Literal["normal", "maf"]

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

_LOG_2PI = math.log(2 * math.pi)


class VAE(nn.Module):
    """Bernoulli VAE with an MLP encoder/decoder and a Gaussian or IAF posterior (module doc).

    Args:
        data_features: ``D``, pixels per image.
        latent_features: ``Z``.
        hidden_features: hidden sizes of the encoder; the decoder uses them reversed.
        posterior: ``"gaussian"`` or ``"iaf"``.
        prior: ``"normal"`` or ``"maf"``.
        flow_layers: IAF layers of the posterior, and MAF layers of the prior.
        flow_hidden_features: hidden sizes of each flow layer's MADE.
        context_features: width of the encoder's context ``h`` read by the IAF layers.
        seed: seed of the MADE degrees (the weights use torch's global generator).

    Example:
        >>> vae = VAE(data_features=6, latent_features=2, hidden_features=(8,), posterior="iaf",
        ...           flow_hidden_features=(8,), context_features=4)
        >>> x = torch.randint(0, 2, (5, 6)).float()
        >>> vae.log_weights(x, k=3).shape
        torch.Size([3, 5])
    """

    def __init__(
        self,
        data_features: int = 784,
        latent_features: int = 32,
        hidden_features: Sequence[int] = (300, 300),
        posterior: Posterior = "gaussian",
        prior: Prior = "normal",
        flow_layers: int = 2,
        flow_hidden_features: Sequence[int] = (300, 300),
        context_features: int = 100,
        seed: int = 0,
    ):
        super().__init__()
        if posterior not in ("gaussian", "iaf"):
            raise ValueError(f"'posterior' should be 'gaussian' or 'iaf', got {posterior!r}")
        if prior not in ("normal", "maf"):
            raise ValueError(f"'prior' should be 'normal' or 'maf', got {prior!r}")
        hidden = [int(h) for h in hidden_features]
        self.data_features, self.latent_features = data_features, latent_features
        self.posterior, self.prior_name = posterior, prior
        self.context_features = context_features if posterior == "iaf" else 0
        encoder_out = 2 * latent_features + self.context_features
        self.encoder = mlp([data_features, *hidden, encoder_out], nn.ELU)
        self.decoder = mlp([latent_features, *reversed(hidden), data_features], nn.ELU)
        flow = {"layers": flow_layers, "hidden_features": flow_hidden_features, "seed": seed}
        self.flow = (
            IAF(latent_features, context_features=context_features, **flow)
            if posterior == "iaf"
            else None
        )
        self.prior = MAF(latent_features, **flow) if prior == "maf" else StandardNormal(
            latent_features
        )

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """``x``: ``(B, D)`` -> ``mu``, ``log sigma``: ``(B, Z)``, and ``h``: ``(B, H)`` or None."""
        out = self.encoder(x)
        z = self.latent_features
        h = out[:, 2 * z :] if self.context_features else None
        return out[:, :z], out[:, z : 2 * z], h

    def sample_posterior(
        self, x: Tensor, k: int = 1, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """``k`` reparameterized draws from ``q(z | x)`` per image and their log-density.

        Args:
            x: ``(B, D)`` images.
            k: samples per image.
            generator: source of the noise ``eps`` (torch's global generator if None).

        Returns:
            ``z``: ``(k, B, Z)`` and ``log q(z | x)``: ``(k, B)``.
        """
        mu, log_sigma, h = self.encode(x)
        eps = torch.randn((k, *mu.shape), generator=generator, device=x.device, dtype=mu.dtype)
        z = mu + eps * log_sigma.exp()
        log_q = -(0.5 * eps**2 + log_sigma + 0.5 * _LOG_2PI).sum(-1)
        if self.flow is not None:
            b = x.shape[0]
            context = h.expand(k, -1, -1).reshape(k * b, -1)
            z, log_det = self.flow.transform.inverse(z.reshape(k * b, -1), context)
            z, log_q = z.reshape(k, b, -1), log_q - log_det.reshape(k, b)
        return z, log_q

    def log_joint(self, x: Tensor, z: Tensor) -> Tensor:
        """``log p(x | z) + log p(z)``, ``(k, B)``, for ``x``: ``(B, D)``, ``z``: ``(k, B, Z)``."""
        k, b, _ = z.shape
        logits = self.decoder(z)
        log_px_z = -F.binary_cross_entropy_with_logits(
            logits, x.expand(k, -1, -1), reduction="none"
        ).sum(-1)
        return log_px_z + self.prior.log_prob(z.reshape(k * b, -1)).reshape(k, b)

    def log_weights(
        self, x: Tensor, k: int = 1, generator: torch.Generator | None = None
    ) -> Tensor:
        """Log importance weights ``log p(x, z_i) - log q(z_i | x)``, ``(k, B)``; their mean
        estimates the ELBO, :func:`torch.logsumexp` over ``k`` minus ``log k`` is ``L_k``."""
        z, log_q = self.sample_posterior(x, k, generator)
        return self.log_joint(x, z) - log_q

    def elbo(self, x: Tensor) -> Tensor:
        """One-sample ELBO estimate per image, ``(B,)`` (the training objective)."""
        return self.log_weights(x, 1)[0]

    def extra_repr(self) -> str:
        return f"posterior={self.posterior!r}, prior={self.prior_name!r}"


class _ElboAsLogProb(nn.Module):
    """Presents a :class:`VAE` to :func:`flowkit.train.fit`, which maximises ``log_prob``: here
    the one-sample ELBO, a lower bound on ``log p(x)``. Its ``valid`` loss is then ``-ELBO``.
    ``fit`` passes integer images (binarized MNIST is uint8) as they are; they are cast here, a
    batch at a time, to the model's dtype."""

    def __init__(self, vae: VAE):
        super().__init__()
        self.vae = vae
        self.features = vae.data_features

    def log_prob(self, x: Tensor) -> Tensor:
        return self.vae.elbo(x.to(self.vae.encoder[0].weight.dtype))


def train(
    vae: VAE,
    x_train: Tensor,
    x_valid: Tensor | None = None,
    *,
    epochs: int,
    batch_size: int = 100,
    lr: float = 1e-3,
    lr_schedule: str | None = "cosine",
    seed: int = 0,
    device: str | torch.device = "auto",
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    callbacks: Callbacks | None = None,
) -> History:
    """Maximise the ELBO with :func:`flowkit.train.fit` (Adam); returns its ``History``, whose
    losses are ``-ELBO`` in nats per image. A checkpoint is written after every epoch;
    ``callbacks`` are ``fit``'s (see :class:`flowkit.train.Callbacks`)."""
    steps_per_epoch = max(x_train.shape[0] // batch_size, 1)
    return fit(
        _ElboAsLogProb(vae),
        x_train,
        valid=x_valid,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        lr_schedule=lr_schedule,
        seed=seed,
        device=device,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=steps_per_epoch,
        resume=resume,
        progress=progress,
        log_every=min(100, steps_per_epoch),
        callbacks=callbacks,
    )


@torch.no_grad()
def evaluate(
    vae: VAE,
    x: Tensor,
    k: int,
    images_per_chunk: int | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Per-image ELBO (mean of ``k`` log-weights) and ``L_k`` bound on ``log p(x)``.

    Each chunk of ``B`` images is one batch of ``k * B`` posterior samples; the loop runs over
    chunks of images, never over samples.

    Args:
        vae: the model (left in evaluation mode).
        x: ``(N, D)`` images of 0s and 1s, any dtype.
        k: importance samples per image.
        images_per_chunk: ``B``; default keeps ``k * B`` near 20000 rows.
        generator: noise source on the model's device.

    Returns:
        ``{"elbo": (N,), "log_px": (N,)}``, float64 on the CPU, in nats.
    """
    vae.eval()
    ref = next(vae.parameters())
    b = images_per_chunk or max(1, 20_000 // k)
    elbo, log_px = [], []
    for i in range(0, x.shape[0], b):
        xb = x[i : i + b].to(ref.device, ref.dtype)
        lw = vae.log_weights(xb, k, generator).double()
        elbo.append(lw.mean(0).cpu())
        log_px.append((torch.logsumexp(lw, 0) - math.log(k)).cpu())
    return {"elbo": torch.cat(elbo), "log_px": torch.cat(log_px)}


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
    parser.add_argument("--latent", type=int, default=32, help="latent dimensions (default: 32)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[300, 300],
                        help="encoder hidden sizes; the decoder mirrors them (default: 300 300)")
    parser.add_argument("--flow-layers", type=int, default=2,
                        help="IAF layers of the posterior / MAF layers of the prior (default: 2)")
    parser.add_argument("--flow-hidden", type=int, nargs="+", default=[300, 300],
                        help="hidden sizes of each flow layer's MADE (default: 300 300)")
    parser.add_argument("--context", type=int, default=100,
                        help="width of the encoder context h read by the IAF (default: 100)")
    parser.add_argument("--epochs", type=int, default=20, help="passes over the training set")
    parser.add_argument("--batch-size", type=int, default=100,
                        help="images per optimizer step")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    parser.add_argument("--schedule", choices=["constant", "cosine"], default="cosine",
                        help="learning-rate schedule over the run (default: cosine)")
    parser.add_argument("--iw-samples", type=int, default=1000,
                        help="k of the importance-weighted log p(x) estimate (default: 1000)")
    parser.add_argument("--eval-images", type=int, default=None,
                        help="score the first N validation images (default: all 10000)")
    parser.add_argument("--root", default=None,
                        help="data directory holding binarized_mnist.npz or the "
                             "binarized_mnist_{train,valid}.amat files (default: $FLOWKIT_DATA, "
                             "else ~/.cache/flowkit); never downloads: 'flowkit mnist' does")
    parser.add_argument("--resume", action="store_true",
                        help="continue each variant from OUT/VARIANT/checkpoint.pt")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 300 train / 100 valid images, 2 epochs, k=20")


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
    lines = [
        "| variant | params | epochs | train s | -ELBO (all valid) | -ELBO | -log p(x) | "
        "gain vs first | eval s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        gain = r.get("log_px_gain")
        gain_text = "" if gain is None else f"{gain:.2f} ± {r['log_px_gain_se']:.2f}"
        lines.append(
            f"| {name} | {r['parameters']:,} | {r['epochs']} | {r['train_seconds']:.0f} | "
            f"{r['neg_elbo_full_valid']:.2f} | {r['neg_elbo']:.2f} ± {r['neg_elbo_se']:.2f} | "
            f"{r['nll']:.2f} ± {r['nll_se']:.2f} | {gain_text} | {r['eval_seconds']:.0f} |"
        )
    return "\n".join(lines)


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
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    epochs, k = (2, 20) if args.quick else (args.epochs, args.iw_samples)
    device = resolve_device(args.device)
    x_train, x_valid = _load(args)
    x_eval = x_valid[: args.eval_images]
    out = Path(args.out)
    for name in args.variants:  # before any training
        refuse_to_replace(out / name / CHECKPOINT_NAME, args.resume)
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
        )
        history = train(
            vae, x_train, x_valid, epochs=epochs, batch_size=args.batch_size, lr=args.lr,
            lr_schedule=None if args.schedule == "constant" else args.schedule, seed=args.seed,
            device=device, checkpoint_dir=out / name, resume=args.resume,
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
    (out / "results.json").write_text(json.dumps(results, indent=2))
    table = _format_table(results)
    (out / "results.md").write_text(table + "\n")
    print(table)
    return results
