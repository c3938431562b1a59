"""Tests of the 2-D experiments: ``flowkit toy`` and ``flowkit energy`` smoke runs (the --quick
mode CI runs), their metrics and tables, the soft-walled energy targets, and the NaN/Inf sweep
(a few combinations in CI, all of them under ``-m slow``)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from flowkit import load_model
from flowkit.app.cli import main
from flowkit.app.energy import ENERGY_SETTINGS, fit_energy
from flowkit.app.experiment2d import FLOWS, QUICK, TRANSFORMERS, FlowSettings, build_flow
from flowkit.app.toy import _TEST_SEED_OFFSET, SWEEP_LRS, fit_toy, robustness_sweep, toy_table
from flowkit.data.energy import (
    ENERGIES,
    ENERGY_BOXES,
    energy_log_density,
    energy_log_normalizer,
    walled_log_density,
    walled_log_normalizer,
)
from flowkit.data.toy import TOY_DATASETS, has_exact_density, sample_toy

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _one_thread():
    """One CPU thread, as the commands use (their default --threads 1); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_toy_quick_cli(tmp_path, capsys):
    """The CI smoke test: ``flowkit toy --quick`` on all eight datasets."""
    out = tmp_path / "toy"
    assert main(["toy", "--quick", "--quiet", "--device", "cpu", "--out", str(out)]) == 0
    for name in ["gallery.png", "losses.png", *(f"toy_{d}.png" for d in TOY_DATASETS)]:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
    record = json.loads((out / "metrics.json").read_text())
    runs = record["metrics"]["runs"]
    assert [r["dataset"] for r in runs] == list(TOY_DATASETS)
    assert record["metrics"]["settings"]["steps"] == QUICK.steps
    models = [out / "models" / f"{d}_maf_spline.pt" for d in TOY_DATASETS]
    assert record["metrics"]["models"] == [str(m) for m in models]
    for r, path in zip(runs, models, strict=True):
        assert math.isfinite(r["test_nll"]) and r["test_nll_se"] > 0
        if has_exact_density(r["dataset"]):
            assert r["kl"] == pytest.approx(r["test_nll"] - r["entropy"])
        else:
            assert r["kl"] is None and r["entropy"] is None
        # the saved flow is the trained one: it gives the recorded NLL on the same test points
        test = sample_toy(r["dataset"], QUICK.eval_samples, seed=_TEST_SEED_OFFSET)
        with torch.no_grad():
            nll = -load_model(path).log_prob(test).double().mean().item()
        assert nll == pytest.approx(r["test_nll"], rel=1e-6)
    scores, costs = (out / "table.md").read_text().split("\n\n")
    assert scores.splitlines()[0] == "| dataset | entropy | MAF spline NLL | MAF spline KL |"
    assert len(scores.splitlines()) == 2 + len(TOY_DATASETS)
    assert costs.splitlines()[2].startswith("| MAF spline | ")
    assert "MAF spline NLL" in capsys.readouterr().out


def test_toy_options_override_quick(tmp_path):
    out = tmp_path / "toy"
    argv = ["toy", "--quick", "--quiet", "--device", "cpu", "--out", str(out)]
    argv += ["--datasets", "rings", "--flows", "maf", "iaf", "--transformer", "affine"]
    argv += ["--steps", "7", "--hidden", "8", "--lr-schedule", "none"]
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    assert metrics["settings"]["steps"] == 7
    assert metrics["settings"]["hidden"] == [8]
    assert metrics["settings"]["lr_schedule"] is None
    assert metrics["settings"]["layers"] == QUICK.layers
    assert [(r["flow"], r["transformer"]) for r in metrics["runs"]] == [
        ("maf", "affine"),
        ("iaf", "affine"),
    ]
    header = (out / "table.md").read_text().splitlines()[0]
    assert header == (
        "| dataset | entropy | MAF affine NLL | MAF affine KL | IAF affine NLL | IAF affine KL |"
    )


@pytest.mark.parametrize(
    ("command", "flag", "values"),
    [
        ("toy", "--datasets", ["moons", "spiral"]),
        ("toy", "--flows", ["nice"]),
        ("toy", "--transformer", ["affine", "splin"]),
        ("energy", "--energies", ["U5"]),
        ("energy", "--transformer", [","]),
    ],
)
def test_unknown_names_are_user_errors_naming_the_option(tmp_path, capsys, command, flag, values):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--quick", flag, *values, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert f"argument {flag}: invalid choice: '{values[-1]}'" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "option", "names"), [
    ("toy", "datasets", ["moons", "circles"]), ("toy", "flows", ["maf", "iaf"]),
    ("toy", "transformer", ["affine", "spline"]), ("energy", "energies", ["U1", "U4"]),
    ("energy", "flows", ["iaf", "maf"]), ("energy", "transformer", ["spline", "affine"]),
])
def test_lists_of_names_are_space_separated_as_in_the_other_commands(command, option, names):
    from flowkit.app.cli import build_parser

    args = build_parser(command).parse_args([command, f"--{option}", *names])
    assert getattr(args, option) == names


def test_unknown_names_in_python_calls_name_the_argument():
    with pytest.raises(ValueError, match="'transformers' should be a non-empty subset"):
        robustness_sweep(["moons"], ["maf"], ["splin"])


def test_energy_quick_cli(tmp_path):
    out = tmp_path / "energy"
    argv = ["energy", "--quick", "--quiet", "--device", "cpu", "--out", str(out)]
    assert main([*argv, "--energies", "U1", "U4", "--steps", "10"]) == 0
    for name in ["gallery.png", "losses.png", "energy_U1.png", "energy_U4.png"]:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
    runs = json.loads((out / "metrics.json").read_text())["metrics"]["runs"]
    assert [r["energy"] for r in runs] == ["U1", "U4"]
    for r in runs:
        assert r["kl"] == pytest.approx(r["log_z"] - r["elbo"])
        assert 0.0 <= r["outside"] <= 1.0
    assert (out / "table.md").read_text().startswith("| energy | log Z | IAF spline ELBO |")
    # the saved flows are the trained ones: training is seeded, so a second fit gives the
    # same weights, and the loaded files the same log-densities
    settings = replace(QUICK, bound=ENERGY_SETTINGS.bound, steps=10)
    z = torch.randn(5, 2)
    for name in ["U1", "U4"]:
        *_, model = fit_energy(name, "iaf", "spline", settings, device=torch.device("cpu"))
        loaded = load_model(out / "models" / f"{name}_iaf_spline.pt")
        with torch.no_grad():
            assert torch.equal(loaded.log_prob(z), model.log_prob(z))


def test_build_flow_is_seeded_and_leaves_the_global_generator_alone():
    settings = replace(QUICK, layers=2)
    state = torch.get_rng_state()
    a = build_flow("iaf", "spline", settings, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    b = build_flow("iaf", "spline", settings, seed=3)
    c = build_flow("iaf", "spline", settings, seed=4)
    pairs = list(zip(a.parameters(), b.parameters(), strict=True))
    assert all(torch.equal(p, q) for p, q in pairs)
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))
    with pytest.raises(ValueError, match="'transformer' should be one of affine, spline"):
        build_flow("maf", "cubic", settings)


def test_fit_toy_metrics_are_consistent():
    settings = replace(QUICK, steps=5, eval_samples=500, plot_samples=50, resolution=12)
    test = torch.randn(500, 2)
    run = fit_toy("checkerboard", "maf", "affine", settings, test=test, device=torch.device("cpu"))
    m = run.metrics
    assert m["kl"] == pytest.approx(m["test_nll"] - math.log(32.0))
    assert run.log_density.shape == (12, 12) and run.samples.shape == (50, 2)
    assert len(run.history.train_loss) == 5
    assert [p.title.split("\n")[0] for p in run.panels()] == [
        "MAF affine density",
        "MAF affine samples",
    ]


def test_toy_table_leaves_missing_runs_blank():
    records = [
        {
            "dataset": "moons",
            "flow": "maf",
            "transformer": "affine",
            "test_nll": 2.0,
            "entropy": None,
            "kl": None,
        },
        {
            "dataset": "rings",
            "flow": "iaf",
            "transformer": "affine",
            "test_nll": 3.0,
            "entropy": 2.5,
            "kl": 0.5,
        },
    ]
    assert toy_table(records).splitlines()[2:] == [
        "| moons | n/a | 2.000 | n/a | n/a | n/a |",
        "| rings | 2.500 | n/a | n/a | 3.000 | 0.500 |",
    ]


@pytest.mark.parametrize("name", ENERGIES)
def test_walled_target_is_the_energy_inside_the_box(name):
    xmin, xmax, ymin, ymax = ENERGY_BOXES[name]
    inside = torch.rand(200, 2, dtype=torch.float64)
    inside = inside * torch.tensor([xmax - xmin, ymax - ymin]) + torch.tensor([xmin, ymin])
    torch.testing.assert_close(walled_log_density(name, inside), energy_log_density(name, inside))
    outside = inside + torch.tensor([xmax - xmin + 0.3, 0.0], dtype=torch.float64)
    wall = -0.5 * (0.3 + (inside[:, 0] - xmin)) ** 2 / 0.1**2
    torch.testing.assert_close(
        walled_log_density(name, outside), energy_log_density(name, outside) + wall
    )


@pytest.mark.parametrize("name", ENERGIES)
def test_walled_log_normalizer(name):
    box, walled = energy_log_normalizer(name, 500), walled_log_normalizer(name, resolution=400)
    # the wall adds mass only where the box truncates the density: the z1 edges of U2-U4
    assert 0.0 <= walled - box < (1e-6 if name == "U1" else 0.035)
    assert walled_log_normalizer(name, resolution=300) == pytest.approx(walled, abs=1e-5)


def _check_sweep(records, expected):
    assert len(records) == expected
    failures = [r for r in records if not r["finite"]]
    assert not failures, failures
    assert all(math.isfinite(r["last_loss"]) for r in records)


def test_sweep_short():
    """A few of the hardest combinations at the largest learning rate, full-size models."""
    settings = FlowSettings(steps=20)
    records = robustness_sweep(
        ["checkerboard", "rings"],
        ["maf", "iaf"],
        ["spline"],
        [1e-2],
        settings=settings,
        device="cpu",
    )
    _check_sweep(records, 4)


@pytest.mark.slow
def test_sweep_full():
    """Every dataset x MAF/IAF x affine/spline x lr in {1e-4, 1e-3, 1e-2}: 96 runs, the same
    as ``flowkit toy --sweep --flows maf iaf --transformer affine spline --steps 150``."""
    records = robustness_sweep(settings=FlowSettings(steps=150), device="cpu")
    _check_sweep(records, len(TOY_DATASETS) * len(FLOWS) * len(TRANSFORMERS) * len(SWEEP_LRS))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_toy_on_cuda(tmp_path):
    out = tmp_path / "cuda"
    argv = ["toy", "--quick", "--quiet", "--device", "cuda", "--out", str(out)]
    assert main([*argv, "--datasets", "moons", "rings", "--flows", "maf", "iaf"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    assert metrics["device"].startswith("cuda")
    assert all(math.isfinite(r["test_nll"]) for r in metrics["runs"])


@pytest.mark.parametrize("command, target", [("toy", ["--datasets", "moons"]),
                                             ("energy", ["--energies", "U1"])])
def test_a_rerun_does_not_replace_the_results(tmp_path, capsys, command, target):
    out = tmp_path / "run"
    argv = [command, "--quick", "--quiet", "--device", "cpu", "--out", str(out), *target,
            "--steps", "3", "--eval-samples", "200", "--plot-samples", "100",
            "--resolution", "8"]
    assert main(argv) == 0
    table = (out / "table.md").stat().st_mtime_ns
    capsys.readouterr()
    assert main(argv) == 2
    assert "table.md' exists: a rerun would replace that run's results; pick another --out" in (
        capsys.readouterr().err)
    assert (out / "table.md").stat().st_mtime_ns == table
    (out / "table.md").unlink()  # as after an interruption: the saved flows are kept too
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "_spline.pt' exists, left by a run into" in err and "did not finish" in err


@pytest.mark.parametrize("option, value", [
    ("--eval-samples", "0"), ("--plot-samples", "0"), ("--batch-size", "0"), ("--hidden", "0"),
    ("--steps", "0"), ("--lr", "nan"), ("--bound", "-1"), ("--threads", "0"),
])
def test_bad_numbers_are_refused_naming_the_option(tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as exit_info:
        main(["toy", "--quick", option, value, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert f"argument {option}: should be" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["toy", "energy"])
@pytest.mark.parametrize("value", ["1", "7"])
def test_a_resolution_too_coarse_to_show_a_density_is_refused(tmp_path, capsys, command, value):
    """``--resolution 1`` drew a blank panel: one cell, one colour (review 11)."""
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--quick", "--resolution", value, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert f"argument --resolution: should be an integer >= 8, got '{value}'" in (
        capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_one_run_is_one_run(tmp_path, capsys):
    """It printed "1 runs in 13.2 s" (review 11)."""
    argv = ["toy", "--quick", "--quiet", "--device", "cpu", "--out", str(tmp_path / "out"),
            "--datasets", "moons", "--steps", "2", "--eval-samples", "200", "--plot-samples",
            "100", "--resolution", "8"]
    assert main(argv) == 0
    assert "\n1 run in " in capsys.readouterr().out


@pytest.mark.parametrize("command, targets", [("toy", ["moons", "rings"]), ("energy", ["U1"])])
def test_a_line_names_the_run_of_each_progress_bar(tmp_path, capsys, command, targets):
    """The bars are labelled with the loss only: eight identical bars did not say which dataset
    was running (review 11). --quiet shows neither."""
    option = "--datasets" if command == "toy" else "--energies"
    argv = [command, "--quick", "--device", "cpu", option, *targets, "--steps", "2",
            "--eval-samples", "200", "--plot-samples", "100", "--resolution", "8"]
    flow = "MAF" if command == "toy" else "IAF"
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "(run " in line]
    n = len(targets)
    assert lines == [f"{t}: {flow} spline (run {i} of {n})" for i, t in enumerate(targets, 1)]
    assert main([*argv, "--quiet", "--out", str(tmp_path / "b")]) == 0
    assert "(run " not in capsys.readouterr().out
