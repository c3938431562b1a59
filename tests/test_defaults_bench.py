"""`flowkit bench-defaults`: the tasks it builds and a smoke run of a few seconds (the full run
is a benchmark, not a test)."""

import json
import math

import numpy as np
import pytest

from flowkit.app import cli
from flowkit.app.defaults_bench.suite import make_tasks
from flowkit.app.defaults_bench.table import cells_table, summarize, verdicts


def test_tasks_share_one_split_and_change_units_on_one_axis():
    tasks = {t.name: t for t in make_tasks(200, 100, seed=0)}
    own, units = tasks["8gaussians:own"], tasks["8gaussians:x100+1000"]
    assert np.allclose(units.train[:, 0], own.train[:, 0] * 100.0 + 1000.0)
    assert np.array_equal(units.test[:, 1], own.test[:, 1])
    assert units.log_jacobian == math.log(100.0) and own.log_jacobian == 0.0
    assert own.entropy is not None and tasks["moons:own"].entropy is None
    raw, std = tasks["wine:raw"], tasks["wine:std"]
    assert raw.train.shape == std.train.shape and raw.real
    assert len(raw.test) == 178 // 5
    fitted = np.concatenate([std.train, std.valid])
    assert np.allclose(fitted.mean(0), 0.0, atol=1e-5)
    assert np.allclose(fitted.std(0), 1.0, atol=1e-4)
    moons = tasks["moons|y:x100+1000"]
    assert moons.context is not None and set(np.unique(moons.context[0])) == {0.0, 1.0}
    names = list(tasks)
    assert len(names) == len(set(names)) == 8 * 2 + 5 * 2 + 2


def test_quick_run_writes_cells_and_a_table_and_resumes(tmp_path, capsys):
    out = tmp_path / "bench"
    args = ["bench-defaults", "--quick", "--tasks", "moons:x100+1000", "moons|y:own",
            "--models", "flowkit-maf", "gmm", "--quiet", "--out", str(out)]
    assert cli.main(args) == 0
    cells = sorted(p.name for p in (out / "cells").glob("seed0/*.json"))
    assert len(cells) == 4
    table = (out / "table.md").read_text()
    assert "| task | flowkit-maf | gmm |" in table and "| moons\\|y:own |" in table
    record = json.loads((out / "cells" / "seed0" / "moons_x100p1000__flowkit-maf.json").read_text())
    assert math.isfinite(record["nll"]) and record["se"] > 0
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*/*.json")}
    capsys.readouterr()
    assert cli.main(args) == 0  # every cell is there: nothing is fitted again
    assert stamps == {p.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*/*.json")}
    assert "flowkit-maf:" not in capsys.readouterr().out
    # a cell computed with other settings is not taken for this run's: it is an error
    assert cli.main([*args[:-2], "--patience", "7", "--out", str(out)]) == 2
    assert "was computed with --patience 100 (now 7)" in capsys.readouterr().err
    assert stamps == {p.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*/*.json")}
    # the table of a run shows its seeds only; --table-only shows every seed found
    assert cli.main([*args[:-2], "--seed", "1", "--out", str(out)]) == 0
    run_table = capsys.readouterr().out
    assert cli.main([*args, "--table-only"]) == 0
    all_table = capsys.readouterr().out
    one = json.loads((out / "cells" / "seed1" / "moons_given_y_own__gmm.json").read_text())
    assert f"{one['nll']:.3f}" in run_table.split("moons\\|y:own")[1].split("\n")[0]
    assert run_table != all_table


def test_table_marks_the_lowest_nll_and_shows_failures():
    cells = {"t": {"a": {"nll": 1.0, "se": 0.1}, "b": {"nll": 0.5, "se": 0.1},
                   "c": {"error": "diverged at step 3", "seconds": 1.0}}}
    table = cells_table(cells, ["t"], ["a", "b", "c"])
    assert "| t | 1.000 ± 0.100 | **0.500 ± 0.100** | diverged at step 3 |" in table


def test_seeds_are_summarized_by_their_mean_and_standard_error():
    records = [{"nll": 1.0, "se": 0.5, "seconds": 1.0}, {"nll": 3.0, "se": 0.5, "seconds": 3.0}]
    s = summarize(records)
    assert s["nll"] == 2.0 and s["seeds"] == 2 and s["seconds"] == 2.0
    assert math.isclose(s["se"], 1.0)  # sample deviation sqrt(2) over sqrt(2) seeds
    assert summarize(records[:1])["se"] == 0.5  # one seed: its standard error over test rows
    failed = summarize([records[0], {"error": "diverged at step 7", "seconds": 1.0}])
    assert failed["nll"] == math.inf and failed["error"] == "diverged at step 7 (1 of 2 seeds)"


def test_verdict_counts_only_the_references_standard_error():
    row = {"flowkit-maf": {"nll": 1.05, "se": 9.0}, "zuko-maf": {"nll": 1.0, "se": 0.1},
           "flowkit-spline": {"nll": 1.2, "se": 0.0}, "zuko-nsf": {"nll": 1.0, "se": 0.1},
           "gmm": {"nll": 1.1, "se": 0.0}, "kde": {"nll": 2.0, "se": 0.0}}
    lines = verdicts({"t": row}, ["t"])
    assert lines[0] == ("- t: flowkit-maf vs zuko-maf: yes; flowkit-spline vs zuko-nsf: NO; "
                        "flowkit vs best sklearn: yes")
    assert lines[-1] == "\ntargets met: 2 of 3 comparisons"


def test_options_given_win_over_quick():
    from flowkit.app.defaults_bench import _settings

    parser = cli.build_parser("bench-defaults")
    quick = _settings(parser.parse_args(["bench-defaults", "--quick", "--out", "o"]))
    assert (quick.steps, quick.real_steps, quick.n_train, quick.valid_every) == (20, 20, 600, 10)
    given = _settings(parser.parse_args(["bench-defaults", "--quick", "--steps", "50",
                                         "--n-train", "900", "--valid-every", "5", "--out", "o"]))
    assert (given.steps, given.real_steps, given.n_train, given.valid_every) == (50, 20, 900, 5)
    full = _settings(parser.parse_args(["bench-defaults", "--out", "o"]))
    assert (full.steps, full.target_steps, full.n_train, full.valid_every) == (3000, 3000, 10000,
                                                                              None)


def test_flow_and_fit_options_reach_the_flowkit_cells_and_are_recorded(tmp_path, capsys):
    base = ["bench-defaults", "--quick", "--tasks", "moons:own", "--models", "flowkit-spline",
            "--quiet"]
    assert cli.main([*base, "--out", str(tmp_path / "a")]) == 0
    options = ["--flow-options", '{"layers": 1, "hidden_features": [8]}',
               "--fit-options", '{"lr": 0.01}']
    assert cli.main([*base, *options, "--out", str(tmp_path / "b")]) == 0
    cell = "cells/seed0/moons_own__flowkit-spline.json"
    plain = json.loads((tmp_path / "a" / cell).read_text())
    varied = json.loads((tmp_path / "b" / cell).read_text())
    # MAF's lu_linear, given or not (its default changed: review 28)
    assert plain["settings"]["flow_options"] == {"lu_linear": True}
    assert varied["settings"]["flow_options"] == {"lu_linear": True, "layers": 1,
                                                  "hidden_features": [8]}
    assert varied["settings"]["fit_options"] == {"lr": 0.01}
    assert varied["nll"] != plain["nll"]
    capsys.readouterr()
    # the cells of one run are not taken for another's
    assert cli.main([*base, "--out", str(tmp_path / "b")]) == 2
    assert "--flow-options" in capsys.readouterr().err
    # nor a cell of before the default changed (no flow options recorded) for today's flow
    path = tmp_path / "a" / cell
    path.write_text(json.dumps({**plain, "settings": {
        k: v for k, v in plain["settings"].items() if k != "flow_options"}}))
    assert cli.main([*base, "--out", str(tmp_path / "a")]) == 2
    assert ("--flow-options {'lu_linear': False} (now {'lu_linear': True})"
            in capsys.readouterr().err)
    assert cli.main([*base, "--flow-options", '{"lu_linear": false}',  # the flow it holds
                     "--out", str(tmp_path / "a")]) == 0
    # not a JSON object; a keyword the benchmark sets itself
    with pytest.raises(SystemExit):
        cli.main([*base, "--flow-options", "[1]", "--out", str(tmp_path / "c")])
    assert "argument --flow-options: should be a JSON object" in capsys.readouterr().err
    assert cli.main([*base, "--fit-options", '{"steps": 5}', "--out", str(tmp_path / "c")]) == 2
    assert "'--fit-options' sets steps, which the benchmark sets" in capsys.readouterr().err
