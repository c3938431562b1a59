"""The sections of the suite: one function each, ``section(bench, config, *shape)``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import flowkit
from flowkit.app.bench.measure import Bench, speed
from flowkit.app.bench.models import (
    bernoulli_calls,
    densify,
    make_bernoulli,
    make_flow,
    naive_solver,
    peer_flows,
    sampling_calls,
)
from flowkit.validation import validate_values


def density(bench: Bench, config: str, features: int, hidden: tuple[int, ...], layers: int,
            batch: int) -> None:
    """MAF log_prob and an Adam step against the same flow with unmasked MLPs."""
    spec = dict(features=features, hidden=hidden, layers=layers, batch=batch, seed=bench.seed)
    flow, x = make_flow("maf", spec, bench.device)
    dense = densify(flow)
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
    bench.measure("density", config, calls, reference, probes=probes)


def sampling(bench: Bench, config: str, features: int, hidden: tuple[int, ...], layers: int,
             batch: int) -> None:
    """The solving directions (MAF sampling, IAF density of outside points) against one pass
    in the cheap direction and against the naive solver."""
    spec = dict(features=features, hidden=hidden, layers=layers, batch=batch, seed=bench.seed)
    for kind in ("maf", "iaf"):
        flow, x = make_flow(kind, spec, bench.device)
        calls = sampling_calls(kind, flow, x)
        one, fast, naive = list(calls)
        with torch.no_grad(), validate_values(False):
            torch.manual_seed(0)
            a = calls[fast]()
            with naive_solver(flow):
                torch.manual_seed(0)
                b = calls[fast]()
        probes = {name: {**spec, "kind": kind, "call": name} for name in calls}
        naive_call = calls.pop(naive)
        bench.measure("sampling", config, calls, {fast: one}, probes=probes)
        stats = bench.measure("sampling", config, {naive: naive_call}, {},
                              repeats=bench.naive_repeats, probes=probes)
        row = next(r for r in bench.rows if r["config"] == config and r["what"] == fast)
        row["vs_naive"] = stats[naive]["ms"] / row["ms"]
        row["max_abs_diff_vs_naive"] = (a - b).abs().max().item()
        bench.say(f"    {fast}: {speed(1 / row['vs_naive'])} than naive, "
                  f"max |difference| {row['max_abs_diff_vs_naive']:.2e}")


def bernoulli(bench: Bench, config: str, features: int, hidden: tuple[int, ...],
              samples: int) -> None:
    """BernoulliMADE sampling against the naive sampler (same noise, same samples)."""
    spec = dict(features=features, hidden=hidden, samples=samples, seed=bench.seed)
    model = make_bernoulli(spec, bench.device)
    calls = bernoulli_calls(model, samples, bench.seed)
    same = torch.equal(calls["sample"](), calls["sample, naive"]())
    naive = calls.pop("sample, naive")
    probes = {name: {**spec, "kind": "bernoulli", "call": name}
              for name in ("sample", "sample, naive")}
    stats = bench.measure("bernoulli", config, calls, {"sample, cold": "sample"}, probes=probes)
    naive_stats = bench.measure("bernoulli", config, {"sample, naive": naive}, {},
                                repeats=bench.naive_repeats, probes=probes)
    for row in bench.rows[-3:-1]:
        row["vs_naive"] = naive_stats["sample, naive"]["ms"] / row["ms"]
        row["identical_to_naive"] = same
    ratio = stats["sample"]["ms"] / naive_stats["sample, naive"]["ms"]
    bench.say(f"    sample: {speed(ratio)} than naive, identical samples: {same}")


def compare(bench: Bench, config: str, features: int, hidden: tuple[int, ...], layers: int,
            batch: int) -> None:
    """nflows' and zuko's MAFs of the same shape, where installed."""
    spec = dict(features=features, hidden=hidden, layers=layers, batch=batch, seed=bench.seed)
    flow, x = make_flow("maf", spec, bench.device)
    peers = peer_flows(spec, bench.device)
    if not peers:
        bench.say("    compare: neither nflows nor zuko is installed, skipped")
        return

    def ours_log_prob() -> Tensor:
        with torch.no_grad(), validate_values(False):
            return flow.log_prob(x)

    def ours_sample() -> Tensor:
        with validate_values(False):
            return flow.sample(batch)

    calls: dict[str, Callable[[], object]] = {"flowkit log_prob": ours_log_prob}
    reference = {}
    for lib, (log_prob, _) in peers.items():
        calls[f"{lib} log_prob"] = log_prob(x)
        reference[f"{lib} log_prob"] = "flowkit log_prob"
    bench.measure("compare", config, calls, reference)
    calls = {"flowkit sample": ours_sample}
    reference = {}
    for lib, (_, sample) in peers.items():
        calls[f"{lib} sample"] = sample(batch)
        reference[f"{lib} sample"] = "flowkit sample"
    bench.measure("compare", config, calls, reference, repeats=bench.naive_repeats)
