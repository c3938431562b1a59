"""Tests of flowkit.plot: the density grid, panels, loss curves and PNG output (Agg, no display)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from flowkit.plot import (
    Panel,
    draw_samples,
    grid_log_density,
    loss_figure,
    moving_average,
    pairs_figure,
    panel_figure,
    save_figure,
)
from flowkit.train import History

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BOX = (-4.0, 4.0, -3.0, 3.0)


def test_grid_orientation_and_midpoints():
    # log p(x, y) = x + 10 y: x must vary along the columns and y along the rows, at midpoints.
    image = grid_log_density(lambda x: x[:, 0] + 10.0 * x[:, 1], (0.0, 4.0, 0.0, 2.0), 4)
    assert image.shape == (4, 4)
    xs = torch.tensor([0.5, 1.5, 2.5, 3.5])
    ys = torch.tensor([0.25, 0.75, 1.25, 1.75])
    torch.testing.assert_close(image, xs[None, :] + 10.0 * ys[:, None])


def test_grid_chunks_do_not_change_the_result():
    def log_p(x):
        return -0.5 * x.square().sum(1)

    whole = grid_log_density(log_p, BOX, 37)
    torch.testing.assert_close(grid_log_density(log_p, BOX, 37, chunk=100), whole)


def test_grid_integrates_a_normal_density_to_one():
    def log_p(x):
        return -0.5 * x.square().sum(1) - math.log(2 * math.pi)

    image = grid_log_density(log_p, (-8.0, 8.0, -8.0, 8.0), 200, dtype=torch.float64)
    cell = (16.0 / 200) ** 2
    assert float(image.exp().sum() * cell) == pytest.approx(1.0, abs=1e-10)


def test_grid_runs_without_gradients():
    weight = torch.ones(2, requires_grad=True)
    image = grid_log_density(lambda x: x @ weight, BOX, 8)
    assert not image.requires_grad


def test_panel_needs_exactly_one_kind_of_content():
    with pytest.raises(ValueError, match="exactly one of 'log_density' and 'samples'"):
        Panel("empty", BOX)
    with pytest.raises(ValueError, match="exactly one"):
        Panel("both", BOX, log_density=np.zeros((3, 3)), samples=np.zeros((5, 2)))


def test_panel_figure_layout_and_png(tmp_path):
    log_p = torch.full((20, 20), -math.inf)
    log_p[5:10, 5:10] = 0.0  # a support with -inf outside, as for the checkerboard
    log_p[0, 0] = math.nan
    points = torch.randn(300, 2)
    rows = [
        [
            Panel("truth", BOX, log_density=log_p),
            Panel("data", BOX, samples=points, histogram=True),
            Panel("samples", BOX, samples=points),
        ],
        [Panel("only one", BOX, samples=points.numpy())],
    ]
    fig = panel_figure(rows, row_labels=["a", "b"], title="demo")
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 4  # the missing cells of the short row stay blank
    assert [ax.get_title() for ax in fig.axes] == ["truth", "data", "samples", "only one"]
    assert [ax.get_ylabel() for ax in fig.axes] == ["a", "", "", "b"]
    path = save_figure(fig, tmp_path / "sub" / "fig.png")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_panel_figure_rejects_bad_input():
    with pytest.raises(ValueError, match="'rows'"):
        panel_figure([])
    with pytest.raises(ValueError, match="'row_labels' should have 1 labels, got 2"):
        panel_figure([[Panel("x", BOX, samples=np.zeros((3, 2)))]], row_labels=["a", "b"])
    with pytest.raises(ValueError, match=r"'log_density' should have shape \(R, R\)"):
        panel_figure([[Panel("x", BOX, log_density=np.zeros(5))]])


def test_draw_samples_checks_shape():
    ax = Figure().add_subplot()
    with pytest.raises(ValueError, match=r"'samples' should have shape \(N, 2\), got \(4, 3\)"):
        draw_samples(ax, np.zeros((4, 3)), BOX)


def test_moving_average_matches_the_definition():
    values = np.random.default_rng(0).normal(size=57)
    expected = [values[max(0, i - 9) : i + 1].mean() for i in range(57)]
    np.testing.assert_allclose(moving_average(values, 10), expected)
    np.testing.assert_allclose(moving_average(values, 100), np.cumsum(values) / np.arange(1, 58))
    for window in (0, 2.5):
        with pytest.raises(ValueError, match="'window' should be"):
            moving_average(values, window)


def test_grid_checks_chunk():
    with pytest.raises(ValueError, match="'chunk' should be >= 1, got 0"):
        grid_log_density(lambda x: x[:, 0], BOX, 4, chunk=0)


def test_loss_figure(tmp_path):
    a = History(objective="nll", train_loss=list(np.linspace(5.0, 3.0, 200)))
    b = History(
        objective="nll",
        train_loss=list(np.linspace(6.0, 3.5, 200)),
        valid_steps=[100, 200],
        valid_loss=[4.0, 3.6],
    )
    elbo = History(objective="neg_elbo", train_loss=[3.0, 2.5, 2.2])
    fig = loss_figure(
        {"rings": {"MAF": a, "IAF": b}, "U1": {"IAF": elbo}},
        references={"rings": ("entropy", 2.6)},
        smooth=10,
    )
    rings, energy = fig.axes[:2]
    assert rings.get_ylabel() == "NLL (nats)" and energy.get_ylabel() == "-ELBO (nats)"
    low, high = rings.get_ylim()
    assert low < 2.6 < high  # the reference line is in view
    assert [t.get_text() for t in rings.get_legend().get_texts()] == [
        "MAF",
        "IAF",
        "entropy = 2.600",
    ]
    assert save_figure(fig, tmp_path / "loss.png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="'histories'"):
        loss_figure({})
    with pytest.raises(ValueError, match=r"at least one run per group; \['U2'\] have none"):
        loss_figure({"U1": {"IAF": elbo}, "U2": {}})


def test_density_colour_scale():
    log_p = np.zeros((40, 40))
    log_p[3, 4] = 5.0  # one isolated spike
    robust, shared = panel_figure(
        [
            [
                Panel("robust", BOX, log_density=log_p),
                Panel("shared", BOX, log_density=log_p, vmax=2.0),
            ]
        ]
    ).axes
    assert robust.images[0].norm.vmax == pytest.approx(1.0)  # the spike does not set the scale
    assert shared.images[0].norm.vmax == 2.0
    assert robust.images[0].norm.vmin == shared.images[0].norm.vmin == 0.0


def test_palette_png_is_smaller_and_looks_the_same(tmp_path):
    from PIL import Image

    log_p = grid_log_density(lambda x: -0.5 * x.square().sum(1), BOX, 100)
    points = torch.randn(3000, 2)
    fig = panel_figure([[Panel("d", BOX, log_density=log_p), Panel("s", BOX, samples=points)]])
    full = save_figure(fig, tmp_path / "full.png", dpi=80)
    small = save_figure(fig, tmp_path / "small.png", dpi=80, palette=True)
    assert small.stat().st_size < full.stat().st_size
    a, b = Image.open(full), Image.open(small)
    assert b.mode == "P" and a.size == b.size
    diff = np.abs(np.asarray(a.convert("RGB"), float) - np.asarray(b.convert("RGB"), float))
    assert diff.mean() < 2.0  # out of 255


def test_save_figure_replaces_a_file_atomically_and_names_what_it_wrote(tmp_path, monkeypatch):
    """A write that fails leaves the earlier figure as it was (it used to truncate it); a path
    without a suffix gets .png, and that is the path returned."""
    import flowkit.checkpoint.format as fmt

    fig = Figure(figsize=(2, 2))
    fig.add_subplot().plot([0, 1], [0, 1])
    path = save_figure(fig, tmp_path / "fig.png")
    before = path.read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fmt.os, "replace", disk_full)
    fig.add_subplot().plot([1, 0], [0, 1])
    for palette in (False, True):
        with pytest.raises(OSError):
            save_figure(fig, path, palette=palette)
        assert path.read_bytes() == before
        assert [p.name for p in tmp_path.iterdir()] == ["fig.png"]  # no temporary file left
    monkeypatch.undo()
    named = save_figure(fig, tmp_path / "out" / "figure")
    assert named == tmp_path / "out" / "figure.png" and named.read_bytes()[:8] == PNG_MAGIC


def test_loss_figure_names_bad_columns_and_smooth():
    """They raised ZeroDivisionError, or named moving_average's 'window'."""
    h = History()
    h.train_loss = [1.0, 0.5]
    for name, kwargs in (("columns", {"columns": 0}), ("smooth", {"smooth": 0})):
        with pytest.raises(ValueError, match=f"'{name}' should be >= 1"):
            loss_figure({"a": {"run": h}}, **kwargs)


def test_pairs_figure_layout_ranges_and_histograms():
    """A K x K grid: histograms of each shown feature on the diagonal (the data's as a density
    over the panel's bins), scatter plots of the pairs below it, nothing above; each axis spans
    the data's central range, not the samples', and the share of samples outside is named."""
    g = torch.Generator().manual_seed(0)
    data = torch.randn(4000, 4, generator=g) * torch.tensor([1.0, 100.0, 0.01, 5.0])
    samples = data.clone()
    samples[:10, 1] = 1e6  # a few far samples must not stretch the panels
    fig = pairs_figure(data, samples, features=[1, 3, 0], labels=["a", "b", "c", "d"], bins=30)
    axes = np.array(fig.axes).reshape(3, 3)
    for i in range(3):
        for j in range(3):
            assert axes[i, j].axison == (j <= i)
    assert axes[2, 0].get_xlabel() == "b" and axes[1, 0].get_ylabel() == "d"
    low, high = axes[0, 0].get_xlim()
    assert -400 < low < -200 and 200 < high < 400  # feature 1 (scale 100): its data's range
    assert axes[1, 0].get_ylim() == axes[1, 1].get_xlim()  # the pair shares feature 3's range
    outside = ((samples[:, 1] < low) | (samples[:, 1] > high)).float().mean().item()
    assert outside > 10 / 4000
    assert axes[0, 0].get_title() == f"{outside:.1%} of samples outside"
    heights = axes[0, 0].patches[0].get_xy()[:, 1]  # the data's filled histogram
    expected, _ = np.histogram(data[:, 1].numpy(), bins=np.linspace(low, high, 31), density=True)
    assert heights.max() == pytest.approx(expected.max(), rel=1e-6)
    assert len(axes[1, 0].collections) == 2  # data, then samples


def test_pairs_figure_one_feature_and_defaults():
    x = torch.randn(300, 9)
    fig = pairs_figure(x, x)
    assert len(fig.axes) == 36  # the first six features
    assert fig.axes[0].get_xlabel() == "" and fig.axes[-1].get_xlabel() == "x5"
    one = pairs_figure(x[:, :1], x[:, :1] + 1.0, title="one")
    assert len(one.axes) == 1 and one.texts[0].get_text() == "one"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"samples": torch.randn(5, 2)}, r"'samples' should have shape \(M, 3\)"),
        ({"data": torch.randn(5)}, r"'data' should have shape \(N, D\)"),
        ({"features": [0, 3]}, r"'features' should be distinct feature indices in \[0, 3\)"),
        ({"features": [1, 1]}, r"'features' should be distinct"),
        ({"features": [-1]}, r"'features\[0\]'"),
        ({"labels": ["a"]}, r"'labels' should name the 3 features, got 1"),
        ({"data": torch.full((4, 3), float("nan"))}, r"'data' has no row of finite values"),
    ],
)
def test_pairs_figure_refuses_bad_arguments(kwargs, message):
    args = {"data": torch.randn(50, 3), "samples": torch.randn(60, 3), **kwargs}
    with pytest.raises(ValueError, match=message):
        pairs_figure(args.pop("data"), args.pop("samples"), **args)


def test_loss_figure_takes_one_history_and_names_what_it_refuses():
    """``loss_figure(history)``, the first call one tries, was an AttributeError ('History'
    object has no attribute 'items'; review 22)."""
    history = History(objective="nll", train_loss=[3.0, 2.5, 2.0], valid_steps=[3],
                      valid_loss=[2.2])
    fig = loss_figure(history)
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) == 3  # smoothed, raw, validation
    for bad in ([history], {"g": [history]}, {"g": {"run": [1.0, 2.0]}}):
        with pytest.raises(TypeError, match=r"'histories' should be a History or a mapping "
                                            r"\{group: \{run label: History\}\}"):
            loss_figure(bad)


def test_grid_log_density_refuses_the_flow_itself():
    """Calling a flow gives its distribution given a context: passed instead of
    ``flow.log_prob``, the grid's points were taken for a context (review 22)."""
    import flowkit

    flow = flowkit.MAF(2, layers=1, hidden_features=(4,))
    with pytest.raises(TypeError, match=r"'log_prob' should be a function x -> log p\(x\), "
                                        r"such as flow.log_prob; got the Flow itself"):
        grid_log_density(flow, BOX, 4)
    assert grid_log_density(flow.log_prob, BOX, 4).shape == (4, 4)


def test_pairs_figure_names_a_data_frames_columns_and_stays_quiet_without_samples_in_range():
    """A frame's column names label the panels; samples all outside the data's range drew a
    numpy RuntimeWarning from an empty density histogram (review 25)."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"age": np.linspace(20, 70, 50), "income": np.linspace(1, 2, 50)})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fig = pairs_figure(frame, np.full((40, 2), 1e6))
    assert [ax.get_xlabel() for ax in fig.axes[2:]] == ["age", "income"]
    one = pairs_figure(frame["age"], frame["age"] + 1.0)  # a Series: one column (review 27)
    assert len(one.axes) == 1 and one.axes[0].get_xlabel() == "age"
    assert fig.axes[0].get_title() == "100.0% of samples outside"
