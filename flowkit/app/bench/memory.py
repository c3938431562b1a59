"""Peak memory of one call, in a fresh process on the CPU (Linux) or from the CUDA allocator."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import flowkit
from flowkit.app.bench.models import (
    adam_step,
    bernoulli_calls,
    dense_products,
    densify,
    make_bernoulli,
    make_flow,
    sampling_calls,
)
from flowkit.validation import validate_values


def peak_memory(probe: dict, device: torch.device) -> float:
    """Peak memory in MB of one call described by ``probe`` (see :func:`probe_call`); on the
    CPU in a subprocess, so that earlier calls do not hide the peak."""
    if device.type == "cuda":
        return probe_call(probe, device)
    code = ("import json, sys, torch; from flowkit.app.bench.memory import probe_call; "
            "torch.set_num_threads(int(sys.argv[2])); "
            "print(json.dumps(probe_call(json.loads(sys.argv[1]), torch.device('cpu'))))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(probe),
                          str(torch.get_num_threads())],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe_call(probe: dict, device: torch.device) -> float:
    """Build what ``probe`` describes, then run its call once: the rise of the peak memory in
    MB (resident set on CPU, allocated tensors on CUDA) over the state after building."""
    fn = _call(probe, device)
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


def _call(probe: dict, device: torch.device) -> Callable[[], object]:
    probe = {**probe, "hidden": tuple(probe["hidden"])}
    if probe["kind"] == "bernoulli":
        model = make_bernoulli(probe, device)
        return bernoulli_calls(model, probe["samples"], probe["seed"])[probe["call"]]
    if probe["kind"] == "mnist":
        return _mnist_step(probe, device)
    if probe["kind"] not in ("density", "staircase"):
        flow, x = make_flow(probe["kind"], probe, device)
        return sampling_calls(probe["kind"], flow, x)[probe["call"]]
    flow, x = make_flow("maf", probe, device)
    if probe["kind"] == "staircase":  # calls end in " unmasked" (MLPs), " dense" or neither
        target = {"unmasked": densify, "dense": dense_products}.get(
            probe["call"].rsplit(" ", 1)[-1], lambda f: f)(flow)
        x = x[: probe["train_batch"]] if probe["call"].startswith("train") else x
    else:
        target = densify(flow) if probe["call"].endswith("dense") else flow
    if probe["call"].startswith("train"):
        return adam_step(target, x, 1e-5)

    def fn() -> None:
        with torch.no_grad(), validate_values(probe["call"].endswith("on")):
            target.log_prob(x)
    return fn


def _mnist_step(probe: dict, device: torch.device) -> Callable[[], object]:
    """One Adam step of a Bernoulli-MADE (direct connection) on a batch of random bits."""
    model = flowkit.BernoulliMADE(784, probe["hidden"], direct_connection=True,
                                  seed=probe["seed"]).to(device)
    if probe["call"].endswith("dense"):
        model.made.product = "dense"
    x = torch.randint(0, 2, (probe["batch"], 784), device=device).float()
    return adam_step(model, x, 1e-3)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")
