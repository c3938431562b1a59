"""Density estimation on the 2-D toy datasets with MAF and IAF flows (affine or spline layers).

Each flow is fitted by maximum likelihood on fresh samples drawn at every step, then scored by
its NLL on fresh test samples and, where the true density is known (8gaussians, checkerboard,
circles, rings), by KL(data || model) = test NLL - entropy(data).

Writes to --out: gallery.png (one row per dataset: truth or data histogram | model density |
model samples, for every flow), toy_<dataset>.png (one row each), losses.png (training NLL per
step, with the entropy where known), table.md (the NLL/KL table, then the wall time of each
flow's training, density and sampling), metrics.json and the trained flows,
models/<dataset>_<flow>_<transformer>.pt (flowkit.save_model files: flowkit.load_model reads them).
A rerun into an --out that holds these results is refused: pick another --out.

--sweep runs the robustness sweep instead: every selected dataset x flow x transformer at the
learning rates 1e-4, 1e-3 and 1e-2 for --steps steps, checking that the loss and the parameters
stay finite; it writes sweep.md.

examples:
  flowkit toy --datasets moons --flows maf --out runs/demo
  flowkit toy --out runs/toy                  (all 8 datasets, MAF spline: a few minutes)
  flowkit toy --quick --out runs/toy-quick    (seconds: the CI smoke test)
  flowkit toy --flows maf iaf --transformer affine spline --out runs/toy-all
  flowkit toy --sweep --flows maf iaf --transformer affine spline --steps 150 --out runs/sweep
The commands behind every table of docs/toy.md are listed there.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from flowkit.checkpoint import write_bytes_atomic
from flowkit.data import TOY_BOX, TOY_DATASETS, has_exact_density, sample_toy, toy_entropy
from flowkit.data import toy_log_prob as true_log_prob
from flowkit.flows import Flow
from flowkit.plot import Panel, grid_log_density
from flowkit.train import History, fit, resolve_device

from .common import count, mean_se, refuse_to_replace, use_threads
from .experiment2d import (
    QUICK,
    FlowSettings,
    Gallery,
    add_settings_arguments,
    add_target_arguments,
    announce_run,
    build_flow,
    check_selection,
    refuse_to_replace_gallery,
    run_label,
    runs_table,
    settings_from_args,
    timed,
)
from .toy_sweep import SWEEP_LRS, robustness_sweep, sweep_table

_TEST_SEED_OFFSET = 10_007  # test samples come from their own stream, never the training one


@dataclass
class ToyRun:
    """One flow fitted to one dataset: its metrics, history, trained model and what the figures
    show."""

    metrics: dict[str, Any]
    history: History
    model: Flow
    log_density: Tensor  # (R, R) on the plotting grid, on the CPU
    samples: Tensor  # (plot_samples, 2), on the CPU

    @property
    def label(self) -> str:
        return run_label(self.metrics["flow"], self.metrics["transformer"])

    def panels(self, vmax: float | None = None) -> list[Panel]:
        """Model density (titled with NLL and KL; colours up to ``vmax``, see :class:`Panel`)
        and model samples."""
        score = f"NLL {self.metrics['test_nll']:.3f}"
        if self.metrics["kl"] is not None:
            score += f"   KL {self.metrics['kl']:.3f}"
        density_title = f"{self.label} density\n{score}"
        return [
            Panel(density_title, TOY_BOX, log_density=self.log_density, vmax=vmax),
            Panel(f"{self.label} samples", TOY_BOX, samples=self.samples),
        ]


def fit_toy(
    dataset: str,
    flow: str,
    transformer: str,
    settings: FlowSettings,
    *,
    test: Tensor,
    device: torch.device,
    seed: int = 0,
    progress: bool = False,
) -> ToyRun:
    """Fit one flow to one dataset by maximum likelihood and evaluate it.

    Args:
        dataset: one of :data:`flowkit.data.TOY_DATASETS`.
        flow, transformer: see :func:`build_flow`.
        settings: the run's settings.
        test: ``(N, 2)`` fresh test samples on ``device``.
        device: where everything runs; the training batches are drawn there.
        seed: initial weights and training data.
        progress: show the fit loop's progress bar.

    Returns:
        The run. Its ``metrics``: ``test_nll`` (nats, mean over ``test``) and its standard
        error ``test_nll_se``; ``entropy`` and ``kl = test_nll - entropy`` (None without an
        exact density); ``train_s`` and ``ms_per_step`` (training wall time);
        ``density_ms_per_1k`` and ``sample_ms_per_1k`` (wall time of ``log_prob`` on ``test``
        and of drawing the plot samples, per 1000 points); ``parameters``.
    """
    model = build_flow(flow, transformer, settings, seed=seed).to(device)  # trained, scored there

    def sample(n: int, generator: torch.Generator) -> Tensor:
        return sample_toy(dataset, n, generator=generator)

    history = fit(
        model, sample, **settings.fit_options(), seed=seed, device=device, progress=progress
    )
    with torch.no_grad():
        log_q, density_s = timed(lambda: model.log_prob(test), device)
        samples, sample_s = timed(lambda: model.sample(settings.plot_samples), device)
    test_nll, test_nll_se = mean_se(-log_q)
    entropy = toy_entropy(dataset) if has_exact_density(dataset) else None
    metrics = {
        "dataset": dataset,
        "flow": flow,
        "transformer": transformer,
        "test_nll": test_nll,
        "test_nll_se": test_nll_se,
        "entropy": entropy,
        "kl": None if entropy is None else test_nll - entropy,
        "train_s": history.wall_time,
        "ms_per_step": 1e3 * history.wall_time / settings.steps,
        "density_ms_per_1k": 1e6 * density_s / test.shape[0],
        "sample_ms_per_1k": 1e6 * sample_s / settings.plot_samples,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    log_density = grid_log_density(model.log_prob, TOY_BOX, settings.resolution, device=device)
    return ToyRun(metrics, history, model, log_density.cpu(), samples.cpu())


def _truth_panel(dataset: str, test: Tensor, resolution: int) -> Panel:
    """The true density where known, else a histogram of the test samples."""
    if has_exact_density(dataset):
        log_p = grid_log_density(
            lambda x: true_log_prob(dataset, x), TOY_BOX, resolution, device=test.device
        )
        title = f"true density\nentropy {toy_entropy(dataset):.3f}"
        return Panel(title, TOY_BOX, log_density=log_p, vmax=float(log_p.max().exp()))
    title = f"data ({test.shape[0]:,} samples)\nno closed-form density"
    return Panel(title, TOY_BOX, samples=test, histogram=True)


def toy_table(records: Sequence[Mapping[str, Any]]) -> str:
    """The NLL/KL table of :func:`run_toy` records (see :func:`runs_table`)."""
    return runs_table(
        records,
        row_key="dataset",
        reference=("entropy", "entropy"),
        scores=[("NLL", "test_nll"), ("KL", "kl")],
    )


def cost_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of the wall times of each flow, averaged over the datasets: training
    (ms per step), density of the test points and sampling (ms per 1000 points)."""
    lines = [
        "| flow | train ms/step | log_prob ms/1k points | sample ms/1k points |",
        "|---|---|---|---|",
    ]
    for label in dict.fromkeys(run_label(r["flow"], r["transformer"]) for r in records):
        runs = [r for r in records if run_label(r["flow"], r["transformer"]) == label]
        means = [
            statistics.fmean(r[key] for r in runs)
            for key in ("ms_per_step", "density_ms_per_1k", "sample_ms_per_1k")
        ]
        lines.append(f"| {label} | " + " | ".join(f"{m:.1f}" for m in means) + " |")
    return "\n".join(lines) + "\n"


def run_toy(
    datasets: Sequence[str] = TOY_DATASETS,
    flows: Sequence[str] = ("maf",),
    transformers: Sequence[str] = ("spline",),
    settings: FlowSettings | None = None,
    *,
    out: str | Path | None = None,
    device: str | torch.device = "auto",
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Fit every ``flow x transformer`` to every dataset; with ``out``, write the figures
    (:func:`~flowkit.app.experiment2d.write_figures`), ``table.md`` (:func:`toy_table` and
    :func:`cost_table`) and each trained flow (:func:`~flowkit.app.experiment2d.save_flow`)
    there. With ``progress``, a line names each run before its progress bar
    (:func:`~flowkit.app.experiment2d.announce_run`).

    Returns:
        ``{"settings", "device", "wall_s", "runs": [metrics of each run, see fit_toy],
        "figures": [paths], "models": [paths]}``, JSON-serialisable.
    """
    check_selection("datasets", datasets, TOY_DATASETS, flows, transformers)
    settings = settings or FlowSettings()
    dev = resolve_device(device)
    start = time.perf_counter()
    gallery = Gallery(out)
    for dataset in datasets:
        test = sample_toy(dataset, settings.eval_samples, seed=seed + _TEST_SEED_OFFSET, device=dev)
        truth = _truth_panel(dataset, test.cpu(), settings.resolution)
        gallery.start_row(dataset, truth)
        for flow in flows:
            for transformer in transformers:
                if progress:
                    total = len(datasets) * len(flows) * len(transformers)
                    announce_run(dataset, flow, transformer, len(gallery.records) + 1, total)
                run = fit_toy(
                    dataset,
                    flow,
                    transformer,
                    settings,
                    test=test,
                    device=dev,
                    seed=seed,
                    progress=progress,
                )
                gallery.add(dataset, flow, transformer, run.metrics, run.history,
                            run.panels(vmax=truth.vmax), run.model)
    records = gallery.records
    references = {d: ("entropy", toy_entropy(d)) for d in datasets if has_exact_density(d)}
    figures = gallery.write("toy", references, toy_table(records) + "\n" + cost_table(records))
    return {
        "settings": asdict(settings),
        "device": str(dev),
        "wall_s": time.perf_counter() - start,
        "runs": records,
        "figures": [str(f) for f in figures],
        "models": [str(m) for m in gallery.models],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = add_target_arguments(parser, "datasets", TOY_DATASETS, ["maf"])
    what.add_argument(
        "--sweep",
        action="store_true",
        help="robustness sweep over the selection and the learning rates "
        f"{', '.join(map(str, SWEEP_LRS))} instead of the gallery",
    )
    add_settings_arguments(parser, FlowSettings())


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = settings_from_args(args, FlowSettings(), QUICK)
    use_threads(args.threads)
    if args.sweep:
        refuse_to_replace(args.out / "sweep.md", False, resumable=False)
        records = robustness_sweep(
            args.datasets,
            args.flows,
            args.transformer,
            settings=settings,
            device=args.device,
            seed=args.seed,
        )
        table = sweep_table(records)
        write_bytes_atomic(args.out / "sweep.md", table.encode())
        print(table.splitlines()[0])
        return {
            "settings": asdict(settings),
            "runs": len(records),
            "failed": sum(not r["finite"] for r in records),
            "records": records,
        }
    refuse_to_replace_gallery(args.out, args.datasets, args.flows, args.transformer)
    metrics = run_toy(
        args.datasets,
        args.flows,
        args.transformer,
        settings,
        out=args.out,
        device=args.device,
        seed=args.seed,
        progress=not args.quiet,
    )
    print(toy_table(metrics["runs"]), end="")
    print(
        f"{count(len(metrics['runs']), 'run')} in {metrics['wall_s']:.1f} s on "
        f"{metrics['device']}; figures in {args.out}"
    )
    return metrics
