"""The options that :func:`~flowkit.train.fit` and :func:`~flowkit.train.fit_reverse_kl` share,
declared once: :class:`TrainOptions` (names, types, meaning), :data:`DEFAULTS`, and
:func:`resolve`, which checks what a caller passed. Also how the ``optimizer`` and
``lr_schedule`` options become torch objects, and how a resumed run rescales them to a new
``lr``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, ReduceLROnPlateau

from ..validation import ArgumentError, check_bool, check_float, check_int
from .callbacks import Callbacks

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # pragma: no cover (Python 3.10: torch depends on typing_extensions)
    from typing_extensions import Unpack

__all__ = ["DEFAULTS", "TrainOptions", "Unpack", "resolve"]

OPTIMIZERS: dict[str, type[Optimizer]] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
}
SCHEDULES = ("cosine", "linear")


class TrainOptions(TypedDict, total=False):
    """Keyword options of both :func:`~flowkit.train.fit` and
    :func:`~flowkit.train.fit_reverse_kl`, with their defaults (:data:`DEFAULTS`).

    Attributes:
        lr: learning rate, a finite number > 0 (default ``3e-3`` for ``fit``, ``1e-3`` for
            ``fit_reverse_kl``).
        optimizer: ``"adam"`` (default), ``"adamw"``, ``"sgd"``, or a callable ``(params,
            lr=lr) -> Optimizer`` such as ``torch.optim.RMSprop`` or
            ``functools.partial(torch.optim.SGD, momentum=0.9)``.
        weight_decay: ``None`` (default: the named optimizer's own, 0 for Adam and SGD, 0.01
            for AdamW) or a finite number >= 0 passed to it (decoupled for ``"adamw"``, an L2
            term in the gradient for ``"adam"`` and ``"sgd"``). A callable ``optimizer`` takes
            its own: ``weight_decay`` with one is an error.
        lr_schedule: ``None`` (constant; the default of ``fit_reverse_kl``), ``"cosine"``
            (cosine decay to 0 over the run; the default of ``fit``, so a resumed ``fit`` run
            keeps its ``steps``), ``"linear"`` (linear decay to 0), or a callable
            ``(optimizer, steps) -> LRScheduler`` (what it returns is checked to be one, and
            not a ``ReduceLROnPlateau``, which steps on a validation metric); stepped once per
            optimizer step. ``fit``'s
            defaults were chosen on the defaults benchmark (``docs/defaults.md``).
        clip_grad_norm: ``None`` (default: no clipping) or a finite number > 0: the global
            gradient norm is clipped to it at every step.
        divergence_threshold: stop with a :class:`~flowkit.train.DivergenceError` when the
            running median of the last 11 training losses rises more than this many times
            ``max(1, |best|)`` above its lowest value so far (see ``docs/training.md``;
            default ``10.0``), or, in a run that keeps its best validation's weights, end it
            there and return them with a :class:`~flowkit.train.DivergenceWarning`; ``None``
            turns the check off. Non-finite losses are always an error.
        seed: ``None`` (default: one is drawn from torch's global generator, so a
            ``torch.manual_seed`` before the call makes the run repeatable, and recorded in
            ``History.seed``) or an integer in ``[0, 2**63)``. Seeds the data order, per-step
            sampling and torch's global generator (per process, for dropout and model
            sampling): draws after ``fit`` continue from the run's seed. The model's initial
            weights are not the run's: a builder draws them from torch's global generator
            when it builds the model, so a repeatable run calls ``torch.manual_seed`` before
            building it too.
        device: where the run computes: ``"auto"`` (default: CUDA if available), ``"cpu"``,
            ``"cuda"``, ``"cuda:1"``, ... or a :class:`torch.device`. The model is moved there
            for the run and back to its own device at the end (also when the run fails), so
            a script behaves the same with and without a GPU; a model put on the GPU first
            (``model.cuda()``) stays there.
        checkpoint_dir: ``None`` (default) or a folder for ``checkpoint.pt``, written
            atomically every ``checkpoint_every`` steps and at the end;
            :func:`flowkit.load_model` reads it.
        checkpoint_every: steps between checkpoints (default ``1000``).
        resume: continue from ``checkpoint_dir/checkpoint.pt`` if it exists, else start fresh
            (default ``False``). The resumed run ends with the same weights as an
            uninterrupted one. Pass the same settings; a different ``lr`` rescales the
            learning-rate schedule from there on.
        progress: show a tqdm progress bar (default ``True``).
        log_every: steps between host copies of the loss (progress bar, NaN and divergence
            checks; default ``100``).
        callbacks: a :class:`~flowkit.train.Callbacks`, code run after each step, epoch and
            checkpoint (default ``None``).
    """

    lr: float
    optimizer: str | Callable[..., Optimizer]
    weight_decay: float | None
    lr_schedule: str | Callable[[Optimizer, int], LRScheduler] | None
    clip_grad_norm: float | None
    divergence_threshold: float | None
    seed: int | None
    device: str | torch.device
    checkpoint_dir: str | os.PathLike | None
    checkpoint_every: int
    resume: bool
    progress: bool
    log_every: int
    callbacks: Callbacks | None


DEFAULTS: TrainOptions = {
    "lr": 1e-3,
    "optimizer": "adam",
    "weight_decay": None,
    "lr_schedule": None,
    "clip_grad_norm": None,
    "divergence_threshold": 10.0,
    "seed": None,
    "device": "auto",
    "checkpoint_dir": None,
    "checkpoint_every": 1000,
    "resume": False,
    "progress": True,
    "log_every": 100,
    "callbacks": None,
}
"""The default of every :class:`TrainOptions` entry."""

FUNCTION_DEFAULTS: dict[str, TrainOptions] = {"fit": {"lr": 3e-3, "lr_schedule": "cosine"}}
"""Where a function's default differs from :data:`DEFAULTS`: ``fit``'s learning rate and
schedule, measured on ``flowkit bench-defaults`` (``docs/defaults.md``)."""


def resolve(function: str, options: Mapping[str, Any]) -> TrainOptions:
    """``options`` completed with :data:`DEFAULTS` and checked: every entry of the right type,
    finite and in range, nothing converted silently. Errors name the option as passed.

    Args:
        function: the public function the options were passed to, for the messages.
        options: the keyword options a caller passed.

    Raises:
        TypeError: an unknown option.
        ArgumentError: a bad value (a ``ValueError``).
    """
    unknown = [name for name in options if name not in DEFAULTS]
    if unknown:
        raise TypeError(
            f"{function}() got an unexpected keyword argument {unknown[0]!r} (its options are "
            f"listed in flowkit.train.TrainOptions)"
        )
    o: TrainOptions = {  # type: ignore[typeddict-item]
        **DEFAULTS, **FUNCTION_DEFAULTS.get(function, {}), **options
    }
    o["lr"] = check_float("lr", o["lr"], minimum=0, exclusive=True)
    optimizer = o["optimizer"]
    if not (callable(optimizer) or (isinstance(optimizer, str) and optimizer in OPTIMIZERS)):
        raise ArgumentError(
            "optimizer", f"should be one of {sorted(OPTIMIZERS)} or a callable, got {optimizer!r}"
        )
    if o["weight_decay"] is not None:
        o["weight_decay"] = check_float("weight_decay", o["weight_decay"], minimum=0)
        if callable(optimizer):
            raise ArgumentError(
                "weight_decay",
                f"is only for a named optimizer ('adam', 'adamw', 'sgd'), got "
                f"{o['weight_decay']} with a callable 'optimizer' (pass the decay to it instead)",
            )
    schedule = o["lr_schedule"]
    if not (schedule is None or callable(schedule) or schedule in SCHEDULES):
        raise ArgumentError(
            "lr_schedule",
            f"should be None, 'cosine', 'linear' or a callable, got {schedule!r}",
        )
    for name in ("clip_grad_norm", "divergence_threshold"):
        if o[name] is not None:  # type: ignore[literal-required]
            o[name] = check_float(name, o[name], minimum=0, exclusive=True)  # type: ignore
    if o["seed"] is not None:
        o["seed"] = check_int("seed", o["seed"], minimum=0)
        if o["seed"] >= 2**63:
            raise ArgumentError("seed", f"should be below 2**63, got {o['seed']}")
    for name in ("checkpoint_every", "log_every"):
        o[name] = check_int(name, o[name], minimum=1)  # type: ignore[literal-required]
    for name in ("resume", "progress"):
        o[name] = check_bool(name, o[name])  # type: ignore[literal-required]
    if o["callbacks"] is not None and not isinstance(o["callbacks"], Callbacks):
        raise ArgumentError(
            "callbacks",
            f"should be None or a flowkit.train.Callbacks, got {type(o['callbacks']).__name__}",
        )
    return o


def make_optimizer(
    spec: str | Callable[..., Optimizer], params: list[Tensor], lr: float,
    weight_decay: float | None = None,
) -> Optimizer:
    """The optimizer that the (resolved) ``optimizer`` and ``weight_decay`` options name, over
    ``params``.

    Adam and AdamW run torch's fused kernels (``fused=True``: one pass over all parameters
    instead of a loop of small operations per tensor; the same update up to rounding) where
    torch has them, that is for floating-point parameters on the CPU or CUDA. On a MADE with
    large hidden layers the optimizer step is otherwise a large part of a training step: 77 ms
    against 11 ms for the 12.5M weights of the MNIST model with 8000 hidden units (one thread).
    """
    if isinstance(spec, str):
        kwargs = {} if weight_decay is None else {"weight_decay": weight_decay}
        if spec in ("adam", "adamw") and all(
            p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params
        ):
            return OPTIMIZERS[spec](params, lr=lr, fused=True, **kwargs)
        return OPTIMIZERS[spec](params, lr=lr, **kwargs)
    opt = spec(params, lr=lr)
    if not isinstance(opt, Optimizer):
        raise TypeError(f"'optimizer' returned {type(opt).__name__}, expected a torch Optimizer")
    return opt


def make_schedule(
    spec: str | Callable[[Optimizer, int], LRScheduler] | None, opt: Optimizer, steps: int
) -> LRScheduler | None:
    """The scheduler that the (resolved) ``lr_schedule`` option names, for a run of ``steps``."""
    if spec is None:
        return None
    if spec == "cosine":
        return CosineAnnealingLR(opt, T_max=steps)
    if spec == "linear":
        return LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=steps)
    assert callable(spec)
    schedule = spec(opt, steps)
    if not isinstance(schedule, LRScheduler):
        raise TypeError(
            f"'lr_schedule' returned {type(schedule).__name__}, expected a torch LRScheduler "
            "(a callable (optimizer, steps) -> LRScheduler; for a constant rate pass "
            "lr_schedule=None)"
        )
    if isinstance(schedule, ReduceLROnPlateau):
        raise TypeError(
            "'lr_schedule' returned ReduceLROnPlateau, which steps on a validation metric "
            "(scheduler.step(metric)), but fit steps the schedule once per optimizer step without "
            "one: pass a schedule of the step count instead (such as 'cosine', or a callable "
            "returning a LinearLR or SequentialLR)"
        )
    return schedule


def rescale_lr(opt: torch.optim.Optimizer, sched: LRScheduler | None, ratio: float) -> None:
    """Multiply the current and base learning rates (a new ``lr`` given on resume)."""
    for group in opt.param_groups:
        for key in ("lr", "initial_lr"):
            if key in group:
                group[key] *= ratio
    if sched is not None:
        sched.base_lrs = [b * ratio for b in sched.base_lrs]
