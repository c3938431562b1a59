"""Option types shared by the subcommands (imported by them and by :mod:`flowkit.app.cli`,
which imports no subcommand module up front: the dependency runs one way)."""

from __future__ import annotations

import argparse


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
