"""The ``flowkit`` command (also ``python -m flowkit``): one subcommand per experiment.

Usage::

    flowkit --help
    flowkit fit --data moons --steps 2000 --out runs/moons
    torchrun --standalone --nproc_per_node 2 -m flowkit fit --data moons --out runs/moons

Every subcommand gets the common options ``--device {auto,cpu,cuda}``, ``--seed``, ``--out``
(output folder, default ``runs/<command>-<date>-<time>``) and ``--quiet`` (no progress bars).
After the subcommand returns, the CLI writes ``<out>/metrics.json`` with the command, its
arguments and the metrics it returned; an ``--out`` whose metrics.json another subcommand wrote
is refused before the run. Errors in the user's input (``ValueError``,
``FileNotFoundError``, ``FloatingPointError``) are printed as one line, exit status 2; warnings
too, as ``flowkit <command>: warning: <Category>: <message>`` (while the command runs; the
library itself never changes how warnings are shown).

Adding a subcommand
-------------------
1. Write a module with two functions (see :mod:`flowkit.app.fit` for a complete one)::

       def add_arguments(parser: argparse.ArgumentParser) -> None:
           parser.add_argument("--energy", default="U1", help="...")

       def run(args: argparse.Namespace) -> dict:
           # args.device, args.seed, args.out (a Path that exists), args.quiet are set
           ...  # write figures and checkpoints into args.out
           return {"elbo": 1.23}  # JSON-serialisable metrics

   The module docstring is the description shown by ``flowkit <name> --help``.
2. Add one ``(name, module path, one-line summary)`` line to :data:`COMMANDS`. Nothing else
   changes. Modules are imported only when their subcommand is used, so ``flowkit --help`` stays
   fast and a module with a missing optional dependency cannot break the other subcommands.

Under ``torchrun`` only rank 0 creates ``--out`` and writes ``metrics.json``; pass the same
explicit ``--out`` to all ranks (the default is time-stamped).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from flowkit import __version__
from flowkit.checkpoint import run_lock, write_bytes_atomic
from flowkit.train import is_main_process

COMMANDS: list[tuple[str, str, str]] = [
    (
        "fit",
        "flowkit.app.fit",
        "fit a MAF or IAF to a 2-D toy dataset or to samples in a .csv, .npy or .npz file",
    ),
    ("toy", "flowkit.app.toy", "MAF/IAF density estimation on the 2-D toy datasets"),
    ("energy", "flowkit.app.energy", "IAF fitted by reverse KL to the energies U1-U4"),
    ("mnist", "flowkit.app.mnist", "Bernoulli-MADE on binarized MNIST: train, sample"),
    (
        "mnist-eval",
        "flowkit.app.mnist_eval",
        "score a saved MADE on a split file: NLL, single mask and ensemble",
    ),
    ("bench", "flowkit.app.bench", "benchmark suite: density, sampling, memory"),
    (
        "bench-defaults",
        "flowkit.app.defaults_bench",
        "defaults benchmark: flowkit vs zuko vs scikit-learn, held-out NLL, changes of units",
    ),
    ("vae", "flowkit.app.vae", "VAE on binarized MNIST: Gaussian vs IAF posterior"),
    (
        "sbibm",
        "flowkit.app.sbibm",
        "NPE on sbibm tasks: flowkit flows vs sbi's MAF and NSF (needs sbi, sbibm)",
    ),
    ("rl", "flowkit.app.rl", "SAC on Pendulum-v1: conditional IAF vs Gaussian policy"),
    (
        "sklearn-compare",
        "flowkit.app.sklearn_compare",
        "test log-likelihood of a MAF vs GaussianMixture and KernelDensity (toy, digits)",
    ),
]
"""Subcommands as ``(name, module, one-line summary)``; see "Adding a subcommand" above."""

USER_ERRORS = (ValueError, OSError, FloatingPointError)
"""Errors printed as one line (exit status 2): bad input (``ValueError``, which includes
:class:`flowkit.CheckpointError`), files that cannot be read or written (``OSError``: missing,
no permission, disk full) and diverged training (``FloatingPointError``). Anything else is a bug
and keeps its traceback."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written (plain text, see "Adding a subcommand"), and every option's
    default after its help, unless the help already says it or there is none to show
    (``None``, a switch that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in text
            or default in (None, False, argparse.SUPPRESS)
        ):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, list | tuple) else default
        return f"{text} (default: {str(shown).replace('%', '%%')})".lstrip()


def _load(module_path: str) -> ModuleType:
    module = importlib.import_module(module_path)
    for name in ("add_arguments", "run"):
        if not callable(getattr(module, name, None)):
            raise TypeError(f"subcommand module {module_path} has no function {name}()")
    return module


def add_common_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """The options every subcommand has."""
    common = parser.add_argument_group("common options")
    common.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where to compute; auto = cuda if available (default: %(default)s)",
    )
    common.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    common.add_argument(
        "--out",
        type=lambda text: Path(text).expanduser(),  # a '~' the shell left (quoted, --out=~/x)
        default=None,
        help=f"output folder: metrics.json and the files the command writes (see its "
        f"description) (default: runs/{command}-<date>-<time>)",
    )
    common.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser. Only ``command``'s module is imported and asked for its arguments."""
    parser = argparse.ArgumentParser(
        prog="flowkit",
        description="Normalizing flows built on MADE: experiments and training from the shell.",
        epilog="Run 'flowkit <command> --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"flowkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", title="commands")
    for name, module_path, summary in COMMANDS:
        if name != command:
            sub.add_parser(name, help=summary)
            continue
        module = _load(module_path)
        p = sub.add_parser(
            name,
            help=summary,
            description=(module.__doc__ or summary).strip(),
            formatter_class=HelpFormatter,
        )
        module.add_arguments(p)
        add_common_arguments(p, name)
        p.set_defaults(_module=module, _parser=p)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the top level has no options that take values)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flowkit`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    parser = build_parser(command)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command's parser ('flowkit fit: error: ...', with its usage)
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    del args._parser
    if args.out is None:
        args.out = Path("runs") / f"{args.command}-{time.strftime('%Y%m%d-%H%M%S')}"
    module = args.__dict__.pop("_module")
    created: list[Path] = []
    main_process = is_main_process()
    try:
        if main_process:
            created = _make_folder(args.out)
        # one writer per --out (rank 0 writes); fit() inside takes the same lock again
        shown: list[str] = []  # the warnings, also kept in metrics.json
        with _warnings_as_lines(args.command, shown), _sigterm_as_interrupt(), (
            run_lock(args.out) if main_process else contextlib.nullcontext()
        ):
            if main_process:
                _refuse_another_commands_results(args.out / "metrics.json", args.command)
            metrics = module.run(args)
            if main_process:
                record = {"command": args.command, "args": vars(args), "metrics": metrics,
                          "warnings": shown}
                path = args.out / "metrics.json"
                text = json.dumps(_finite(record), indent=2, default=str) + "\n"
                write_bytes_atomic(path, text.encode())
    except USER_ERRORS as e:
        print(f"flowkit {args.command}: error: {e}", file=sys.stderr)
        _remove_if_empty(created)
        return 2
    except KeyboardInterrupt as e:
        checkpoint = args.out / "checkpoint.pt"
        kept = (f"; '{checkpoint}' holds the last checkpoint: run the same command with "
                "--resume to continue" if checkpoint.exists() else "")
        how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        print(f"flowkit {args.command}: {how}{kept}", file=sys.stderr)
        _remove_if_empty(created)
        return 128 + signal.SIGTERM if isinstance(e, Terminated) else 130
    except BaseException:
        _remove_if_empty(created)
        raise
    if main_process:
        print(f"flowkit {args.command}: wrote {path}")
    return 0


class Terminated(KeyboardInterrupt):
    """The SIGTERM that job schedulers and ``timeout`` send to end or preempt a command, raised
    where the command is, so that it ends as on Ctrl-C: the run folder's lock released, a line
    saying how to resume, exit status 143."""


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM raises :class:`Terminated` (in the main thread, where Python
    runs signal handlers; elsewhere the block changes nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _warnings_as_lines(command: str, shown: list[str]) -> Iterator[None]:
    """Inside the block, a warning is shown as one line,
    ``flowkit <command>: warning: <Category>: <message>`` (without Python's source path, line
    number and source line), and ``<Category>: <message>`` is appended to ``shown`` (for
    ``metrics.json``); the previous format comes back after the block. Only the format
    changes, so code that records warnings (``warnings.catch_warnings(record=True)``,
    ``pytest.warns``) still receives them."""

    def format_line(message: Warning | str, category: type[Warning], filename: str,
                    lineno: int, line: str | None = None) -> str:
        text = f"{category.__name__}: {' '.join(str(message).split())}"
        shown.append(text)
        return f"flowkit {command}: warning: {text}\n"

    previous, warnings.formatwarning = warnings.formatwarning, format_line
    try:
        yield
    finally:
        warnings.formatwarning = previous


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None, so that metrics.json is
    strict JSON (Python's ``json`` writes them as the non-standard ``NaN`` and ``Infinity``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _refuse_another_commands_results(path: Path, command: str) -> None:
    """Fail if ``path`` (an ``--out``'s metrics.json) holds the results of another subcommand,
    which this one would replace (``flowkit mnist-eval run/model.pt --out run`` after
    ``flowkit mnist --out run``). A rerun of the same subcommand is that command's own check:
    most refuse it or need ``--resume``; the benchmarks add cells to their ``--out``."""
    if not path.exists():
        return
    try:
        previous = json.loads(path.read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        previous = None
    if previous != command:
        written = f"flowkit {previous}" if isinstance(previous, str) else "another program"
        raise ValueError(f"'{path}' holds the results of {written}, which this command would "
                         "replace: pick another --out")


def _make_folder(out: Path) -> list[Path]:
    """Create the output folder ``out`` and its missing parents; returns the folders created,
    deepest first. An ``out`` that exists as a file is a ``NotADirectoryError`` naming it."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out '{out}' exists and is not a folder")
    missing = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"--out '{out}' cannot be created: {e.strerror or e}") from e
    return missing


def _remove_if_empty(created: list[Path]) -> None:
    """After a failed command: remove the folders it created if nothing was written to them,
    so a failed invocation leaves no empty output folder behind."""
    for folder in created:
        try:
            folder.rmdir()  # only succeeds on an empty folder
        except OSError:
            return
