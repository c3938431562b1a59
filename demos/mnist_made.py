"""A Bernoulli-MADE on binarized MNIST in a page (see docs/discrete.md)
====================================================================


Trains a one-hidden-layer MADE with direct connections and 8 connectivity masks for a few
epochs with ``flowkit.fit``, cycling to the next mask set after every step (a callback);
scores the validation split with one mask and with the 8-mask ensemble; saves 100 exact
samples. The full experiment (checkpoints, resume, learning curves, the numbers in the docs)
is ``flowkit mnist``::

    .venv/bin/python demos/mnist_made.py --root ../shared/data --epochs 3
"""

import argparse
from pathlib import Path

import torch
from matplotlib.image import imsave

from flowkit import BernoulliMADE, fit
from flowkit.data import binarized_mnist
from flowkit.train import Callbacks


def nll(model: BernoulliMADE, x: torch.Tensor, mask_ensemble: int | None = None) -> torch.Tensor:
    """Per-image ``-log p(x)`` in nats, ``(N,)``, in batches of 1000 (the active mask set, or
    the average of the densities of ``mask_ensemble`` sets)."""
    with torch.no_grad():
        return torch.cat([-model.log_prob(chunk, mask_ensemble) for chunk in x.split(1000)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None,
                        help="data directory of binarized MNIST (.npz or .amat files; default: "
                             "$FLOWKIT_DATA, else ~/.cache/flowkit); missing splits are downloaded")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=500)
    parser.add_argument("--masks", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("runs/mnist-demo"))
    args = parser.parse_args()
    torch.set_flush_denormal(True)  # masked-out weights decay into slow denormals on the CPU

    x_train = binarized_mnist("train", root=args.root).float()  # (50000, 784) of 0/1
    x_valid = binarized_mnist("valid", root=args.root).float()  # (10000, 784)
    model = BernoulliMADE(784, hidden_features=[args.hidden], num_masks=args.masks,
                          direct_connection=True)

    def valid_nll_of_set_0(model: BernoulliMADE) -> float:  # the same model at every epoch
        with model.made.mask_set(0):
            return nll(model, x_valid).mean().item()

    history = fit(model, x_train, valid=valid_nll_of_set_0, epochs=args.epochs, batch_size=100,
                  lr=1e-3, lr_schedule=None, seed=0,
                  # connectivity-agnostic training: a new mask set after every step
                  callbacks=Callbacks(after_step=lambda p: p.model.next_mask()))
    model.set_mask(0)
    print(f"valid NLL per epoch (mask 0): {[round(v, 2) for v in history.valid_loss]} nats")

    single, ensemble = nll(model, x_valid), nll(model, x_valid, mask_ensemble=args.masks)
    print(f"valid NLL: {single.mean():.2f} ± {single.std() / len(single) ** 0.5:.2f} nats with "
          f"mask 0, {ensemble.mean():.2f} ± {ensemble.std() / len(ensemble) ** 0.5:.2f} with "
          f"the {args.masks}-mask ensemble")

    args.out.mkdir(parents=True, exist_ok=True)
    samples = model.sample(100, generator=torch.Generator().manual_seed(0))  # exact, mask 0
    grid = samples.reshape(10, 10, 28, 28).permute(0, 2, 1, 3).reshape(280, 280)
    imsave(args.out / "samples.png", grid.numpy(), cmap="gray_r")
    print(f"wrote {args.out / 'samples.png'}")


if __name__ == "__main__":
    main()
