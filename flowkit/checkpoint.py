"""Safe, atomic checkpoint files.

A flowkit checkpoint is a file written by :func:`torch.save` holding a ``dict`` with the marker
key ``"flowkit_format"`` (currently ``1``) and a ``"kind"`` (see :data:`KINDS`):

* a **model file** written by :func:`save_model`::

      {"flowkit_format": 1, "kind": "model",
       "model": {"config": {"type": "MAF", "kwargs": {...}}, "state_dict": {...}}}

* a **training checkpoint** written by :func:`flowkit.train.fit`, which has the same ``"model"``
  entry plus optimizer, scheduler, step, RNG states and history (``"kind": "training"``);
* a **training checkpoint of** ``flowkit mnist`` (:mod:`flowkit.app.mnist`), with the
  ``"model"`` entry, its own training state and the run's ``"settings"``
  (``"kind": "mnist-training"``; files of older versions say ``"training"``, see
  :func:`checkpoint_kind`).

:func:`load_model` reads every kind. Code that resumes a run asks :func:`safe_load` for its own
kind and gets a :class:`CheckpointError` naming the file and both kinds otherwise.

Files are written atomically (temporary file in the same folder, ``fsync``, then
:func:`os.replace`), so a crash mid-write leaves the previous file intact.
Files are read with ``torch.load(..., weights_only=True)``: only tensors and plain containers
are unpickled, never arbitrary objects, and the model is rebuilt from its JSON ``config`` by
calling a public flowkit constructor.
"""

from __future__ import annotations

import inspect
import json
import os
import secrets
import typing
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from flowkit.validation import is_permutation

__all__ = [
    "CheckpointError",
    "atomic_save",
    "safe_load",
    "save_model",
    "load_model",
    "model_config",
    "checkpoint_kind",
    "KINDS",
]

FORMAT_KEY = "flowkit_format"
FORMAT_VERSION = 1

KINDS = {
    "model": "a model file written by flowkit.save_model",
    "training": "a training checkpoint written by flowkit.train.fit or fit_reverse_kl",
    "mnist-training": "a training checkpoint written by 'flowkit mnist'",
}
"""The kinds of flowkit checkpoint (the ``"kind"`` entry) and what writes them."""


class CheckpointError(ValueError):
    """A file is missing, truncated, corrupt or not a flowkit checkpoint of the expected kind."""


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """Write ``obj`` with :func:`torch.save` to ``path`` so that ``path`` is never half-written.

    The object goes to a temporary file in the same folder, which is flushed, ``fsync``-ed and
    then renamed over ``path`` with :func:`os.replace` (atomic on POSIX and Windows). If anything
    fails, the temporary file is removed and an existing file at ``path`` is left untouched.
    Missing parent folders are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name in the same folder (os.replace is only atomic within a file system); "xb"
    # refuses to reuse an existing file and, unlike mkstemp, gives the umask's permissions
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        with open(tmp, "xb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Persist a rename on POSIX by syncing the folder entry (not possible on Windows)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def safe_load(
    path: str | os.PathLike, map_location: Any = None, kind: str | None = None
) -> dict[str, Any]:
    """Read a flowkit checkpoint without unpickling arbitrary objects.

    Args:
        path: file written by :func:`save_model`, :func:`atomic_save` of a flowkit dict, or a
            training run.
        map_location: passed to :func:`torch.load` (e.g. ``"cpu"``).
        kind: if given, the :func:`checkpoint_kind` the file must have (a key of :data:`KINDS`).

    Returns:
        The checkpoint ``dict`` (it contains ``"flowkit_format"``).

    Raises:
        CheckpointError: the file is missing, truncated, not a torch file, holds objects other
            than tensors and plain containers, is not a flowkit checkpoint, or is not of
            ``kind``.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at '{path}'")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError, ... here
        raise CheckpointError(
            f"'{path}' could not be read as a flowkit checkpoint (expected a file written by "
            f"flowkit.save_model or flowkit.train.fit; it may be truncated, corrupt or hold "
            f"non-tensor objects): {type(e).__name__}: {_first_line(e)}"
        ) from e
    if not isinstance(obj, dict) or FORMAT_KEY not in obj:
        got = (
            f"a dict with keys {sorted(map(str, obj))[:6]}"
            if isinstance(obj, dict)
            else (type(obj).__name__)
        )
        raise CheckpointError(
            f"'{path}' is not a flowkit checkpoint: expected a dict with the key "
            f"'{FORMAT_KEY}', got {got}"
        )
    version = obj[FORMAT_KEY]
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise CheckpointError(
            f"'{path}' has {FORMAT_KEY}={version!r}; this flowkit reads versions 1 to "
            f"{FORMAT_VERSION} (upgrade flowkit to read newer files)"
        )
    found = checkpoint_kind(obj)
    if kind is not None and found != kind:
        raise CheckpointError(
            f"'{path}' is {KINDS.get(found, f'a checkpoint of kind {found!r}')} "
            f"(kind {found!r}), expected {KINDS[kind]} (kind {kind!r})"
        )
    return obj


def checkpoint_kind(ckpt: dict[str, Any]) -> Any:
    """The kind of a loaded checkpoint: its ``"kind"`` entry, except for checkpoints of
    ``flowkit mnist`` written before that command had its own kind, which say ``"training"``
    but carry the run's ``"settings"`` (a :func:`flowkit.train.fit` checkpoint never does):
    those are ``"mnist-training"``."""
    found = ckpt.get("kind")
    return "mnist-training" if found == "training" and "settings" in ckpt else found


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


def model_config(type_name: str, **kwargs: Any) -> dict[str, Any]:
    """A model's ``config``, ``{"type": type_name, "kwargs": kwargs}``, with JSON values.

    What :func:`load_model` calls ``getattr(flowkit, type_name)(**kwargs)`` with. Constructors
    store their arguments through it, so arguments that are not JSON types but have an obvious
    JSON form are accepted: numpy scalars (``np.int64(8)``) become Python numbers, tuples
    become lists, tensors and numpy arrays become nested lists (:meth:`torch.Tensor.tolist`),
    recursively inside lists and dicts. Anything else is kept as it is, and
    :func:`save_model` reports it.
    """
    return {"type": type_name, "kwargs": {k: _plain(v) for k, v in kwargs.items()}}


def _plain(value: Any) -> Any:
    """``value`` with numpy scalars, tuples, tensors and arrays turned into JSON types."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def model_entry(model: nn.Module) -> dict[str, Any]:
    """The ``"model"`` entry of a checkpoint: ``{"config": dict | None, "state_dict": dict}``.

    ``config`` is ``model.config`` when the model has one (checked to be JSON-serialisable and of
    the form ``{"type": str, "kwargs": dict}``), else ``None``.
    """
    config = getattr(model, "config", None)
    if config is not None:
        _check_config(config, f"{type(model).__name__}.config")
    return {"config": config, "state_dict": model.state_dict()}


def _check_config(config: Any, where: str) -> None:
    if (
        not isinstance(config, dict)
        or not isinstance(config.get("type"), str)
        or not isinstance(config.get("kwargs"), dict)
    ):
        raise CheckpointError(
            f"{where} should be a dict {{'type': str, 'kwargs': dict}}, got {config!r}"
        )
    try:
        json.dumps(config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where} should be JSON-serialisable: {e}") from e


def save_model(model: nn.Module, path: str | os.PathLike) -> None:
    """Save a flowkit model (its ``config`` and ``state_dict``) atomically to ``path``.

    Example:
        >>> import flowkit, tempfile, os
        >>> flow = flowkit.MAF(2, hidden_features=(8,), layers=2)
        >>> path = os.path.join(tempfile.mkdtemp(), "maf.pt")
        >>> flowkit.save_model(flow, path)
        >>> x = torch.randn(4, 2)
        >>> torch.equal(flowkit.load_model(path).log_prob(x), flow.eval().log_prob(x))
        True

    Raises:
        CheckpointError: the model has no ``config`` attribute (only models built by a public
            flowkit constructor can be rebuilt), or the config is malformed.
    """
    if getattr(model, "config", None) is None:
        raise CheckpointError(
            f"'model' ({type(model).__name__}) has no 'config' attribute, so it cannot be rebuilt "
            "from a file; save model.state_dict() with flowkit.checkpoint.atomic_save instead"
        )
    atomic_save({FORMAT_KEY: FORMAT_VERSION, "kind": "model", "model": model_entry(model)}, path)


def load_model(path: str | os.PathLike, map_location: Any = None) -> nn.Module:
    """Rebuild a model from a file written by :func:`save_model` or by a training run.

    The model is constructed as ``getattr(flowkit, config["type"])(**config["kwargs"])``, where
    ``config["type"]`` must name a public flowkit class deriving from :class:`torch.nn.Module`,
    or a public function annotated to return one (e.g. ``flowkit.MAF``); any other name is
    refused before anything is called. The model is then cast to the floating dtype its weights
    were saved in (a ``float64`` model comes back as ``float64``) and the weights are loaded
    strictly.

    Args:
        path: checkpoint file.
        map_location: device for the weights; if it is a device or device string, the rebuilt
            model is moved there too.

    Returns:
        The model, in evaluation mode (call ``.train()`` to keep training it).

    Raises:
        CheckpointError: unreadable file, a file without a model config (e.g. a training run of a
            custom ``nn.Module``), an unknown model type, a config the constructor refuses,
            weights that are not tensors or do not match, or structural buffers (MADE masks and
            orderings, permutations) that are not what the model's construction allows.
    """
    ckpt = safe_load(path, map_location=map_location)
    entry = ckpt.get("model")
    if not isinstance(entry, dict) or "state_dict" not in entry:
        raise CheckpointError(f"'{path}' holds no model (expected a 'model' entry)")
    config = entry.get("config")
    if config is None:
        raise CheckpointError(
            f"'{path}' holds weights of a model without a 'config', so it cannot be rebuilt "
            "automatically; build the model yourself and call "
            "model.load_state_dict(flowkit.checkpoint.safe_load(path)['model']['state_dict'])"
        )
    _check_config(config, f"the config in '{path}'")
    state_dict = entry["state_dict"]
    if not isinstance(state_dict, dict):
        raise CheckpointError(
            f"'{path}': the stored weights should be a dict of tensors, got "
            f"{type(state_dict).__name__}"
        )
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(
                f"'{path}': the stored weight {key!r} should be a tensor, got "
                f"{type(value).__name__}"
            )
    build = _constructor(config["type"], path)
    try:
        model = build(**config["kwargs"])
    except (TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"'{path}': a {config['type']} cannot be built from the stored config "
            f"{config['kwargs']}: {_first_line(e)}"
        ) from e
    dtype = _saved_dtype(state_dict)
    if dtype is not None:
        model = model.to(dtype)
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as e:
        raise CheckpointError(
            f"'{path}': the stored weights do not fit a {config['type']} built from the stored "
            f"config: {_first_line(e)}"
        ) from e
    _check_structure(model, path)
    if isinstance(map_location, str | torch.device):
        model = model.to(map_location)
    return model.eval()


def _check_structure(model: nn.Module, path: str | os.PathLike) -> None:
    """Refuse weights whose structural buffers were tampered with: in every
    :class:`~flowkit.nn.MADE` the orderings must be permutations, ``mask_index`` a valid mask
    set and the masks those that set's degrees give (a wrong mask breaks the autoregressive
    property, and with it every density); in every :class:`~flowkit.transforms.Permutation`
    ``permutation`` must be a permutation and ``inverse_permutation`` its inverse."""
    from flowkit.nn import MADE, MaskedLinear  # late import: flowkit/__init__ imports this module
    from flowkit.transforms import Permutation

    def refuse(module: str, buffer: str, expected: str) -> typing.NoReturn:
        name = f"{module}.{buffer}" if module else buffer
        raise CheckpointError(f"'{path}': the stored buffer '{name}' should be {expected}")

    for name, module in model.named_modules():
        if isinstance(module, Permutation):
            if not is_permutation(module.permutation):
                refuse(name, "permutation", "a permutation of range(features)")
            if not torch.equal(module.inverse_permutation, module.permutation.argsort()):
                refuse(name, "inverse_permutation", "the inverse of 'permutation'")
        if not isinstance(module, MADE):
            continue
        if not all(is_permutation(order) for order in module.orders):
            refuse(name, "orders", "permutations of range(features)")
        index = int(module.mask_index)
        if not 0 <= index < module.num_masks:
            refuse(name, "mask_index", f"in [0, {module.num_masks}), got {index}")
        layers = [(n, m) for n, m in module.named_modules() if isinstance(m, MaskedLinear)]
        stored = [m.mask.clone() for _, m in layers]
        module.set_mask(index)  # rebuilds the masks of set `index` from the stored degrees
        for (layer, m), mask in zip(layers, stored, strict=True):
            if not torch.equal(m.mask, mask):
                refuse(
                    name,
                    f"{layer}.mask",
                    f"the mask that the stored orders and degrees give for mask set {index}",
                )


def _saved_dtype(state_dict: dict[str, Any]) -> torch.dtype | None:
    """The floating dtype the weights were saved in: that of the first floating tensor of the
    ``state_dict`` (the model's dtype, as :meth:`torch.nn.Module.to` sets it), None if none."""
    return next((t.dtype for t in state_dict.values() if t.is_floating_point()), None)


def _constructor(name: str, path: str | os.PathLike) -> typing.Callable[..., nn.Module]:
    """``getattr(flowkit, name)`` if it is a public model constructor, else CheckpointError."""
    import flowkit  # late import: flowkit/__init__ imports this module

    obj = getattr(flowkit, name, None) if name.isidentifier() and not name.startswith("_") else None
    if inspect.isclass(obj) and issubclass(obj, nn.Module):
        return obj
    if inspect.isfunction(obj):
        try:
            returns = typing.get_type_hints(obj).get("return")
        except Exception:  # unresolvable annotations: treat as unannotated
            returns = None
        if inspect.isclass(returns) and issubclass(returns, nn.Module):
            return obj
    raise CheckpointError(
        f"'{path}' holds a model of type {name!r}, which is not a model constructor in this "
        "flowkit (expected the name of a public flowkit class or builder returning an nn.Module, "
        "e.g. 'MAF')"
    )
