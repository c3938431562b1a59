"""A Bernoulli-MADE on binarized MNIST in a page (see docs/discrete.md)
====================================================================


Trains a one-hidden-layer MADE with direct connections and 8 connectivity masks for a few
epochs, cycling to the next mask set after every step; scores the validation split with one
mask and with the 8-mask ensemble; saves 100 exact samples. The full experiment (checkpoints,
resume, learning curves, the numbers in the docs) is ``flowkit mnist``::

    .venv/bin/python demos/mnist_made.py --root ../shared/data --epochs 3
"""

import argparse
import time
from pathlib import Path

import torch

from flowkit import BernoulliMADE
from flowkit.app.common import mean_se
from flowkit.app.mnist import evaluate, save_sample_grid
from flowkit.data import binarized_mnist


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
    torch.manual_seed(0)
    torch.set_flush_denormal(True)  # masked-out weights decay into slow denormals on the CPU

    x_train = binarized_mnist("train", root=args.root).float()  # (50000, 784) of 0/1
    x_valid = binarized_mnist("valid", root=args.root)  # (10000, 784)
    model = BernoulliMADE(784, hidden_features=[args.hidden], num_masks=args.masks,
                          direct_connection=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        for batch in x_train[torch.randperm(len(x_train))].split(100):
            loss = -model.log_prob(batch).mean()  # nats per image
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            model.next_mask()  # connectivity-agnostic training: a new mask set every step
        model.set_mask(0)
        print(f"epoch {epoch}: valid NLL {evaluate(model, x_valid).mean():.2f} nats (mask 0), "
              f"{time.perf_counter() - start:.0f} s")

    single = mean_se(evaluate(model, x_valid))
    ensemble = mean_se(evaluate(model, x_valid, mask_ensemble=args.masks))
    print(f"valid NLL: {single[0]:.2f} ± {single[1]:.2f} nats with mask 0, "
          f"{ensemble[0]:.2f} ± {ensemble[1]:.2f} with the {args.masks}-mask ensemble")

    args.out.mkdir(parents=True, exist_ok=True)
    samples = model.sample(100, generator=torch.Generator().manual_seed(0))  # exact, mask 0
    save_sample_grid(samples, args.out / "samples.png")
    print(f"wrote {args.out / 'samples.png'}")


if __name__ == "__main__":
    main()
