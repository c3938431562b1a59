"""`flowkit fit` on files: --key, --context (columns or an array), --transformer, the
standardization switch, the batch size capped by the data, the samples-over-data plot."""

import json
import re
import warnings

import numpy as np
import pytest
import torch

import flowkit
from flowkit.app import cli
from flowkit.transforms import Standardize

FAST = ["--steps", "3", "--hidden", "8", "--layers", "1", "--quiet", "--device", "cpu",
        "--threads", "1"]


def _metrics(out):
    return json.loads((out / "metrics.json").read_text())["metrics"]


def _table(tmp_path, rows=60):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 2)) * [1000.0, 0.01] + [5e4, 0.0]
    y = rng.integers(0, 2, size=rows)
    np.savez(tmp_path / "table.npz", x=x, y=y, other=rng.normal(size=(rows, 3)))
    return tmp_path / "table.npz"


def test_npz_key_and_context_array_with_spline(tmp_path, capsys):
    path, out = _table(tmp_path), tmp_path / "run"
    code = cli.main(["fit", "--data", str(path), "--key", "x", "--context", "y",
                     "--transformer", "spline", *FAST, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    m = _metrics(out)
    assert (m["features"], m["context_features"], m["transformer"]) == (2, 1, "spline")
    assert m["standardize"] == flowkit.flows.builders.DEFAULT_STANDARDIZATION
    assert (out / "samples.png").stat().st_size > 0 and (out / "loss.png").exists()
    flow = flowkit.load_model(out / "checkpoint.pt")
    assert flow.context_features == 1 and flow.standardize_context.initialized
    std = flow.transform.transforms[0]
    assert isinstance(std, Standardize) and std.scale[0] > 100.0  # set from the data in metres


def test_context_columns_and_capped_batch_size(tmp_path, capsys):
    x = np.random.default_rng(1).normal(size=(50, 3))
    np.save(tmp_path / "d.npy", x)
    out = tmp_path / "cols"
    code = cli.main(["fit", "--data", str(tmp_path / "d.npy"), "--context", "2", *FAST,
                     "--batch-size", "256", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # fit's valid="auto" holds out min(20, 50 // 5) = 10 of the 50 rows
    assert "note: --batch-size 256 is more than the 40 training rows; using 40" in captured.out
    m = _metrics(out)
    assert (m["features"], m["context_features"], m["batch_size"]) == (2, 1, 40)
    default = tmp_path / "default"  # fit's default for 40 training rows: 16
    assert cli.main(["fit", "--data", str(tmp_path / "d.npy"), *FAST, "--out", str(default)]) == 0
    assert "note" not in capsys.readouterr().out and _metrics(default)["batch_size"] == 16


def test_the_data_file_can_be_named_without_the_option(tmp_path, capsys):
    """``flowkit fit table.npy`` was "unrecognized arguments: table.npy"."""
    np.save(tmp_path / "d.npy", np.random.default_rng(1).normal(size=(50, 2)))
    out = tmp_path / "run"
    assert cli.main(["fit", str(tmp_path / "d.npy"), *FAST, "--out", str(out)]) == 0
    assert _metrics(out)["data"] == str(tmp_path / "d.npy")
    assert json.loads((out / "metrics.json").read_text())["args"]["data"] == str(tmp_path / "d.npy")
    code = cli.main(["fit", str(tmp_path / "d.npy"), "--data", "moons", *FAST,
                     "--out", str(tmp_path / "twice")])
    assert code == 2
    assert "named twice" in capsys.readouterr().err
    assert cli.main(["fit", *FAST, "--out", str(tmp_path / "toy")]) == 0  # the default: moons
    assert _metrics(tmp_path / "toy")["data"] == "moons"


def test_no_standardize_builds_the_plain_flow(tmp_path):
    np.save(tmp_path / "d.npy", np.random.default_rng(2).normal(size=(40, 2)))
    out = tmp_path / "plain"
    assert cli.main(["fit", "--data", str(tmp_path / "d.npy"), "--no-standardize", *FAST,
                     "--out", str(out)]) == 0
    flow = flowkit.load_model(out / "checkpoint.pt")
    assert not any(isinstance(m, Standardize) for m in flow.modules())
    assert _metrics(out)["standardize"] is False


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--key", "nope"], "'--key' 'nope' is not an array of"),
        (["--context", "5"], r"'--context' columns should be distinct integers in \[0, 2\)"),
        (["--context", "0", "1"], "takes every column"),
        (["--context", "missing"], "'--context' should be column numbers of 'x' or the name"),
    ],
)
def test_bad_file_options_are_named(tmp_path, capsys, extra, message):
    path = _table(tmp_path)
    code = cli.main(["fit", "--data", str(path), *extra, *FAST, "--out", str(tmp_path / "o")])
    assert code == 2
    assert re.search(message, capsys.readouterr().err)


def test_context_array_with_a_wrong_number_of_rows_is_named(tmp_path, capsys):
    np.savez(tmp_path / "t.npz", x=np.zeros((20, 2)), c=np.zeros((19, 1)))
    code = cli.main(["fit", "--data", str(tmp_path / "t.npz"), "--context", "c", *FAST,
                     "--out", str(tmp_path / "o")])
    assert code == 2
    assert r"the context array 'c' should have shape (20, C) or (20,)" in capsys.readouterr().err


def test_file_options_with_toy_data_and_npy_key_are_refused(tmp_path, capsys):
    assert cli.main(["fit", "--data", "moons", "--context", "0", *FAST,
                     "--out", str(tmp_path / "t")]) == 2
    assert "'--context' and '--key' are options of file data" in capsys.readouterr().err
    np.save(tmp_path / "d.npy", np.zeros((10, 2)))
    assert cli.main(["fit", "--data", str(tmp_path / "d.npy"), "--key", "x", *FAST,
                     "--out", str(tmp_path / "n")]) == 2
    assert "'--key' names an array of a .npz file" in capsys.readouterr().err


def test_npz_with_several_arrays_needs_a_key(tmp_path, capsys):
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "two.npz", a=rng.normal(size=(30, 2)), b=rng.normal(size=(30, 2)))
    assert cli.main(["fit", "--data", str(tmp_path / "two.npz"), *FAST,
                     "--out", str(tmp_path / "o")]) == 2
    assert "name the one to model with --key" in capsys.readouterr().err
    assert cli.main(["fit", "--data", str(tmp_path / "two.npz"), "--key", "b", *FAST,
                     "--out", str(tmp_path / "b")]) == 0


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (np.arange(40).reshape(20, 2), r"holds integer values \(int64\): .*dequantize"),
        (np.ones((20, 2), dtype=bool), r"holds boolean values \(bool\): .*dequantize"),
        (np.where(np.arange(40).reshape(20, 2) == 7, np.nan, 1.5), r"holds NaN or Inf values "
         r"\(first at row 3, column 1\)"),
        (np.ones(20), r"should hold an array of shape \(N, D\), got \(20,\); one value per row"),
    ],
    ids=["int", "bool", "nan", "1-D"],
)
def test_file_values_a_flow_cannot_fit_are_one_line_errors(tmp_path, capsys, values, message):
    path = tmp_path / "d.npy"
    np.save(path, values)
    code = cli.main(["fit", "--data", str(path), *FAST, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert re.search(f"^flowkit fit: error: '--data' '{re.escape(str(path))}' {message}", err)
    assert "'valid'" not in err and "'data'" not in err


@pytest.mark.parametrize(("extra", "option"), [(["--layers", "0"], "--layers"),
                                               (["--hidden", "8", "0"], "--hidden")])
def test_model_sizes_below_one_are_refused_by_option(tmp_path, capsys, extra, option):
    with pytest.raises(SystemExit) as info:
        cli.main(["fit", "--data", "moons", *FAST, *extra, "--out", str(tmp_path / "o")])
    assert info.value.code == 2
    assert f"argument {option}: should be an integer >= 1" in capsys.readouterr().err


def test_a_negative_seed_is_named_by_its_option(tmp_path, capsys):
    np.save(tmp_path / "d.npy", np.random.default_rng(4).normal(size=(30, 2)))
    code = cli.main(["fit", "--data", str(tmp_path / "d.npy"), *FAST, "--seed", "-1",
                     "--out", str(tmp_path / "o")])
    assert code == 2
    assert "flowkit fit: error: '--seed' should be >= 0, got -1" in capsys.readouterr().err


def test_validation_options_of_the_other_kind_of_data_are_refused(tmp_path, capsys):
    np.save(tmp_path / "d.npy", np.random.default_rng(5).normal(size=(30, 2)))
    assert cli.main(["fit", "--data", str(tmp_path / "d.npy"), "--valid-size", "10", *FAST,
                     "--out", str(tmp_path / "f")]) == 2
    assert "'--valid-size' applies to toy datasets" in capsys.readouterr().err
    assert cli.main(["fit", "--data", "moons", "--valid-fraction", "0.5", *FAST,
                     "--out", str(tmp_path / "t")]) == 2
    assert "'--valid-fraction' applies to file data" in capsys.readouterr().err
    # without them, each kind of data gets its documented default, recorded in metrics.json
    assert cli.main(["fit", "--data", str(tmp_path / "d.npy"), *FAST,
                     "--out", str(tmp_path / "f2")]) == 0
    args = json.loads((tmp_path / "f2" / "metrics.json").read_text())["args"]
    assert (args["valid_fraction"], args["valid_size"]) == (None, None)  # fit's "auto"


def test_resume_with_another_lr_schedule_names_the_option(tmp_path, capsys):
    np.save(tmp_path / "d.npy", np.random.default_rng(6).normal(size=(30, 2)))
    run = ["fit", "--data", str(tmp_path / "d.npy"), *FAST, "--out", str(tmp_path / "o")]
    assert cli.main([*run, "--lr-schedule", "none"]) == 0
    capsys.readouterr()
    assert cli.main([*run, "--resume"]) == 2  # the default --lr-schedule is cosine
    err = capsys.readouterr().err
    assert "was written by a run with --lr-schedule none, not --lr-schedule cosine; pass " \
           "--lr-schedule none to resume it" in err


def test_resume_with_other_model_or_data_options_names_them_as_typed(tmp_path, capsys):
    """A changed --valid-fraction surfaced as a batch-size or row-count mismatch, a changed
    --hidden as Python keywords (review 11); options.json records the options of the run."""
    np.save(tmp_path / "d.npy", np.random.default_rng(7).normal(size=(300, 2)))
    out = tmp_path / "o"
    run = ["fit", "--data", str(tmp_path / "d.npy"), *FAST, "--out", str(out)]
    assert cli.main(run) == 0
    recorded = json.loads((out / "options.json").read_text())
    assert recorded["hidden"] == [8] and recorded["valid_fraction"] is None
    capsys.readouterr()
    assert cli.main([*run, "--resume", "--valid-fraction", "0.3", "--no-standardize"]) == 2
    err = capsys.readouterr().err
    assert ("these differ: --valid-fraction 0.3 (started with no --valid-fraction); "
            "--no-standardize (started with no --no-standardize)") in err
    assert cli.main([*run, "--resume", "--steps", "6", "--lr-schedule", "none"]) == 2
    assert "these differ" not in capsys.readouterr().err  # training options are fit's to check
    assert cli.main(run) == 2  # a fresh run is refused and leaves the record as it was
    assert json.loads((out / "options.json").read_text()) == recorded


def test_a_run_started_before_valid_auto_resumes_with_its_tenth(tmp_path, capsys):
    """Review 33: a run of 120 rows started when a file's default holdout was a tenth could not
    be resumed (fit's 'auto' holds out 24 rows there, and --valid-fraction 0.1 was refused as a
    changed option). Its options.json records no valid_default: it resumes with 0.1."""
    np.save(tmp_path / "d.npy", np.random.default_rng(3).normal(size=(120, 2)))

    def run(out, steps, *more):
        return cli.main(["fit", "--data", str(tmp_path / "d.npy"), "--checkpoint-every", "3",
                         *FAST, "--steps", str(steps), "--lr-schedule", "none",
                         "--out", str(tmp_path / out), *more])

    assert run("old", 3, "--valid-fraction", "0.1") == 0
    record = json.loads((tmp_path / "old" / "options.json").read_text())
    assert record.pop("valid_default") == "auto"
    (tmp_path / "old" / "options.json").write_text(json.dumps({**record, "valid_fraction": None}))
    capsys.readouterr()
    assert run("old", 6, "--resume") == 0, capsys.readouterr().err
    assert _metrics(tmp_path / "old")["steps"] == 6
    assert run("new", 3) == 0 and run("new", 6, "--resume") == 0  # fit's "auto" both times


def test_lu_linear_is_a_model_option_and_an_older_run_resumes_with_it(tmp_path, capsys):
    """--lu-linear / --no-lu-linear reach the builder and define the run; a run whose
    options.json predates the option (started when the MAF had no LU-linear maps by default)
    resumes as it was built, with or without --no-lu-linear (review 28)."""
    np.save(tmp_path / "d.npy", np.random.default_rng(8).normal(size=(60, 3)))
    out = tmp_path / "o"
    run = ["fit", "--data", str(tmp_path / "d.npy"), *FAST, "--out", str(out)]
    assert cli.main([*run, "--no-lu-linear"]) == 0
    flow = flowkit.load_model(out / "checkpoint.pt")
    assert flow.config["kwargs"]["lu_linear"] is False
    assert "LULinear" not in {type(t).__name__ for t in flow.transform.transforms}
    capsys.readouterr()
    assert cli.main([*run, "--resume"]) == 2
    assert ("these differ: neither --lu-linear nor --no-lu-linear (started with "
            "--no-lu-linear)") in capsys.readouterr().err
    options = json.loads((out / "options.json").read_text())
    del options["lu_linear"]  # as written before the option existed
    (out / "options.json").write_text(json.dumps(options))
    assert cli.main([*run, "--resume"]) == 0
    assert cli.main([*run, "--resume", "--no-lu-linear"]) == 0
    assert cli.main([*run, "--resume", "--lu-linear"]) == 2
    assert "these differ: --lu-linear (started with --no-lu-linear)" in capsys.readouterr().err
    assert cli.main(["fit", "--data", str(tmp_path / "d.npy"), *FAST,
                     "--out", str(tmp_path / "lu")]) == 0  # the library's default: on for a MAF
    assert flowkit.load_model(tmp_path / "lu" / "checkpoint.pt").config["kwargs"]["lu_linear"]


@pytest.mark.parametrize(
    "name, write, message",
    [
        ("t.txt", lambda p: p.write_text("a,b\n1,2\n"), "reads .npy and .npz files .* and .csv"),
        ("gap.csv", lambda p: p.write_text("a,b\n1,2\n\n# note\n3,\n"),
         r"line 5, field 2 is empty \(a missing value: drop or fill such rows first\)"),
        ("word.csv", lambda p: p.write_text("1,2\n3,x\n"), "line 2, field 2 is 'x'"),
        ("ragged.csv", lambda p: p.write_text("a,b\n1,2\n3,4,5\n"),
         "line 3 has 3 fields, the lines before it 2"),
        ("header.csv", lambda p: p.write_text("a,b,c\n1,2\n"), "a header of 3 names and rows of 2"),
        ("blank.csv", lambda p: p.write_text("\n# nothing\n"), "is empty: it holds no rows"),
        ("header-only.csv", lambda p: p.write_text("a,b\n"), "has a header but no rows"),
        ("index.csv", lambda p: p.write_text(",a,b\n0,1,2\n"),
         r"the header names no column 0 \(pandas' to_csv writes the frame's index"),
        ("semicolons.csv", lambda p: p.write_text("1;2\n3;4\n"),
         r"seems separated by ';' \(line 1\): only commas are read"),
        ("twice.csv", lambda p: p.write_text("a,a\n1,2\n"),
         r"the header names several columns \['a'\]"),
        ("text-na.csv", lambda p: p.write_text("1.2,0.3,NA\n1,2,3\n"),
         r"line 1, field 3 is 'NA' \(a missing value: drop or fill such rows first\)"),
        ("gap-first.csv", lambda p: p.write_text("1,,3\n4,5,6\n"),
         r"line 1, field 2 is empty"),
        ("nan.csv", lambda p: p.write_text("a,b\n1,2\n3,nan\n"),
         r"holds NaN or Inf values \(first at row 1, column 1\)"),
        ("renamed.npy", lambda p: p.write_text("a,b\n1,2\n"), "is not a numpy .npy file"),
        ("cut.npy", lambda p: p.write_bytes(_npy_bytes(np.ones((50, 2)))[:90]),
         "cannot be read as a numpy .npy file"),
        ("objects.npz", lambda p: np.savez(p, x=np.array([{"a": 1}], dtype=object)),
         "holds Python objects, not an array of numbers"),
        ("empty.npy", lambda p: np.save(p, np.zeros((0, 2))), r"is empty: shape \(0, 2\)"),
        ("no-columns.npy", lambda p: np.save(p, np.zeros((5, 0))), r"is empty: shape \(5, 0\)"),
    ],
)
def test_files_numpy_cannot_use_are_named_with_the_option(tmp_path, capsys, name, write, message):
    """They gave numpy's own text, or errors about --batch-size and 'features' (review 11)."""
    path = tmp_path / name
    write(path)
    assert cli.main(["fit", "--data", str(path), *FAST, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(f"'--data' .*{message}", err), err


def _npz_bytes(compressed=False, **arrays):
    import io

    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


def _flipped(data: bytes, offset: int, bit: int = 4) -> bytes:
    return data[:offset] + bytes([data[offset] ^ (1 << bit)]) + data[offset + 1:]


_NPZ = _npz_bytes(x=np.random.default_rng(1).normal(size=(50, 2)))
_NPZ_COMPRESSED = _npz_bytes(compressed=True, x=np.random.default_rng(1).normal(size=(50, 2)))


@pytest.mark.parametrize(
    "content, message",
    [
        (_NPZ[: len(_NPZ) // 2], r"File is not a zip file"),
        (_flipped(_NPZ, len(_NPZ) // 2), r"Bad CRC-32 for file 'x.npy'"),
        (_flipped(_NPZ_COMPRESSED, len(_NPZ_COMPRESSED) // 2), r"(Bad CRC-32|Error -3)"),
    ],
    ids=["truncated", "bit-flip", "bit-flip-compressed"],
)
def test_a_damaged_npz_is_a_one_line_error_naming_the_option(tmp_path, capsys, content, message):
    """zipfile's BadZipFile (and zlib's error for a compressed member) ended the command in a
    traceback (review 19, finding 9)."""
    path = tmp_path / "d.npz"
    path.write_bytes(content)
    assert cli.main(["fit", "--data", str(path), *FAST, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(f"^flowkit fit: error: '--data' '{re.escape(str(path))}' cannot be read as "
                     f"a numpy .npz file \\(.*{message}.*\\): it is damaged or truncated", err), err


def test_fit_command_data_reads_or_names_an_npz_with_a_bit_flipped_anywhere(tmp_path):
    """One bit flipped in each byte of a small .npz (bit i mod 8 of byte i): every file is read
    or refused with a ValueError naming '--data' (never another exception: a damaged header
    gave zipfile's NotImplementedError or RuntimeError too)."""
    from flowkit.app.fit_data import load_file

    path = tmp_path / "d.npz"
    for data in (_npz_bytes(x=np.ones((4, 2))), _npz_bytes(compressed=True, x=np.ones((4, 2)))):
        for offset in range(len(data)):
            path.write_bytes(_flipped(data, offset, offset % 8))
            try:
                load_file(path, None, None)
            except ValueError as e:
                assert "'--data'" in str(e) or str(path) in str(e), (offset, e)


def test_a_big_endian_file_is_converted_exactly(tmp_path):
    """A valid .npy of '>f8' (and a big-endian context array) trains as the same values in this
    machine's byte order; torch's 'byte order different from the native byte order' error named
    neither --data nor the file before."""
    rng = np.random.default_rng(6)
    x, c = rng.normal(size=(40, 2)), rng.normal(size=(40, 1))
    np.savez(tmp_path / "native.npz", x=x, c=c)
    np.savez(tmp_path / "big.npz", x=x.astype(">f8"), c=c.astype(">f8"))
    np.save(tmp_path / "big.npy", x.astype(">f8"))
    np.save(tmp_path / "native.npy", x)
    results = {}
    for name, extra in (("native.npy", []), ("big.npy", []), ("native.npz", ["--context", "c"]),
                        ("big.npz", ["--context", "c"])):
        assert cli.main(["fit", "--data", str(tmp_path / name), *extra, *FAST,
                         "--out", str(tmp_path / name.replace(".", "-"))]) == 0
        results[name] = _metrics(tmp_path / name.replace(".", "-"))["valid_nll"]
    assert results["big.npy"] == results["native.npy"]
    assert results["big.npz"] == results["native.npz"]


def test_a_folder_as_data_and_a_valid_size_below_one_are_named(tmp_path, capsys):
    (tmp_path / "cli").mkdir()
    assert cli.main(["fit", "--data", str(tmp_path / "cli"), *FAST,
                     "--out", str(tmp_path / "o")]) == 2
    assert re.search(r"'--data' should be a toy dataset .* got '.*cli' \(a folder: pass a .npy, "
                     r".npz or .csv file inside it\)", capsys.readouterr().err)
    for size in ("0", "-3"):
        with pytest.raises(SystemExit) as info:
            cli.main(["fit", "--data", "moons", "--valid-size", size, *FAST,
                      "--out", str(tmp_path / "o")])
        assert info.value.code == 2
        assert "argument --valid-size: should be an integer >= 1" in capsys.readouterr().err


def _npy_bytes(array):
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_upper_case_suffixes_are_read_and_the_result_is_printed(tmp_path, capsys):
    (tmp_path / "D.NPY").write_bytes(_npy_bytes(np.random.default_rng(0).normal(size=(40, 2))))
    assert cli.main(["fit", "--data", str(tmp_path / "D.NPY"), *FAST,
                     "--out", str(tmp_path / "o")]) == 0
    valid_nll = _metrics(tmp_path / "o")["valid_nll"]
    assert f"flowkit fit: validation NLL {valid_nll:.4f} nats" in capsys.readouterr().out


def test_full_standardization_from_the_command_line(tmp_path, capsys):
    rng = np.random.default_rng(3)
    u = rng.normal(size=(80, 2))
    np.save(tmp_path / "d.npy", np.c_[u[:, 0] * 100.0, u[:, 0] + 0.1 * u[:, 1]])
    out = tmp_path / "full"
    assert cli.main(["fit", "--data", str(tmp_path / "d.npy"), "--standardize", "full", *FAST,
                     "--out", str(out)]) == 0
    std = flowkit.load_model(out / "checkpoint.pt").transform.transforms[0]
    assert std.covariance == "full" and std.cholesky[1, 0] > 0.9  # the columns' correlation
    assert _metrics(out)["standardize"] == "full"
    with pytest.raises(SystemExit):
        cli.main(["fit", "--data", str(tmp_path / "d.npy"), "--standardize", "full",
                  "--no-standardize", *FAST, "--out", str(tmp_path / "both")])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("steps, last", [(1, "1 step"), (50, "50 steps"), (2000, "100 steps")])
def test_the_summary_says_over_how_many_steps_the_training_nll_is_averaged(steps, last):
    """``train_nll_last_100`` is the mean of the last 100 steps, or of all steps if fewer; the
    summary said "the last 100 steps" after 50 (review 11)."""
    from flowkit.app.fit import _summary

    metrics = {"steps": steps, "wall_time_s": 1.0, "valid_nll": None, "train_nll_last_100": 1.5,
               "epochs": None}
    text = _summary(metrics)
    assert f"(mean of the last {last}; no validation)" in text
    assert text.endswith(f"; {steps} step{'s' if steps > 1 else ''}, 1.0 s")


def test_help_says_what_train_nll_last_100_is(capsys):
    with pytest.raises(SystemExit):
        cli.main(["fit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("train_nll_last_100, the mean training NLL of the last 100 steps (of all steps in a "
            "run of fewer)") in text


def test_help_says_which_rows_samples_png_shows(capsys):
    """The help said "one sample per validation row" where every row of a file is shown, up to
    5000 (review 11)."""
    with pytest.raises(SystemExit):
        cli.main(["fit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("samples.png shows samples of the flow over the data: the first 5000 rows of a file "
            "(training and validation rows alike) or of a toy dataset's validation points, one "
            "sample per row (for a conditional flow, given that row's context)") in text


def test_csv_with_a_header_names_the_context_and_the_plot(tmp_path, capsys):
    """A CSV file is read with its header: --context by column name (or number), the rows in
    the data's units, samples.png a grid of the modelled columns, named (2026-11-26, tenth
    session: CSV files were refused with a one-line conversion to run first)."""
    rng = np.random.default_rng(0)
    table = np.column_stack([rng.uniform(20, 70, 80), rng.normal(5e4, 1e4, 80),
                             rng.normal(170, 8, 80), rng.normal(0, 1, 80)])
    path = tmp_path / "people.csv"
    lines = ["# a comment", "age, \"income\",height,z"]
    lines += [",".join(f"{v:.6g}" for v in row) for row in table]
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "byname"
    assert cli.main(["fit", "--data", str(path), "--context", "age", *FAST,
                     "--out", str(out)]) == 0, capsys.readouterr().err
    m = _metrics(out)
    assert (m["features"], m["context_features"]) == (3, 1)
    flow = flowkit.load_model(out / "checkpoint.pt")
    std = flow.transform.transforms[0]
    assert std.scale[0] > 1000.0  # income, standardized from its rows in their own units
    assert (out / "samples.png").stat().st_size > 0
    out2 = tmp_path / "bynumber"
    assert cli.main(["fit", "--data", str(path), "--context", "0", *FAST,
                     "--out", str(out2)]) == 0
    assert _metrics(out2)["valid_nll"] == pytest.approx(m["valid_nll"])  # the same columns
    assert cli.main(["fit", "--data", str(path), "--context", "weight", *FAST,
                     "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert ("'--context' should name columns of" in err and "['age', 'income', 'height', 'z']"
            in err and "['weight'] is not among them" in err)
    assert cli.main(["fit", "--data", str(path), "--key", "x", *FAST,
                     "--out", str(tmp_path / "key")]) == 2
    assert "'--key' names an array of a .npz file" in capsys.readouterr().err
    for twice in (["--context", "age", "age"], ["--context", "age", "--context", "age"]):
        assert cli.main(["fit", "--data", str(path), *twice, *FAST,
                         "--out", str(tmp_path / "twice")]) == 2  # was "got ['0', '0']"
        assert "'--context' names 'age' more than once" in capsys.readouterr().err
    out3 = tmp_path / "two-flags"  # one --context after another: both (review 35)
    assert cli.main(["fit", "--data", str(path), "--context", "age", "--context", "z", *FAST,
                     "--out", str(out3)]) == 0
    assert (_metrics(out3)["features"], _metrics(out3)["context_features"]) == (2, 2)


def test_csv_without_a_header_reads_every_line(tmp_path, monkeypatch):
    path = tmp_path / "plain.csv"
    rows = np.random.default_rng(1).normal(size=(30, 2))
    path.write_text("\n".join(f"{float(a)!r},{float(b)!r}" for a, b in rows) + "\n")
    from flowkit.app import fit_data

    table, names = fit_data.read_csv(path)
    assert names is None and np.array_equal(table, rows)  # every line, exactly
    drawn = {}

    def spy(flow, data, path, title, labels):
        drawn["shape"], drawn["labels"] = np.shape(data), labels

    monkeypatch.setattr("flowkit.app.fit.plot_samples", spy)
    assert cli.main(["fit", "--data", str(path), *FAST, "--out", str(tmp_path / "o")]) == 0
    assert drawn == {"shape": (30, 2), "labels": None}


def test_epochs_instead_of_steps_and_the_passes_a_run_covered(tmp_path, capsys):
    """--epochs sets the length by passes over a file's rows; the result line says how many
    passes a run covered, and a run of less than one says so (review 22: 2000 steps were 0.57
    of an epoch on 1e6 rows, validated once, without a word)."""
    x = np.random.default_rng(0).normal(size=(400, 2))
    np.save(tmp_path / "d.npy", x)
    fast = [a for a in FAST if a not in ("--steps", "3")]
    out = tmp_path / "e"
    assert cli.main(["fit", "--data", str(tmp_path / "d.npy"), "--epochs", "2", *fast,
                     "--out", str(out)]) == 0
    m = _metrics(out)
    assert m["batch_size"] == 22 and m["steps"] == 2 * (360 // 22) and m["epochs"] == 2.0
    assert "32 steps (2 epochs)" in capsys.readouterr().out
    assert cli.main(["fit", "--data", str(tmp_path / "d.npy"), "--steps", "4", *fast,
                     "--out", str(tmp_path / "s")]) == 0
    text = capsys.readouterr().out
    assert "4 steps (0.25 epochs)" in text
    assert "note: the run saw less than one pass over the training rows" in text
    assert cli.main(["fit", "--data", "moons", "--epochs", "2", *fast,
                     "--out", str(tmp_path / "t")]) == 2
    assert "'--epochs' applies to file data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["fit", "--data", "moons", "--epochs", "2", "--steps", "3",
                  "--out", str(tmp_path / "u")])
    assert "not allowed with argument" in capsys.readouterr().err


def test_csv_byte_order_marks_and_numbers_that_are_also_names(tmp_path):
    """A byte-order mark (as spreadsheets write) made a headerless file's first row a header;
    --context 0 took a column named "0" where numbers are positions, as for .npy (review 24)."""
    from pathlib import Path

    from flowkit.app.fit_data import load_file, read_csv

    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf1,2,3\n4,5,6\n")
    table, names = read_csv(path)
    assert names is None and table.tolist() == [[1, 2, 3], [4, 5, 6]]
    path.write_bytes(b"\xef\xbb\xbfa,0,1\n20,1,2\n50,3,4\n")
    (x, c), positions, context_features, labels = load_file(Path(path), None, ["0"])
    assert c.ravel().tolist() == [20.0, 50.0] and labels == ["0", "1"] and positions == [1, 2]
    (x, c), *_ = load_file(Path(path), None, ["a"])
    assert c.ravel().tolist() == [20.0, 50.0]


def test_first_lines_that_look_like_a_header_and_are_not_or_the_reverse(tmp_path):
    """Review 34: '473,NA,906' (a row with a missing value) was taken for a header of names, and
    a header of numbers ('2019,2020,2021', as pandas writes numbered columns) was read as a row
    of outliers, both without a word. The first is now refused at its field; the second is
    still a row (it cannot be told from one), with a warning naming the line."""
    from flowkit.app.fit_data import read_csv

    rows = np.random.default_rng(0).normal(size=(20, 3))
    body = "\n".join(",".join(f"{v:.6f}" for v in row) for row in rows) + "\n"
    path = tmp_path / "t.csv"
    for missing in ("NA", "n/a", "null", "?"):
        path.write_text(f"473,{missing},906\n" + body)
        with pytest.raises(ValueError, match=f"line 1, field 2 is '{re.escape(missing)}'"):
            read_csv(path)
    path.write_text("age,NA,height\n" + body)  # names, one of them 'NA': a header
    assert read_csv(path)[1] == ["age", "NA", "height"]
    path.write_text("2019,2020,2021\n" + body)
    with pytest.warns(flowkit.train.DataWarning, match=r"line 1 \(2019,2020,2021\), holds only "
                      r"whole numbers where the rows below it hold decimals in most columns"):
        table, names = read_csv(path)
    assert names is None and table.shape == (21, 3) and table[0].tolist() == [2019, 2020, 2021]
    counts = "\n".join(f"{i},{2 * i},{i % 7}" for i in range(20)) + "\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error", flowkit.train.DataWarning)
        path.write_text(counts)  # whole numbers throughout: nothing to say
        assert read_csv(path)[0].shape == (20, 3)
        for first in ("0,0,0", "-1,2,3"):  # repeated or signed: a row (review 35)
            path.write_text(f"{first}\n" + body)
            assert read_csv(path)[0].shape == (21, 3)
    path.write_text(",NA\n0,1.5\n1,2.5\n")  # pandas' index beside a column named NA
    with pytest.raises(ValueError, match=r"the header names no column 0 \(pandas' to_csv"):
        read_csv(path)


def test_quoted_numbers_and_files_in_other_encodings(tmp_path):
    """Review 34: quoted numbers (pandas' QUOTE_ALL) were refused as '"51.8"'; a thousands
    separator inside quotes was reported as the field '"1'; Latin-1 and UTF-16 files got
    messages about numbers instead of their encoding."""
    from flowkit.app.fit_data import read_csv

    path = tmp_path / "q.csv"
    path.write_text('"age","income"\n"51.8","27097.9"\n"33.5","1.2e4"\n')
    table, names = read_csv(path)
    assert names == ["age", "income"] and table.tolist() == [[51.8, 27097.9], [33.5, 12000.0]]
    path.write_text('a,b\n"1,234.5",2\n')
    with pytest.raises(ValueError, match=r"line 2, field 1 is '1,234.5' \(write numbers "
                                         r"without thousands separators\)"):
        read_csv(path)
    path.write_bytes("größe,b\n1.5,2\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"is not UTF-8 text: line 1 holds the byte 0xf6"):
        read_csv(path)
    path.write_bytes("a,b\n1.5,2\n3,4\n".encode("utf-16"))
    with pytest.raises(ValueError, match=r"looks like UTF-16 text: save it as UTF-8"):
        read_csv(path)
    path.write_bytes(b"a,b\n1.5,2\n# caf\xe9")  # at the end, without a newline (review 35)
    with pytest.raises(ValueError, match=r"is not UTF-8 text: line 3 holds the byte 0xe9"):
        read_csv(path)
    lines, rest = divmod((1 << 20) - 1 - 4, 6)  # an "é" cut by the first 1 MiB read
    text = b"a,b\n" + b"1.5,2\n" * lines + b"1.5,2"[:rest] + "é\n".encode() + b"1,\xe9\n"
    assert text[(1 << 20) - 1] == 0xC3
    path.write_bytes(text)
    with pytest.raises(ValueError, match=rf"line {lines + 3} holds the byte 0xe9"):
        read_csv(path)
    path.write_text('a,b\n"1.5,2.5\n')
    with pytest.raises(ValueError, match=r"\(a quote left open\)"):
        read_csv(path)


def test_the_rows_and_columns_read_are_said_before_the_run(tmp_path, capsys):
    """Review 34: nothing said how many rows and which columns a file gave, so a misread file
    showed only in the fit's result; now one line before the run, and rows in metrics.json."""
    rows = np.random.default_rng(0).normal(size=(50, 3))
    path = tmp_path / "t.csv"
    path.write_text("age,income,z\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    out = tmp_path / "o"
    loud = [a for a in FAST if a != "--quiet"]
    assert cli.main(["fit", "--data", str(path), "--context", "z", *loud,
                     "--out", str(out)]) == 0
    assert (f"flowkit fit: read 50 rows from '{path}': 2 modelled columns (age, income) and 1 "
            "context column\n") in capsys.readouterr().out
    assert _metrics(out)["rows"] == 50
    assert cli.main(["fit", "--data", "moons", *loud, "--out", str(tmp_path / "m")]) == 0
    assert "flowkit fit: read" not in capsys.readouterr().out
    assert _metrics(tmp_path / "m")["rows"] is None


def test_warnings_of_fit_name_the_commands_options(tmp_path, recwarn):
    """Review 32/34: fit's warnings named 'data' and transformer='spline' under flowkit fit; a
    DataWarning shown inside the command is spelled with its options, as its errors are."""
    rows = np.random.default_rng(0).normal(size=(100, 2))
    path = tmp_path / "small.npy"
    np.save(path, rows)
    assert cli.main(["fit", "--data", str(path), *FAST, "--out", str(tmp_path / "o")]) == 0
    texts = [str(w.message) for w in recwarn if issubclass(w.category, flowkit.train.DataWarning)]
    affine = [t for t in texts if "rows to train a flow with affine" in t]
    assert len(affine) == 1 and affine[0].startswith("'--data' leaves 80 rows"), texts
    assert "The spline (--transformer spline) does not" in affine[0]
    recwarn.clear()
    assert cli.main(["fit", "--data", str(path), "--valid-fraction", "0.04", *FAST,
                     "--out", str(tmp_path / "v")]) == 0
    texts = [str(w.message) for w in recwarn if issubclass(w.category, flowkit.train.DataWarning)]
    assert any(t.startswith("--valid-fraction 0.04 holds out 4 of the 100 rows") for t in texts)
    recwarn.clear()  # the builders' warnings too (review 39)
    np.save(tmp_path / "one.npy", rows[:, :1])
    assert cli.main(["fit", "--data", str(tmp_path / "one.npy"), *FAST,
                     "--out", str(tmp_path / "one")]) == 0
    texts = [str(w.message) for w in recwarn if w.category is flowkit.checkpoint.BuildWarning]
    assert texts == ["MAF(1) with --transformer affine is a Gaussian whatever its layers: a "
                     "one-feature MADE has nothing to condition on, so each layer is one affine "
                     "map; pass --transformer spline for a density of another shape"]


def test_bounds_of_columns_by_name_or_number(tmp_path, capsys):
    """--bounds COL=LOW:HIGH: a positive column and a box from the command line, as the
    builders' bounds= (the CLI could not say that a column is positive)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "t.csv"
    rows = np.column_stack([rng.uniform(20, 70, 80), np.exp(rng.normal(10, 0.5, 80)),
                            rng.normal(size=80)])
    path.write_text("age,income,z\n" + "\n".join(",".join(map(str, r.tolist())) for r in rows)
                    + "\n")
    out = tmp_path / "b"
    assert cli.main(["fit", "--data", str(path), "--bounds", "income=0:", "0=18:90", *FAST,
                     "--out", str(out)]) == 0, capsys.readouterr().err
    flow = flowkit.load_model(out / "checkpoint.pt")
    assert flow.config["kwargs"]["bounds"] == [[18.0, 0.0, None], [90.0, None, None]]
    samples = flow.sample(500)
    assert (samples[:, 1] > 0).all() and ((samples[:, 0] > 18) & (samples[:, 0] < 90)).all()
    for specs, message in ((["weight=0:"], r"the column should be one of the modelled columns, "
                                           r"by position \[0, 1, 2\] or one of \['age', "),
                           (["income=a:"], "LOW and HIGH should be numbers or empty"),
                           (["income"], r"takes COL=LOW:HIGH"),
                           (["income=5:1"], r"'income=5:1': LOW should be below HIGH"),
                           (["income=nan:1"], r"LOW and HIGH should be numbers, not nan"),
                           (["1=0:", "income=1:"], r"'--bounds' names column 'income' twice")):
        assert cli.main(["fit", "--data", str(path), "--bounds", *specs, *FAST,
                         "--out", str(tmp_path / "x")]) == 2
        assert re.search(message, capsys.readouterr().err)
    # numbers are positions in the file, as in --context (review 25: they counted the modelled
    # columns, so --context 0 --bounds 1=0: bounded the wrong one)
    out = tmp_path / "c"
    assert cli.main(["fit", "--data", str(path), "--context", "0", "--bounds", "1=0:", *FAST,
                     "--out", str(out)]) == 0
    assert flowkit.load_model(out / "checkpoint.pt").config["kwargs"]["bounds"] == [
        [0.0, None], [None, None]]
    assert cli.main(["fit", "--data", str(path), "--context", "0", "--bounds", "0=18:", *FAST,
                     "--out", str(tmp_path / "d")]) == 2
    assert "(not a --context one)" in capsys.readouterr().err


def test_a_commented_header_as_numpy_writes_it_names_the_columns(tmp_path):
    """np.savetxt(..., header="a,b") writes '# a,b': the names were lost (review 25)."""
    from flowkit.app.fit_data import read_csv

    path = tmp_path / "saved.csv"
    np.savetxt(path, np.arange(6.0).reshape(3, 2), delimiter=",", header="age,income")
    table, names = read_csv(path)
    assert names == ["age", "income"] and table.shape == (3, 2)
    path.write_text("# written by a script\n1,2\n")  # one field above two: not a header
    assert read_csv(path)[1] is None
    path.write_text("# measured in mm, , ok\n1,2,3\n")  # an empty name: only a comment
    assert read_csv(path)[1] is None  # (review 27: refused as a header without a name)


def test_resume_takes_the_same_bounds_spelled_another_way(tmp_path, capsys):
    """--resume compared --bounds as typed: 'income=0:' against '1=0.0:' was refused
    (review 25); now the bounds themselves are recorded and compared."""
    rng = np.random.default_rng(0)
    path = tmp_path / "t.csv"
    rows = np.column_stack([rng.uniform(20, 70, 60), np.exp(rng.normal(10, 0.5, 60))])
    path.write_text("age,income\n" + "\n".join(",".join(map(str, r.tolist())) for r in rows)
                    + "\n")
    out = str(tmp_path / "r")
    fast = [a for a in FAST if a not in ("--steps", "3")]
    base = ["fit", "--data", str(path), "--lr-schedule", "none", "--checkpoint-every", "2",
            *fast, "--out", out]
    assert cli.main([*base, "--steps", "2", "--bounds", "income=0:"]) == 0
    assert cli.main([*base, "--steps", "4", "--bounds", "1=0.0:", "--resume"]) == 0, (
        capsys.readouterr().err)
    assert cli.main([*base, "--steps", "6", "--bounds", "1=1:", "--resume"]) == 2
    assert "these differ: --bounds" in capsys.readouterr().err


def test_data_warnings_name_the_option_and_the_headers_columns(tmp_path, recwarn):
    """The command's own check of a file's rows names '--data' and the header's columns (fit
    named 'data', column 0; review 25), once (fit's own check is off for file data)."""
    rng = np.random.default_rng(0)
    rows = np.column_stack([rng.integers(20, 30, 300), rng.normal(size=300)])
    path = tmp_path / "t.csv"
    path.write_text("age,income\n" + "\n".join(",".join(map(str, r.tolist())) for r in rows)
                    + "\n")
    assert cli.main(["fit", "--data", str(path), *FAST, "--out", str(tmp_path / "o")]) == 0
    texts = [str(w.message) for w in recwarn if issubclass(w.category, flowkit.train.DataWarning)]
    named = [t for t in texts if "column 0 ('age'), takes only 10 distinct values" in t]
    assert len(named) == 1 and named[0].startswith("'--data'")
    assert not any(t.startswith("'data'") for t in texts)
    recwarn.clear()  # without a header, by their positions in the file, context columns apart
    np.savetxt(tmp_path / "n.csv", np.c_[rng.normal(size=300), np.full(300, 3.0), rows],
               delimiter=",")
    assert cli.main(["fit", "--data", str(tmp_path / "n.csv"), "--context", "0", *FAST,
                     "--out", str(tmp_path / "n")]) == 0
    texts = [str(w.message) for w in recwarn if issubclass(w.category, flowkit.train.DataWarning)]
    assert any(t.startswith("'--data', column 1, holds a single value (3) in all 300 rows")
               for t in texts), texts
    assert any(t.startswith("'--data', column 2, takes only 10 distinct values") for t in texts)


def test_skewed_positive_columns_are_named_with_the_options_that_help(tmp_path, recwarn):
    """Review 42's log-normal case from the command line: the file's column, '--bounds' and
    '--transformer spline'; a column --bounds bounds, and the spline, are not warned of."""
    rng = np.random.default_rng(0)
    table = np.c_[rng.normal(size=300), np.exp(2.0 * rng.normal(size=(300, 2)))]
    np.savetxt(tmp_path / "s.csv", table, delimiter=",")

    def skew_warnings(*extra):
        recwarn.clear()
        assert cli.main(["fit", str(tmp_path / "s.csv"), "--context", "0", *FAST, *extra,
                         "--out", str(tmp_path / f"o{len(extra)}")]) == 0
        return [str(w.message) for w in recwarn if "only positive values" in str(w.message)]

    texts = skew_warnings()
    assert len(texts) == 1 and texts[0].startswith("'--data', columns 1 and 2, hold only positive")
    assert "('--bounds': the flow" in texts[0]
    assert "(--transformer spline)" in texts[0]
    texts = skew_warnings("--bounds", "1=0:")
    assert len(texts) == 1 and "'--data', column 2, holds only" in texts[0]
    assert skew_warnings("--transformer", "spline", "--bounds", "1=0:") == []


def test_toy_data_outside_the_bounds_are_named_as_the_datasets(tmp_path, capsys):
    """The error named --valid-fraction, which toy data refuse (review 27), then --valid-size,
    which is only their count (review 39): it names the toy dataset and --bounds."""
    assert cli.main(["fit", "--data", "moons", "--bounds", "0=0:1", *FAST,
                     "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "'--bounds' should contain toy dataset 'moons': " in err
    assert "--valid-fraction" not in err and "--valid-size" not in err


def test_float64_runs_for_columns_that_float32_rounds(tmp_path, capsys, recwarn):
    """Review 34's leftover: the PrecisionWarning told a command-line user to call
    model.double(). It names --dtype float64 there, which trains, saves and resumes a float64
    flow that sees the column unrounded; the Python wording stays model.double()."""
    rng = np.random.default_rng(0)
    t = 1.7e9 + rng.normal(0.0, 600.0, 400)  # timestamps in seconds: float32 keeps ~3 steps/sd
    np.savetxt(tmp_path / "ts.csv", np.c_[t, rng.normal(size=400)], delimiter=",",
               header="time,value", comments="", fmt="%.6f")
    run = ["fit", "--data", str(tmp_path / "ts.csv"), *FAST]
    assert cli.main([*run, "--out", str(tmp_path / "a")]) == 0
    texts = [str(w.message) for w in recwarn if w.category is flowkit.train.PrecisionWarning]
    assert len(texts) == 1 and texts[0].startswith(
        "'--data', column 0 ('time'), has a standard deviation")
    assert texts[0].endswith("train a float64 model (--dtype float64)")
    recwarn.clear()
    out = tmp_path / "b"
    assert cli.main([*run, "--dtype", "float64", "--out", str(out)]) == 0
    assert not [w for w in recwarn if w.category is flowkit.train.PrecisionWarning]
    assert _metrics(out)["dtype"] == "float64"
    flow = flowkit.load_model(out / "checkpoint.pt")
    assert {p.dtype for p in flow.parameters()} == {torch.float64}
    shift = next(m for m in flow.modules() if isinstance(m, Standardize)).shift
    assert abs(float(shift[0]) - t.mean()) < 1e3 and shift.dtype == torch.float64
    capsys.readouterr()
    assert cli.main([*run, "--out", str(out), "--resume"]) == 2
    assert ("these differ: no --dtype (started with --dtype float64)"
            in capsys.readouterr().err)
    assert cli.main([*run, "--dtype", "float64", "--out", str(out), "--resume"]) == 0
    with pytest.warns(flowkit.train.PrecisionWarning, match=r"\(model.double\(\)\)$"):
        flowkit.fit(flowkit.MAF(2, hidden_features=(8,), layers=1), np.c_[t, t], steps=1,
                    valid=None)


def test_resume_says_where_it_resumed_and_what_changed(tmp_path, capsys):
    """Review 39: a --resume with nothing to resume started a new run silently, a resume never
    said its step, a new --lr went unremarked, and an early stop was not in the result line."""
    out = tmp_path / "o"
    run = ["fit", "--data", "moons", "--hidden", "8", "--layers", "1", "--quiet", "--threads",
           "1", "--lr-schedule", "none", "--checkpoint-every", "2", "--out", str(out)]
    assert cli.main([*run, "--steps", "4", "--resume"]) == 0
    assert "nothing to resume in" in capsys.readouterr().out
    assert cli.main([*run, "--steps", "8", "--resume", "--lr", "0.01"]) == 0
    printed = capsys.readouterr().out
    assert "--lr 0.01 differs from the 0.003 the run started with" in printed
    assert "resumed '" in printed and "checkpoint.pt' at step 4" in printed
    assert "nothing to resume" not in printed
    assert cli.main([*run, "--steps", "8", "--resume"]) == 0  # a finished run (review 40)
    assert "checkpoint.pt' had run all its 8 steps: nothing was left to train" in (
        capsys.readouterr().out)
    # a checkpoint without its options.json: not "nothing to resume" (it resumed the checkpoint
    # unchecked, and recorded these options as the run's)
    (out / "options.json").unlink()
    assert cli.main([*run, "--steps", "8", "--resume"]) == 2
    assert "exists but" in capsys.readouterr().err and not (out / "options.json").exists()
    assert cli.main(["fit", "--data", "moons", "--hidden", "8", "--layers", "1", "--quiet",
                     "--steps", "400", "--valid-every", "1", "--patience", "1", "--lr", "0.1",
                     "--out", str(tmp_path / "p")]) == 0
    assert "(stopped early: no better validation in 1 validations, --patience)" in (
        capsys.readouterr().out)


def test_a_rounded_column_is_named_as_the_file_has_it(tmp_path, recwarn):
    """Review 40: with --context, the PrecisionWarning counted the modelled columns (column 1
    for the file's column 2) and gave no header name; once, not again from fit."""
    rng = np.random.default_rng(1)
    stamp = 1.7e9 + rng.normal(0.0, 600.0, 300)  # ~3 float32 steps per sd
    np.savetxt(tmp_path / "t.csv", np.c_[rng.normal(size=300), rng.normal(size=300), stamp],
               delimiter=",", header="c,v,stamp", comments="", fmt="%.6f")
    assert cli.main(["fit", "--data", str(tmp_path / "t.csv"), "--context", "c", *FAST,
                     "--out", str(tmp_path / "o")]) == 0
    texts = [str(w.message) for w in recwarn if w.category is flowkit.train.PrecisionWarning]
    assert len(texts) == 1 and texts[0].startswith("'--data', column 2 ('stamp'), has a "), texts


def test_gross_outliers_are_named_with_the_option_that_helps(tmp_path, recwarn):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 2))
    x[3, 0] = 5e6
    np.savetxt(tmp_path / "o.csv", x, delimiter=",", header="a,b", comments="")
    assert cli.main(["fit", "--data", str(tmp_path / "o.csv"), *FAST,
                     "--out", str(tmp_path / "o")]) == 0
    texts = [str(w.message) for w in recwarn if "interquartile" in str(w.message)]
    assert len(texts) == 1 and texts[0].startswith("'--data', column 0 ('a'), has a standard")
    assert "row 3: 5e+06" in texts[0] and texts[0].endswith(
        "build the flow with --standardize robust (median and interquartile range)")
    recwarn.clear()
    assert cli.main(["fit", "--data", str(tmp_path / "o.csv"), *FAST, "--standardize", "robust",
                     "--out", str(tmp_path / "r")]) == 0
    assert not [w for w in recwarn if "interquartile" in str(w.message)]
