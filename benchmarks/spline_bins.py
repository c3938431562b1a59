"""The rational-quadratic spline's bin lookup: gathering the bin's two knots and derivatives from
the cumulative sums (what ``RationalQuadraticSpline`` does) against forming every knot and
derivative first with ``knots()`` and gathering from those (the lookup before 2026-11-26),
timed in one process on the same inputs, rounds interleaved. Prints the median time of one
spline forward and backward (and forward alone, without gradients) per shape, and the ratio.

    OMP_NUM_THREADS=1 python benchmarks/spline_bins.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from flowkit.transforms.spline import RationalQuadraticSpline


def knots_first_bin(
    spline: RationalQuadraticSpline, value: torch.Tensor, params: torch.Tensor, along_y: bool
) -> tuple[torch.Tensor, ...]:
    """The lookup before: every knot and derivative, then the bin's gathered from them."""
    x_knots, y_knots, derivatives = spline.knots(params)
    search = y_knots if along_y else x_knots
    index = torch.searchsorted(search[..., 1:-1].contiguous(), value[..., None].contiguous(),
                               right=True)

    def pick(t: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return t.gather(-1, index + offset).squeeze(-1)

    x_k, y_k = pick(x_knots), pick(y_knots)
    return (x_k, pick(x_knots, 1) - x_k, y_k, pick(y_knots, 1) - y_k, pick(derivatives),
            pick(derivatives, 1))


def timer(call: Callable[[], None], repeats: int) -> list[float]:
    call()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spline = RationalQuadraticSpline()  # the builders' default: 16 bins on [-5, 5], linear tails
    gathered = RationalQuadraticSpline._bin
    print("| rows x features | call | knots first (ms) | gathered (ms) | speed-up |")
    print("|---|---|---:|---:|---:|")
    for rows, features in ((4096, 2), (256, 10), (512, 64), (256, 300)):
        g = torch.Generator().manual_seed(0)
        x = 3 * torch.randn(rows, features, generator=g)
        raw = torch.randn(rows, features, spline.params_per_feature, generator=g)

        def train(x: torch.Tensor = x, raw: torch.Tensor = raw) -> None:
            params = raw.clone().requires_grad_()
            z, log_det = spline.forward(x, params)
            (z.sum() + log_det.sum()).backward()

        def density(x: torch.Tensor = x, raw: torch.Tensor = raw) -> None:
            with torch.no_grad():
                spline.forward(x, raw)

        for name, call in (("forward + backward", train), ("forward, no grad", density)):
            samples: dict[str, list[float]] = {"knots first": [], "gathered": []}
            for _ in range(3):  # interleaved rounds
                for label, lookup in (("knots first", knots_first_bin), ("gathered", gathered)):
                    RationalQuadraticSpline._bin = lookup
                    try:
                        samples[label] += timer(call, args.repeats)
                    finally:
                        RationalQuadraticSpline._bin = gathered
            medians = {k: 1000 * statistics.median(v) for k, v in samples.items()}
            print(f"| {rows} x {features} | {name} | {medians['knots first']:.2f} | "
                  f"{medians['gathered']:.2f} | "
                  f"{medians['knots first'] / medians['gathered']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
