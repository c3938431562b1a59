"""The ``flowkit`` command itself: help text, option defaults, one-line errors, and no output
folder left behind by a failed invocation."""

import os
import re
import time

import pytest

from flowkit.app import cli

COMMANDS = [name for name, _, _ in cli.COMMANDS]
MARKUP = re.compile(r":(func|class|mod|meth|attr|math|data):`|``|^\s*\.\. \w+::", re.MULTILINE)


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_plain_text(command, capsys):
    text = _help(command, capsys)
    assert not MARKUP.search(text), MARKUP.search(text).group(0)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_every_default(command, capsys):
    parser = cli.build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, cli.argparse._SubParsersAction))
    formatter = cli.HelpFormatter(command)
    for action in sub.choices[command]._actions:
        if not action.option_strings or action.default in (None, False, cli.argparse.SUPPRESS):
            continue
        assert "default" in formatter._get_help_string(action), action.option_strings


def test_failed_command_leaves_no_output_folder(tmp_path, capsys):
    out = tmp_path / "runs" / "missing"
    assert cli.main(["fit", "--data", str(tmp_path / "nothing.npy"), "--out", str(out)]) == 2
    assert "nothing.npy" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_out_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    assert cli.main(["fit", "--data", "moons", "--steps", "1", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "not a folder" in err
    assert target.read_text() == "keep me"


def test_another_commands_results_are_not_replaced(tmp_path, capsys):
    """Every subcommand writes --out/metrics.json: one pointed at a folder that holds another
    command's results (scoring a model next to its training run) refuses, before any work."""
    out = tmp_path / "run"
    out.mkdir()
    record = '{"command": "mnist", "metrics": {"valid_nll": 86.6}}\n'
    (out / "metrics.json").write_text(record)
    assert cli.main(["fit", "--data", "moons", "--steps", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds the results of flowkit mnist" in err
    assert (out / "metrics.json").read_text() == record
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]


def test_ctrl_c_is_one_line_that_says_how_to_resume(tmp_path, capsys, monkeypatch):
    from flowkit.app import fit

    out = tmp_path / "o"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"")

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(fit, "run", interrupted)
    assert cli.main(["fit", "--out", str(out), "--resume"]) == 130
    err = capsys.readouterr().err
    assert err == (f"flowkit fit: interrupted; '{out / 'checkpoint.pt'}' holds the last "
                   "checkpoint: run the same command with --resume to continue\n")


def test_sigterm_ends_a_command_as_ctrl_c_does(tmp_path, capsys, monkeypatch):
    """Review 34: SIGTERM (what timeout, schedulers and preemption send) ended a run silently
    and left its lock behind; it now ends as Ctrl-C does, with status 143, and the handler
    before the command is back after it."""
    import signal

    from flowkit.app import fit

    out = tmp_path / "o"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"")

    def terminated(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends

    monkeypatch.setattr(fit, "run", terminated)
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["fit", "--out", str(out), "--resume"]) == 143
    assert capsys.readouterr().err == (
        f"flowkit fit: terminated (SIGTERM); '{out / 'checkpoint.pt'}' holds the last "
        "checkpoint: run the same command with --resume to continue\n")
    assert not (out / "flowkit.lock").exists() and signal.getsignal(signal.SIGTERM) is before


def test_metrics_json_is_strict_json():
    """A one-seed standard deviation was written as a bare NaN (review 11)."""
    record = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf")}, "e": "x"}
    assert cli._finite(record) == {"a": None, "b": [1.0, None], "c": {"d": None}, "e": "x"}


def test_unknown_gymnasium_environment_is_a_one_line_error(tmp_path, capsys):
    pytest.importorskip("gymnasium")
    out = tmp_path / "rl"
    assert cli.main(["rl", "--env", "NoSuchEnv-v0", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NoSuchEnv-v0" in err
    assert not out.exists()


@pytest.mark.parametrize("value", ["0", "-1", "2.5"])
def test_bench_repeats_must_be_positive(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--quick", "--repeats", value, "--out", str(tmp_path / "b")])
    assert exit_info.value.code == 2
    assert "--repeats" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_readme_lists_every_subcommand():
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    listed = readme.split("`flowkit --help` lists the subcommands (")[1].split(")")[0]
    assert re.findall(r"`([\w-]+)`", listed) == COMMANDS


def test_sklearn_compare_hidden_sizes_are_checked_naming_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sklearn-compare", "--hidden", "0", "--out", str(tmp_path / "s")])
    assert exit_info.value.code == 2
    assert "argument --hidden: should be an integer >= 1, got '0'" in capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
def test_options_with_a_default_have_help_text(command):
    """argparse shows no help line, hence no default, for an option without help."""
    parser = cli.build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, cli.argparse._SubParsersAction))
    for action in sub.choices[command]._actions:
        if action.option_strings and action.default not in (None, False, cli.argparse.SUPPRESS):
            assert action.help, action.option_strings


TRAINING = ["fit", "toy", "energy", "mnist", "mnist-eval", "vae", "rl", "sklearn-compare"]
"""The commands with ``--threads`` from :func:`flowkit.app.common.add_threads_option`."""


def _given(command: str) -> list[str]:
    """What ``command`` needs besides its options (mnist-eval: a model file)."""
    return [command, "model.pt"] if command == "mnist-eval" else [command]


@pytest.mark.parametrize("command", TRAINING)
def test_threads_is_one_option_applied_before_any_work(command, tmp_path, capsys, monkeypatch):
    import torch

    text = " ".join(_help(command, capsys).split())
    assert "--threads N CPU threads for torch" in text
    calls = []

    def record(n):
        calls.append(n)
        raise ValueError("stopped at set_num_threads")

    monkeypatch.setattr(torch, "set_num_threads", record)
    out = tmp_path / "out"
    assert cli.main([*_given(command), "--threads", "3", "--device", "cpu", "--out", str(out)]) == 2
    assert calls == [3]
    assert "stopped at set_num_threads" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*_given(command), "--threads", "0", "--out", str(out)])
    assert exit_info.value.code == 2
    assert "argument --threads: should be an integer >= 1, got '0'" in capsys.readouterr().err


def _parse(argv: list[str]):
    return cli.build_parser(argv[0]).parse_args(argv)


@pytest.mark.parametrize("command", ["fit", "toy", "energy", "mnist", "vae"])
def test_the_learning_rate_schedule_is_lr_schedule_in_every_command(command, capsys):
    text = _help(command, capsys)
    assert "--lr-schedule" in text and "--schedule" not in text.replace("--lr-schedule", "")
    assert _parse([command, "--lr-schedule", "cosine"]).lr_schedule == "cosine"
    # a constant rate is 'none' in every command (review 39: mnist and vae took 'constant' only)
    assert _parse([command, "--lr-schedule", "none"]).lr_schedule in ("none", "constant", None)


@pytest.mark.parametrize("command", ["mnist", "vae"])
def test_schedule_is_still_read_as_lr_schedule(command):
    assert _parse([command]).lr_schedule == ("constant" if command == "mnist" else "cosine")
    assert _parse([command, "--schedule", "cosine"]).lr_schedule == "cosine"
    assert _parse([command, "--schedule", "constant"]).lr_schedule == "constant"


def test_settings_saved_with_the_former_name_schedule_are_checked_on_resume(tmp_path):
    from flowkit.app.common import check_same_settings

    saved = {"lr": 0.001, "schedule": "constant", "epochs": 2}
    now = {"lr": 0.001, "lr_schedule": "constant", "epochs": 3}
    check_same_settings(saved, now, ("lr", "lr_schedule"), tmp_path)  # same: no error
    with pytest.raises(ValueError, match="'--lr-schedule' is 'cosine' but the run in .* used "
                                         "'constant'"):
        check_same_settings(saved, {**now, "lr_schedule": "cosine"}, ("lr", "lr_schedule"),
                            tmp_path)


def test_mnist_eval_help_says_that_out_receives_only_metrics_json(capsys):
    text = " ".join(_help("mnist-eval", capsys).split())
    assert "Writes only metrics.json to --out" in text
    out = text.split("--out OUT ")[1]
    assert out.startswith("output folder: metrics.json and the files the command writes")
    assert "figures" not in out.split("(default")[0]


def test_warnings_are_one_line_without_source_path_while_the_command_runs(tmp_path):
    """End to end, in a process of its own (pytest records warnings instead of showing them)."""
    import subprocess
    import sys

    import numpy as np

    x = np.random.default_rng(0).normal(size=(200, 3))
    x[:, 2] = 1.0  # a constant column: fit warns with a DataWarning
    np.save(tmp_path / "x.npy", x)
    argv = ["fit", "--data", str(tmp_path / "x.npy"), "--steps", "2", "--quiet", "--threads", "1",
            "--out", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-m", "flowkit", *argv], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "DataWarning" in line]
    assert len(lines) == 1
    assert lines[0].startswith("flowkit fit: warning: DataWarning: '--data', column 2, holds a ")
    assert ".py:" not in done.stderr
    # and kept with the results (review 42: metrics.json showed an NLL without its caveat)
    import json

    kept = json.loads((tmp_path / "run" / "metrics.json").read_text())["warnings"]
    assert [w for w in kept if w.startswith("DataWarning: '--data', column 2, holds a ")]


def test_a_multi_line_warning_is_one_line_and_the_format_comes_back():
    import warnings

    before = warnings.formatwarning
    shown = []
    with cli._warnings_as_lines("fit", shown):
        text = warnings.formatwarning(RuntimeWarning("first\n  second"), RuntimeWarning,
                                      "somewhere.py", 3)
    assert text == "flowkit fit: warning: RuntimeWarning: first second\n"
    assert shown == ["RuntimeWarning: first second"]
    assert warnings.formatwarning is before


def test_warnings_of_a_command_still_reach_code_that_records_them(tmp_path, monkeypatch):
    import warnings

    from flowkit.app import fit

    def warns(args):
        warnings.warn("first\n  second", RuntimeWarning, stacklevel=1)
        return {}

    monkeypatch.setattr(fit, "run", warns)
    with pytest.warns(RuntimeWarning, match="first"):
        assert cli.main(["fit", "--out", str(tmp_path / "run")]) == 0
