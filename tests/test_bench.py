"""The benchmark suite runs end to end in --quick mode (a smoke test; no timing assertions)."""

import argparse
import json

from flowkit.app import bench


def test_bench_quick_writes_a_table_and_json(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--quick", "--repeats", "1", "--json", str(tmp_path / "b.json")])
    args.device, args.seed, args.out, args.quiet = "cpu", 0, tmp_path, False
    metrics = bench.run(args)
    record = json.loads((tmp_path / "b.json").read_text())
    assert {r["section"] for r in record["rows"]} == {"density", "sampling", "bernoulli",
                                                      "staircase"}
    assert all(r["vs_dense"] > 0 for r in record["rows"] if "vs_dense" in r)
    assert all(r["ms"] > 0 for r in record["rows"])
    assert all(r["identical_to_naive"] for r in record["rows"] if "identical_to_naive" in r)
    assert metrics["density/D=2/log_prob"] > 0
    assert "| density | D=2 | log_prob |" in capsys.readouterr().out


def test_quiet_keeps_the_results_table(tmp_path, capsys):
    from flowkit.app.cli import main

    argv = ["bench", "--quick", "--sections", "density", "--repeats", "1", "--quiet",
            "--device", "cpu", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| density | D=2 | log_prob |" in out
    assert f"wrote {tmp_path / 'bench.json'}" in out


def test_memory_alone_is_refused(tmp_path, capsys):
    from flowkit.app.cli import main

    assert main(["bench", "--quick", "--sections", "memory", "--out", str(tmp_path / "b")]) == 2
    assert "'--sections memory' measures the memory of the other" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
