"""The model registry: how a model class declares that it can be rebuilt from a file, and how its
stored buffers are checked when a file is read.

* :func:`register_model` decorates a constructor (a class, or a function returning a module,
  such as :func:`flowkit.MAF`). Each model it builds gets a ``config``
  ``{"type": name, "kwargs": {...}}`` recording the call's arguments (defaults included, numpy
  and tensor values as plain JSON), and :func:`flowkit.load_model` rebuilds a file's model by
  calling the registered constructor of that name with those arguments. Names that are not
  registered are refused before anything is called. A constructor whose defaults changed
  declares a ``version`` (recorded in the config from 2 on) and how to read the arguments of an
  older file (:func:`upgraded_config`), so an old file still rebuilds the model it holds.
* :func:`register_check` attaches a check to a module class: when weights are restored (by
  :func:`flowkit.load_model` or by resuming a run), every submodule of a registered class (or a
  subclass) is checked, and a buffer that its construction could not have produced (a MADE mask
  that its stored degrees do not give, a permutation that is not one) raises
  :class:`InvalidBuffer`, reported as a :class:`~flowkit.checkpoint.CheckpointError` naming the
  file and the buffer.

The registrations live next to the model classes (``flowkit/flows/builders.py``,
``flowkit/distributions/discrete.py``, ``flowkit/nn/made.py``, ``flowkit/transforms/base.py``);
this module imports no model.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from ..validation import Mention, Worded
from .format import CheckpointError

__all__ = ["BuildWarning", "InvalidBuffer", "register_check", "register_model", "upgraded_config"]

C = TypeVar("C", bound=Callable[..., nn.Module])
M = TypeVar("M", bound=nn.Module)

_CONSTRUCTORS: dict[str, Callable[..., nn.Module]] = {}
_CHECKS: dict[type[nn.Module], Callable[[Any], None]] = {}
_ADDED: dict[str, dict[str, Any]] = {}
Upgrade = Callable[[dict[str, Any], int], dict[str, Any]]
_VERSIONS: dict[str, tuple[int, Upgrade | None]] = {}


class BuildWarning(Worded, UserWarning):
    """Advice that a registered constructor gives about the model it builds (for example that
    ``MAF(1)`` with affine layers is a Gaussian), through :func:`warn_on_build`.
    :func:`flowkit.load_model` does not repeat it when it rebuilds a saved model: the choice was
    made, and warned about, when it was built. Its message may name arguments as
    :class:`~flowkit.validation.Mention` parts (a command line spells them as its options)."""


_REBUILDING: contextvars.ContextVar[bool] = contextvars.ContextVar("rebuilding", default=False)


def warn_on_build(*parts: str | Mention, stacklevel: int) -> None:
    """Give the message of ``parts`` (text and :class:`~flowkit.validation.Mention` parts) as
    a :class:`BuildWarning` (``stacklevel`` counted from the caller), unless
    :func:`flowkit.load_model` is rebuilding a saved model (no change of the warning filters,
    which would show every warning the program already gave once again)."""
    if not _REBUILDING.get():
        warnings.warn(BuildWarning(*parts), stacklevel=stacklevel + 1)


@contextmanager
def rebuilding() -> Iterator[None]:
    """Within this block registered constructors do not give :class:`BuildWarning`."""
    token = _REBUILDING.set(True)
    try:
        yield
    finally:
        _REBUILDING.reset(token)


class InvalidBuffer(ValueError):
    """Raised by a check registered with :func:`register_check`: the buffer ``buffer`` (a name
    relative to the checked module, e.g. ``"hidden.0.mask"``) is not ``expected``."""

    def __init__(self, buffer: str, expected: str):
        super().__init__(f"'{buffer}' should be {expected}")
        self.buffer, self.expected = buffer, expected


def register_model(
    name: str | None = None,
    store: Mapping[str, Callable[[Any], Any]] | None = None,
    added: Mapping[str, Any] | None = None,
    version: int = 1,
    upgrade: Upgrade | None = None,
) -> Callable[[C], C]:
    """Register a model constructor under ``name`` (default: its ``__name__``) so that
    :func:`flowkit.save_model` can save what it builds and :func:`flowkit.load_model` rebuild it.

    The decorated constructor sets ``model.config = {"type": name, "kwargs": arguments}`` on
    every model it builds (for a class: on instances of exactly that class; a subclass registers
    itself). Arguments are stored as JSON: numpy scalars become numbers, tuples lists, tensors and
    arrays nested lists; ``store`` maps an argument's name to a function giving the JSON form of
    other values, one the constructor accepts back (e.g. a class by its name); a value with no
    JSON form is reported when the model is saved. ``added`` maps an argument the constructor
    gained after files were first written to the value that rebuilds what an older file (whose
    config lacks it) holds; :func:`flowkit.load_model` passes it for such files. ``version``
    counts the changes of the constructor's defaults that make the same stored arguments build
    another model (configs record it from 2 on; files without one are version 1), and
    ``upgrade(kwargs, file_version)`` returns the arguments that rebuild an older file's model
    under today's defaults.

    Example:
        >>> from torch import nn
        >>> @register_model("DocExampleScale")
        ... class Scale(nn.Module):
        ...     def __init__(self, features: int, init: float = 1.0):
        ...         super().__init__()
        ...         self.log_scale = nn.Parameter(torch.full((features,), init).log())
        >>> Scale(3).config
        {'type': 'DocExampleScale', 'kwargs': {'features': 3, 'init': 1.0}}

    Raises:
        ValueError: another constructor (defined elsewhere) is registered under ``name``.
        TypeError: the constructor takes ``*args`` (they cannot be stored by name).
    """

    def decorate(constructor: C) -> C:
        key = constructor.__name__ if name is None else name
        signature = inspect.signature(constructor)
        if any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values()):
            raise TypeError(f"{key}: a registered constructor cannot take *args")
        if key in _CONSTRUCTORS and _origin(_CONSTRUCTORS[key]) != _origin(constructor):
            raise ValueError(f"a model constructor named {key!r} is already registered")
        _ADDED[key] = dict(added or {})
        _VERSIONS[key] = (version, upgrade)

        def record(model: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            for p in signature.parameters.values():
                if p.kind is p.VAR_KEYWORD:
                    arguments.update(arguments.pop(p.name, {}))
            for argument, plain in (store or {}).items():
                arguments[argument] = plain(arguments[argument])
            model.config = model_config(key, **arguments)
            if version > 1:
                model.config["version"] = version

        if inspect.isclass(constructor):
            init = constructor.__init__

            @functools.wraps(init)
            def __init__(self: nn.Module, *args: Any, **kwargs: Any) -> None:
                init(self, *args, **kwargs)
                if type(self) is constructor:
                    record(self, args, kwargs)

            constructor.__init__ = __init__  # type: ignore[misc]
            _CONSTRUCTORS[key] = constructor
            return constructor

        @functools.wraps(constructor)
        def build(*args: Any, **kwargs: Any) -> nn.Module:
            model = constructor(*args, **kwargs)
            record(model, args, kwargs)
            return model

        _CONSTRUCTORS[key] = build
        return build  # type: ignore[return-value]

    return decorate


def _origin(f: Callable[..., Any]) -> tuple[str, str]:
    """Where ``f`` is defined (a module reloaded registers the same constructors again)."""
    return f.__module__, f.__qualname__


def register_check(cls: type[M]) -> Callable[[Callable[[M], None]], Callable[[M], None]]:
    """Register ``check(module)`` for the modules of class ``cls`` (and its subclasses): called on
    each such submodule of a model whose weights were restored from a file, it raises
    :class:`InvalidBuffer` if a stored buffer is not one the module's construction allows. It may
    rebuild derived buffers from stored ones (a MADE's masks from its degrees) to compare them.

    Raises:
        ValueError: ``cls`` already has a check (defined elsewhere).
    """

    def decorate(check: Callable[[M], None]) -> Callable[[M], None]:
        if cls in _CHECKS and _origin(_CHECKS[cls]) != _origin(check):
            raise ValueError(f"{cls.__name__} already has a registered check")
        _CHECKS[cls] = check
        return check

    return decorate


def registered_models() -> list[str]:
    """The registered constructor names, sorted."""
    return sorted(_CONSTRUCTORS)


def constructor(name: Any, where: str) -> Callable[..., nn.Module]:
    """The constructor registered as ``name``; a :class:`CheckpointError` naming ``where``
    otherwise (before anything is called)."""
    if isinstance(name, str) and name in _CONSTRUCTORS:
        return _CONSTRUCTORS[name]
    raise CheckpointError(
        f"{where} holds a model of type {name!r}, which is not a model constructor in this "
        f"flowkit (registered: {', '.join(registered_models())}; see "
        "flowkit.checkpoint.register_model)"
    )


def upgraded_config(config: dict[str, Any], where: str = "the file") -> dict[str, Any]:
    """A file's (checked) model ``config`` as its registered constructor reads it today: the
    arguments the constructor gained since (its ``added``) filled in, and for a file of an older
    ``version`` its ``upgrade`` applied; the config a model built now with the same meaning has.

    Raises:
        CheckpointError: the file records a newer version than this flowkit knows.
    """
    name = config["type"]
    kwargs = {**_ADDED.get(name, {}), **config["kwargs"]}
    saved = config.get("version", 1)
    version, upgrade = _VERSIONS.get(name, (1, None))
    if saved > version:
        raise CheckpointError(
            f"{where} holds a {name} of config version {saved}, written by a newer flowkit; this "
            f"one reads versions up to {version}: upgrade flowkit to load it"
        )
    if saved < version and upgrade is not None:
        kwargs = upgrade(kwargs, saved)
    return {"type": name, "kwargs": kwargs, **({"version": version} if version > 1 else {})}


def check_buffers(model: nn.Module) -> Iterator[tuple[str, InvalidBuffer]]:
    """Run the registered checks on every submodule of ``model``; yields ``(full buffer name,
    error)`` for each one that fails (stops at the first failure of each module)."""
    for name, module in model.named_modules():
        for cls, check in _CHECKS.items():
            if isinstance(module, cls):
                try:
                    check(module)
                except InvalidBuffer as e:
                    yield (f"{name}.{e.buffer}" if name else e.buffer), e


def model_config(type_name: str, **kwargs: Any) -> dict[str, Any]:
    """A model's ``config``, ``{"type": type_name, "kwargs": kwargs}``, with JSON values
    (numpy scalars as Python numbers, tuples as lists, tensors and arrays as nested lists,
    recursively inside lists and dicts; anything else kept, and reported by
    :func:`check_config`)."""
    return {"type": type_name, "kwargs": {k: _plain(v) for k, v in kwargs.items()}}


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor | np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def check_config(config: Any, where: str) -> None:
    """Refuse a ``config`` that is not ``{"type": str, "kwargs": dict}`` (and an optional
    ``"version"``, an integer >= 1) of JSON values."""
    version = config.get("version", 1) if isinstance(config, dict) else None
    if (
        not isinstance(config, dict)
        or not isinstance(config.get("type"), str)
        or not isinstance(config.get("kwargs"), dict)
        or set(config) - {"type", "kwargs", "version"}
        or type(version) is not int
        or version < 1
    ):
        raise CheckpointError(
            f"{where} should be a dict {{'type': str, 'kwargs': dict}} (and an integer "
            f"'version' >= 1 if any), got {config!r}"
        )
    try:
        json.dumps(config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where} should be JSON-serialisable: {e}") from e
