"""The training engine shared by :func:`flowkit.train.fit` and
:func:`flowkit.train.fit_reverse_kl`: a run (:class:`Trainer`: optimizer and schedule, steps,
validation bookkeeping, callbacks, checks, checkpoints, progress) inside its session
(:mod:`flowkit.train.session`). Internal; the public API is in :mod:`flowkit.train`.

Implementation notes:

* **No per-step host synchronisation.** Each step's loss stays on the device in a list; it is
  copied to the host (one ``.tolist()``, averaged over processes) only every ``log_every`` steps,
  at validations, at checkpoints and, when an ``after_epoch`` callback asks for it, at the end
  of each epoch ("recording"). Each recording checks the new losses (finite, not diverged) and
  the weights and floating buffers (finite: a step with a finite loss but an infinite gradient
  makes Adam write NaN weights), and then keeps a copy of the weights. When a check fails, the
  model gets that copy back (the last weights found finite; in a run that keeps its best
  validation's weights, those) before the error is raised, so ``fit`` never leaves non-finite
  weights in the model, and a checkpoint is only written from checked weights, so the last
  checkpoint on disk is always a good one.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..checkpoint import (
    save_checkpoint,
)
from ..transforms import Standardize
from ..validation import ArgumentError, Mention, WordedError, validate_values
from .callbacks import Progress
from .checks import (
    Divergence,
    DivergenceError,
    DivergenceWarning,
    NonFiniteLossError,
    first_nonfinite,
)
from .history import History
from .objectives import Objective
from .options import TrainOptions, make_optimizer, make_schedule, rescale_lr
from .session import TRAINING_KIND, Session, model_class, rng_state, set_rng_state


@dataclass(frozen=True)
class RunPlan:
    """What a run does besides the shared options: its length and its validation."""

    steps: int
    valid_every: int | None = None
    patience: int | None = None
    restore_best: bool = False


class HeldOutLoss(Protocol):
    """What computes the validation loss of a run: called for it, and asked why it was not
    finite (which ends the run: :class:`~flowkit.train.NonFiniteLossError`)."""

    def __call__(self) -> float: ...

    def cause(self, step: int, value: float) -> tuple[str | Mention, ...]:
        """The message parts telling why the validation loss of step ``step`` was ``value``."""
        ...


class _Best:
    """Best validation loss so far (always finite), its weights (when ``keep`` is set) and
    patience count."""

    def __init__(self, patience: int | None, keep: bool):
        self.patience, self.keep, self.state, self.bad = patience, keep, None, 0

    def update(self, model: nn.Module, history: History, step: int, loss: float) -> None:
        history.valid_steps.append(step)
        history.valid_loss.append(loss)
        best = history.best_valid_loss
        if best is None or loss < best:
            history.best_step, history.best_valid_loss, self.bad = step, loss, 0
            if self.keep:
                self.state = _copy(model)
        else:
            self.bad += 1
            if self.patience is not None and self.bad >= self.patience:
                history.stopped_early = True

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.state, "bad": self.bad}

    def load_state_dict(self, d: dict[str, Any], device: torch.device) -> None:
        self.bad = d["bad"]
        self.state = (
            None if d["state"] is None or not self.keep
            else {k: v.to(device) for k, v in d["state"].items()}
        )


LOG_REFRESH_S = 10.0
"""Seconds between progress-bar updates written to a file or pipe rather than a terminal or a
notebook: each update is a line's worth of text, ten a second by tqdm's default (a
log grew by 3.6 MB an hour)."""


def refresh_interval() -> float:
    """tqdm's ``mininterval`` for a progress bar on standard error: its default 0.1 s on a
    terminal or in a notebook (IPython's kernel), :data:`LOG_REFRESH_S` when standard error goes
    to a file or pipe (a log). Every progress bar of flowkit's training loops and commands uses
    it."""
    interactive = sys.stderr.isatty() if hasattr(sys.stderr, "isatty") else False
    return 0.1 if interactive or "ipykernel" in sys.modules else LOG_REFRESH_S


class _Bar:
    """The tqdm progress bar and its postfix: the loss (the ELBO for reverse-KL runs) and the
    last validation loss."""

    def __init__(self, steps: int, step: int, objective: str, enabled: bool):
        self.tqdm = tqdm(total=steps, initial=step, unit="step", dynamic_ncols=True,
                         desc=objective, disable=not enabled, mininterval=refresh_interval())
        self.postfix: dict[str, str] = {}
        self.label, self.sign = ("elbo", -1.0) if objective == "neg_elbo" else ("loss", 1.0)

    def loss(self, mean: float) -> None:
        self.postfix[self.label] = f"{self.sign * mean:.4f}"

    def valid(self, history: History) -> None:
        self.postfix["valid"] = f"{history.valid_loss[-1]:.4f}"
        if history.stopped_early:
            self.postfix["stopped early; best step"] = str(history.best_step)

    def restored(self, history: History) -> None:
        """The run's last word when it ends with the best validation's weights: that loss and
        its step, unless it is the last validation (which ``valid`` shows)."""
        if history.best_step == history.valid_steps[-1]:
            return
        self.postfix.pop("stopped early; best step", None)
        self.postfix["returned"] = (
            f"best valid {history.best_valid_loss:.4f} (step {history.best_step})")

    def show(self, refresh: bool = False) -> None:
        self.tqdm.set_postfix(self.postfix, refresh=refresh)


class Trainer:
    """One run: the optimizer steps of :meth:`run` and everything that happens between them.

    Args:
        s: the :func:`session` of the run.
        model: the model being trained (already on ``s.device``).
        objective: the loss as a module (its ``forward`` computes the loss of a batch; it may
            also tell why a loss was not finite, :meth:`~flowkit.train.objectives.Objective.cause`).
        source: the batch source (:mod:`flowkit.train.sources`), with ``next_batch(step)``,
            ``batches_per_epoch``, ``state_dict()`` and ``load_state_dict(state, step)``.
        o: the resolved shared options.
        plan: the run's length and validation.
        validate: what computes the validation loss (:class:`HeldOutLoss`), or None.
    """

    def __init__(
        self,
        s: Session,
        model: nn.Module,
        objective: Objective,
        source: Any,
        o: TrainOptions,
        plan: RunPlan,
        validate: HeldOutLoss | None,
    ):
        self.s, self.model, self.objective, self.source = s, model, objective, source
        self.o, self.plan, self.validate = o, plan, validate
        self.callbacks = o["callbacks"]
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("'model' has no trainable parameters")
        self.opt = make_optimizer(o["optimizer"], self.params, o["lr"], o["weight_decay"])
        self.sched = make_schedule(o["lr_schedule"], self.opt, plan.steps)
        self.best = _Best(plan.patience, keep=plan.restore_best or plan.patience is not None)
        self.divergence = Divergence(o["divergence_threshold"])
        self.history = History(objective=s.objective, seed=s.seed)
        self.step = 0
        self.saved_step: int | None = None  # the step of the checkpoint on disk
        self.pending: list[Tensor] = []  # losses of the steps since the last recording
        if s.ckpt is not None:
            self._resume(s.ckpt)
        # the last weights found finite: copied when the run starts (after check() of run()
        # has set the standardization), then at every recording whose weights pass
        self.good_step = self.step
        self.good: dict[str, Tensor] | None = None
        self.bar = _Bar(plan.steps, self.step, s.objective, o["progress"] and s.dist.is_main)
        self.wall_start, self.t0 = self.history.wall_time, time.perf_counter()

    # ------------------------------------------------------------------ resume and checkpoints

    def _resume(self, c: dict[str, Any]) -> None:
        s, o = self.s, self.o  # the weights were restored by session()
        then, now = c.get("optimizer_class"), type(self.opt).__name__
        if then is not None and then != now:
            raise ArgumentError(
                "optimizer", f"'{s.path}' was written by a run with the optimizer {then}, not "
                f"{now}: its state cannot continue under another; pass the same ",
                Mention("optimizer"),
            )
        if c.get("last_weights") is not None:  # a finished run that restored its best weights
            self.model.load_state_dict(c["last_weights"])
        self.opt.load_state_dict(c["optimizer"])
        self._check_schedule(c)
        if self.sched is not None:
            if c["total_steps"] != self.plan.steps:
                raise ArgumentError(
                    "steps", Mention("steps"), f" is {self.plan.steps} but '{s.path}' belongs to "
                    f"a run of {c['total_steps']} steps, and its learning-rate schedule was built "
                    "for that length; resume with the same ", Mention("steps"), " (runs with no "
                    "schedule, ", Mention("lr_schedule", None), ", can be extended)",
                )
            self.sched.load_state_dict(c["scheduler"])
        if o["lr"] != c["lr"]:
            rescale_lr(self.opt, self.sched, o["lr"] / c["lr"])
        if c["step"] > self.plan.steps:
            raise ArgumentError(
                "steps", Mention("steps"), f" is {self.plan.steps} but '{s.path}' has done "
                f"{c['step']} steps already: a resumed run cannot end before them; pass ",
                Mention("steps"), f" of at least {c['step']}, or load its model "
                "(flowkit.load_model) to use it as it is",
            )
        self.best.load_state_dict(c["best"], s.device)
        self.step = self.saved_step = c["step"]
        self.history = History.from_dict(c["history"])
        for loss in self.history.train_loss:
            self.divergence.update(loss)
        mine = c["processes"][s.dist.rank]
        self.source.load_state_dict(mine["data"], self.step)
        set_rng_state(mine["rng"], s.device)

    def _check_schedule(self, c: dict[str, Any]) -> None:
        """Refuse a checkpoint written with another ``lr_schedule``: its schedule state cannot
        continue under this one."""
        now = _schedule_name(self.o["lr_schedule"])
        # files written before the name was recorded only tell whether they had a schedule
        then = c.get("lr_schedule", None if c["scheduler"] is None else _UNRECORDED)
        if then == now or (then == _UNRECORDED and now is not None):
            return
        raise ArgumentError(
            "lr_schedule", f"'{self.s.path}' was written by a run with ", *_schedule_parts(then),
            ", not ", *_schedule_parts(now), "; pass ",
            *(("the same ", Mention("lr_schedule")) if then in (_CALLABLE, _UNRECORDED)
              else _schedule_parts(then)),
            " to resume it",
        )

    def _save(self, last_weights: dict[str, Tensor] | None = None) -> None:
        """Write the checkpoint of this step (weights checked first), then ``on_checkpoint``.
        ``last_weights``: the weights of this step when the model holds others (the best
        validation's, restored at the end), so that a resumed run continues from them."""
        s = self.s
        if self.good_step != self.step and self.history.diverged_step is None:
            self._check_weights()
        self._clock()
        mine = {"rng": rng_state(s.device), "data": self.source.state_dict()}
        processes = s.dist.gather(mine)
        if s.dist.is_main and s.path is not None:
            save_checkpoint(
                s.path,
                TRAINING_KIND,
                model=self.model,
                extra={
                    "optimizer": self.opt.state_dict(),
                    "optimizer_class": type(self.opt).__name__,
                    "model_class": model_class(self.model),
                    "last_weights": last_weights,
                    "scheduler": None if self.sched is None else self.sched.state_dict(),
                    "lr_schedule": _schedule_name(self.o["lr_schedule"]),
                    "step": self.step,
                    "total_steps": self.plan.steps,
                    "seed": s.seed,
                    "lr": self.o["lr"],
                    "world_size": s.dist.world_size,
                    "processes": processes,
                    "history": self.history.to_dict(),
                    "best": self.best.state_dict(),
                },
            )
        self.saved_step = self.step
        if self.callbacks is not None and self.callbacks.on_checkpoint is not None:
            self.callbacks.on_checkpoint(self._progress(checkpoint=s.path))

    # ------------------------------------------------------------------------------ the run

    def run(self, check: Callable[[tuple[Any, ...]], None]) -> History:
        """Train to ``plan.steps`` (or early stopping) and return the history. ``check`` is
        called once on the first batch, before the first step."""
        s = self.s
        runner = s.dist.wrap(self.objective, s.device)
        self.model.train()
        checked = False
        # flowkit models check their inputs for NaN/Inf, which reads them back to the host; the
        # data was checked once up front (arrays) or shows up as a non-finite loss (other sources)
        with validate_values(False), self.bar.tqdm:
            while self.step < self.plan.steps and not self.history.stopped_early:
                args = self.source.next_batch(self.step)
                if not checked:
                    cuda = [s.device] if s.device.type == "cuda" else []
                    with torch.random.fork_rng(devices=cuda), validate_values(True):
                        check(args)
                    checked = True
                    self.good = _copy(self.model)
                self._train_step(runner, args)
                self._between_steps()
            self._record()
            if self.best.state is not None and self.history.best_step is not None:
                self.bar.restored(self.history)
            self.bar.show()  # closing the bar draws it once more, with this postfix
        self._finish()
        return self.history

    def _train_step(self, runner: nn.Module, args: tuple[Any, ...]) -> None:
        self.opt.zero_grad(set_to_none=True)
        try:
            loss = runner(*args)
        except (ValueError, TypeError) as e:  # e.g. a later batch that does not fit the model
            blamed = self.objective.blame(e, self.step + 1)
            if blamed is None:
                raise
            raise blamed from e
        loss.backward()
        if self.o["clip_grad_norm"] is not None:
            nn.utils.clip_grad_norm_(self.params, self.o["clip_grad_norm"])
        self.opt.step()
        if self.sched is not None:
            self.sched.step()
        loss = loss.detach()
        self.pending.append(loss)
        self.step += 1
        self.bar.tqdm.update()
        if self.callbacks is not None and self.callbacks.after_step is not None:
            self.callbacks.after_step(self._progress(loss=loss))

    def _between_steps(self) -> None:
        """What happens after a step: recording, validation, ``after_epoch``, checkpoint."""
        step, plan, o, cb = self.step, self.plan, self.o, self.callbacks
        per_epoch = self.source.batches_per_epoch
        at_valid = self.validate is not None and (
            step % plan.valid_every == 0 or step == plan.steps
        )
        at_epoch = (
            per_epoch is not None and step % per_epoch == 0
            and cb is not None and cb.after_epoch is not None
        )
        at_ckpt = (  # the last step's checkpoint is _finish's (once, with the best weights)
            self.s.path is not None and step % o["checkpoint_every"] == 0 and step != plan.steps
        )
        if not (at_valid or at_epoch or at_ckpt or step % o["log_every"] == 0
                or step == plan.steps):
            return
        self._record()
        if at_valid and self.history.diverged_step is None:  # not the diverged weights
            self._validate()
        if at_epoch:
            cb.after_epoch(self._progress())
        if at_ckpt:
            self._save()
        self.bar.show()

    def _validate(self) -> None:
        t0 = time.perf_counter()
        assert self.validate is not None
        loss = self.validate()
        self.history.valid_time += time.perf_counter() - t0
        if not math.isfinite(loss):  # never the best: early stopping would end the run on it
            self._fail(NonFiniteLossError, self.validate.cause(self.step, loss), self.step, loss,
                       fixes=False)
        self.best.update(self.model, self.history, self.step, loss)
        self.bar.valid(self.history)

    def _finish(self) -> None:
        """Check the last weights, restore the best ones if asked, write the last checkpoint
        (whose model is the returned one, the best; the last weights go beside it, unless the
        run diverged: those are not kept, nor checked)."""
        diverged = self.history.diverged_step is not None
        if self.good_step != self.step and not diverged:
            self._check_weights()
        last = None
        if self.best.state is not None:
            keep = self.s.path is not None and not diverged
            last = _copy(self.model) if keep else None
            self.model.load_state_dict(self.best.state)
        if self.s.path is not None:
            self._save(last)
        self._clock()
        self.model.eval()

    # --------------------------------------------------------------------- recording, checks

    def _record(self) -> None:
        """Copy the pending losses to the history and check them and the weights."""
        if not self.pending:
            return
        values = self.s.dist.all_mean(torch.stack(self.pending)).tolist()
        self.pending.clear()
        first = len(self.history.train_loss) + 1
        for step, v in enumerate(values, start=first):
            if not math.isfinite(v):
                cause = self.objective.cause(step - first, step, self.s.dist)
                if cause is not None:
                    self._fail(NonFiniteLossError, cause, step, v, fixes=False)
                self._fail(NonFiniteLossError, f"the training loss is {v} at step {step}", step, v)
            if self.divergence.update(v) and not self.history.stopped_early:
                d = self.divergence
                problem = (f"the training loss diverged at step {step}: its median over the "
                           f"last {d.WINDOW} steps reached {d.median:.4g}, far above its best "
                           f"{d.best:.4g} (more than {d.threshold:g} x max(1, |best|) above it; "
                           "see ", Mention("divergence_threshold"), ")")
                if self.best.state is None:
                    self._fail(DivergenceError, problem, step, d.median, best=d.best)
                self._stop_at_divergence(problem, step)
                values = values[: step - first + 1]  # the steps after it are not the run's
                break
        self.objective.recorded()
        self.history.train_loss.extend(values)
        _record_epochs(self.history, self.source.batches_per_epoch)
        if self.history.diverged_step is None:  # else the best validation's weights return
            self._check_weights()
        self._clock()
        self.bar.loss(sum(values) / len(values))

    def _stop_at_divergence(self, problem: tuple[str | Mention, ...], step: int) -> None:
        """A divergence in a run that keeps its best validation's weights: the run ends, as
        early stopping ends it, and returns those weights with a warning (on small
        data sets the training loss blew up hundreds of steps after the best validation, and
        the DivergenceError lost the run's history). The steps recorded after it are dropped,
        non-finite losses and weights included."""
        self.history.stopped_early, self.history.diverged_step = True, step
        best = self.history.best_step
        warnings.warn(DivergenceWarning(
            *problem, f", {step - best} steps after the best validation (step {best}): the run "
            "stopped there and returns the weights of that validation. A lower ", Mention("lr"),
            " or ", Mention("clip_grad_norm"), " may take a run further"), stacklevel=2)
        self.bar.postfix["diverged; best step"] = str(best)

    def _check_weights(self) -> None:
        """Fail if a weight or floating buffer is not finite; else keep a copy of them."""
        bad = first_nonfinite(self.model, self.s.dist)
        if bad is not None:
            name, value = bad
            self._fail(
                NonFiniteLossError,
                f"the model's '{name}' is {value} at step {self.step}, although every loss so far "
                "was finite (an infinite gradient, or a buffer such as a running statistic that "
                "overflowed)",
                self.step, value,
            )
        self.good_step, self.good = self.step, _copy(self.model)

    def _fail(self, error: type[WordedError], problem: str | tuple[str | Mention, ...],
              step: int, value: float, fixes: bool = True, **extra: float) -> None:
        """Give the model back its best validation's weights (when the run keeps them, see
        :class:`_Best`), else its last weights found finite, and raise ``error`` (with the usual
        fixes unless ``fixes`` is False: ``problem`` then says what to do)."""
        self.model.load_state_dict(self.good if self.best.state is None else self.best.state)
        self.model.eval()
        raise error(*_advice(problem, self, fixes), step=step, value=value,
                    history=self.history, **extra)

    def _clock(self) -> None:
        self.history.wall_time = self.wall_start + time.perf_counter() - self.t0

    def _progress(self, loss: Tensor | None = None, checkpoint: Path | None = None) -> Progress:
        per_epoch = self.source.batches_per_epoch
        return Progress(
            model=self.model,
            step=self.step,
            steps=self.plan.steps,
            epoch=None if per_epoch is None else self.step // per_epoch,
            history=self.history,
            loss=loss,
            checkpoint=checkpoint,
        )


def _advice(
    problem: str | tuple[str | Mention, ...], t: Trainer, fixes: bool = True
) -> tuple[str | Mention, ...]:
    """The message of a failed run: ``problem``, the usual fixes (when ``fixes``), what became of
    the weights and of the checkpoint (to resume from with a lower ``lr`` when ``fixes``: a
    problem that says what to do, such as a validation loss or a batch that is not finite, is
    no matter of the learning rate), in parts that name :func:`~flowkit.train.fit`'s arguments
    (a command line re-spells them as its options)."""
    parts: list[str | Mention] = [*((problem,) if isinstance(problem, str) else problem)]
    if fixes:
        parts += [
            ". Usual fixes: lower the learning rate (", Mention("lr", t.o["lr"]),
            " now), clip gradients (", Mention("clip_grad_norm", 1.0), "), ",
            "" if _standardizes(t.model) else
            "standardise the data (zero mean and unit variance per feature) and ",
            "check the data for extreme values or duplicates (continuous densities on repeated "
            "points grow without bound).",
        ]
    parts.append(
        " The model holds the "
        + (f"weights of step {t.good_step}, the last found finite." if t.best.state is None else
           f"weights of its best validation (step {t.history.best_step}).")
    )
    if t.saved_step is not None:
        parts += [f" The last good checkpoint, '{t.s.path}' (step {t.saved_step}), was kept: "
                  "continue from it with ", Mention("resume", True),
                  *((" and a lower ", Mention("lr")) if fixes else ()), "."]
    elif t.s.path is not None:
        first = min(t.o["checkpoint_every"], t.plan.steps)
        parts.append(f" No checkpoint was written yet (the first is due at step {first}).")
    else:
        parts += [" No checkpoint was written (pass ", Mention("checkpoint_dir"),
                  " to keep one)."]
    return tuple(parts)


_CALLABLE = "callable"
"""How a checkpoint records an ``lr_schedule`` given as a callable."""

_UNRECORDED = "unrecorded"
"""The ``lr_schedule`` of a checkpoint that had a schedule but did not record its name."""


def _schedule_name(spec: Any) -> str | None:
    """How a checkpoint records the (resolved) ``lr_schedule``: None, its name, or
    :data:`_CALLABLE`."""
    return spec if spec is None or isinstance(spec, str) else _CALLABLE


def _schedule_parts(name: str | None) -> tuple[str | Mention, ...]:
    """A recorded ``lr_schedule`` in a message: ``lr_schedule='cosine'``, a callable, or (not
    recorded) a schedule."""
    if name == _CALLABLE:
        return ("a callable ", Mention("lr_schedule"))
    if name == _UNRECORDED:
        return ("a learning-rate schedule",)
    return (Mention("lr_schedule", name),)


def _standardizes(model: nn.Module) -> bool:
    """Whether the model standardizes its data itself (a flowkit Standardize set from it)."""
    return any(isinstance(m, Standardize) and m.is_initialized for m in model.modules())


def _copy(model: nn.Module) -> dict[str, Tensor]:
    """A copy of the model's weights and buffers (on its device)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _record_epochs(history: History, steps_per_epoch: int | None) -> None:
    """Append to ``history.epoch_loss`` the mean loss of each epoch that ``history.train_loss``
    completes since the last call (nothing for data without epochs)."""
    if steps_per_epoch is None:
        return
    while (len(history.epoch_loss) + 1) * steps_per_epoch <= len(history.train_loss):
        start = len(history.epoch_loss) * steps_per_epoch
        history.epoch_loss.append(
            sum(history.train_loss[start : start + steps_per_epoch]) / steps_per_epoch
        )
