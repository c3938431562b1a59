"""A Bernoulli-MADE MNIST training step as `flowkit mnist` takes it, three ways, interleaved.

The model of `flowkit mnist` (784 binary pixels, one hidden layer of H units, direct connection,
batch 100, AdamW at lr 1e-3) trained three ways from the same initial weights on the same
batches, in one process, one round after another:

* ``dense + AdamW loop``: the path before the block staircase and the fused optimizer (dense
  masked products, AdamW's loop over tensors);
* ``staircase + AdamW loop``: the block-staircase products alone;
* ``staircase + fused AdamW``: what `flowkit mnist` runs now.

Prints the median process CPU time of a step (one thread), an epoch's estimate (500 steps of the
50,000 training images) and the speed-up over the first way; then, after ``--steps`` steps in
all on the same batches, the validation NLL of the three models (the same sums added in another
order: they differ by rounding, which the first steps of Adam amplify and later steps damp).

    python benchmarks/mnist_step.py --data ../shared/data/binarized_mnist.npz --hidden 8000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import flowkit

WAYS = {  # name: (MADE.product, fused AdamW)
    "dense + AdamW loop": ("dense", False),
    "staircase + AdamW loop": ("auto", False),
    "staircase + fused AdamW": ("auto", True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="binarized MNIST .npz (train, valid)")
    parser.add_argument("--hidden", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=9, help="rounds of 2 timed steps")
    parser.add_argument("--steps", type=int, default=300, help="steps before the NLL")
    args = parser.parse_args()
    torch.set_num_threads(1)
    images = np.load(args.data)
    train = torch.from_numpy(images["train"][:5000]).float()
    valid = torch.from_numpy(images["valid"][:2000]).float()
    runs, initial = {}, None
    for name, (product, fused) in WAYS.items():
        model = flowkit.BernoulliMADE(784, (args.hidden,), direct_connection=True, seed=0)
        initial = initial or model.state_dict()
        model.load_state_dict(initial)  # the same initial weights (torch's init draws them)
        model.made.product = product
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0,
                                      fused=fused)
        runs[name] = (model, optimizer)

    def step(name: str, i: int) -> None:
        model, optimizer = runs[name]
        start = (i * 100) % train.shape[0]
        loss = -model.log_prob(train[start:start + 100]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    times: dict[str, list[float]] = {name: [] for name in WAYS}
    for r in range(args.rounds + 1):
        for name in WAYS:
            step(name, 3 * r)
            begin = time.process_time()
            step(name, 3 * r + 1)
            step(name, 3 * r + 2)
            if r:  # the first round warms up
                times[name].append((time.process_time() - begin) / 2)
    first = None
    for name, ts in times.items():
        median = sorted(ts)[len(ts) // 2]
        first = first or median
        print(f"h={args.hidden} {name:24s} step {median * 1e3:6.1f} ms   "
              f"epoch ~{median * 500:5.1f} s   {first / median:.2f}x")
    for i in range(3 * (args.rounds + 1), args.steps):
        for name in WAYS:
            step(name, i)
    with torch.no_grad():
        for name, (model, _) in runs.items():
            nll = -model.log_prob(valid).mean().item()
            print(f"h={args.hidden} {name:24s} validation NLL (2000 images) after "
                  f"{max(args.steps, 3 * (args.rounds + 1))} steps {nll:.4f}")


if __name__ == "__main__":
    main()
