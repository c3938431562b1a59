"""Benchmarks: masked networks at dense speed, autoregressive sampling at about one pass.

Sections (--sections, all by default):
  density    MAF log_prob and an Adam training step vs the same flow with unmasked MLPs
             (the arithmetic floor), D=2 (hidden 64x2, 5 layers, batch 4096) and D=64 (hidden
             512x2, 5 layers, batch 1024); log_prob with the NaN/Inf check of the inputs off and on.
  sampling   MAF sampling and IAF density of outside points (both solve D equations per layer)
             vs (a) one pass of the same model in its cheap direction (MAF log_prob, IAF
             sample_and_log_prob) and (b) the same call with the naive D-pass solver.
  bernoulli  BernoulliMADE sampling of 100 vectors of 784 dims (hidden 500 and 2000x2000) vs
             the naive sampler, same noise, same samples; "cold" is the first call after a
             weight update (the sorted weights are rebuilt), the others reuse them.
  memory     peak memory of each measured call (see below).
  compare    nflows and zuko on the density/sampling configurations, if they are installed.

Every time is the median over --repeats interleaved rounds, with the interquartile range, of
the process CPU time on the CPU (the machine may be shared: CPU time does not count the time the
process waits for a core; wall times are in the JSON too; with --threads 1, the default, that is
the work done) and of the wall time between two torch.cuda.synchronize() calls on CUDA (where
the host's CPU time only counts launching and waiting). Every speed is also a ratio to a
reference measured in the same run. Memory is what the first call adds at its peak, in a fresh
process after building the model and inputs, so it
includes what the call keeps for the next ones (cached masked and sorted weights, an optimizer's
state): on CPU the peak resident set size (VmHWM, reset through /proc/self/clear_refs, Linux)
minus the resident size before the call, in a subprocess per call; on CUDA the peak of
torch.cuda.max_memory_allocated minus the memory allocated before the call.

examples:
  flowkit bench --out runs/bench
  flowkit bench --quick --out runs/bench-quick        # a few seconds, tiny configurations
  python -m flowkit.app.bench --sections bernoulli
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import Tensor, nn

import flowkit
from flowkit.distributions import discrete
from flowkit.nn.inversion import solve_naive, solve_naive_with_params
from flowkit.train import resolve_device
from flowkit.transforms import autoregressive
from flowkit.validation import validate_values

SECTIONS = ("density", "sampling", "bernoulli", "memory", "compare")

# name -> (features, hidden, layers, batch); bernoulli: name -> (features, hidden, samples)
FLOWS = {
    "full": {"D=2": (2, (64, 64), 5, 4096), "D=64": (64, (512, 512), 5, 1024)},
    "quick": {"D=2": (2, (16, 16), 2, 256), "D=8": (8, (32, 32), 2, 64)},
}
BERNOULLI = {
    "full": {"h=500": (784, (500,), 100), "h=2000x2000": (784, (2000, 2000), 100)},
    "quick": {"h=32": (24, (32,), 10), "h=64x64": (24, (64, 64), 10)},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="tiny configurations and 2 repeats: a smoke test of a few seconds")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=None,
                        help="what to run (default: all; --quick leaves out memory and compare)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="rounds per measurement (default: 9, --quick: 2)")
    parser.add_argument("--naive-repeats", type=int, default=None,
                        help="rounds of the slow naive references (default: 3, --quick: 1)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write the results (default: <out>/bench.json)")


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    size = "quick" if args.quick else "full"
    sections = args.sections or [s for s in SECTIONS
                                 if not args.quick or s not in ("memory", "compare")]
    device = resolve_device(args.device)
    bench = _Bench(
        device=device,
        repeats=args.repeats or (2 if args.quick else 9),
        naive_repeats=args.naive_repeats or (1 if args.quick else 3),
        memory="memory" in sections,
        seed=args.seed,
        say=(lambda *a: None) if args.quiet else print,
    )
    started = time.time()
    load = [os.getloadavg()[0]]
    if "density" in sections:
        for name, config in FLOWS[size].items():
            bench.density(name, *config)
    if "sampling" in sections:
        for name, config in FLOWS[size].items():
            bench.sampling(name, *config)
    if "bernoulli" in sections:
        for name, config in BERNOULLI[size].items():
            bench.bernoulli(name, *config)
    if "compare" in sections:
        for name, config in FLOWS[size].items():
            bench.compare(name, *config)
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
    table = format_table(bench.rows, cuda=device.type == "cuda")
    bench.say(table)
    path = args.json or Path(args.out) / "bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    bench.say(f"wrote {path}")
    return {"json": str(path), **{
        f"{r['section']}/{r['config']}/{r['what']}": r["ratio"] for r in bench.rows
        if r["ratio"] is not None
    }}


# --------------------------------------------------------------------------- measuring

def _timed(fn: Callable[[], object], cuda: bool) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one call."""
    if cuda:
        torch.cuda.synchronize()
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.process_time() - cpu, time.perf_counter() - wall


def _summary(times: list[tuple[float, float]], cuda: bool) -> dict[str, float]:
    """Median and quartiles in ms of the CPU time (of the wall time on CUDA)."""
    ms = sorted(t[1 if cuda else 0] * 1e3 for t in times)
    q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [ms[0]] * 3
    return {
        "ms": statistics.median(ms), "q1_ms": q[0], "q3_ms": q[2], "min_ms": ms[0],
        "max_ms": ms[-1], "cpu_ms": statistics.median(t[0] * 1e3 for t in times),
        "wall_ms": statistics.median(t[1] * 1e3 for t in times), "n": len(ms),
    }


class _Bench:
    def __init__(self, device: torch.device, repeats: int, naive_repeats: int, memory: bool,
                 seed: int, say: Callable[..., None]):
        self.device, self.repeats, self.naive_repeats = device, repeats, naive_repeats
        self.memory, self.seed, self.say = memory, seed, say
        self.rows: list[dict[str, Any]] = []

    def measure(self, section: str, config: str, calls: dict[str, Callable[[], object]],
                reference: dict[str, str], repeats: int | None = None,
                probes: dict[str, dict] | None = None) -> dict[str, dict]:
        """Time ``calls`` in interleaved rounds (one warm-up call each first); each row gets
        ``ratio = time / time of reference[name]``."""
        cuda = self.device.type == "cuda"
        for fn in calls.values():
            fn()
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
        for _ in range(repeats or self.repeats):
            for name, fn in calls.items():
                times[name].append(_timed(fn, cuda))
        stats = {name: _summary(t, cuda) for name, t in times.items()}
        for name, s in stats.items():
            ref = reference.get(name)
            row = {"section": section, "config": config, "what": name, **s,
                   "reference": ref, "ratio": s["ms"] / stats[ref]["ms"] if ref else None,
                   "peak_mb": None}
            if self.memory and probes and name in probes:
                row["peak_mb"] = _peak_memory(probes[name], self.device)
            self.rows.append(row)
            self.say(_format_row(row))
        return stats

    # ----------------------------------------------------------------------- sections

    def density(self, config: str, features: int, hidden: tuple[int, ...], layers: int,
                batch: int) -> None:
        spec = dict(features=features, hidden=hidden, layers=layers, batch=batch,
                    seed=self.seed)
        flow, x = _flow("maf", spec, self.device)
        dense = _densify(flow)
        optimizers = {f: torch.optim.Adam(f.parameters(), lr=1e-5) for f in (flow, dense)}

        def log_prob(f: flowkit.Flow, checks: bool) -> Callable[[], Tensor]:
            def call() -> Tensor:
                with torch.no_grad(), validate_values(checks):
                    return f.log_prob(x)
            return call

        def train(f: flowkit.Flow) -> Callable[[], float]:
            def call() -> float:
                with validate_values(False):
                    loss = -f.log_prob(x).mean()
                optimizers[f].zero_grad()
                loss.backward()
                optimizers[f].step()
                return 0.0
            return call

        calls = {
            "log_prob dense": log_prob(dense, False),
            "log_prob": log_prob(flow, False),
            "log_prob, checks on": log_prob(flow, True),
            "train step dense": train(dense),
            "train step": train(flow),
        }
        reference = {"log_prob": "log_prob dense", "log_prob, checks on": "log_prob dense",
                     "train step": "train step dense"}
        probes = {name: {**spec, "kind": "density", "call": name} for name in calls}
        self.measure("density", config, calls, reference, probes=probes)

    def sampling(self, config: str, features: int, hidden: tuple[int, ...], layers: int,
                 batch: int) -> None:
        spec = dict(features=features, hidden=hidden, layers=layers, batch=batch,
                    seed=self.seed)
        for kind in ("maf", "iaf"):
            flow, x = _flow(kind, spec, self.device)
            calls = _sampling_calls(kind, flow, x)
            one, fast, naive = list(calls)
            with torch.no_grad(), validate_values(False):
                torch.manual_seed(0)
                a = calls[fast]()
                with _naive_solvers():
                    torch.manual_seed(0)
                    b = calls[fast]()
            probes = {name: {**spec, "kind": kind, "call": name} for name in calls}
            naive_call = calls.pop(naive)
            self.measure("sampling", config, calls, {fast: one}, probes=probes)
            stats = self.measure("sampling", config, {naive: naive_call}, {},
                                 repeats=self.naive_repeats, probes=probes)
            fast_row = next(r for r in self.rows if r["config"] == config and r["what"] == fast)
            fast_row["vs_naive"] = stats[naive]["ms"] / fast_row["ms"]
            fast_row["max_abs_diff_vs_naive"] = (a - b).abs().max().item()
            self.say(f"    {fast}: {fast_row['vs_naive']:.1f}x faster than naive, "
                     f"max |difference| {fast_row['max_abs_diff_vs_naive']:.2e}")

    def bernoulli(self, config: str, features: int, hidden: tuple[int, ...],
                  samples: int) -> None:
        spec = dict(features=features, hidden=hidden, samples=samples, seed=self.seed)
        model = _bernoulli(spec, self.device)
        calls = _bernoulli_calls(model, samples, self.seed)
        same = torch.equal(calls["sample"](), calls["sample, naive"]())
        naive = calls.pop("sample, naive")
        probes = {name: {**spec, "kind": "bernoulli", "call": name}
                  for name in ("sample", "sample, naive")}
        stats = self.measure("bernoulli", config, calls, {"sample, cold": "sample"},
                             probes=probes)
        naive_stats = self.measure("bernoulli", config, {"sample, naive": naive}, {},
                                   repeats=self.naive_repeats, probes=probes)
        for row in self.rows[-3:-1]:
            row["vs_naive"] = naive_stats["sample, naive"]["ms"] / row["ms"]
            row["identical_to_naive"] = same
        self.say(f"    sample: {naive_stats['sample, naive']['ms'] / stats['sample']['ms']:.1f}x "
                 f"faster than naive, identical samples: {same}")

    def compare(self, config: str, features: int, hidden: tuple[int, ...], layers: int,
                batch: int) -> None:
        spec = dict(features=features, hidden=hidden, layers=layers, batch=batch,
                    seed=self.seed)
        flow, x = _flow("maf", spec, self.device)
        others = _other_libraries(spec, self.device)
        if not others:
            self.say("    compare: neither nflows nor zuko is installed, skipped")
            return
        calls: dict[str, Callable[[], object]] = {}

        def ours_log_prob() -> Tensor:
            with torch.no_grad(), validate_values(False):
                return flow.log_prob(x)

        def ours_sample() -> Tensor:
            with validate_values(False):
                return flow.sample(batch)

        calls["flowkit log_prob"] = ours_log_prob
        reference = {}
        for lib, (log_prob, _) in others.items():
            calls[f"{lib} log_prob"] = log_prob(x)
            reference[f"{lib} log_prob"] = "flowkit log_prob"
        self.measure("compare", config, calls, reference)
        calls = {"flowkit sample": ours_sample}
        reference = {}
        for lib, (_, sample) in others.items():
            calls[f"{lib} sample"] = sample(batch)
            reference[f"{lib} sample"] = "flowkit sample"
        self.measure("compare", config, calls, reference, repeats=self.naive_repeats)


# --------------------------------------------------------------------------- models

def _flow(kind: str, spec: dict, device: torch.device) -> tuple[flowkit.Flow, Tensor]:
    """A MAF or IAF with non-trivial weights (not the identity it starts as) and data."""
    builder = flowkit.MAF if kind == "maf" else flowkit.IAF
    flow = builder(spec["features"], layers=spec["layers"], hidden_features=spec["hidden"],
                   seed=spec["seed"]).to(device)
    generator = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for module in flow.modules():
            if isinstance(module, autoregressive.MaskedAutoregressive):
                w = module.made.output.weight
                w.copy_(torch.randn(w.shape, generator=generator) * 0.01)
    x = torch.randn(spec["batch"], spec["features"], generator=generator).to(device)
    return flow, x


class _DenseMLP(nn.Module):
    """A MADE's network without its masks: same shapes and weights, dense arithmetic."""

    def __init__(self, made: flowkit.MADE):
        super().__init__()
        self.shape = (made.features, made.params_per_feature)
        self.activation = made.activation
        self.hidden = nn.ModuleList(_linear(layer) for layer in made.hidden)
        self.output = _linear(made.output)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        h = x if context is None else torch.cat([x, context], dim=-1)
        for layer in self.hidden:
            h = self.activation(layer(h))
        return self.output(h).unflatten(-1, self.shape)


def _linear(masked: nn.Linear) -> nn.Linear:
    layer = nn.Linear(masked.in_features, masked.out_features, device=masked.weight.device)
    layer.load_state_dict({"weight": masked.weight, "bias": masked.bias})
    return layer


def _densify(flow: flowkit.Flow) -> flowkit.Flow:
    """A copy of ``flow`` whose conditioners are dense MLPs (not a valid flow: a timing floor)."""
    dense = copy.deepcopy(flow)
    for module in dense.modules():
        if isinstance(module, autoregressive.MaskedAutoregressive):
            module.made = _DenseMLP(module.made)
    return dense


@contextmanager
def _naive_solvers() -> Iterator[None]:
    """Within the block, the flow layers and the discrete models solve with the naive D-pass
    reference (:func:`~flowkit.nn.inversion.solve_naive`) instead of the incremental solver:
    the same calls, same noise and same code path but for the solver. The modules take no
    solver argument, so their module-level names are swapped for the block."""
    with (
        mock.patch.object(autoregressive, "solve_with_params", solve_naive_with_params),
        mock.patch.object(discrete, "solve", solve_naive),
    ):
        yield


def _sampling_calls(kind: str, flow: flowkit.Flow, x: Tensor) -> dict[str, Callable[[], Tensor]]:
    """(one pass in the cheap direction, the solving call, the solving call with the naive
    solver) for a MAF (sampling) or an IAF (density of points it did not sample)."""
    n = x.shape[0]

    def no_checks(fn: Callable[[], Tensor]) -> Callable[[], Tensor]:
        def call() -> Tensor:
            with torch.no_grad(), validate_values(False):
                return fn()
        return call

    def naive(fn: Callable[[], Tensor]) -> Callable[[], Tensor]:
        def call() -> Tensor:
            with _naive_solvers():
                return fn()
        return call

    if kind == "maf":
        one, solved = no_checks(lambda: flow.log_prob(x)), no_checks(lambda: flow.sample(n))
        return {"MAF log_prob": one, "MAF sample": solved, "MAF sample, naive": naive(solved)}
    one = no_checks(lambda: flow.sample_and_log_prob(n)[1])
    solved = no_checks(lambda: flow.log_prob(x))
    return {"IAF sample_and_log_prob": one, "IAF log_prob": solved,
            "IAF log_prob, naive": naive(solved)}


def _bernoulli(spec: dict, device: torch.device) -> discrete.BernoulliMADE:
    model = discrete.BernoulliMADE(spec["features"], spec["hidden"], seed=spec["seed"]).to(device)
    generator = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        w = model.made.output.weight
        w.copy_(torch.randn(w.shape, generator=generator) / w.shape[1] ** 0.5)
    return model


def _bernoulli_calls(model: discrete.BernoulliMADE, samples: int,
                     seed: int) -> dict[str, Callable[[], Tensor]]:
    device = model.made.output.weight.device

    def sample() -> Tensor:
        return model.sample(samples, generator=torch.Generator(device).manual_seed(seed))

    def cold() -> Tensor:
        with torch.no_grad():  # an in-place update, as an optimizer step would make
            model.made.output.weight.add_(0.0)
        return sample()

    def naive() -> Tensor:
        with _naive_solvers():
            return sample()

    return {"sample": sample, "sample, cold": cold, "sample, naive": naive}


def _other_libraries(spec: dict, device: torch.device) -> dict[str, tuple[Callable, Callable]]:
    """``{library: (log_prob(x) -> call, sample(n) -> call)}`` for the installed ones, MAFs of
    the same shape (affine layers, reversed orderings, ReLU MADEs without residual blocks)."""
    out: dict[str, tuple[Callable, Callable]] = {}
    features, hidden, layers = spec["features"], spec["hidden"], spec["layers"]
    try:
        import zuko
    except ImportError:
        pass
    else:
        flow = zuko.flows.MAF(features, transforms=layers, hidden_features=hidden).to(device)
        out["zuko"] = (
            lambda x: _no_grad(lambda: flow().log_prob(x)),
            lambda n: _no_grad(lambda: flow().sample((n,))),
        )
    try:
        from nflows import distributions, flows, transforms
    except ImportError:
        pass
    else:
        steps = []
        for _ in range(layers):
            steps += [
                transforms.MaskedAffineAutoregressiveTransform(
                    features, hidden[0], num_blocks=len(hidden) - 1,
                    use_residual_blocks=False),
                transforms.ReversePermutation(features),
            ]
        nf = flows.Flow(transforms.CompositeTransform(steps[:-1]),
                        distributions.StandardNormal([features])).to(device)
        out["nflows"] = (
            lambda x: _no_grad(lambda: nf.log_prob(x)),
            lambda n: _no_grad(lambda: nf.sample(n)),
        )
    return out


def _no_grad(fn: Callable[[], Tensor]) -> Callable[[], Tensor]:
    def call() -> Tensor:
        with torch.no_grad():
            return fn()
    return call


# --------------------------------------------------------------------------- memory

def _peak_memory(probe: dict, device: torch.device) -> float:
    """Peak memory in MB of one call described by ``probe`` (see :func:`_probe`)."""
    if device.type == "cuda":
        return _probe(probe, device)
    code = ("import json, sys, torch; from flowkit.app.bench import _probe; "
            "torch.set_num_threads(int(sys.argv[2])); "
            "print(json.dumps(_probe(json.loads(sys.argv[1]), torch.device('cpu'))))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(probe),
                          str(torch.get_num_threads())],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _probe(probe: dict, device: torch.device) -> float:
    """Build what ``probe`` describes, then run its call once: the rise of the peak memory in
    MB (resident set on CPU, allocated tensors on CUDA) over the state after building."""
    probe = {**probe, "hidden": tuple(probe["hidden"])}
    if probe["kind"] == "density":
        flow, x = _flow("maf", probe, device)
        dense = _densify(flow)
        target = dense if probe["call"].endswith("dense") else flow
        optimizer = torch.optim.Adam(target.parameters(), lr=1e-5)

        def fn() -> None:
            if probe["call"].startswith("train"):
                with validate_values(False):
                    loss = -target.log_prob(x).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            else:
                with torch.no_grad(), validate_values(probe["call"].endswith("on")):
                    target.log_prob(x)
    elif probe["kind"] == "bernoulli":
        model = _bernoulli(probe, device)
        fn = _bernoulli_calls(model, probe["samples"], probe["seed"])[probe["call"]]
    else:
        flow, x = _flow(probe["kind"], probe, device)
        fn = _sampling_calls(probe["kind"], flow, x)[probe["call"]]
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    # Linux: writing 5 to clear_refs resets the peak resident set size (VmHWM) to the current
    # one (VmRSS), so the peak after the call minus the size before is what the call added.
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kb("VmRSS")
    fn()
    return (_status_kb("VmHWM") - before) / 1024


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


# --------------------------------------------------------------------------- output

def _format_row(row: dict) -> str:
    ratio = "" if row["ratio"] is None else f"{row['ratio']:7.2f}x {row['reference']}"
    memory = "" if row["peak_mb"] is None else f"{row['peak_mb']:8.1f} MB"
    return (f"  {row['section']:9s} {row['config']:12s} {row['what']:26s} {row['ms']:10.2f} ms "
            f"[{row['q1_ms']:.2f}, {row['q3_ms']:.2f}] {memory} {ratio}")


def format_table(rows: list[dict], cuda: bool = False) -> str:
    """A Markdown table of the results (times: CPU ms, or wall ms on CUDA)."""
    lines = [
        f"| section | config | call | {'wall' if cuda else 'CPU'} ms (median) | IQR | ratio "
        "| reference | vs naive | peak MB |",
        "|---|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        vs_naive = "" if "vs_naive" not in r else (
            f"{r['vs_naive']:.1f}x faster" if r["vs_naive"] >= 1 else
            f"{1 / r['vs_naive']:.1f}x slower"
        )
        peak = "" if r["peak_mb"] is None else f"{r['peak_mb']:.1f}"
        lines.append(
            f"| {r['section']} | {r['config']} | {r['what']} | {r['ms']:.2f} | "
            f"{r['q1_ms']:.2f}-{r['q3_ms']:.2f} | {ratio} | {r['reference'] or ''} | "
            f"{vs_naive} | {peak} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m flowkit.app.bench``: the same as ``flowkit bench``."""
    from flowkit.app.cli import add_common_arguments

    parser = argparse.ArgumentParser(
        prog="python -m flowkit.app.bench", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    add_common_arguments(parser, "bench")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
