"""A VAE with an IAF posterior, written from scratch in user code (see docs/vae_tutorial.md)
=========================================================================================

Only the public flowkit API: the posterior q(z | x) is one ``flowkit.IAF`` conditioned on the
encoder's last hidden layer e, with a conditional Gaussian base (z_0 = mu(e) + sigma(e) * eps,
a linear head on e) and two IAF layers that read h = W e + b (a linear embedding);
``sample_and_log_prob`` gives the sample and its exact log-density in one pass.

    .venv/bin/python demos/vae_tutorial.py --root ../shared/data --epochs 5 --threads 1
    .venv/bin/python demos/vae_tutorial.py --quick      # seconds, synthetic images

Prints the validation -ELBO (one sample per image, all images) and the importance-weighted
estimate of -log p(x) (k samples per image, first --eval-images images), in nats per image.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import flowkit
from flowkit.data import binarized_mnist


def mlp(sizes: list[int]) -> nn.Sequential:
    """Linear layers with ELU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        if i > 0:
            layers.append(nn.ELU())
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
    return nn.Sequential(*layers)


class VAE(nn.Module):
    """Bernoulli decoder p(x | z), N(0, I) prior, IAF posterior q(z | x)."""

    def __init__(self, pixels: int = 784, latent: int = 32, hidden: int = 300,
                 context: int = 100):
        super().__init__()
        self.latent = latent
        self.encoder = nn.Sequential(mlp([pixels, hidden, hidden]), nn.ELU())  # x -> e
        self.posterior = flowkit.IAF(  # q(z | e): z_0 ~ N(mu(e), sigma(e)^2), 2 IAF layers
            latent, layers=2, hidden_features=(hidden, hidden), context_features=hidden,
            conditional_base=True, base_context="raw",  # [mu(e), log sigma(e)] = linear(e)
            embedding=flowkit.MLPEmbedding(hidden, context, hidden_features=()),  # h = W e + b
            standardize=False,  # e is a learned feature, not data in its own units
        )
        self.decoder = mlp([latent, hidden, hidden, pixels])  # z -> Bernoulli logits

    def log_weights(self, x: Tensor, k: int = 1) -> Tensor:
        """log p(x, z_i) - log q(z_i | x) for k posterior samples per image: (k, B)."""
        e = self.encoder(x)
        z, log_q = self.posterior.sample_and_log_prob(k, e)  # (k, B, Z), (k, B)
        logits = self.decoder(z)
        log_px_z = -F.binary_cross_entropy_with_logits(
            logits, x.expand(k, -1, -1), reduction="none"
        ).sum(-1)
        log_pz = -0.5 * (z**2).sum(-1) - 0.5 * self.latent * math.log(2 * math.pi)
        return log_px_z + log_pz - log_q


def train(vae: VAE, x_train: Tensor, epochs: int, batch_size: int = 100, lr: float = 1e-3,
          seed: int = 0) -> float:
    """Maximise the one-sample ELBO with Adam and a cosine learning-rate decay; seconds."""
    optimizer = torch.optim.Adam(vae.parameters(), lr=lr)
    steps = epochs * (x_train.shape[0] // batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    order = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for epoch in range(epochs):
        perm = torch.randperm(x_train.shape[0], generator=order)
        for i in range(x_train.shape[0] // batch_size):
            x = x_train[perm[i * batch_size:(i + 1) * batch_size]].float()
            loss = -vae.log_weights(x).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        print(f"epoch {epoch + 1}: -ELBO {loss.item():.2f} (last batch)", flush=True)
    return time.perf_counter() - t0


@torch.no_grad()
def evaluate(vae: VAE, x: Tensor, k: int, chunk: int = 100) -> tuple[Tensor, Tensor]:
    """Per-image ELBO (mean of k log-weights) and L_k = log mean exp of the log-weights."""
    vae.eval()
    elbo, log_px = [], []
    for i in range(0, x.shape[0], chunk):
        lw = vae.log_weights(x[i:i + chunk].float(), k).double()
        elbo.append(lw.mean(0))
        log_px.append(torch.logsumexp(lw, 0) - math.log(k))
    return torch.cat(elbo), torch.cat(log_px)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None, help="folder with binarized_mnist.npz")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--eval-images", type=int, default=1000)
    parser.add_argument("--k", type=int, default=100, help="importance samples per image")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="tiny synthetic run (CI)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.quick:  # random binary images, small networks
        x_train = (torch.rand(200, 784) < 0.3).to(torch.uint8)
        x_valid = (torch.rand(50, 784) < 0.3).to(torch.uint8)
        vae = VAE(hidden=32, latent=4, context=8)
        epochs, k, n_eval = 1, 5, 20
    else:
        x_train = binarized_mnist("train", root=args.root, download=False)
        x_valid = binarized_mnist("valid", root=args.root, download=False)
        vae = VAE()
        epochs, k, n_eval = args.epochs, args.k, args.eval_images
    seconds = train(vae, x_train, epochs, seed=args.seed)
    elbo_all, _ = evaluate(vae, x_valid, k=1)
    elbo, log_px = evaluate(vae, x_valid[:n_eval], k=k)
    result = {
        "parameters": sum(p.numel() for p in vae.parameters()), "epochs": epochs,
        "train_seconds": round(seconds, 1), "neg_elbo_all_valid": -elbo_all.mean().item(),
        "neg_elbo": -elbo.mean().item(), "nll": -log_px.mean().item(),
        "nll_se": log_px.std().item() / math.sqrt(log_px.numel()), "k": k,
        "eval_images": n_eval,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
