"""Input checks shared by every public entry point.

Errors name the argument and say what was expected. Shape, dtype and device checks are free;
the finiteness check reads the tensor back to the host, so it can be switched off for hot
loops with :func:`validate_values` (the fit loop checks its data once, up front). Code compiled
with :func:`torch.compile` skips it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from numbers import Integral

import torch
from torch import Tensor

_check_values = True


@contextmanager
def validate_values(enabled: bool) -> Iterator[None]:
    """Turn the NaN/Inf checks of :func:`check_features` on or off inside a ``with`` block."""
    global _check_values
    previous, _check_values = _check_values, enabled
    try:
        yield
    finally:
        _check_values = previous


def check_features(
    name: str,
    value: object,
    features: int,
    like: Tensor,
    floating: bool = True,
) -> Tensor:
    """Check that ``value`` is a ``(N, features)`` tensor, ``N >= 1``, on ``like``'s device,
    with ``like``'s dtype (or any integer/bool dtype when ``floating`` is False), and finite."""
    if not isinstance(value, Tensor):
        raise TypeError(
            f"'{name}' should be a torch.Tensor of shape (N, {features}), "
            f"got {type(value).__name__}"
        )
    if value.dim() != 2 or value.shape[1] != features:
        raise ValueError(f"'{name}' should have shape (N, {features}), got {tuple(value.shape)}")
    if value.shape[0] == 0:
        raise ValueError(f"'{name}' is an empty batch: shape {tuple(value.shape)}")
    if floating and value.dtype != like.dtype:
        raise TypeError(
            f"'{name}' should have dtype {like.dtype} (the model's), got {value.dtype}"
        )
    if value.device != like.device:
        raise ValueError(
            f"'{name}' is on {value.device} but the model is on {like.device}; "
            f"move one of them with .to()"
        )
    # A data-dependent branch would break a torch.compile graph: compiled code skips this one.
    checking = _check_values and not torch.compiler.is_compiling()
    if floating and checking and not torch.isfinite(value).all():
        raise ValueError(f"'{name}' contains NaN or Inf values")
    return value


def check_context(context: object, context_features: int, rows: int, like: Tensor) -> Tensor | None:
    """Check a context against a model's ``context_features``; returns ``(rows, C)`` or None.

    A context of shape ``(C,)`` is one context for every row and is expanded explicitly;
    ``(rows, C)`` gives one context per row. Anything else is an error.
    """
    if context_features == 0:
        if context is not None:
            raise ValueError("'context' was given but the model has context_features=0")
        return None
    if context is None:
        raise ValueError(
            f"'context' is required: a tensor of shape ({rows}, {context_features}) or "
            f"({context_features},)"
        )
    if isinstance(context, Tensor) and context.dim() == 1:
        context = context.expand(rows, -1) if context.shape[0] == context_features else context
    check_features("context", context, context_features, like)
    if context.shape[0] != rows:
        raise ValueError(
            f"'context' should have shape ({rows}, {context_features}) to match 'x', "
            f"got {tuple(context.shape)}"
        )
    return context


def check_n(n: object) -> int:
    """Check a number of samples ``n``: an integer >= 1 (Python or numpy, not bool)."""
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
        raise ValueError(f"'n' should be a positive number of samples, got {n!r}")
    return int(n)
