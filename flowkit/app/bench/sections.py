"""The sections of the suite: one function each, ``section(bench, config, *shape)``."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor

import flowkit
from flowkit.app.bench.measure import Bench, speed
from flowkit.app.bench.models import (
    adam,
    adam_step,
    bernoulli_calls,
    dense_products,
    densify,
    make_bernoulli,
    make_flow,
    naive_solver,
    peer_flows,
    sampling_calls,
)
from flowkit.data import binarized_mnist, load_split_file
from flowkit.validation import validate_values


def train_step(flow: flowkit.Flow, x: Tensor) -> Callable[[], None]:
    """:func:`adam_step` (lr 1e-5) on a copy of ``flow``. The copy keeps the section's
    ``log_prob`` calls timing evaluation with weights that stay the same between calls, as in a
    user's evaluation loop (otherwise every ``log_prob`` round after a training round would
    rebuild the masked and sorted weights)."""
    return adam_step(copy.deepcopy(flow), x, 1e-5)


def density(bench: Bench, config: str, features: int, hidden: tuple[int, ...], layers: int,
            batch: int) -> None:
    """MAF log_prob and an Adam step against the same flow with unmasked MLPs."""
    spec = dict(features=features, hidden=hidden, layers=layers, batch=batch, seed=bench.seed)
    flow, x = make_flow("maf", spec, bench.device)
    dense = densify(flow)

    def log_prob(f: flowkit.Flow, checks: bool) -> Callable[[], Tensor]:
        def call() -> Tensor:
            with torch.no_grad(), validate_values(checks):
                return f.log_prob(x)
        return call

    calls = {
        "log_prob dense": log_prob(dense, False),
        "log_prob": log_prob(flow, False),
        "log_prob, checks on": log_prob(flow, True),
        "train step dense": train_step(dense, x),
        "train step": train_step(flow, x),
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
        reference = {fast: one}
        if bench.cuda and kind == "maf":  # the same call replayed from a CUDA graph
            graphed = f"{fast}, CUDA graph"
            calls[graphed], reference[graphed] = graph_call(flow, x.shape[0]), one
        bench.measure("sampling", config, calls, reference, probes=probes)
        stats = bench.measure("sampling", config, {naive: naive_call}, {},
                              repeats=bench.naive_repeats, probes=probes)
        row = next(r for r in bench.rows if r["config"] == config and r["what"] == fast)
        row["vs_naive"] = stats[naive]["ms"] / row["ms"]
        row["max_abs_diff_vs_naive"] = (a - b).abs().max().item()
        bench.say(f"    {fast}: {speed(1 / row['vs_naive'])} than naive, "
                  f"max |difference| {row['max_abs_diff_vs_naive']:.2e}")


def graph_call(model: torch.nn.Module, n: int) -> Callable[[], Tensor]:
    """``model.sample(n)`` replayed from a CUDA graph (:class:`flowkit.GraphedSampler`, on an
    eval-mode copy), without the value checks, as the eager calls it is compared with."""
    sampler = flowkit.GraphedSampler(copy.deepcopy(model).eval(), n)

    def call() -> Tensor:
        with validate_values(False):
            return sampler()
    return call


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
    reference = {"sample, cold": "sample"}
    if bench.cuda:
        calls["sample, CUDA graph"] = graph_call(model, samples)
        reference["sample, CUDA graph"] = "sample"
    stats = bench.measure("bernoulli", config, calls, reference, probes=probes)
    naive_stats = bench.measure("bernoulli", config, {"sample, naive": naive}, {},
                                repeats=bench.naive_repeats, probes=probes)
    for row in bench.rows[-len(calls) - 1:-1]:
        row["vs_naive"] = naive_stats["sample, naive"]["ms"] / row["ms"]
        if row["what"] != "sample, CUDA graph":  # the graph draws its own noise
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


def staircase(bench: Bench, config: str, features: int, hidden: tuple[int, ...], layers: int,
              batch: int, train_batch: int, direct: bool) -> None:
    """MAF log_prob and an Adam step with the block-staircase products (the default choice)
    against the dense masked products and the unmasked MLPs of the same shape."""
    spec = dict(features=features, hidden=hidden, layers=layers, batch=batch,
                direct=direct, seed=bench.seed)
    flow, x = make_flow("maf", spec, bench.device)
    flows = {"": flow, " dense": dense_products(flow), " unmasked": densify(flow)}

    def log_prob(f: flowkit.Flow) -> Callable[[], Tensor]:
        def call() -> Tensor:
            with torch.no_grad(), validate_values(False):
                return f.log_prob(x)
        return call

    def train(f: flowkit.Flow) -> Callable[[], None]:
        return train_step(f, x[:train_batch])

    calls, reference, probes = {}, {}, {}
    for what, make in (("log_prob", log_prob), (f"train step (batch {train_batch})", train)):
        for suffix, f in flows.items():
            calls[what + suffix] = make(f)
            probes[what + suffix] = {**spec, "kind": "staircase", "call": what + suffix,
                                     "train_batch": train_batch}
            if suffix != " unmasked":
                reference[what + suffix] = what + " unmasked"
    stats = bench.measure("staircase", config, calls, reference, probes=probes)
    for what in ("log_prob", f"train step (batch {train_batch})"):
        row = next(r for r in bench.rows[-len(calls):] if r["what"] == what)
        row["vs_dense"] = stats[what + " dense"]["ms"] / row["ms"]
        bench.say(f"    {what}: {speed(1 / row['vs_dense'])} than the dense masked products")


def mnist(bench: Bench, config: str, hidden: tuple[int, ...], batch: int, chunk: int,
          steps: int) -> None:
    """Bernoulli-MADE training on binarized MNIST (direct connection, Adam, lr 1e-3) with the
    default products against the dense masked products: the time of ``chunk`` steps (an epoch
    is ``50000 / batch`` steps), then the validation NLL of two runs of ``steps`` steps from
    the same seed, batches and initial weights, one with each kind of product."""
    try:
        data = [binarized_mnist(s, download=False) if bench.mnist_data is None
                else load_split_file(bench.mnist_data, s) for s in ("train", "valid")]
    except FileNotFoundError as error:
        bench.say(f"    mnist: no binarized MNIST data ({error}; pass --mnist-data), skipped")
        return
    train_x, valid_x = (d.to(bench.device, torch.float32) for d in data)
    model = flowkit.BernoulliMADE(784, hidden, direct_connection=True, seed=bench.seed)
    initial = copy.deepcopy(model.state_dict())
    models = {"": model.to(bench.device), " dense": dense_products(model)}

    def run(m: flowkit.BernoulliMADE, order: Tensor, start: int, count: int) -> None:
        optimizer = optimizers[m]
        for i in range(start, start + count):
            rows = order[(i * batch) % len(order):][:batch]
            with validate_values(False):
                loss = -m.log_prob(train_x[rows]).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    def timed_steps(m: flowkit.BernoulliMADE) -> Callable[[], None]:
        position = [0]

        def call() -> None:
            run(m, order, position[0], chunk)
            position[0] += chunk
        return call

    order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(bench.seed))
    order = order.to(bench.device)
    optimizers = {m: adam(m, 1e-3) for m in models.values()}
    what = f"{chunk} train steps (batch {batch})"
    calls = {what + suffix: timed_steps(m) for suffix, m in models.items()}
    probes = {name: {"kind": "mnist", "hidden": hidden, "batch": batch, "seed": bench.seed,
                     "call": name} for name in calls}
    bench.measure("mnist", config, calls, {what: what + " dense"}, probes=probes)

    nll = {}
    for suffix in models:
        fresh = flowkit.BernoulliMADE(784, hidden, direct_connection=True, seed=bench.seed)
        fresh.load_state_dict(initial)  # the same initial weights: only the products differ
        fresh = fresh.to(bench.device)
        fresh.made.product = "dense" if suffix else "auto"
        optimizers[fresh] = adam(fresh, 1e-3)
        run(fresh, order, 0, steps)
        with torch.no_grad(), validate_values(False):
            nll[suffix] = -torch.cat([fresh.log_prob(v) for v in valid_x.split(1000)]).mean()
    row = next(r for r in bench.rows[-2:] if r["what"] == what)
    row.update(epoch_s=row["ms"] * 50000 / batch / chunk / 1000, nll_steps=steps,
               valid_nll=nll[""].item(), valid_nll_dense=nll[" dense"].item())
    bench.say(f"    epoch about {row['epoch_s']:.0f} s; validation NLL after {steps} steps "
              f"{row['valid_nll']:.4f} (dense products {row['valid_nll_dense']:.4f}, "
              f"difference {abs(row['valid_nll'] - row['valid_nll_dense']):.2e} nats)")
