"""Option types shared by the subcommands (imported by them and by :mod:`flowkit.app.cli`,
which imports no subcommand module up front: the dependency runs one way)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"should be an integer >= {minimum}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (``0``, ``-1`` and ``2.5`` are refused with the
    option's name, instead of being replaced by a default)."""
    return _int(text, 1)


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An ``argparse`` type: an integer >= ``minimum``, refused like :func:`positive_int`."""
    return lambda text: _int(text, minimum)


def _float(text: str, minimum: float, strict: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise argparse.ArgumentTypeError(f"should be a finite number {bound}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An ``argparse`` type: a finite number > 0 (a learning rate)."""
    return _float(text, 0.0, strict=True)


def nonnegative_float(text: str) -> float:
    """An ``argparse`` type: a finite number >= 0 (a weight decay)."""
    return _float(text, 0.0, strict=False)
