"""Benchmarks: masked networks at dense speed, autoregressive sampling at about one pass.

Sections (--sections, all by default):
  density    MAF log_prob and an Adam training step vs the same flow with unmasked MLPs
             (the arithmetic floor), D=2 (hidden 64x2, 5 layers, batch 4096) and D=64 (hidden
             512x2, 5 layers, batch 1024); log_prob with the NaN/Inf check of the inputs off and on.
  sampling   MAF sampling and IAF density of outside points (both solve D equations per layer)
             vs (a) one pass of the same model in its cheap direction (MAF log_prob, IAF
             sample_and_log_prob) and (b) the same call with the naive D-pass solver; on
             CUDA also MAF sampling replayed from a CUDA graph (flowkit.GraphedSampler).
  bernoulli  BernoulliMADE sampling of 100 vectors of 784 dims (hidden 500 and 2000x2000) vs
             the naive sampler, same noise, same samples; "cold" is the first call after a
             weight update (the sorted weights are rebuilt), the others reuse them; on CUDA
             also sampling replayed from a CUDA graph.
  staircase  MAF log_prob and an Adam step with the block-staircase products (the default)
             vs the dense masked products and vs the unmasked MLPs: D=64 (hidden 512x2, 5
             layers, batch 1024, training batch 512) and D=784 (hidden 2000, one layer with a
             direct connection, batch 1000, training batch 100: the MNIST shape).
  mnist      Bernoulli-MADE training on binarized MNIST (hidden 2000 and 8000, direct
             connection, batch 100), default vs dense masked products: the time of a few
             steps, and the validation NLL of a short fixed-seed run with each (needs the data:
             --mnist-data or the data root; skipped without it).
  memory     peak memory of each measured call (see below).
  compare    nflows and zuko on the density/sampling configurations, if they are installed.

Every time is the median over --repeats interleaved rounds, with the interquartile range, of
the process CPU time on the CPU (the machine may be shared: CPU time does not count the time the
process waits for a core; wall times are in the JSON too; with --threads 1, the default, that is
the work done) and of the wall time between two torch.cuda.synchronize() calls on CUDA (where
the host's CPU time only counts launching and waiting). Every speed is also compared with a
reference measured in the same run, in one wording: "2.50x faster" or "1.20x slower" than it.
Memory is what the first call adds at its peak, in a fresh process after building the model and
inputs, so it includes what the call keeps for the next ones (cached masked and sorted weights,
an optimizer's state): on CPU the peak resident set size (VmHWM, reset through
/proc/self/clear_refs, Linux) minus the resident size before the call, in a subprocess per call;
on CUDA the peak of torch.cuda.max_memory_allocated minus the memory allocated before the call.

examples:
  flowkit bench --out runs/bench
  flowkit bench --quick --out runs/bench-quick        # a few seconds, tiny configurations
  python -m flowkit.app.bench --sections bernoulli

Layout: measure.py (timing, the table), models.py (what is measured), sections.py (one
function per section), memory.py (peak-memory probes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

import flowkit
from flowkit.app.bench import sections as _sections
from flowkit.app.bench.measure import Bench, format_table
from flowkit.app.options import positive_int
from flowkit.train import resolve_device

SECTIONS = ("density", "sampling", "bernoulli", "staircase", "mnist", "memory", "compare")

# name -> (features, hidden, layers, batch); bernoulli: name -> (features, hidden, samples)
FLOWS = {
    "full": {"D=2": (2, (64, 64), 5, 4096), "D=64": (64, (512, 512), 5, 1024)},
    "quick": {"D=2": (2, (16, 16), 2, 256), "D=8": (8, (32, 32), 2, 64)},
}
# staircase: name -> (features, hidden, layers, batch, training batch, direct connection)
STAIRCASE = {
    "full": {"D=64": (64, (512, 512), 5, 1024, 512, False),
             "D=784": (784, (2000,), 1, 1000, 100, True)},
    "quick": {"D=16": (16, (64, 64), 2, 64, 32, False), "D=24": (24, (48,), 1, 32, 16, True)},
}
# mnist: name -> (hidden, batch, timed steps per round, steps of the NLL runs)
MNIST = {"full": {"h=2000": ((2000,), 100, 10, 300), "h=8000": ((8000,), 100, 4, 100)}}
BERNOULLI = {
    "full": {"h=500": (784, (500,), 100), "h=2000x2000": (784, (2000, 2000), 100)},
    "quick": {"h=32": (24, (32,), 10), "h=64x64": (24, (64, 64), 10)},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="tiny configurations and 2 repeats: a smoke test of a few seconds; "
                             "--sections, --repeats and --naive-repeats, when given, win")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=None,
                        help="what to run (default: all; --quick leaves out mnist, memory and "
                             "compare); memory is not a section of its own: it adds the peak "
                             "memory of the other sections' calls")
    parser.add_argument("--repeats", type=positive_int, default=None,
                        help="rounds per measurement (default: 9, --quick: 2)")
    parser.add_argument("--naive-repeats", type=positive_int, default=None,
                        help="rounds of the slow naive references (default: 3, --quick: 1)")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--mnist-data", type=Path, default=None,
                        help="binarized MNIST .npz with 'train' and 'valid' arrays for the "
                             "mnist section (default: the data root, see flowkit.data)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write the results (default: <out>/bench.json)")


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    size = "quick" if args.quick else "full"
    sections = args.sections or [s for s in SECTIONS
                                 if not args.quick or s not in ("mnist", "memory", "compare")]
    if sections == ["memory"]:
        raise ValueError(
            "'--sections memory' measures the memory of the other sections' calls: name at "
            "least one more, e.g. --sections density memory"
        )
    device = resolve_device(args.device)
    bench = Bench(
        device=device,
        repeats=args.repeats or (2 if args.quick else 9),
        naive_repeats=args.naive_repeats or (1 if args.quick else 3),
        memory="memory" in sections,
        seed=args.seed,
        say=(lambda *a: None) if args.quiet else print,
        mnist_data=args.mnist_data,
    )
    started = time.time()
    load = [os.getloadavg()[0]]
    for section in sections:
        if section == "memory":  # not a section of its own: the peaks of the others' calls
            continue
        configs = {"bernoulli": BERNOULLI, "staircase": STAIRCASE, "mnist": MNIST}.get(
            section, FLOWS)
        if section == "mnist" and size == "quick":
            bench.say("    mnist: no quick configuration (a training run on MNIST), skipped")
            continue
        for name, config in configs[size].items():
            getattr(_sections, section)(bench, name, *config)
    load.append(os.getloadavg()[0])
    record = {
        "machine": {
            "torch": torch.__version__, "flowkit": flowkit.__version__,
            "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "threads": torch.get_num_threads(), "device": str(device),
            "load_average_start_end": load,
        },
        "settings": {"size": size, "sections": sections, "repeats": bench.repeats,
                     "clock": "wall" if device.type == "cuda" else "process CPU",
                     "naive_repeats": bench.naive_repeats, "seed": args.seed},
        "seconds": round(time.time() - started, 1),
        "rows": bench.rows,
    }
    table = format_table(bench.rows, cuda=bench.cuda)
    print(table)  # the results, also with --quiet (no progress lines)
    path = args.json or Path(args.out) / "bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    return {"json": str(path), **{
        f"{r['section']}/{r['config']}/{r['what']}": r["ratio"] for r in bench.rows
        if r["ratio"] is not None
    }}
