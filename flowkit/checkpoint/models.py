"""What a checkpoint holds, and models saved to and rebuilt from files.

The payload of every flowkit file (see :mod:`flowkit.checkpoint.format` for the bytes around it)
is one dict::

    {"kind": str,
     "model": {"config": dict | None, "state_dict": dict[str, Tensor]} | None,
     "extra": dict}

* ``kind`` says what the file is for: ``"model"`` for :func:`save_model`, ``"training"`` for
  :func:`flowkit.train.fit`, any other string for an application's own checkpoints (this module
  gives no kind a meaning; a reader asks :func:`load_checkpoint` for the kind it expects);
* ``model`` is a model's weights and, if it was built by a registered constructor (see
  :mod:`flowkit.checkpoint.registry`), its ``config``, from which :func:`load_model` rebuilds it;
* ``extra`` is whatever the writer needs besides (optimizer state, step, history, settings):
  tensors and plain containers only.

Files of format 1 were dicts ``{"flowkit_format": 1, "kind": ..., "model": ..., <entries>}``;
they are read as ``extra = <entries>``.

Weights are restored (by :func:`load_model` and when :func:`flowkit.train.fit` resumes) through
:meth:`Checkpoint.restore`, which applies every check: tensors only, a strict fit to the model,
the registered buffer checks (MADE masks against their degrees, permutations) and finite values.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..validation import check_bool, invalid_values, open_ends
from .format import (
    CheckpointError,
    check_path_to_read,
    check_path_to_write,
    first_line,
    read_file,
    write_file,
)
from .registry import check_buffers, check_config, constructor, rebuilding, upgraded_config

__all__ = [
    "Checkpoint",
    "check_same_config",
    "load_checkpoint",
    "load_model",
    "save_checkpoint",
    "save_model",
]

MODEL_KIND = "model"
"""The ``kind`` of the files :func:`save_model` writes."""

_LEAVES = (
    torch.Tensor, nn.Parameter, str, int, float, bool, type(None), torch.dtype, torch.device,
    torch.Size,
)
"""The exact types of the values that ``torch.load(weights_only=True)`` reads back; a subclass
(``np.float64`` of ``float``, an ``IntEnum`` of ``int``) is written by pickle under its own class,
which that load refuses."""
_CONTAINERS = (dict, OrderedDict, list, tuple)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint file as :func:`load_checkpoint` read it (intact, of a known format).

    Attributes:
        path: the file.
        version: its format (1 or 2; see :mod:`flowkit.checkpoint.format`).
        kind: what it is for (``"model"``, ``"training"``, or an application's kind).
        model: ``{"config": dict | None, "state_dict": dict}``, or None if it holds no model.
        extra: the writer's other entries.
    """

    path: Path
    version: int
    kind: str
    model: dict[str, Any] | None
    extra: dict[str, Any]

    def restore(self, model: nn.Module, *, allow_nonfinite: bool = False) -> None:
        """Load the stored weights into ``model`` and check them: when both the file and
        ``model`` have a ``config``, they are the same (:func:`check_same_config`, as when
        :func:`flowkit.train.fit` resumes: a MAF's weights are not restored into an IAF, or into
        a MAF of another activation, whose densities they would change); the weights are tensors
        that fit ``model`` exactly (``strict``), every buffer passes the checks registered for its
        module's class (:func:`~flowkit.checkpoint.register_check`), and floating values are
        finite.

        Args:
            model: a model of the architecture the file was written for.
            allow_nonfinite: accept NaN and infinite weights (to inspect a diverged model).

        Raises:
            CheckpointError: naming the file and the configs' differing arguments, or the first
                weight or buffer that fails. ``model`` may then hold part of the stored weights:
                do not use it.
            ValueError: ``allow_nonfinite`` is not True or False.
        """
        check_bool("allow_nonfinite", allow_nonfinite)
        if self.model is None:
            raise CheckpointError(f"'{self.path}' holds no model weights")
        check_same_config(
            self.path, self.model.get("config"), model,
            "restore it into the model it was written for (flowkit.load_model(path) rebuilds "
            "it; pass embedding= for a custom embedding)",
        )
        self._restore_weights(model, allow_nonfinite)

    def _restore_weights(self, model: nn.Module, allow_nonfinite: bool) -> None:
        """:meth:`restore` without the comparison of configs (for a model built from the file's
        own config, whose custom embedding may be the same class under another module name)."""
        assert self.model is not None
        state = self.model["state_dict"]
        model = unwrap_compiled(model)
        prefix = "_orig_mod."  # files of compiled models written before unwrap_compiled
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
        _refuse_other_dtypes(self.path, state, model.state_dict())
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            config = getattr(model, "config", None)
            label = config["type"] if isinstance(config, dict) else type(model).__name__
            raise CheckpointError(
                f"'{self.path}': the stored weights do not fit a {label} (built from the stored "
                f"config, or the model given to resume them): "
                f"{_state_difference(state, model.state_dict()) or first_line(e)}"
            ) from e
        for name, error in check_buffers(model):
            raise CheckpointError(
                f"'{self.path}': the stored buffer '{name}' should be {error.expected}"
            )
        if not allow_nonfinite:
            infinite_ok = open_ends(model)
            for key, value in state.items():
                if value.is_floating_point() or value.is_complex():
                    bad = int(invalid_values(value, key in infinite_ok).sum())
                    if bad:
                        raise CheckpointError(
                            f"'{self.path}': the stored weight '{key}' holds {bad} NaN or "
                            f"infinite value(s) of {value.numel()} (a diverged model; pass "
                            "allow_nonfinite=True to load it anyway)"
                        )


def _refuse_other_dtypes(
    path: object, stored: dict[str, Tensor], expected: dict[str, Tensor]
) -> None:
    """Refuse to restore floating-point weights into tensors of another dtype:
    ``load_state_dict`` would cast them (float64 weights into a float16 model become inf, a
    float64 run resumed by a float32 model rounds its weights and optimizer state)."""
    for key, value in stored.items():
        target = expected.get(key)
        if (target is not None and value.is_floating_point() and target.is_floating_point()
                and value.dtype != target.dtype):
            raise CheckpointError(
                f"'{path}' holds {str(value.dtype).removeprefix('torch.')} weights ('{key}'), "
                f"the model {str(target.dtype).removeprefix('torch.')} ones: a restore does not "
                f"cast them; convert the model first, model.to({value.dtype}), or load the "
                "file with flowkit.load_model, which builds the model in the file's dtype"
            )


def check_same_config(
    path: str | os.PathLike, stored: dict[str, Any] | None, model: nn.Module, remedy: str
) -> None:
    """Refuse to put the weights of a file written for one model into a model of another
    configuration (another class, activation, ``log_scale_bound``, ...): with the same shapes
    they would load, and give other densities. Not compared: ``seed``, which only drew the
    initial weights, masks and permutations that the file's weights and buffers replace, and
    the module a custom embedding class was imported from (``__main__.Net`` is ``nets.Net``),
    as :func:`load_model` reads it. Used by :meth:`Checkpoint.restore` and when
    :func:`flowkit.train.fit` resumes.

    Args:
        path: the file, for the message.
        stored: the file's model ``config`` (None: nothing to compare).
        model: the model the weights are for; one without a ``config`` is not compared.
        remedy: the message's end, what to do instead.

    Raises:
        CheckpointError: the file's config (read as today's constructor reads it,
            :func:`~flowkit.checkpoint.registry.upgraded_config`) differs from ``model.config``;
            the message lists only the arguments that differ, e.g. ``'run.pt' was written for a
            MAF with {'activation': 'ReLU'}, not for this MAF with {'activation': 'Tanh'}``.
    """
    current = model_entry(model)["config"]
    if stored is None or current is None:
        return
    stored, current = _comparable(upgraded_config(stored, f"'{path}'")), _comparable(current)
    if _embedding_structure(stored) is None or _embedding_structure(current) is None:
        for config in (stored, current):  # older files record no custom network's structure
            if isinstance(config["kwargs"].get("embedding"), dict):  # copies (_comparable)
                config["kwargs"]["embedding"].pop("structure", None)
    if stored != current:
        raise CheckpointError(
            f"'{path}' was written for {_config_difference(stored, current)}: {remedy}"
        )


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without what :func:`check_same_config` does not compare."""
    kwargs = {k: v for k, v in config["kwargs"].items() if k != "seed"}
    embedding = kwargs.get("embedding")
    if isinstance(embedding, dict):
        kwargs["embedding"] = dict(embedding)
        if isinstance(embedding.get("custom"), str):
            kwargs["embedding"]["custom"] = embedding["custom"].rsplit(".", 1)[-1]
    return {**config, "kwargs": kwargs}


def _embedding_structure(config: dict[str, Any]) -> str | None:
    """The stored ``repr`` of a config's custom embedding network, if any."""
    embedding = config["kwargs"].get("embedding")
    return embedding.get("structure") if isinstance(embedding, dict) else None


def _config_difference(stored: dict[str, Any], current: dict[str, Any]) -> str:
    """How two model configs differ, for a message: only the arguments that differ, e.g.
    ``a MAF with {'activation': 'ReLU'}, not for this MAF with {'activation': 'Tanh'}``."""
    if stored["type"] != current["type"]:  # other classes: their arguments do not compare
        return f"a {stored['type']}, not for this {current['type']}"
    then, now = stored["kwargs"], current["kwargs"]
    keys = [k for k in {**then, **now} if then.get(k) != now.get(k)]

    def model(config: dict[str, Any], kwargs: dict[str, Any]) -> str:
        shown = {k: kwargs.get(k) for k in keys}
        return config["type"] + (f" with {shown}" if shown else "")

    return f"a {model(stored, then)}, not for this {model(current, now)}"


def save_checkpoint(
    path: str | os.PathLike,
    kind: str,
    model: nn.Module | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write a checkpoint atomically, with a checksum (see :mod:`flowkit.checkpoint.format`).

    Args:
        path: the file (its folder is created if missing).
        kind: what the file is for; readers ask :func:`load_checkpoint` for it.
        model: a model whose weights (and ``config``, if it has one) the file keeps.
        extra: other entries: tensors and plain containers (dict, list, tuple, str, int, float,
            bool, None) only, so that the file is read back without unpickling objects. The types
            must be exactly these: a subclass (``np.float64``, what ``np.mean`` returns, an
            ``IntEnum``, a ``str`` subclass) is refused, naming its key, not converted, so that
            ``load_checkpoint`` gives back exactly what was saved.

    Raises:
        TypeError, ValueError: ``path`` is not a file path, ``kind`` not a non-empty string,
            ``extra`` holds another type or a subclass of a plain one (the error names its key,
            e.g. ``extra['c']``, and the conversion), or ``model.config`` is
            malformed, or a buffer of the model fails the checks a load runs (a
            :class:`CheckpointError`).
        CheckpointWriteError: the write failed; the previous file is intact.
    """
    path = check_path_to_write(path)
    if type(kind) is not str or not kind:
        raise TypeError(f"'kind' should be a non-empty string, got {kind!r}")
    extra = {} if extra is None else extra
    if not isinstance(extra, Mapping):
        raise TypeError(f"'extra' should be a mapping, got {type(extra).__name__}")
    extra = dict(extra)
    _check_plain(extra, "extra")
    entry = None if model is None else model_entry(model)
    if entry is not None:
        _check_plain(entry["config"], "model.config")
        _check_plain(entry["state_dict"], "model.state_dict()")
        _check_one_dtype(entry)
        for name, error in check_buffers(model):  # the checks a load runs: no unloadable file
            raise CheckpointError(
                f"'model' holds a buffer '{name}' that should be {error.expected} (written in "
                "place?); a file of it would not load"
            )
    write_file({"kind": kind, "model": entry, "extra": extra}, path)


def _check_one_dtype(entry: dict[str, Any]) -> None:
    """Refuse a model that :func:`load_model` would not give back as it is: one whose
    floating-point tensors mix dtypes (it rebuilds the model in one, :func:`_saved_dtype`; a
    model without a config keeps its own dtypes, restored by name)."""
    if entry["config"] is None:
        return
    first: dict[torch.dtype, str] = {}
    for key, value in entry["state_dict"].items():
        if value.is_floating_point():
            first.setdefault(value.dtype, key)
    if len(first) > 1:
        (a, key_a), (b, key_b) = list(first.items())[:2]
        raise ValueError(
            f"'model' mixes {str(a).removeprefix('torch.')} ('{key_a}') and "
            f"{str(b).removeprefix('torch.')} ('{key_b}') tensors, which a file of it would "
            "not give back (a model is rebuilt in one dtype): convert it to one first, e.g. "
            f"model.to({a})"
        )


def _check_plain(value: Any, where: str) -> None:
    """Refuse a value (by where it is, e.g. ``extra['c']``) that :func:`load_checkpoint` could not
    read back: only the exact types of :data:`_LEAVES` and :data:`_CONTAINERS`, not subclasses."""
    kind = type(value)
    if kind in _LEAVES:
        if kind in (torch.Tensor, nn.Parameter) and value.is_meta:
            raise ValueError(
                f"{where} is a tensor on the meta device, which holds no values (a file of it "
                "would have none): move it to a real device first, e.g. .to('cpu') after "
                "loading or initializing its values"
            )
        return
    if kind in (dict, OrderedDict):
        for k, v in value.items():
            if type(k) not in (str, int, bool):
                raise TypeError(
                    f"{where} should have str or int keys, got {k!r} ({_type_name(k)})"
                )
            _check_plain(v, f"{where}[{k!r}]")
        return
    if kind in (list, tuple):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
        return
    plain = next((t for t in (*_LEAVES, *_CONTAINERS) if isinstance(value, t)), None)
    if plain is None:
        raise TypeError(
            f"{where} should hold tensors and plain containers only (dict, list, tuple, str, "
            f"int, float, bool, None), got {type(value).__name__}"
        )
    convert = ("value.as_subclass(torch.Tensor)" if plain in (torch.Tensor, nn.Parameter)
               else f"{plain.__name__}(value)")
    raise TypeError(
        f"{where} is a {_type_name(value)}, a subclass of {plain.__name__} that "
        f"load_checkpoint cannot read back (only the plain types are read without unpickling "
        f"objects): store {convert} instead"
    )


def _type_name(value: Any) -> str:
    """``float64`` -> ``numpy.float64``; builtins by their bare name."""
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def load_checkpoint(
    path: str | os.PathLike, kind: str | None = None, map_location: Any = None
) -> Checkpoint:
    """Read a checkpoint, verifying its checksum, without unpickling arbitrary objects.

    Args:
        path: the file.
        kind: if given, the kind the file must have.
        map_location: where to put the tensors: None (where they were saved), a device such as
            ``"cpu"``, or anything else :func:`torch.load` takes.

    Raises:
        CheckpointError: a missing, damaged (checksum, length), foreign or malformed file, or one
            of another kind. The message names the file.
        ValueError, TypeError: ``path`` is not a file path (None, a number, empty), or
            ``map_location`` is not a usable device (``"meta"`` included: it holds no values).
        OSError: the file cannot be read (permission denied, ...).
    """
    path = check_path_to_read(path)
    version, obj = read_file(path, map_location=map_location)
    if version == 1:
        obj = dict(obj)
        del obj["flowkit_format"]
        obj = {"kind": obj.pop("kind", None), "model": obj.pop("model", None), "extra": obj}
    if not isinstance(obj, dict) or sorted(obj) != ["extra", "kind", "model"]:
        raise CheckpointError(
            f"'{path}' is not a flowkit checkpoint: its contents should be a dict with the keys "
            f"'kind', 'model' and 'extra'"
        )
    found, entry, extra = obj["kind"], obj["model"], obj["extra"]
    if not isinstance(found, str) or not isinstance(extra, dict):
        raise CheckpointError(f"'{path}' is malformed: no 'kind' string or 'extra' dict")
    if kind is not None and found != kind:
        raise CheckpointError(
            f"'{path}' is a checkpoint of kind {found!r}, expected kind {kind!r} (a file written "
            "by another function or command)"
        )
    if entry is not None:
        _check_entry(entry, path)
    return Checkpoint(path, version, found, entry, extra)


def _check_entry(entry: Any, path: Path) -> None:
    if not isinstance(entry, dict) or not isinstance(entry.get("state_dict"), dict):
        raise CheckpointError(
            f"'{path}': the 'model' entry should be a dict with a 'state_dict' dict of tensors"
        )
    for key, value in entry["state_dict"].items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(
                f"'{path}': the stored weight {key!r} should be a tensor, got "
                f"{type(value).__name__}"
            )
    if entry.get("config") is not None:
        check_config(entry["config"], f"the config in '{path}'")


def unwrap_compiled(model: nn.Module) -> nn.Module:
    """The module that ``torch.compile`` wrapped (``model`` itself if it is not compiled): files
    hold the weights under the original module's names, so a compiled and an uncompiled model
    read and write the same files."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else model


def _state_difference(stored: Mapping[str, torch.Tensor], expected: Mapping[str, Any]) -> str:
    """What keeps stored weights from fitting a model, in one line: the missing, unexpected and
    differently shaped entries, the first of each named ("" if the names and shapes agree)."""
    missing = [k for k in expected if k not in stored]
    unexpected = [k for k in stored if k not in expected]
    shapes = [k for k in stored if k in expected and stored[k].shape != expected[k].shape]
    parts = []
    if missing:
        parts.append(f"{len(missing)} weight(s) missing from the file (first {missing[0]!r})")
    if unexpected:
        parts.append(
            f"{len(unexpected)} in the file that the model does not have (first "
            f"{unexpected[0]!r})"
        )
    if shapes:
        k = shapes[0]
        parts.append(
            f"{len(shapes)} of another shape (first {k!r}: {tuple(stored[k].shape)} in the file, "
            f"{tuple(expected[k].shape)} in the model)"
        )
    return "; ".join(parts)


def model_entry(model: nn.Module) -> dict[str, Any]:
    """The ``"model"`` entry of a checkpoint: ``{"config": dict | None, "state_dict": dict}``.

    ``config`` is ``model.config`` when the model has one (checked to be JSON-serialisable and of
    the form ``{"type": str, "kwargs": dict}``), else ``None``. A ``torch.compile``-d model is
    stored as the module it wraps (:func:`unwrap_compiled`).
    """
    model = unwrap_compiled(model)
    config = getattr(model, "config", None)
    if config is not None:
        check_config(config, f"{type(model).__name__}.config")
    return {"config": config, "state_dict": model.state_dict()}


def save_model(model: nn.Module, path: str | os.PathLike) -> None:
    """Save a flowkit model (its ``config`` and ``state_dict``) atomically, with a checksum.

    Example:
        >>> import flowkit, tempfile, os
        >>> flow = flowkit.MAF(2, hidden_features=(8,), layers=2)
        >>> path = os.path.join(tempfile.mkdtemp(), "maf.pt")
        >>> flowkit.save_model(flow, path)
        >>> x = torch.randn(4, 2)
        >>> torch.equal(flowkit.load_model(path).log_prob(x), flow.eval().log_prob(x))
        True

    Raises:
        CheckpointError: the model has no ``config`` (only models built by a registered
            constructor can be rebuilt), or a malformed one.
        TypeError, ValueError: ``path`` is not a file path (None, a folder).
        CheckpointWriteError: the write failed; the previous file is intact.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"'model' should be a torch.nn.Module, got {type(model).__name__}")
    if getattr(model, "config", None) is None:
        inner = next((name for name, child in model.named_children()
                      if getattr(child, "config", None) is not None), None)
        access = f"[{inner}]" if inner is not None and inner.isdigit() else f".{inner}"
        wrapped = ("" if inner is None else f"; it holds a model that can be saved, "
                   f"'{inner}': flowkit.save_model(model{access}, path)")
        raise CheckpointError(
            f"'model' ({type(model).__name__}) has no 'config' (the arguments of a registered "
            f"constructor, which a builder such as flowkit.MAF records), so it cannot be rebuilt "
            f"from a file{wrapped}; write the code that builds it as a function and register it "
            "with flowkit.checkpoint.register_model (docs/flows.md, 'Saving a flow built by "
            "hand'), or save its weights with flowkit.checkpoint.save_checkpoint(path, kind, "
            "model=model) and restore them into a model you build"
        )
    save_checkpoint(path, MODEL_KIND, model=model)


def load_model(
    path: str | os.PathLike,
    map_location: Any = None,
    *,
    allow_nonfinite: bool = False,
    embedding: nn.Module | None = None,
) -> nn.Module:
    """Rebuild a model from a file written by :func:`save_model` or by a training run.

    The model is built by the constructor registered under its ``config["type"]`` (e.g.
    :func:`flowkit.MAF`) with the stored arguments; any other name is refused before anything is
    called. It is cast to the floating dtype its weights were saved in (a ``float64`` model comes
    back as ``float64``), and the weights are restored with every check of
    :meth:`Checkpoint.restore`.

    Args:
        path: checkpoint file.
        map_location: device for the weights; if it is a device or device string, the rebuilt
            model is moved there too.
        allow_nonfinite: accept NaN and infinite weights.
        embedding: for a flow saved with a custom embedding network (any network other than
            :class:`flowkit.nn.MLPEmbedding`, which the file cannot rebuild), that network,
            built again by the caller; its weights are then loaded from the file. Refused for
            any other file.

    Returns:
        The model, in evaluation mode (call ``.train()`` to keep training it).

    Raises:
        CheckpointError: a missing, damaged or foreign file, a file without a model config (e.g.
            a training run of a custom ``nn.Module``), an unknown model type, a config the
            constructor refuses, weights that are not tensors, do not fit or are not finite, or
            structural buffers (MADE masks and orderings, permutations) that the model's
            construction does not allow.
        ValueError, TypeError: ``path`` is not a file path, ``map_location`` is not a usable
            device, or ``allow_nonfinite`` is not True or False.
    """
    check_bool("allow_nonfinite", allow_nonfinite)
    ckpt = load_checkpoint(path, map_location=map_location)
    if ckpt.model is None:
        raise CheckpointError(f"'{path}' holds no model (its kind is {ckpt.kind!r})")
    config = ckpt.model.get("config")
    if config is None:
        raise CheckpointError(
            f"'{path}' holds weights of a model without a 'config', so it cannot be rebuilt "
            "automatically; build the model yourself and call "
            "flowkit.checkpoint.load_checkpoint(path).restore(model)"
        )
    build = constructor(config["type"], f"'{path}'")
    kwargs = upgraded_config(config, f"'{path}'")["kwargs"]
    if embedding is not None:
        stored = kwargs.get("embedding")
        if not (isinstance(stored, dict) and "custom" in stored):
            raise CheckpointError(
                f"'embedding' was given but the model in '{path}' has "
                f"{'no embedding network' if stored is None else 'a built-in embedding'}; "
                "load it without 'embedding'"
            )
        if not isinstance(embedding, nn.Module):
            raise CheckpointError(
                f"'embedding' should be an nn.Module (an instance of {stored['custom']}), got "
                f"{type(embedding).__name__}"
            )
        # the class, not its module: a class saved from __main__ may load from a package
        name = type(embedding).__qualname__
        if not (stored["custom"] == name or stored["custom"].endswith("." + name)):
            raise CheckpointError(
                f"'embedding' is a {name}, but the model in '{path}' was "
                f"saved with a {stored['custom']}: its weights would load into another network "
                "and give other densities; pass an instance of the saved class"
            )
        if "structure" in stored and stored["structure"] != repr(embedding):  # files from 11-27
            raise CheckpointError(
                f"'embedding' is a {name} of another structure than the one the model in "
                f"'{path}' was saved with: its weights would load into another network and "
                f"give other densities; saved:\n{stored['structure']}\ngiven:\n{embedding!r}"
            )
        kwargs["embedding"] = embedding
    dtype = _saved_dtype(ckpt.model["state_dict"])
    try:
        with _built_in(dtype), rebuilding():  # no BuildWarning: given when it was built
            model = build(**kwargs)
    except (TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"'{path}': a {config['type']} cannot be built from the stored config "
            f"{config['kwargs']}: {first_line(e)}"
        ) from e
    if dtype is not None:
        model = model.to(dtype)
    ckpt._restore_weights(model, allow_nonfinite)  # built from the file's own config
    if isinstance(map_location, str | torch.device):
        model = model.to(map_location)
    return model.eval()


@contextmanager
def _built_in(dtype: torch.dtype | None) -> Iterator[None]:
    """Within the block, float64 is torch's default dtype if ``dtype`` is: a float64 model is
    rebuilt in float64, so that values its constructor checks in the default dtype (a
    :class:`~flowkit.transforms.Logit`'s bounds) are checked as they were when it was built."""
    previous = torch.get_default_dtype()
    if dtype == torch.float64:
        torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _saved_dtype(state_dict: dict[str, Any]) -> torch.dtype | None:
    """The floating dtype the weights were saved in: that of the first floating tensor of the
    ``state_dict`` (the model's dtype, as :meth:`torch.nn.Module.to` sets it), None if none."""
    return next((t.dtype for t in state_dict.values() if t.is_floating_point()), None)

