"""What the 2-D experiments (flowkit toy, flowkit energy) share: their settings, building a
flow from them, the check of what a run selects, timing, the collection of a run's results
(:class:`Gallery`), tables, figures and command-line options."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from flowkit.checkpoint import save_model, write_bytes_atomic
from flowkit.flows import IAF, MAF, Flow
from flowkit.plot import Panel, loss_figure, panel_figure, save_figure
from flowkit.train import History

from .common import add_threads_option, markdown_table, refuse_to_replace
from .options import int_at_least, positive_float, positive_int

FLOWS = {"maf": MAF, "iaf": IAF}
TRANSFORMERS = ("affine", "spline")

T = TypeVar("T")


@dataclass(frozen=True)
class FlowSettings:
    """Model, training and evaluation settings shared by the runs of a 2-D experiment.

    Attributes:
        layers: autoregressive layers per flow.
        hidden: hidden sizes of each layer's MADE.
        bins: spline bins ``K``. With 16 rather than 8 the rings' KL after the default 1000
            steps fell from 0.20 to 0.07 nats, for about the same time per step.
        bound: spline interval ``[-bound, bound]`` (identity outside). The toy data lie in
            about ``[-4, 4]^2``, the checkerboard exactly: a bound of 4 covers them (a bound
            of 5 gave a larger KL on the checkerboard, 0.081 against 0.075 after 3000 steps).
        steps: optimizer steps (fresh samples at each).
        batch_size: samples per step.
        lr: Adam learning rate.
        lr_schedule: ``"cosine"`` (decay to 0 over the run) or ``None`` (constant).
        eval_samples: fresh samples for the test NLL (toy; also the data histogram) or the
            ELBO estimate (energy).
        plot_samples: model samples drawn for the scatter panels.
        resolution: grid cells per side of the density heat maps; the commands take at least
            :data:`MIN_RESOLUTION`.
    """

    layers: int = 5
    hidden: tuple[int, ...] = (64, 64)
    bins: int = 16
    bound: float = 4.0
    steps: int = 1000
    batch_size: int = 256
    lr: float = 3e-3
    lr_schedule: str | None = "cosine"
    eval_samples: int = 20_000
    plot_samples: int = 4000
    resolution: int = 200

    def fit_options(self) -> dict[str, Any]:
        """The arguments of :func:`flowkit.train.fit` and :func:`flowkit.train.fit_reverse_kl`
        that these settings give: ``steps``, ``batch_size``, ``lr`` and ``lr_schedule``."""
        return {"steps": self.steps, "batch_size": self.batch_size, "lr": self.lr,
                "lr_schedule": self.lr_schedule}


MIN_RESOLUTION = 8
"""The smallest ``--resolution``. The heat maps show the density at the cells' midpoints: one
cell is a single colour, and on coarse grids the midpoints miss narrow features (at 2 cells per
side no cell of the rings, U2 or U3 reaches 5% of its peak density, at 4 none of the 8
Gaussians'), while at 8 every toy density and energy shows at least 14 such cells."""

QUICK = FlowSettings(
    layers=2,
    hidden=(16, 16),
    bins=4,
    steps=20,
    batch_size=128,
    eval_samples=2000,
    plot_samples=1000,
    resolution=48,
)
"""Settings of ``--quick``: seconds for all eight datasets, for smoke tests (not for quality)."""


def build_flow(flow: str, transformer: str, settings: FlowSettings, *, seed: int = 0) -> Flow:
    """A 2-D :func:`~flowkit.MAF` or :func:`~flowkit.IAF` (``flow``) with ``"affine"`` or
    ``"spline"`` layers, sized by ``settings``.

    The initial weights are drawn from torch's global generator seeded with ``seed`` inside
    :func:`torch.random.fork_rng`, so the caller's random state is left as it was.
    """
    if flow not in FLOWS:
        raise ValueError(f"'flow' should be one of {', '.join(FLOWS)}, got {flow!r}")
    if transformer not in TRANSFORMERS:
        raise ValueError(
            f"'transformer' should be one of {', '.join(TRANSFORMERS)}, got {transformer!r}"
        )
    kwargs = {"bins": settings.bins, "bound": settings.bound} if transformer == "spline" else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return FLOWS[flow](
            2,
            layers=settings.layers,
            hidden_features=settings.hidden,
            transformer=transformer,
            transformer_kwargs=kwargs,
            seed=seed,
        )


def run_label(flow: str, transformer: str) -> str:
    """``"MAF spline"``: the name of a run in figures and tables."""
    return f"{flow.upper()} {transformer}"


def announce_run(target: str, flow: str, transformer: str, number: int, total: int) -> None:
    """Print which run the next progress bar belongs to, e.g. ``moons: MAF spline (run 1 of
    8)``: the bar of :func:`flowkit.train.fit` is labelled with the loss only."""
    print(f"{target}: {run_label(flow, transformer)} (run {number} of {total})", flush=True)


def flow_path(out: Path, row: str, flow: str, transformer: str) -> Path:
    """``out/models/<row>_<flow>_<transformer>.pt`` (e.g. ``models/moons_maf_spline.pt``),
    where :func:`save_flow` saves a trained flow."""
    return out / "models" / f"{row}_{flow}_{transformer}.pt"


def save_flow(model: Flow, out: Path, row: str, flow: str, transformer: str) -> Path:
    """Save a trained flow with :func:`flowkit.save_model` at :func:`flow_path`, which
    :func:`flowkit.load_model` reads back; returns the path."""
    path = flow_path(out, row, flow, transformer)
    save_model(model, path)
    return path


def refuse_to_replace_gallery(
    out: Path, targets: Sequence[str], flows: Sequence[str], transformers: Sequence[str]
) -> None:
    """Fail before any training if ``out`` holds the results of an earlier run that this one
    would replace: its ``table.md`` or a flow it would save (:func:`flow_path`), e.g. of an
    interrupted run (see :func:`~flowkit.app.common.refuse_to_replace`)."""
    refuse_to_replace(out / "table.md", False, resumable=False)
    for path in (flow_path(out, t, f, tr) for t in targets for f in flows for tr in transformers):
        if path.exists():  # without a table: left by a run that did not finish (review 39)
            raise ValueError(
                f"'{path}' exists, left by a run into '{out}' that did not finish (it has no "
                f"table.md); this command cannot resume it: remove '{out}', or pick another "
                "--out"
            )


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """``fn()`` and its wall time in seconds (a CUDA device is synchronised before and after,
    outside any training loop)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def check_choices(name: str, values: Sequence[str], allowed: Sequence[str]) -> None:
    """Raise a ValueError unless ``values`` is a non-empty subset of ``allowed``."""
    if not values or any(v not in allowed for v in values):
        raise ValueError(
            f"'{name}' should be a non-empty subset of {', '.join(allowed)}, "
            f"got {', '.join(values) or 'nothing'}"
        )


def check_selection(
    name: str, targets: Sequence[str], allowed: Sequence[str], flows: Sequence[str],
    transformers: Sequence[str],
) -> None:
    """Check what a run selects: its targets (argument ``name``, e.g. ``"datasets"``, from
    ``allowed``), its flows and its transformers (:func:`check_choices`)."""
    check_choices(name, targets, allowed)
    check_choices("flows", flows, tuple(FLOWS))
    check_choices("transformers", transformers, TRANSFORMERS)


def fmt(value: float | None) -> str:
    """A score with 3 decimals, or n/a."""
    return "n/a" if value is None else f"{value:.3f}"


def runs_table(
    records: Sequence[Mapping[str, Any]],
    *,
    row_key: str,
    reference: tuple[str, str],
    scores: Sequence[tuple[str, str]],
) -> str:
    """A Markdown table with one row per ``record[row_key]`` and, for every run label
    (:func:`run_label` of the record's ``flow`` and ``transformer``), one column per score.

    Args:
        records: run metrics, e.g. ``{"dataset", "flow", "transformer", "test_nll", ...}``.
        row_key: the record key naming the row, e.g. ``"dataset"``.
        reference: ``(header, key)`` of a per-row column, e.g. ``("entropy", "entropy")``.
        scores: ``(header, key)`` per run column, e.g. ``[("NLL", "test_nll"), ("KL", "kl")]``.
    """
    labels = list(dict.fromkeys(run_label(r["flow"], r["transformer"]) for r in records))
    by_key = {(r[row_key], run_label(r["flow"], r["transformer"])): r for r in records}
    head = [row_key, reference[0]] + [f"{lab} {h}" for lab in labels for h, _ in scores]
    rows = []
    for row in dict.fromkeys(r[row_key] for r in records):
        first = next(r for r in records if r[row_key] == row)
        cells = [row, fmt(first[reference[1]])]
        for label in labels:
            r = by_key.get((row, label))
            cells += [fmt(None if r is None else r[key]) for _, key in scores]
        rows.append(cells)
    return markdown_table(head, rows) + "\n"


class Gallery:
    """What a 2-D experiment collects while it fits every flow to every target (a toy dataset,
    an energy): a figure row per target, the training histories, the metrics of every run and,
    given an output folder, the saved flows. :meth:`write` writes the figures and the table.

    Args:
        out: the output folder, or None to keep everything in memory.
    """

    def __init__(self, out: str | Path | None):
        self.out = None if out is None else Path(out)
        self.rows: dict[str, list[Panel]] = {}
        self.histories: dict[str, dict[str, History]] = {}
        self.records: list[dict[str, Any]] = []
        self.models: list[Path] = []

    def start_row(self, target: str, reference: Panel) -> None:
        """Start the row of ``target`` with the panel of what the flows should match."""
        self.rows[target] = [reference]
        self.histories[target] = {}

    def add(
        self, target: str, flow: str, transformer: str, metrics: dict[str, Any],
        history: History, panels: list[Panel], model: Flow,
    ) -> None:
        """Record one fitted flow (its metrics, history and panels) and save it under ``out``
        (:func:`save_flow`)."""
        self.records.append(metrics)
        if self.out is not None:
            self.models.append(save_flow(model, self.out, target, flow, transformer))
        self.rows[target] += panels
        self.histories[target][run_label(flow, transformer)] = history

    def write(self, prefix: str, references: Mapping[str, tuple[str, float]], table: str
              ) -> list[Path]:
        """Given an output folder, write the figures (:func:`write_figures`) and ``table.md``;
        returns the figures' paths (none without a folder)."""
        if self.out is None:
            return []
        figures = write_figures(self.out, prefix, self.rows, self.histories, references)
        write_bytes_atomic(self.out / "table.md", table.encode())
        return figures


def write_figures(
    out: Path,
    prefix: str,
    rows: Mapping[str, list[Panel]],
    histories: Mapping[str, Mapping[str, History]],
    references: Mapping[str, tuple[str, float]],
) -> list[Path]:
    """``<prefix>_<row>.png`` per row, ``gallery.png`` with every row (both as 256-colour
    PNGs, see :func:`~flowkit.plot.save_figure`) and ``losses.png``."""
    paths = [
        save_figure(
            panel_figure([row], row_labels=[name]), out / f"{prefix}_{name}.png", palette=True
        )
        for name, row in rows.items()
    ]
    gallery = panel_figure(list(rows.values()), row_labels=list(rows), size=2.0)
    paths.append(save_figure(gallery, out / "gallery.png", dpi=80, palette=True))
    paths.append(save_figure(loss_figure(histories, references=references), out / "losses.png"))
    return paths


def add_settings_arguments(parser: argparse.ArgumentParser, defaults: FlowSettings) -> None:
    """One option per :class:`FlowSettings` field (``--batch-size`` for ``batch_size``...),
    then ``--quick`` and ``--threads`` (default 1). Options of the fields left out stay None, so
    that :func:`settings_from_args` can tell them apart."""
    group = parser.add_argument_group("model and training")
    for f in fields(FlowSettings):
        flag, default = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        if f.name == "hidden":
            group.add_argument(
                flag,
                type=positive_int,
                nargs="+",
                metavar="H",
                help=f"MADE hidden sizes (default: {' '.join(map(str, default))})",
            )
        elif f.name == "lr_schedule":
            group.add_argument(
                flag, choices=("cosine", "none"), help=f"(default: {default or 'none'})"
            )
        elif f.name == "resolution":
            group.add_argument(flag, type=int_at_least(MIN_RESOLUTION),
                               help=f"(default: {default}; at least {MIN_RESOLUTION})")
        else:
            kind = positive_int if isinstance(default, int) else positive_float
            group.add_argument(flag, type=kind, help=f"(default: {default})")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny models, few steps: seconds, for smoke tests; the options above, when given, "
        "win",
    )
    # on a shared machine the busy-waiting of a second thread made training several times slower
    add_threads_option(parser, default=1,
                       why="the 2-D models are tiny: more threads only add synchronisation")


def settings_from_args(
    args: argparse.Namespace, defaults: FlowSettings, quick: FlowSettings
) -> FlowSettings:
    """``quick`` with ``--quick``, else ``defaults``; then every option given."""
    given = {f.name: getattr(args, f.name) for f in fields(FlowSettings)}
    given = {k: v for k, v in given.items() if v is not None}
    if "hidden" in given:
        given["hidden"] = tuple(given["hidden"])
    if given.get("lr_schedule") == "none":
        given["lr_schedule"] = None
    return replace(quick if args.quick else defaults, **given)


def add_names_option(
    group: argparse._ArgumentGroup, option: str, allowed: Sequence[str], default: list[str],
    *, what: str = "", note: str = "",
) -> None:
    """``--<option> NAME [NAME ...]``: one or more of ``allowed``, space-separated like the
    lists of the other commands (``sklearn-compare --datasets``, ``vae --variants``); argparse
    refuses any other name, naming the option. ``what`` starts the help, ``note`` follows the
    default."""
    group.add_argument(
        f"--{option}", nargs="+", choices=allowed, default=default, metavar="NAME",
        help=f"{what}one or more of {', '.join(allowed)} (default: {' '.join(default)}{note})",
    )


def add_target_arguments(
    parser: argparse.ArgumentParser, option: str, allowed: Sequence[str], flows: list[str],
    note: str = "",
) -> argparse._ArgumentGroup:
    """The group "what to fit": ``--<option>`` (names from ``allowed``, default all of them),
    ``--flows`` (default ``flows``; ``note`` follows it in the help) and ``--transformer``
    (default spline), each a space-separated list (:func:`add_names_option`); returns it."""
    what = parser.add_argument_group("what to fit")
    add_names_option(what, option, allowed, list(allowed))
    add_names_option(what, "flows", tuple(FLOWS), flows, note=note)
    add_names_option(what, "transformer", TRANSFORMERS, ["spline"],
                     what="elementwise map of the layers: ")
    return what
