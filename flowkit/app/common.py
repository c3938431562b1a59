"""Small helpers shared by the experiments: a mean with its standard error, a plain MLP, the
refusal to replace an earlier run, the spelling of library arguments as command options, the
options of a recipe trained by epochs, ``--threads`` and the minimums of integer options, a
Markdown table."""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from flowkit.validation import Mention, Worded, python_spelling

from .options import positive_float, positive_int

FLOW_OPTIONS_ADDED: dict[str, Any] = {"lu_linear": False}
"""Flow options that the apps' records (``flowkit fit``'s ``options.json``, bench-defaults'
cells, sbibm's results) predate, with the value the flows recorded before them were built with
(a MAF had no LU-linear maps before they became its default, 2026-11-26): a record is read as
``{**FLOW_OPTIONS_ADDED, **record}``."""

__all__ = [
    "FLOW_OPTIONS_ADDED",
    "add_epoch_options",
    "add_threads_option",
    "as_options",
    "check_minimums",
    "check_same_settings",
    "count",
    "markdown_table",
    "mean_se",
    "mlp",
    "refuse_to_replace",
    "use_threads",
]


def mean_se(values: Tensor) -> tuple[float, float]:
    r"""Mean of ``values`` and its standard error :math:`s / \sqrt n`.

    ``s`` is the sample standard deviation (``n - 1`` in the denominator), computed in float64.

    Args:
        values: ``(n,)`` per-example scores, e.g. NLLs or ELBOs (any shape: all elements count).

    Returns:
        ``(mean, standard error)`` as floats; the standard error is NaN when ``n < 2``.

    Example:
        >>> import torch
        >>> mean_se(torch.tensor([1.0, 2.0, 3.0, 4.0]))  # s = sqrt(5/3)
        (2.5, 0.6454972243679028)
    """
    values = values.detach().double()
    n = values.numel()
    se = values.std().item() / math.sqrt(n) if n > 1 else math.nan
    return values.mean().item(), se


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, with an ``s`` unless ``n`` is 1 (for nouns whose plural adds one).

    Example:
        >>> count(1, "run"), count(8, "run")
        ('1 run', '8 runs')
    """
    return f"{n} {noun}{'' if n == 1 else 's'}"


def mlp(sizes: Sequence[int], activation: Callable[[], nn.Module]) -> nn.Sequential:
    """Linear layers ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` with a fresh ``activation()``
    after each but the last.

    Args:
        sizes: layer widths, input first; at least two.
        activation: a module factory, e.g. ``nn.ReLU`` or ``nn.ELU``.

    Example:
        >>> mlp([3, 8, 2], nn.ELU)
        Sequential(
          (0): Linear(in_features=3, out_features=8, bias=True)
          (1): ELU(alpha=1.0)
          (2): Linear(in_features=8, out_features=2, bias=True)
        )
    """
    if len(sizes) < 2:
        raise ValueError(f"'sizes' should have at least 2 widths, got {list(sizes)}")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        if i > 0:
            layers.append(activation())
        layers.append(nn.Linear(a, b))
    return nn.Sequential(*layers)


def check_same_settings(
    saved: Mapping[str, Any], now: Mapping[str, Any], fixed: Sequence[str], where: Path,
    prefix: str = "--resume: ",
) -> None:
    """Refuse to continue the run in ``where``, whose options were ``saved``, with options
    ``now`` that differ in a ``fixed`` one (named as its option, the first that differs), or
    with fewer ``epochs`` than it was started for. With a learning-rate ``lr_schedule`` other
    than ``"constant"``, ``epochs`` is fixed too (the schedule was built for the run's
    length). Settings saved before ``--schedule`` was renamed ``--lr-schedule`` name it
    ``schedule``: it is read as ``lr_schedule``."""
    if "schedule" in saved:
        saved = {"lr_schedule": saved["schedule"], **saved}
    if now.get("lr_schedule", "constant") != "constant":
        fixed = (*fixed, "epochs")
    for key in fixed:
        if saved.get(key) != now.get(key):
            raise ValueError(
                f"{prefix}'--{key.replace('_', '-')}' is {now.get(key)!r} but the run in "
                f"'{where}' used {saved.get(key)!r}; pass the same settings or pick another --out"
            )
    if now["epochs"] < saved.get("epochs", 0):
        raise ValueError(
            f"{prefix}'--epochs' is {now['epochs']} but the run in '{where}' was started for "
            f"{saved['epochs']}; --epochs may only grow"
        )


def refuse_to_replace(checkpoint: Path, resume: bool, *, resumable: bool = True) -> None:
    """Fail if ``checkpoint`` (a file a run writes) exists and the command was not asked to
    ``--resume`` it: a fresh run never replaces an earlier one. For a command without
    ``--resume`` (``resumable=False``) the message only asks for another ``--out``."""
    if checkpoint.exists() and not resume:
        if not resumable:
            raise ValueError(
                f"'{checkpoint}' exists: a rerun would replace that run's results; pick "
                "another --out"
            )
        raise ValueError(
            f"'{checkpoint}' exists: pass --resume to continue that run, or pick another --out"
        )


@contextmanager
def as_options(
    options: Mapping[str, str], nones: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Inside the block, errors and warnings of the library that name its arguments (a
    :class:`~flowkit.validation.Worded` exception: bad arguments, non-finite or diverged
    training; a :class:`~flowkit.train.DataWarning` when shown) name them as this command's
    options: ``'lr'`` as ``'--lr'``, ``lr=0.01`` as ``--lr 0.01``, ``resume=True`` as
    ``--resume``, ``lr_schedule=None`` as ``--lr-schedule none``. Arguments without an option
    keep their Python spelling.

    Args:
        options: the option of each library argument the command sets, e.g.
            ``{"lr": "--lr", "checkpoint_dir": "--out"}``.
        nones: for options that can pass ``None``, the value that does, e.g.
            ``{"lr_schedule": "none"}``.

    Example:
        >>> from flowkit.validation import ArgumentError
        >>> try:
        ...     with as_options({"lr": "--lr"}):
        ...         raise ArgumentError("lr", "should be positive, got -1")
        ... except ArgumentError as e:
        ...     print(e)
        '--lr' should be positive, got -1
    """

    def spell(mention: Mention) -> str:
        option = options.get(mention.name)
        if option is None:
            return python_spelling(mention)
        if not mention.has_value:
            return f"'{option}'"
        if mention.value is None and nones and mention.name in nones:
            return f"{option} {nones[mention.name]}"
        return option if mention.value is True else f"{option} {mention.value}"

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        if isinstance(message, Worded):
            message.spell_with(spell)
        previous(message, category, filename, lineno, file, line)

    previous, warnings.showwarning = warnings.showwarning, show
    try:
        yield
    except Worded as e:
        e.spell_with(spell)
        raise
    finally:
        warnings.showwarning = previous


def check_minimums(args: argparse.Namespace, minimums: dict[str, int]) -> None:
    """Fail early (before any data is read) on an option below its minimum; options left at
    None are not checked."""
    for option, minimum in minimums.items():
        value = getattr(args, option.replace("-", "_"))
        if value is not None and value < minimum:
            raise ValueError(f"'--{option}' should be >= {minimum}, got {value}")


def add_epoch_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    epochs: int,
    schedule: str,
    quick_epochs: int | None = None,
) -> None:
    """Add ``--epochs``, ``--batch-size``, ``--lr`` and ``--lr-schedule``, the options of a
    recipe that trains on images by epochs with Adam (``flowkit mnist``, ``flowkit vae``).
    ``--schedule``, its former name, still works and is not shown in the help.

    Args:
        parser: the parser or argument group to add them to.
        epochs: the default of ``--epochs``.
        schedule: the default of ``--lr-schedule``, ``"constant"`` or ``"cosine"``.
        quick_epochs: for a command with ``--quick``, its number of epochs: ``--epochs`` is
            then None unless given (the command picks ``epochs`` or ``quick_epochs``).
    """
    if quick_epochs is None:
        parser.add_argument("--epochs", type=positive_int, default=epochs,
                            help="passes over the training set")
    else:
        parser.add_argument("--epochs", type=positive_int, default=None,
                            help=f"passes over the training set (default: {epochs}; "
                                 f"{quick_epochs} with --quick)")
    parser.add_argument("--batch-size", type=positive_int, default=100,
                        help="images per optimizer step")
    parser.add_argument("--lr", type=positive_float, default=1e-3, help="Adam learning rate")
    parser.add_argument("--lr-schedule", type=_schedule, choices=["constant", "cosine"],
                        default=schedule, help="learning-rate schedule over the steps of the "
                        "run: constant (also spelled none, as flowkit fit and toy do) or cosine "
                        "(default: %(default)s)")
    parser.add_argument("--schedule", type=_schedule, choices=["constant", "cosine"],
                        dest="lr_schedule", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)  # the former name


def _schedule(value: str) -> str:
    """``--lr-schedule`` as given, ``none`` read as ``constant`` (the other commands' name)."""
    return "constant" if value == "none" else value


def add_threads_option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    default: int | None = None,
    also: str = "",
    why: str = "",
) -> None:
    """Add ``--threads N``, the CPU threads of torch (an integer >= 1), the same in every
    training command; the command applies it with :func:`use_threads` before any work.

    Args:
        parser: the parser or argument group to add it to.
        default: the default of ``--threads``; None keeps torch's default.
        also: what else the option limits, e.g. ``"numpy's BLAS"``.
        why: the reason for the default, shown after it.
    """
    shown = "torch's default" if default is None else str(default)
    parser.add_argument(
        "--threads", type=positive_int, default=default, metavar="N",
        help=f"CPU threads for torch{f' and {also}' if also else ''} (default: {shown})"
             f"{f'; {why}' if why else ''}",
    )


def use_threads(threads: int | None) -> None:
    """``torch.set_num_threads(threads)``: the option of :func:`add_threads_option`; None keeps
    torch's default."""
    if threads is not None:
        torch.set_num_threads(threads)


def markdown_table(
    head: Sequence[str], rows: Iterable[Sequence[str]], right: Collection[int] = ()
) -> str:
    """A Markdown table, without a final newline: the header, the rule, one line per row.

    Args:
        head: the column titles.
        rows: the cells of each row, as text.
        right: the indices of the columns aligned right (numbers).

    Example:
        >>> print(markdown_table(["model", "NLL"], [["maf", "1.25"]], right={1}))
        | model | NLL |
        | --- | ---: |
        | maf | 1.25 |
    """

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    rule = ["---:" if i in right else "---" for i in range(len(head))]
    return "\n".join([line(head), line(rule), *map(line, rows)])
