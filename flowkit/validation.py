"""Input checks, the one place where input is checked.

Public entry points call these once per call, on what the user passed, and errors name that
argument and say what was expected; the layers inside a model trust their caller. Two protocols:
a user-facing batch, ``(..., D)`` with a context ``(..., C)`` that broadcasts against it
(:func:`check_batch`, :func:`check_batch_context`, :func:`broadcast_batch`: :class:`flowkit.Flow`
and :class:`flowkit.FlowDistribution`), and a layer's rows, ``(N, D)`` with a context of exactly
``(N, C)`` (:func:`check_width`, :func:`check_context`: a transform, MADE or solver called
directly). What a transform returns is checked by :func:`check_transform_result`. Type,
shape, dtype and device checks read no values; the finiteness checks (:func:`nonfinite_rows`,
and the context's) read the tensor back to the host, so they can be
switched off for hot loops with :func:`validate_values` (the fit loop checks its data once, up
front). Code compiled with :func:`torch.compile` skips them.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from numbers import Integral, Real
from typing import NamedTuple

import torch
from torch import Tensor

_check_values = True

_NO_VALUE = object()


class Mention(NamedTuple):
    """An argument named in an error message: ``Mention("lr")`` reads ``'lr'``,
    ``Mention("lr", 0.01)`` reads ``lr=0.01`` (a setting the message reports or suggests).
    ``python``: what a Python caller reads instead, for a setting that a command line takes as
    an option and Python code as a call (``Mention("dtype", "float64", "model.double()")``)."""

    name: str
    value: object = _NO_VALUE
    python: str | None = None

    @property
    def has_value(self) -> bool:
        """Whether the mention carries a value (``lr=0.01``) or only the name (``'lr'``)."""
        return self.value is not _NO_VALUE


def python_spelling(mention: Mention) -> str:
    """How a Python caller writes an argument: ``'lr'``, or ``lr=0.01`` with a value (or the
    mention's own ``python`` text)."""
    if mention.python is not None:
        return mention.python
    if not mention.has_value:
        return f"'{mention.name}'"
    return f"{mention.name}={mention.value!r}"


Spelling = Callable[[Mention], str]
"""How a message spells the arguments it mentions (:func:`python_spelling`; a command line
spells them as its options)."""


class Worded(Exception):
    """An error or a warning whose message names arguments as :class:`Mention` parts, so that
    the caller that took them under other names (a command line's ``--lr``) can re-spell the
    message with :meth:`spell_with` instead of rewriting its text.

    Attributes:
        parts: the message, text and :class:`Mention` parts in order.
    """

    def __init__(self, *parts: str | Mention):
        super().__init__(*parts)
        self.parts = parts
        self.spelling: Spelling = python_spelling

    def spell_with(self, spelling: Spelling) -> None:
        """Spell the mentioned arguments with ``spelling`` from now on (``str(self)``)."""
        self.spelling = spelling

    def __str__(self) -> str:
        return "".join(p if isinstance(p, str) else self.spelling(p) for p in self.parts)


class WordedError(Worded):
    """An error whose message names arguments (:class:`Worded`): bad arguments, a run that
    failed."""


class ArgumentError(WordedError, ValueError):
    """A bad argument: wrong type, out of range, not finite, or not fitting the others.

    ``ArgumentError("steps", "should be >= 1, got 0")`` reads ``'steps' should be >= 1, got 0``:
    a message whose parts mention no argument starts with ``argument``'s name.

    Attributes:
        argument: the name of the argument, as the caller passed it.
    """

    def __init__(self, argument: str, *parts: str | Mention):
        if not any(isinstance(p, Mention) for p in parts):
            parts = (Mention(argument), " ", *parts)
        super().__init__(*parts)
        self.argument = argument


@contextmanager
def validate_values(enabled: bool) -> Iterator[None]:
    """Turn the NaN/Inf checks (:func:`nonfinite_rows`, contexts, :func:`check_features`) on or
    off inside a ``with`` block."""
    global _check_values
    previous, _check_values = _check_values, enabled
    try:
        yield
    finally:
        _check_values = previous


Shape = tuple[int | str, ...] | str
"""An expected shape as error messages show it: sizes and names of free sizes, ``("N", 3)``
or ``("...", 3)``, formatted only when a check fails; or the text itself."""


def format_shape(shape: Shape) -> str:
    """``("N", 3)`` as ``"(N, 3)"``, ``(3,)`` as ``"(3,)"``; a string as it is."""
    if isinstance(shape, str):
        return shape
    return f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})"


def check_tensor(
    name: str, value: object, shape: Shape, like: Tensor | None = None, floating: bool = True
) -> Tensor:
    """Check that ``value`` is a tensor and, given ``like``, that it is on ``like``'s device
    with ``like``'s dtype (any dtype when ``floating`` is False). Reads no values. ``shape`` is
    the expected shape, for the messages; checking it is the caller's part. Inside a
    ``torch.autocast`` region a floating ``value`` of lower precision than ``like`` (an
    encoder's bfloat16 output) is returned widened to ``like``'s dtype, which is exact (a flow
    computes in its own dtype there: :class:`flowkit.Flow`); anything else is not cast."""
    if not isinstance(value, Tensor):
        raise TypeError(
            f"'{name}' should be a torch.Tensor of shape {format_shape(shape)}, "
            f"got {type(value).__name__}"
        )
    if like is None:
        return value
    if (floating and value.dtype != like.dtype and value.is_floating_point()
            and like.is_floating_point()
            and torch.finfo(value.dtype).bits < torch.finfo(like.dtype).bits
            and torch.is_autocast_enabled(value.device.type)):
        value = value.to(like.dtype)
    if floating and value.dtype != like.dtype:
        model_too = (f", or the model with .to({value.dtype})"
                     if value.is_floating_point() else "")
        raise TypeError(
            f"'{name}' should have dtype {like.dtype} (the model's), got {value.dtype}: inputs "
            f"are not cast; convert them with .to({like.dtype}){model_too}"
        )
    if value.device != like.device:
        raise ValueError(
            f"'{name}' is on {value.device} but the model is on {like.device}; "
            f"move one of them with .to()"
        )
    return value


def check_width(
    name: str,
    value: object,
    features: int | None,
    like: Tensor | None = None,
    floating: bool = True,
) -> Tensor:
    """:func:`check_tensor`, and that ``value`` has shape ``(N, features)`` (any width if
    ``features`` is None). Reads no values. Without ``like`` (the transforms' check: the type
    and the width) this costs about as much as reading a shape."""
    width = "D" if features is None else features
    value = check_tensor(name, value, ("N", width), like, floating)
    if value.dim() != 2 or (features is not None and value.shape[1] != features):
        raise ValueError(f"'{name}' should have shape (N, {width}), got {tuple(value.shape)}")
    return value


def _all_finite(name: str, value: Tensor) -> bool:
    """Whether every entry of ``value`` is finite, read back to the host; True (not checked)
    when value checks are switched off (:func:`validate_values`) or while compiling (a
    data-dependent branch would break a ``torch.compile`` graph)."""
    if not _check_values or torch.compiler.is_compiling():
        return True
    try:
        return bool(torch.isfinite(value).all())
    except RuntimeError as e:  # torch.func.vmap cannot read values back
        raise RuntimeError(
            f"flowkit checks '{name}' for NaN and Inf by reading its values, which this call "
            "cannot do (inside torch.func.vmap, for example): make the call inside "
            "`with flowkit.validation.validate_values(False):`"
        ) from e


def _check_finite(name: str, value: Tensor) -> Tensor:
    """Fail on NaN/Inf in ``value`` (see :func:`_all_finite`)."""
    if not _all_finite(name, value):
        raise ValueError(f"'{name}' contains NaN or Inf values")
    return value


def check_features(
    name: str,
    value: object,
    features: int,
    like: Tensor,
    floating: bool = True,
) -> Tensor:
    """Check that ``value`` is a ``(N, features)`` tensor, ``N >= 1``, on ``like``'s device,
    with ``like``'s dtype (or any dtype when ``floating`` is False), and finite (floating
    only)."""
    value = check_width(name, value, features, like, floating)
    check_not_empty(name, value, value.shape[:1])
    return _check_finite(name, value) if floating else value


def reference(module: torch.nn.Module, floating: bool = True) -> Tensor | None:
    """The first floating-point parameter or buffer of ``module`` (its dtype and device), or
    None if it has none; with ``floating=False``, the first of any dtype (its device)."""
    tensors = itertools.chain(module.parameters(), module.buffers())
    return next((t for t in tensors if t.is_floating_point() or not floating), None)


def check_context(
    context: object, context_features: int, batch: tuple[int, ...], like: Tensor | None
) -> Tensor | None:
    """Check the context given to a layer (a MADE, a transform, the solver) called directly:
    exactly ``(*batch, C)``, with ``like``'s dtype and device, or None when ``C = 0``. Reads
    no values."""
    if context_features == 0:
        if context is not None:
            raise ValueError("'context' was given but the model has context_features=0")
        return None
    expected = (*batch, context_features)
    if context is None:
        raise ValueError(f"'context' is required: a tensor of shape {format_shape(expected)}")
    context = check_tensor("context", context, expected, like)
    if context.shape != expected:
        raise ValueError(
            f"'context' should have shape {format_shape(expected)}, got {tuple(context.shape)}"
        )
    return context


def check_batch(name: str, value: object, features: int, like: Tensor | None) -> Tensor:
    """Check a batch of points given to a public method: a tensor of shape ``(..., features)``
    (any leading batch shape, at least one axis) with ``like``'s dtype and device. Reads no
    values (see :func:`nonfinite_rows`)."""
    value = check_tensor(name, value, ("...", features), like)
    if value.dim() == 0 or value.shape[-1] != features:
        raise ValueError(f"'{name}' should have shape (..., {features}), got {tuple(value.shape)}")
    return value


def check_batch_context(
    context: object, context_features: int, like: Tensor | None, name: str = "context"
) -> Tensor | None:
    """Check a context given to a public method: ``(..., C)`` (one vector per batch element,
    broadcast against the points), with ``like``'s dtype and device, finite, or None when the
    model has ``C = 0`` (then a context is an error). Errors call it ``name``."""
    if context_features == 0:
        if context is not None:
            raise ValueError(
                f"'{name}' was given but the model has context_features=0: build it with "
                "context_features=C, by name (flowkit.MAF(D, context_features=C); MAF's and "
                "IAF's second positional argument is the number of layers)")
        return None
    shape = f"(..., {context_features})"
    if context is None:
        raise ValueError(f"'{name}' is required: a tensor of shape {shape}")
    context = check_tensor(name, context, shape, like)
    if context.dim() == 0 or context.shape[-1] != context_features:
        raise ValueError(f"'{name}' should have shape {shape}, got {tuple(context.shape)}")
    return _check_finite(name, context)


def broadcast_batch(name: str, value: Tensor, context: Tensor | None) -> torch.Size:
    """The batch shape of ``value`` ``(*A, D)`` and ``context`` ``(*B, C)`` broadcast together
    (torch's rules: size-1 axes stretch), or a ValueError naming both arguments."""
    if context is None:
        return value.shape[:-1]
    try:
        return torch.broadcast_shapes(value.shape[:-1], context.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"'{name}' of shape {tuple(value.shape)} and 'context' of shape "
            f"{tuple(context.shape)} have batch shapes {tuple(value.shape[:-1])} and "
            f"{tuple(context.shape[:-1])}, which do not broadcast"
        ) from None


def check_not_empty(name: str, value: Tensor, batch: torch.Size) -> None:
    """Fail on an empty batch (a zero in ``batch``), naming ``value``'s shape."""
    if 0 in batch:
        raise ValueError(f"'{name}' is an empty batch: shape {tuple(value.shape)}")


def nonfinite_rows(name: str, value: Tensor) -> Tensor | None:
    """Points outside the support: None if every entry of ``value`` ``(..., D)`` is finite (one
    read back to the host), else the mask ``(...,)`` of the points with an infinite entry,
    whose log-density is ``-inf``. NaN is a ValueError naming ``name``. Skipped (None) when
    value checks are switched off (:func:`validate_values`) or while compiling."""
    if _all_finite(name, value):
        return None
    if torch.isnan(value).any():
        raise ValueError(f"'{name}' contains NaN values")
    return torch.isinf(value).any(-1)


def open_ends(module: torch.nn.Module) -> set[str]:
    """The state-dict names of the buffers of ``module`` that may hold infinities: those its
    submodules list in ``infinite_buffers`` (the open ends of
    :class:`~flowkit.transforms.Logit`'s intervals)."""
    return {f"{prefix}.{name}" if prefix else name
            for prefix, sub in module.named_modules()
            for name in getattr(sub, "infinite_buffers", ())}


def invalid_values(value: Tensor, infinite_ok: bool = False) -> Tensor:
    """Where ``value`` holds NaN, or an infinity unless ``infinite_ok``: a boolean mask."""
    return value.isnan() if infinite_ok else ~torch.isfinite(value)


def nonfinite_row_mask(value: Tensor) -> Tensor:
    """Which rows of ``value`` ``(N, ...)`` hold a NaN or an infinite entry: a bool mask
    ``(N,)`` (a 0-dim ``value`` is one row, and its mask is 0-dim). Reads no values back to
    the host (``.any()``, ``.sum()`` or ``.nonzero()`` of the mask do)."""
    bad = ~torch.isfinite(value)
    return bad.flatten(1).any(1) if bad.dim() > 1 else bad


def is_permutation(t: Tensor) -> bool:
    """Whether ``t`` is a 1-D integer tensor holding each of ``0 .. len(t) - 1`` once."""
    return t.dim() == 1 and torch.equal(t.sort().values, torch.arange(t.numel(), device=t.device))


def check_permutation(name: str, value: object, features: int | None = None) -> Tensor:
    """Check that ``value`` is a permutation of ``range(D)``, ``D = features`` where given: a
    flat sequence of integers or an integer tensor. Floating, complex, ``bool`` and ``uint8``
    values are refused (torch reads a ``uint8`` index as a mask of booleans). Returns it as a
    CPU ``long`` tensor ``(D,)``, which may share memory with ``value``."""
    try:
        given = torch.as_tensor(value, device="cpu")
    except (TypeError, ValueError, RuntimeError):  # ragged lists, strings inside, objects
        given = None
    if (
        given is None
        or given.dim() != 1
        or given.dtype in (torch.bool, torch.uint8)
        or given.is_floating_point()
        or given.is_complex()
        or (features is not None and given.numel() != features)
        or not is_permutation(given.long())
    ):
        size = features if features is not None else (
            given.numel() if given is not None and given.dim() == 1 else "D")
        shown = f"{value.tolist()} ({value.dtype})" if isinstance(value, Tensor) else repr(value)
        raise ValueError(f"'{name}' should be a permutation of range({size}) (ints), got {shown}")
    return given.long()


def is_int(value: object) -> bool:
    """An integer, Python or numpy, but not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_int(name: str, value: object, minimum: int) -> int:
    """Check an integer argument (a size, a count, a seed): an ``int`` or numpy integer, not a
    ``bool``, at least ``minimum``. Returns it as a Python ``int`` (``operator.index``), which
    callers should keep: a numpy integer stored in a checkpoint's options is refused there.
    Anything else (``2.5``, ``"2"``, ``True``, ``0`` for ``minimum=1``) is a ValueError, as for
    :func:`check_n`."""
    if not is_int(value):
        raise ArgumentError(name, f"should be an integer >= {minimum}, got {value!r}")
    number = operator.index(value)
    if number < minimum:
        raise ArgumentError(name, f"should be >= {minimum}, got {value!r}")
    return number


def check_float(
    name: str,
    value: object,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive: bool = False,
    finite: bool = True,
) -> float:
    """Check a real-valued argument (a rate, a bound, a scale): a Python or numpy real number,
    not a ``bool``, a string or a complex number; not NaN; finite unless ``finite=False``; in
    ``[minimum, maximum]`` (``(minimum, maximum)`` with ``exclusive=True``) where given.
    Returns it as a Python ``float``; anything else is a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ArgumentError(name, f"should be a real number, got {value!r}")
    number = float(value)
    if math.isnan(number) or (finite and math.isinf(number)):
        raise ArgumentError(name, f"should be a finite number, got {value!r}")
    low = minimum is not None and (number <= minimum if exclusive else number < minimum)
    high = maximum is not None and (number >= maximum if exclusive else number > maximum)
    if low or high:
        if minimum == 0 and maximum is None:
            expected = "positive" if exclusive else ">= 0"
            raise ArgumentError(name, f"should be {expected}, got {value!r}")
        interval = (
            f"{'(' if exclusive else '['}{'-inf' if minimum is None else f'{minimum:g}'}, "
            f"{'inf' if maximum is None else f'{maximum:g}'}{')' if exclusive else ']'}"
        )
        raise ArgumentError(name, f"should be in {interval}, got {value!r}")
    return number


def check_bool(name: str, value: object) -> bool:
    """Check a flag: ``True`` or ``False``, not a truthy string or number (a ValueError)."""
    if not isinstance(value, bool):
        raise ArgumentError(name, f"should be True or False, got {value!r}")
    return value


def check_n(n: object) -> int:
    """Check a number of samples ``n``: an integer >= 1 (Python or numpy, not bool)."""
    if not is_int(n):
        raise ValueError(f"'n' should be an integer number of samples, got {n!r} "
                         f"({type(n).__name__})")
    if n < 1:
        raise ValueError(f"'n' should be a positive number of samples, got {n!r}")
    return operator.index(n)


SampleShape = int | Sequence[int] | None
"""What ``sample`` takes: a number of samples, a sample shape, or None (one per context row)."""


def check_sample_arguments(
    n: object, context: object, context_features: int, like: Tensor | None
) -> tuple[torch.Size, Tensor | None]:
    """The ``n`` and ``context`` of a ``sample(n, context)`` call, checked as given: ``n`` as
    a sample shape (:func:`check_sample_shape`) and the context, ``(..., context_features)``
    and not empty (:func:`check_batch_context`). A tensor passed as ``n`` (a context given by
    position, as nflows takes it) is named as such, before the missing context."""
    if isinstance(n, Tensor) and n.dim() > 0:
        raise ValueError(f"'n' should be an integer number of samples, got a tensor of shape "
                         f"{tuple(n.shape)}; pass a context by keyword: sample(n, context=c), "
                         "or sample(context=c) for one sample per row")
    context = check_batch_context(context, context_features, like)
    if context is not None:
        check_not_empty("context", context, context.shape[:-1])
    return check_sample_shape(n, context is not None), context


def check_sample_shape(n: object, context_given: bool) -> torch.Size:
    """The ``n`` of a ``sample(n, context)`` call as a sample shape: an integer ``n`` (checked
    by :func:`check_n`) is ``(n,)``, a sequence of integers >= 1 is itself, and ``None`` is
    ``()`` when a context gives one sample per row (an error without one: how many?)."""
    if n is None:
        if not context_given:
            raise ValueError("'n', the number of samples, is required without a context: "
                             "sample(n) gives n samples (a flow's flow().sample() gives one)")
        return torch.Size()
    if is_int(n) or isinstance(n, str) or not isinstance(n, Sequence):
        return torch.Size([check_n(n)])
    return torch.Size(check_int(f"n[{i}]", s, 1) for i, s in enumerate(n))


def check_torch_shape(name: str, value: object) -> torch.Size:
    """``value`` as a ``torch.Size``, as :mod:`torch.distributions` take a ``sample_shape`` or
    ``batch_shape``: a sequence of integers >= 0 (``(3,)``, not ``3``; numpy integers, integer
    tensors and 1-D arrays too; no bools). flowkit's own ``sample(n)`` takes
    :func:`check_sample_shape`'s forms instead."""
    sizes = None
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        try:
            sizes = [_shape_size(n) for n in value]
        except TypeError:
            sizes = None
    if sizes is not None and all(n >= 0 for n in sizes):
        return torch.Size(sizes)
    hint = (f" such as ({value},)" if isinstance(value, int) and not isinstance(value, bool)
            and value >= 0 else "")
    raise ValueError(
        f"'{name}' should be a tuple of non-negative integers{hint}, got {value!r}"
    )


def _shape_size(n: object) -> int:
    """One size of a shape: an integer that is not a bool (``operator.index``)."""
    if isinstance(n, bool) or (isinstance(n, Tensor) and n.dtype == torch.bool):
        raise TypeError(n)
    return operator.index(n)


def check_transform_result(
    transform: object, method: str, result: object, x: Tensor
) -> tuple[Tensor, Tensor]:
    """``result`` of ``transform.<method>(x, context)``, checked: a pair ``(y, log_det)`` with
    ``y`` of ``x``'s shape ``(N, D)`` and ``log_det`` of shape ``(N,)``, one value per row
    (a custom transform's log-determinant summed over the batch was broadcast to
    every row, and a bare ``z`` of two rows was unpacked as the pair). Anything else is a
    ValueError naming the transform. Costs a few comparisons of shapes per transform. Flows and
    :class:`~flowkit.transforms.Compose` check each result, and
    :func:`flowkit.testing.check_transform` a transform's own ``forward`` and ``inverse``."""
    if type(result) is tuple and len(result) == 2:
        y, log_det = result
        if (isinstance(y, Tensor) and isinstance(log_det, Tensor) and y.shape == x.shape
                and log_det.shape == x.shape[:1]):
            return y, log_det
        shapes = ", ".join(f"{type(v).__name__} of shape {tuple(v.shape)}"
                           if isinstance(v, Tensor) else type(v).__name__ for v in result)
        got = f"a pair: {shapes}"
    elif isinstance(result, Tensor):
        got = f"one tensor of shape {tuple(result.shape)}"
    else:
        got = (f"a {type(result).__name__} of {len(result)}"
               if isinstance(result, tuple | list) else type(result).__name__)
    raise ValueError(
        f"{type(transform).__name__}.{method} should return (y, log_det), y of its input's shape "
        f"{tuple(x.shape)} and log_det of shape {tuple(x.shape[:1])}, one log|det| per row; "
        f"got {got} (docs/flows.md, 'Writing a transform')")
