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
