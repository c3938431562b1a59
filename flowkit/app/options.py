"""Option types shared by the subcommands (imported by them and by :mod:`flowkit.app.cli`,
which imports no subcommand module up front: the dependency runs one way)."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (``0``, ``-1`` and ``2.5`` are refused with the
    option's name, instead of being replaced by a default)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"should be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"should be an integer >= 1, got {text!r}")
    return value


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
