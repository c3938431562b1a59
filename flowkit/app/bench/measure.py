"""Timing: interleaved rounds, medians and quartiles, one wording for ratios, the table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def timed(fn: Callable[[], object], cuda: bool) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one call; on CUDA the wall time between two
    synchronizations."""
    if cuda:
        torch.cuda.synchronize()
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.process_time() - cpu, time.perf_counter() - wall


def summary(times: list[tuple[float, float]], cuda: bool) -> dict[str, float]:
    """Median and quartiles in ms of the CPU time (of the wall time on CUDA)."""
    ms = sorted(t[1 if cuda else 0] * 1e3 for t in times)
    q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [ms[0]] * 3
    return {
        "ms": statistics.median(ms), "q1_ms": q[0], "q3_ms": q[2], "min_ms": ms[0],
        "max_ms": ms[-1], "cpu_ms": statistics.median(t[0] * 1e3 for t in times),
        "wall_ms": statistics.median(t[1] * 1e3 for t in times), "n": len(ms),
    }


def speed(ratio: float) -> str:
    """The one wording of a time ratio ``time / reference time``: ``"2.50x faster"`` when the
    call takes less time than its reference, ``"1.20x slower"`` when it takes more."""
    return f"{1 / ratio:.2f}x faster" if ratio <= 1 else f"{ratio:.2f}x slower"


class Bench:
    """Measurements of one run: :meth:`measure` times calls and appends one row per call."""

    def __init__(self, device: torch.device, repeats: int, naive_repeats: int, memory: bool,
                 seed: int, say: Callable[..., None], mnist_data: Path | None = None):
        self.device, self.repeats, self.naive_repeats = device, repeats, naive_repeats
        self.memory, self.seed, self.say = memory, seed, say
        self.mnist_data = mnist_data  # an .npz with 'train' and 'valid', else the data root
        self.rows: list[dict[str, Any]] = []

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def measure(self, section: str, config: str, calls: dict[str, Callable[[], object]],
                reference: dict[str, str], repeats: int | None = None,
                probes: dict[str, dict] | None = None) -> dict[str, dict]:
        """Time ``calls`` in interleaved rounds (one warm-up call each first); a row whose name
        is a key of ``reference`` gets ``ratio = time / time of reference[name]``. ``probes``
        describe calls for the peak-memory probe (:mod:`flowkit.app.bench.memory`)."""
        from flowkit.app.bench.memory import peak_memory

        for fn in calls.values():
            fn()
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
        for _ in range(repeats or self.repeats):
            for name, fn in calls.items():
                times[name].append(timed(fn, self.cuda))
        stats = {name: summary(t, self.cuda) for name, t in times.items()}
        for name, s in stats.items():
            ref = reference.get(name)
            row = {"section": section, "config": config, "what": name, **s,
                   "reference": ref, "ratio": s["ms"] / stats[ref]["ms"] if ref else None,
                   "peak_mb": None}
            if self.memory and probes and name in probes:
                row["peak_mb"] = peak_memory(probes[name], self.device)
            self.rows.append(row)
            self.say(format_row(row))
        return stats


def format_row(row: dict) -> str:
    """One progress line: section, config, call, median [quartiles], peak memory, ratio."""
    ratio = "" if row["ratio"] is None else f"{speed(row['ratio'])} than {row['reference']}"
    memory = "" if row["peak_mb"] is None else f"{row['peak_mb']:8.1f} MB"
    return (f"  {row['section']:9s} {row['config']:12s} {row['what']:26s} {row['ms']:10.2f} ms "
            f"[{row['q1_ms']:.2f}, {row['q3_ms']:.2f}] {memory} {ratio}")


def format_table(rows: list[dict], cuda: bool = False) -> str:
    """A Markdown table of the results (times: CPU ms, or wall ms on CUDA)."""
    lines = [
        f"| section | config | call | {'wall' if cuda else 'CPU'} ms (median) | IQR "
        "| vs reference | reference | vs naive | peak MB |",
        "|---|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        ratio = "" if r["ratio"] is None else speed(r["ratio"])
        vs_naive = "" if "vs_naive" not in r else speed(1 / r["vs_naive"])
        peak = "" if r["peak_mb"] is None else f"{r['peak_mb']:.1f}"
        lines.append(
            f"| {r['section']} | {r['config']} | {r['what']} | {r['ms']:.2f} | "
            f"{r['q1_ms']:.2f}-{r['q3_ms']:.2f} | {ratio} | {r['reference'] or ''} | "
            f"{vs_naive} | {peak} |"
        )
    return "\n".join(lines)
