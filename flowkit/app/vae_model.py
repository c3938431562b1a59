r"""The VAE of flowkit vae: a Bernoulli decoder, a Gaussian or IAF posterior, a normal or MAF
prior; its training by :func:`flowkit.train.fit` and its scores (ELBO and ``L_k``).

The command's help (``flowkit vae --help``, the docstring of ``flowkit.app.vae``) describes
the model and the bounds; here they are as code:

* :class:`VAE`: encoder, decoder, posterior and prior, and the log importance weights
  :math:`\log p(x, z_i) - \log q(z_i \mid x)` from which both bounds follow;
* :func:`train`: maximises the one-sample ELBO with :func:`flowkit.train.fit`;
* :func:`evaluate`: per-image ELBO and importance-weighted bound
  :math:`L_k(x) = \log \frac1k \sum_i p(x, z_i) / q(z_i \mid x)` (Burda et al. 2016).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flowkit.distributions import StandardNormal
from flowkit.flows import IAF, MAF
from flowkit.train import Callbacks, History, fit

from .common import mlp

__all__ = ["VAE", "Posterior", "Prior", "evaluate", "train"]

Posterior = Literal["gaussian", "iaf"]
Prior = Literal["normal", "maf"]

_LOG_2PI = math.log(2 * math.pi)


class VAE(nn.Module):
    """Bernoulli VAE with an MLP encoder/decoder and a Gaussian or IAF posterior (see
    ``flowkit vae --help``).

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
        # the prior keeps the MAF of before LU-linear maps became its default (a run started
        # then resumes; docs/vae.md): measured neither way
        self.prior = (MAF(latent_features, **flow, lu_linear=False) if prior == "maf"
                      else StandardNormal(latent_features))

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
