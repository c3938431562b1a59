r"""Plotting helpers: 2-D densities as heat maps on a grid, samples, loss curves, galleries, and
samples of a model of any dimension against its data, feature by feature and in pairs.

Figures are built with matplotlib's object API (:class:`matplotlib.figure.Figure`) and written by
its Agg renderer, so nothing here needs a display or touches :mod:`matplotlib.pyplot`'s global
state: the helpers work the same on a headless server, in a test and in a notebook.

A typical density-estimation figure has one row per dataset::

    truth (or data histogram) | model density | model samples

built from :class:`Panel` objects by :func:`panel_figure`; :func:`grid_log_density` evaluates a
model on the grid that a density panel shows. For data of any number of features,
:func:`pairs_figure` shows a model's samples over the data in a grid of histograms and scatter
plots, one panel per feature and per pair of features.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
from PIL import Image
from torch import Tensor

from flowkit.checkpoint import write_bytes_atomic
from flowkit.data import Box, box_grid
from flowkit.validation import check_int

if TYPE_CHECKING:
    from flowkit.train import History

DENSITY_CMAP = "magma"
SAMPLE_COLOR = "#1f4e79"

ArrayLike = np.ndarray | Tensor


def _numpy(values: ArrayLike) -> np.ndarray:
    if isinstance(values, Tensor):
        return values.detach().to("cpu", torch.float64).numpy()
    return np.asarray(values, dtype=np.float64)


@torch.no_grad()
def grid_log_density(
    log_prob: Callable[[Tensor], Tensor],
    box: Box,
    resolution: int = 200,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    chunk: int = 65536,
) -> Tensor:
    """Evaluate a log-density at the midpoints of a ``resolution x resolution`` grid on ``box``.

    The points are made on ``device`` and evaluated in chunks of ``chunk`` rows, without
    gradients; the result stays on ``device``.

    Args:
        log_prob: ``x: (N, 2) -> log p(x): (N,)``, e.g. ``flow.log_prob``.
        box: ``(xmin, xmax, ymin, ymax)``.
        resolution: cells per side.

    Returns:
        ``log p`` of shape ``(resolution, resolution)`` with ``y`` along the rows, ready for
        :class:`Panel` (``imshow(..., origin="lower", extent=box)``).

    Example:
        >>> image = grid_log_density(lambda x: x[:, 0], (0.0, 4.0, 0.0, 2.0), resolution=2)
        >>> image  # x at the cell midpoints 1 and 3, the same on both rows
        tensor([[1., 3.],
                [1., 3.]])
    """
    chunk = check_int("chunk", chunk, 1)
    if isinstance(log_prob, torch.nn.Module):
        raise TypeError(
            f"'log_prob' should be a function x -> log p(x), such as flow.log_prob; got the "
            f"{type(log_prob).__name__} itself (calling a flow gives its distribution given a "
            "context, not a log-density)"
        )
    points, _ = box_grid(box, resolution, dtype=dtype, device=device)
    values = torch.cat([log_prob(p) for p in points.split(chunk)])
    return values.view(resolution, resolution)


@dataclass(frozen=True)
class Panel:
    """One square panel of a :func:`panel_figure`: a density heat map or a set of points.

    Attributes:
        title: shown above the panel (keep it to two short lines).
        box: ``(xmin, xmax, ymin, ymax)``, the visible region.
        log_density: ``(R, R)`` log-density on the grid of :func:`grid_log_density`, shown as
            ``exp(log_density)`` on a linear colour scale from 0 to ``vmax``; ``-inf`` and NaN
            show as 0.
        samples: ``(N, 2)`` points, used when ``log_density`` is None.
        histogram: draw ``samples`` as a 2-D histogram in the density colours (for data, so
            that it reads like a density) instead of a scatter plot (for model samples).
        vmax: top of the colour scale of ``log_density``, in density units. Give a model panel
            the true density's maximum to draw both in the same colours. Default: the 99.9th
            percentile of the panel's values, so that a few isolated spikes do not darken the
            rest.
    """

    title: str
    box: Box
    log_density: ArrayLike | None = None
    samples: ArrayLike | None = None
    histogram: bool = False
    vmax: float | None = None

    def __post_init__(self) -> None:
        if (self.log_density is None) == (self.samples is None):
            raise ValueError("a Panel needs exactly one of 'log_density' and 'samples'")


def draw_density(ax: Axes, log_density: ArrayLike, box: Box, vmax: float | None = None) -> None:
    """Heat map of ``exp(log_density)`` (``(R, R)``, ``y`` along rows) over ``box``, colours
    from 0 to ``vmax`` (default: the 99.9th percentile of the values)."""
    log_p = _numpy(log_density)
    if log_p.ndim != 2:
        raise ValueError(f"'log_density' should have shape (R, R), got {log_p.shape}")
    density = np.exp(np.nan_to_num(log_p, nan=-np.inf, posinf=np.inf))
    if vmax is None:
        finite = density[np.isfinite(density)]
        vmax = float(np.quantile(finite, 0.999)) if finite.size else 1.0
    ax.imshow(
        density,
        origin="lower",
        extent=box,
        cmap=DENSITY_CMAP,
        vmin=0.0,
        vmax=vmax if vmax > 0 else 1.0,
        interpolation="nearest",
        aspect="auto",
    )


def draw_samples(
    ax: Axes, samples: ArrayLike, box: Box, *, histogram: bool = False, bins: int = 150
) -> None:
    """Points ``(N, 2)`` over ``box``: a scatter plot, or a 2-D histogram in density colours."""
    x = _numpy(samples)
    if x.ndim != 2 or x.shape[1] != 2:
        raise ValueError(f"'samples' should have shape (N, 2), got {x.shape}")
    xmin, xmax, ymin, ymax = box
    if histogram:
        counts, _, _ = np.histogram2d(x[:, 0], x[:, 1], bins=bins, range=(box[:2], box[2:]))
        ax.imshow(counts.T, origin="lower", extent=box, cmap=DENSITY_CMAP, interpolation="nearest")
    else:
        ax.scatter(
            x[:, 0], x[:, 1], s=2.0, alpha=0.5, color=SAMPLE_COLOR, linewidths=0, rasterized=True
        )
    ax.set_xlim(xmin, xmax)
    ax.set_ylim(ymin, ymax)


def _draw_panel(ax: Axes, panel: Panel) -> None:
    if panel.log_density is not None:
        draw_density(ax, panel.log_density, panel.box, panel.vmax)
    else:
        assert panel.samples is not None
        draw_samples(ax, panel.samples, panel.box, histogram=panel.histogram)
    ax.set_title(panel.title, fontsize=8.5)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_aspect("equal")


def panel_figure(
    rows: Sequence[Sequence[Panel]],
    *,
    row_labels: Sequence[str] | None = None,
    title: str | None = None,
    size: float = 2.3,
) -> Figure:
    """A grid of square panels, one list of :class:`Panel` per row (rows may be shorter than
    the longest: the missing cells stay blank).

    Args:
        rows: the panels, row by row.
        row_labels: one bold label per row, left of its first panel (e.g. the dataset).
        title: figure title.
        size: side of one panel in inches.
    """
    if not rows or not all(rows):
        raise ValueError("'rows' should be a non-empty list of non-empty lists of Panels")
    if row_labels is not None and len(row_labels) != len(rows):
        raise ValueError(f"'row_labels' should have {len(rows)} labels, got {len(row_labels)}")
    ncols = max(len(row) for row in rows)
    # Fixed margins in inches (cheaper than tight_layout, and the same for every figure).
    left = 0.3 if row_labels is not None else 0.05
    gap, titles, bottom, head = 0.08, 0.4, 0.05, (0.4 if title else 0.0)
    width = left + ncols * size + (ncols - 1) * gap + 0.05
    height = head + len(rows) * (titles + size) + bottom
    fig = Figure(figsize=(width, height))
    for i, row in enumerate(rows):
        y = height - head - (i + 1) * (titles + size)
        for j, panel in enumerate(row):
            x = left + j * (size + gap)
            ax = fig.add_axes((x / width, y / height, size / width, size / height))
            _draw_panel(ax, panel)
            if j == 0 and row_labels is not None:
                ax.set_ylabel(row_labels[i], fontsize=11, fontweight="bold")
    if title:
        fig.suptitle(title, fontsize=11, y=1.0 - 0.1 / height, va="top")
    return fig


DATA_COLOR = "0.55"


def _table(values: ArrayLike) -> np.ndarray:
    """``values`` as a float64 array, a pandas ``Series`` as one column ``(N, 1)``."""
    if getattr(values, "ndim", 2) == 1 and hasattr(values, "to_numpy"):
        values = values.to_numpy()[:, None]
    return _numpy(values)


def pairs_figure(
    data: ArrayLike,
    samples: ArrayLike,
    *,
    features: Sequence[int] | None = None,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    bins: int = 40,
    size: float = 1.8,
    max_points: int = 5000,
) -> Figure:
    """Samples of a model over the data they should look like, for any number of features: a
    ``K x K`` grid for the ``K`` features shown, with the histograms of feature ``i`` (data in
    grey, samples in blue, both as densities over the same bins) on the diagonal and, at row
    ``i``, column ``j < i``, the samples' scatter plot of features ``(j, i)`` under the contours
    of the data's 2-D histogram (enclosing about 30%, 60% and 90% of the rows), so that neither
    hides the other. With fewer features shown than the data have, the title says so.

    Each feature's range is that of the data (their 0.5th to 99.5th percentile, padded by a
    tenth), so that a few far samples do not squash the panels; the share of samples outside
    it is written above its histogram when there are any.

    Args:
        data: ``(N, D)`` rows of the data (an array, a tensor or a data frame).
        samples: ``(M, D)`` samples of the model, in the data's units.
        features: the features to show, in order (default: the first ``min(D, 6)``).
        labels: a name for each of the ``D`` features (default: a data frame's column names,
            else ``x0, x1, ...``).
        title: figure title.
        bins: histogram bins on the diagonal.
        size: side of one panel in inches.
        max_points: at most this many rows of ``samples`` are scattered (the first ones); the
            histograms and contours use all.

    Example:
        >>> x = torch.randn(500, 3)
        >>> fig = pairs_figure(x, x + 0.1, labels=["a", "b", "c"])
        >>> len(fig.axes)  # 3 x 3 panels
        9
    """
    if labels is None and hasattr(data, "columns"):  # a data frame: its column names
        labels = [str(c) for c in data.columns]
    if labels is None and getattr(data, "ndim", 2) == 1 and hasattr(data, "to_numpy"):
        labels = [str(getattr(data, "name", None) or "x0")]  # a Series: one column
    x, y = _table(data), _table(samples)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"'data' should have shape (N, D) with N, D >= 1, got {x.shape}")
    if y.ndim != 2 or y.shape[0] == 0 or y.shape[1] != x.shape[1]:
        raise ValueError(
            f"'samples' should have shape (M, {x.shape[1]}) like 'data', got {y.shape}"
        )
    dims = x.shape[1]
    if features is None:
        features = list(range(min(dims, 6)))
    features = [check_int(f"features[{k}]", f, 0) for k, f in enumerate(features)]
    if not features or max(features) >= dims or len(set(features)) != len(features):
        raise ValueError(
            f"'features' should be distinct feature indices in [0, {dims}), got {features}"
        )
    if labels is None:
        labels = [f"x{i}" for i in range(dims)]
    elif len(labels) != dims:
        raise ValueError(f"'labels' should name the {dims} features, got {len(labels)} names")
    bins, max_points = check_int("bins", bins, 1), check_int("max_points", max_points, 1)
    finite = np.isfinite(x).all(axis=1)
    if not finite.any():
        raise ValueError("'data' has no row of finite values to set the panels' ranges from")
    low, high = np.percentile(x[finite], [0.5, 99.5], axis=0)
    pad = 0.1 * np.where(high > low, high - low, 1.0)
    low, high = low - pad, high + pad
    k = len(features)
    fig = Figure(figsize=(size * k + 0.4, size * k + 0.4))
    axes = fig.subplots(k, k, squeeze=False)
    shown_y = y[:max_points]
    for row, i in enumerate(features):
        for col, j in enumerate(features):
            ax = axes[row, col]
            if col > row:
                ax.axis("off")
                continue
            if col == row:
                edges = np.linspace(low[i], high[i], bins + 1)
                with np.errstate(invalid="ignore", divide="ignore"):  # no values in range
                    ax.hist(x[:, i], bins=edges, density=True, histtype="stepfilled",
                            color=DATA_COLOR, alpha=0.6)
                    ax.hist(y[:, i], bins=edges, density=True, histtype="step",
                            color=SAMPLE_COLOR, lw=1.2)
                outside = np.mean((y[:, i] < low[i]) | (y[:, i] > high[i]) | ~np.isfinite(y[:, i]))
                if outside > 0:
                    ax.set_title(f"{outside:.1%} of samples outside", fontsize=7)
                ax.set_yticks([])
            else:  # samples as points, the data as the contours of their histogram over them
                ax.scatter(shown_y[:, j], shown_y[:, i], s=2, color=SAMPLE_COLOR, alpha=0.5,
                           linewidths=0, rasterized=True)
                _data_contours(ax, x[:, j], x[:, i], (low[j], high[j]), (low[i], high[i]))
                ax.set_ylim(low[i], high[i])
                if col == 0:
                    ax.set_ylabel(labels[i], fontsize=8)
                else:
                    ax.set_yticklabels([])
            ax.set_xlim(low[j], high[j])
            if row == k - 1:
                ax.set_xlabel(labels[j], fontsize=8)
            else:
                ax.set_xticklabels([])
            ax.tick_params(labelsize=6)
            ax.xaxis.set_major_locator(MaxNLocator(3))
            if col != row:  # the histograms' density axis has no ticks
                ax.yaxis.set_major_locator(MaxNLocator(3))
    fig.legend(
        handles=[Patch(color=DATA_COLOR, alpha=0.6, label="data (contours in the pairs)"),
                 Patch(color=SAMPLE_COLOR, label="samples")],
        loc="upper right", fontsize=8, frameon=False,
    )
    if k < dims:
        shown = f"the first {k}" if features == list(range(k)) else str(k)
        title = f"{title + ': ' if title else ''}{shown} of {dims} columns"
    head = 0.0
    if title:
        head = 0.35 / fig.get_figheight()
        fig.suptitle(title, fontsize=10, x=0.02, y=0.995, ha="left", va="top")
    fig.tight_layout(pad=0.4, rect=(0.0, 0.0, 1.0, 1.0 - head))
    return fig


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each step (fewer at the start); ``window >= 1``."""
    window = check_int("window", window, 1)
    sums = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (sums[1:] - sums[np.arange(1, len(values) + 1) - counts]) / counts


def draw_history(ax: Axes, history: History, label: str, *, smooth: int = 50) -> None:
    """Per-step training loss of a :class:`~flowkit.train.History`: raw (faint) and its moving
    average over ``smooth`` steps (labelled), plus validation losses if any (dots) and the best
    of them (a star, labelled with its step: the weights ``fit`` returns with
    ``restore_best``)."""
    loss = np.asarray(history.train_loss, dtype=np.float64)
    steps = np.arange(1, len(loss) + 1)
    (line,) = ax.plot(steps, moving_average(loss, smooth), lw=1.3, label=label)
    ax.plot(steps, loss, lw=0.5, alpha=0.2, color=line.get_color())
    if history.valid_loss:
        ax.plot(history.valid_steps, history.valid_loss, "o", ms=3, color=line.get_color())
    if history.best_step is not None and history.best_valid_loss is not None:
        ax.plot(history.best_step, history.best_valid_loss, "*", ms=10, color=line.get_color(),
                markeredgecolor="k", markeredgewidth=0.5,
                label=f"best valid {history.best_valid_loss:.4g} (step {history.best_step})")


def _data_contours(ax: Axes, u: np.ndarray, v: np.ndarray, u_range: tuple[float, float],
                   v_range: tuple[float, float]) -> None:
    """Contours of the 2-D histogram of the points ``(u, v)`` (finite ones) on the ranges
    given, ``sqrt(N) / 2`` bins a side (8 to 30): the levels that enclose about 30%, 60% and
    90% of them (thinner outwards)."""
    finite = np.isfinite(u) & np.isfinite(v)
    bins = int(np.clip(np.sqrt(finite.sum()) / 2, 8, 30))
    counts, u_edges, v_edges = np.histogram2d(u[finite], v[finite], bins=bins,
                                              range=(u_range, v_range))
    total = counts.sum()
    if total == 0:
        return
    ordered = np.sort(counts.ravel())[::-1]
    enclosed = np.cumsum(ordered) / total
    levels = sorted({float(ordered[min(np.searchsorted(enclosed, q), len(ordered) - 1)])
                     for q in (0.9, 0.6, 0.3)})
    levels = [level for level in levels if level > 0]
    if not levels:
        return
    centres_u, centres_v = (u_edges[1:] + u_edges[:-1]) / 2, (v_edges[1:] + v_edges[:-1]) / 2
    ax.contour(centres_u, centres_v, counts.T, levels=levels, colors="0.15",
               linewidths=[0.6, 0.9, 1.2][-len(levels):])


def _loss_range(runs: Mapping[str, History], smooth: int) -> tuple[float, float]:
    """The y range of a panel: the smoothed training curves (the first 5% of steps left out, so
    that early losses do not flatten the part worth reading) and the validation losses, those
    above it by more than twice its span left out (a validation loss that explodes would
    flatten the rest); ``(inf, -inf)`` when nothing is finite."""
    low, high = np.inf, -np.inf
    for history in runs.values():
        curve = moving_average(np.asarray(history.train_loss, dtype=np.float64), smooth)
        tail = curve[len(curve) // 20 :]
        tail = tail[np.isfinite(tail)]
        if tail.size:
            low, high = min(low, tail.min()), max(high, tail.max())
    valid = np.concatenate([np.asarray(h.valid_loss, dtype=np.float64) for h in runs.values()])
    valid = valid[np.isfinite(valid)]
    if valid.size:
        low = min(low, valid.min())
        if np.isfinite(high):
            span = max(high - low, 1e-3)
            valid = valid[valid <= high + 2 * span]
        high = max(high, valid.max()) if valid.size else high
    return low, high


_LOSS_LABELS = {"nll": "NLL (nats)", "neg_elbo": "-ELBO (nats)"}


def loss_figure(
    histories: History | Mapping[str, Mapping[str, History]],
    *,
    references: Mapping[str, tuple[str, float]] | None = None,
    smooth: int = 50,
    columns: int = 4,
    size: tuple[float, float] = (3.2, 2.4),
) -> Figure:
    """Loss curves, one panel per group (e.g. per dataset), one line per run in the group.

    Args:
        histories: ``{group: {run label: History}}``, or one :class:`~flowkit.train.History`
            (one panel, one run).
        references: ``{group: (label, value)}``, a dashed horizontal line per group: the lowest
            loss reachable, e.g. ``("entropy", H)`` for NLL or ``("-log Z", -log_z)`` for -ELBO.
        smooth: moving-average window in steps.
        columns: panels per row.
        size: ``(width, height)`` of one panel in inches.

    The y range covers the smoothed training curves (the first 5% of steps left out, so that
    early losses do not flatten the part worth reading) and the validation losses, but for
    those far above (a note in the panel counts them and gives the largest).
    """
    from flowkit.train import History

    if isinstance(histories, History):
        histories = {"": {"train": histories}}
    if not isinstance(histories, Mapping) or not all(
        isinstance(runs, Mapping) and all(isinstance(h, History) for h in runs.values())
        for runs in histories.values()
    ):
        raise TypeError(
            "'histories' should be a History or a mapping {group: {run label: History}}, e.g. "
            f"{{'moons': {{'lr 1e-3': history}}}}, got {type(histories).__name__}"
        )
    if not histories:
        raise ValueError("'histories' should name at least one group")
    empty = [group for group, runs in histories.items() if not runs]
    if empty:
        raise ValueError(f"'histories' should have at least one run per group; {empty} have none")
    columns, smooth = check_int("columns", columns, 1), check_int("smooth", smooth, 1)
    references = references or {}
    ncols = min(columns, len(histories))
    nrows = -(-len(histories) // ncols)
    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (group, runs) in zip(axes, histories.items(), strict=False):
        for label, history in runs.items():
            draw_history(ax, history, label, smooth=smooth)
        low, high = _loss_range(runs, smooth)
        objective = next(iter(runs.values())).objective
        if group in references:
            name, value = references[group]
            ax.axhline(value, ls="--", lw=1.0, color="0.3", label=f"{name} = {value:.3f}")
            low, high = min(low, value), max(high, value)
        if np.isfinite(low) and np.isfinite(high):
            pad = 0.08 * (high - low) + 1e-3
            ax.set_ylim(low - pad, high + pad)
            above = [v for h in runs.values() for v in h.valid_loss if v > high + pad]
            if above:  # said, not hidden: the run overfits or diverges there
                ax.text(0.99, 0.98, f"{len(above)} validation loss(es) above the plot, up to "
                        f"{max(above):.4g}", transform=ax.transAxes, ha="right", va="top",
                        fontsize=7, color="C3")
        ax.set_title(group, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(_LOSS_LABELS.get(objective, objective), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(histories) :]:
        ax.axis("off")
    fig.tight_layout(pad=0.5)
    return fig


def save_figure(
    fig: Figure, path: str | PathLike, *, dpi: int = 100, palette: bool = False
) -> Path:
    """Write ``fig`` as a PNG with the Agg renderer (parent folders are created) and return
    the path written: ``path``, with ``.png`` added when it has no suffix. The file is
    replaced atomically (rendered in memory, then written to a temporary file renamed over
    ``path``), so a failed write leaves an earlier figure intact.

    With ``palette``, the image is reduced to 256 colours (Pillow's fast octree quantizer)
    before writing: heat maps in one colour map and scatter plots look the same and the file
    is 3 to 4 times smaller, which suits galleries kept in a repository.
    """
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix(".png")
    buffer = io.BytesIO()
    canvas = FigureCanvasAgg(fig)
    if palette:
        fig.set_dpi(dpi)
        canvas.draw()
        rgb = Image.fromarray(np.asarray(canvas.buffer_rgba())).convert("RGB")
        rgb.quantize(256, method=Image.Quantize.FASTOCTREE).save(buffer, format="PNG",
                                                                  optimize=True)
    else:
        fig.savefig(buffer, format="png", dpi=dpi)
    write_bytes_atomic(path, buffer.getvalue())
    return path
