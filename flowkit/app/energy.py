r"""Variational inference: an IAF fitted by reverse KL to the energies U1-U4 of Rezende & Mohamed.

The flow q maximises ELBO = E_q[log p~(z) - log q(z)] = log Z - KL(q || p) with
p~ = exp(-U), so the ELBO is a lower bound on log Z and the gap log Z - ELBO is the KL. An IAF
samples and scores its own samples in one pass per layer, which makes each step cheap.

U2-U4 have infinite mass over the plane (they do not decay along z1), so, as in the paper's
figures, the target is exp(-U) on the energy's box (z1 in [-4, 4]). To keep the loss finite for
samples that stray out of the box, the target fitted here adds a soft wall outside it,
log p~(z) = -U(z) - |dist(z, box)|^2 / (2 wall^2). Its log Z is computed numerically on a
grid; at wall = 0.1 it exceeds the log Z of the box alone by 0.031 nats for U2-U4 (1e-8 for
U1). The ELBO is compared with the former; both are reported.

Writes to --out: gallery.png (one row per energy: target | model density | model samples),
energy_<U>.png (one row each), losses.png (-ELBO per step against -log Z), table.md,
metrics.json and the trained flows, models/<U>_<flow>_<transformer>.pt (flowkit.load_model reads
them).
A rerun into an --out that holds these results is refused: pick another --out.

examples:
  flowkit energy --out runs/energy                  (U1-U4, IAF spline)
  flowkit energy --energies U3 U4 --transformer affine spline --out runs/energy-affine
  flowkit energy --quick --out runs/energy-quick    (seconds)
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from flowkit.data import (
    ENERGIES,
    ENERGY_BOXES,
    WALL,
    energy_log_density,
    energy_log_normalizer,
    walled_log_density,
    walled_log_normalizer,
)
from flowkit.flows import Flow
from flowkit.plot import Panel, grid_log_density
from flowkit.train import History, fit_reverse_kl, resolve_device

from .common import mean_se, use_threads
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
from .options import positive_float

ENERGY_SETTINGS = FlowSettings(bound=6.0, steps=2000)
"""Defaults of ``flowkit energy``: U4's box reaches z2 = -6, so the spline covers [-6, 6]."""
def fit_energy(
    name: str,
    flow: str,
    transformer: str,
    settings: FlowSettings,
    *,
    wall: float = WALL,
    device: torch.device,
    seed: int = 0,
    progress: bool = False,
    vmax: float | None = None,
) -> tuple[dict[str, Any], History, list[Panel], Flow]:
    """Fit one flow to one energy by reverse KL and evaluate it.

    Returns:
        ``metrics``: ``elbo`` (mean over ``settings.eval_samples`` fresh samples) and its
        standard error ``elbo_se``; ``log_z`` (of the walled target) and ``log_z_box`` (of
        exp(-U) on the box, :func:`flowkit.data.energy_log_normalizer`); ``kl = log_z - elbo``;
        ``outside`` (share of samples outside the box); ``train_s``, ``ms_per_step``. Also the
        :class:`History`, the model's two figure panels (density colours up to ``vmax``,
        see :class:`flowkit.plot.Panel`) and the trained model.
    """
    model = build_flow(flow, transformer, settings, seed=seed).to(device)  # trained, scored there
    history = fit_reverse_kl(
        model,
        lambda z: walled_log_density(name, z, wall),
        **settings.fit_options(),
        seed=seed,
        device=device,
        progress=progress,
    )
    box = ENERGY_BOXES[name]
    with torch.no_grad():
        (z, log_q), sample_s = timed(
            lambda: model.sample_and_log_prob(settings.eval_samples), device
        )
        gap = walled_log_density(name, z, wall) - log_q
        xmin, xmax, ymin, ymax = box
        inside = (z[:, 0] >= xmin) & (z[:, 0] <= xmax) & (z[:, 1] >= ymin) & (z[:, 1] <= ymax)
    (elbo, elbo_se), log_z = mean_se(gap), walled_log_normalizer(name, wall)
    metrics = {
        "energy": name,
        "flow": flow,
        "transformer": transformer,
        "elbo": elbo,
        "elbo_se": elbo_se,
        "log_z": log_z,
        "log_z_box": energy_log_normalizer(name),
        "kl": log_z - elbo,
        "outside": 1.0 - inside.double().mean().item(),
        "train_s": history.wall_time,
        "ms_per_step": 1e3 * history.wall_time / settings.steps,
        "sample_ms_per_1k": 1e6 * sample_s / settings.eval_samples,
    }
    label = run_label(flow, transformer)
    log_density = grid_log_density(model.log_prob, box, settings.resolution, device=device)
    panels = [
        Panel(
            f"{label} density\nELBO {elbo:.3f}   KL {log_z - elbo:.3f}",
            box,
            log_density=log_density.cpu(),
            vmax=vmax,
        ),
        Panel(f"{label} samples", box, samples=z[: settings.plot_samples].cpu()),
    ]
    return metrics, history, panels, model


def energy_table(records: Sequence[Mapping[str, Any]]) -> str:
    """The ELBO/KL table of :func:`run_energy` records (see
    :func:`flowkit.app.experiment2d.runs_table`)."""
    return runs_table(
        records,
        row_key="energy",
        reference=("log Z", "log_z"),
        scores=[("ELBO", "elbo"), ("KL", "kl")],
    )


def run_energy(
    energies: Sequence[str] = ENERGIES,
    flows: Sequence[str] = ("iaf",),
    transformers: Sequence[str] = ("spline",),
    settings: FlowSettings = ENERGY_SETTINGS,
    *,
    wall: float = WALL,
    out: str | Path | None = None,
    device: str | torch.device = "auto",
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Fit every ``flow x transformer`` to every energy; with ``out``, write the figures,
    ``table.md`` and each trained flow (:func:`flowkit.app.experiment2d.save_flow`) there. With
    ``progress``, a line names each run before its progress bar
    (:func:`~flowkit.app.experiment2d.announce_run`).

    Returns:
        ``{"settings", "wall", "device", "runs": [metrics, see fit_energy], "figures",
        "models"}`` (paths of the files).
    """
    check_selection("energies", energies, ENERGIES, flows, transformers)
    if wall <= 0:
        raise ValueError(f"'wall' should be positive, got {wall}")
    dev = resolve_device(device)
    gallery = Gallery(out)
    for name in energies:
        box = ENERGY_BOXES[name]
        log_z = walled_log_normalizer(name, wall)
        # normalised, so that the target and the model share one colour scale
        log_p = (
            grid_log_density(lambda z, n=name: energy_log_density(n, z), box, settings.resolution)
            - log_z
        )
        vmax = float(log_p.max().exp())
        title = f"target exp(-{name}) / Z\nlog Z {log_z:.3f}"
        gallery.start_row(name, Panel(title, box, log_density=log_p, vmax=vmax))
        for flow in flows:
            for transformer in transformers:
                if progress:
                    total = len(energies) * len(flows) * len(transformers)
                    announce_run(name, flow, transformer, len(gallery.records) + 1, total)
                metrics, history, panels, model = fit_energy(
                    name,
                    flow,
                    transformer,
                    settings,
                    wall=wall,
                    device=dev,
                    seed=seed,
                    progress=progress,
                    vmax=vmax,
                )
                gallery.add(name, flow, transformer, metrics, history, panels, model)
    references = {n: ("-log Z", -walled_log_normalizer(n, wall)) for n in energies}
    figures = gallery.write("energy", references, energy_table(gallery.records))
    return {
        "settings": asdict(settings),
        "wall": wall,
        "device": str(dev),
        "runs": gallery.records,
        "figures": [str(f) for f in figures],
        "models": [str(m) for m in gallery.models],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = add_target_arguments(
        parser, "energies", ENERGIES, ["iaf"], "; a MAF samples in 2 passes per layer"
    )
    what.add_argument(
        "--wall",
        type=positive_float,
        default=WALL,
        help="length scale of the soft wall outside the box (default: %(default)s)",
    )
    add_settings_arguments(parser, ENERGY_SETTINGS)


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = settings_from_args(args, ENERGY_SETTINGS, replace(QUICK, bound=6.0))
    use_threads(args.threads)
    refuse_to_replace_gallery(args.out, args.energies, args.flows, args.transformer)
    metrics = run_energy(
        args.energies,
        args.flows,
        args.transformer,
        settings,
        wall=args.wall,
        out=args.out,
        device=args.device,
        seed=args.seed,
        progress=not args.quiet,
    )
    print(energy_table(metrics["runs"]), end="")
    print(f"figures in {args.out}")
    return metrics
