r"""The training losses, and the wrapper that makes a loss a module for the training engine.

* :class:`NegLogLikelihood`: the mean negative log-likelihood of a batch, for
  :func:`~flowkit.train.fit`;
* :class:`NegElbo`: the negative evidence lower bound of the flow's own samples, for
  :func:`~flowkit.train.fit_reverse_kl`;
* :class:`Objective`: a loss as the ``forward`` of a module (see there why).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from ..nn.modes import evaluating
from ..transforms.bounded import Logit
from ..validation import ArgumentError, Mention, nonfinite_row_mask
from .distributed import Dist


class Objective(nn.Module):
    """The training loss as a module whose ``forward`` computes it.

    Why a wrapper: :class:`~torch.nn.parallel.DistributedDataParallel` prepares its gradient
    all-reduce when the wrapped module's ``forward`` runs. Flows are evaluated through
    ``log_prob`` / ``sample_and_log_prob``, which are not ``forward``, so wrapping the model
    itself in DDP and calling ``ddp.module.log_prob`` would silently skip the averaging. Making
    the whole loss the ``forward`` of this wrapper keeps PyTorch's own engine in charge (bucketed
    all-reduce overlapped with backward, parameter broadcast at start) instead of a hand-written
    all-reduce over parameters. The wrapped ``model`` is a submodule, so its parameters are the
    wrapper's parameters.
    """

    def __init__(self, model: nn.Module, loss: Callable[..., Tensor]):
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, *args: Any) -> Tensor:
        return self.loss(self.model, *args)

    def cause(self, index: int, step: int, dist: Dist) -> tuple[str | Mention, ...] | None:
        """Why the loss of step ``step``, the ``index``-th since the last recording, was not
        finite, when the loss can tell (:meth:`NegLogLikelihood.cause`,
        :meth:`NegElbo.cause`), else None. A collective under ``torchrun``: every process
        calls it, as they all see the same mean loss."""
        cause = getattr(self.loss, "cause", None)
        return None if cause is None else cause(index, step, dist)

    def blame(self, error: Exception, step: int) -> Exception | None:
        """The error to raise for ``error``, which computing the loss of step ``step`` raised,
        when the loss can name its cause (:meth:`NegLogLikelihood.blame`), else None."""
        blame = getattr(self.loss, "blame", None)
        return None if blame is None else blame(error, step)

    def recorded(self) -> None:
        """The losses of the steps so far were recorded: forget what the loss kept of them."""
        nonfinite = getattr(self.loss, "nonfinite", None)
        if nonfinite is not None:
            nonfinite.clear()


def log_prob(model: nn.Module, x: Tensor, context: Tensor | None) -> Tensor:
    """``model.log_prob(x)`` ``(N,)``, with ``context=context`` when there is one (so models
    without a context argument work)."""
    return model.log_prob(x) if context is None else model.log_prob(x, context=context)


class NegLogLikelihood:
    r"""The mean negative log-likelihood of a batch, :math:`-\frac{1}{N}\sum_i \log p(x_i \mid
    c_i)`, in nats per sample.

    Inputs are not checked for NaN/Inf at every step (a check reads a value back to the host);
    instead each step counts, on the device, the rows of ``x`` and of the context that hold
    one, and the engine reads the counts only for a loss that was not finite
    (:meth:`cause`): a NaN in a later batch of a :class:`~torch.utils.data.DataLoader` is then
    reported as such, not as a divergence.

    Attributes:
        nonfinite: per step since the last recording, ``(rows of x, rows of the context,
            rows of log-density -inf)``: the rows holding NaN or Inf, and the finite points the
            model puts outside its support, on this process.
    """

    def __init__(self) -> None:
        self.nonfinite: list[Tensor] = []
        self.bounded: bool | None = None  # the model has a Logit: -inf outside its bounds

    def __call__(self, model: nn.Module, x: Tensor, context: Tensor | None) -> Tensor:
        if self.bounded is None:
            self.bounded = is_bounded(model)
        log_p = log_prob(model, x, context)
        rows = (count_nonfinite_rows(x, x), count_nonfinite_rows(context, x),
                (log_p == -math.inf).sum())
        self.nonfinite.append(torch.stack(rows))
        return -log_p.mean()

    def cause(self, index: int, step: int, dist: Dist) -> tuple[str | Mention, ...] | None:
        """The message parts blaming the batch of step ``step`` (the ``index``-th since the
        last recording), when it held NaN or Inf values, or points of log-density ``-inf``, on
        some process; else None."""
        rows_x, rows_c, outside = dist.all_sum(self.nonfinite[index]).tolist()
        batch = (f"the batch of step {step} from ", Mention("data"))
        if rows_x or rows_c:
            where = " and ".join(f"{k} row(s) of {what}" for what, k in
                                 (("x", rows_x), ("the context", rows_c)) if k)
            return (
                *batch, f" holds NaN or Inf values in {where}, so the loss is not finite: remove "
                "or impute them before fitting (a DataLoader's batches are checked for them only "
                "at the first step).",
            )
        if outside and self.bounded:  # (else a log-density that overflowed: the usual fixes)
            return outside_support(batch, outside)
        return None


    def blame(self, error: Exception, step: int) -> Exception | None:
        """The model refused the batch of step ``step`` (a later batch of a DataLoader or a
        sampling function of the wrong width, or holding values outside the model's domain:
        only the first batch is checked before training): ``error`` naming ``'data'`` and the
        step, as a ``ValueError`` (:class:`~flowkit.validation.ArgumentError`) or
        ``TypeError``. Only errors by which the model refuses its arguments, which flowkit's
        models begin with their names (``'x' should ...``, ``'context' ...``), blame the batch;
        None for any other error (a bug in a model's code, NaN weights after a divergence),
        which is raised as it is."""
        if not str(error).startswith(("'x'", "'context'")):
            return None
        if isinstance(error, ValueError):
            return ArgumentError("data", f"the batch of step {step} from ", Mention("data"),
                                 f" was refused by the model: {error}")
        if isinstance(error, TypeError):
            return TypeError(f"the batch of step {step} from 'data' was refused by the model: "
                             f"{error}")
        return None


def is_bounded(model: nn.Module) -> bool:
    """Whether ``model`` has a :class:`~flowkit.transforms.Logit` (a flow built with
    ``bounds``): its log-density is ``-inf`` outside them."""
    return any(isinstance(m, Logit) for m in model.modules())


def outside_support(
    where: tuple[str | Mention, ...], count: int, rows: list[int] | None = None
) -> tuple[str | Mention, ...]:
    """The message parts blaming ``count`` rows of ``where`` (e.g. ``the batch of step 3 from
    'data'``), the first of them numbered in ``rows``, that a bounded model gives log-density
    ``-inf``."""
    listed = ""
    if rows:
        more = ", ..." if count > len(rows) else ""
        listed = f" ({'row' if count == 1 else 'rows'} {', '.join(map(str, rows))}{more})"
    return (
        *where, f" holds {count} row(s){listed} that the model gives log-density -inf: points "
        "outside its support (a flow built with 'bounds' is zero outside them), so the loss "
        "is infinite. Keep the data inside the bounds, or widen them.",
    )


def rows_outside(
    model: nn.Module, batches: Iterable[tuple[Tensor, Tensor | None]], first: int = 5
) -> tuple[int, list[int]]:
    """How many rows of ``batches`` (``(x, context)`` pairs, in order) ``model`` gives
    log-density ``-inf``, and the numbers of the first ``first`` of them (counted across the
    batches): one pass in evaluation mode without gradients."""
    count, rows, offset = 0, [], 0
    with evaluating(model):
        for x, c in batches:
            hit = (log_prob(model, x, c) == -math.inf).nonzero().flatten()
            count += hit.numel()
            rows += (hit[: max(first - len(rows), 0)] + offset).tolist()
            offset += x.shape[0]
    return count, rows


def count_nonfinite_rows(t: Tensor | None, like: Tensor) -> Tensor:
    """How many rows of ``t`` hold a NaN or an infinite value (0 for no tensor or integer
    data), as a tensor on ``like``'s device."""
    if t is None or not t.is_floating_point():
        return torch.zeros((), dtype=torch.long, device=like.device)
    return nonfinite_row_mask(t).sum()


class NegElbo:
    r"""The negative ELBO of ``n`` reparameterised samples of the flow,
    :math:`\frac{1}{n}\sum_i [\log q(x_i) - \log \tilde p(x_i)]`, with ``target_log_density``
    the unnormalised :math:`\log \tilde p` (with contexts ``c_i``, of
    :math:`\log q(x_i \mid c_i) - \log \tilde p(x_i \mid c_i)`).

    Each step also counts the target's values that are NaN or infinite, on the device (no host
    copy per step; the engine reads them only for a loss that was not finite, :meth:`cause`).

    Attributes:
        nonfinite: per step since the last recording, ``(NaN count, infinite count)`` of the
            target's values on this process's ``n`` samples.
    """

    def __init__(self, target_log_density: Callable[[Tensor], Tensor]):
        self.target = target_log_density
        self.n = 0
        self.nonfinite: list[Tensor] = []

    def __call__(self, flow: nn.Module, n: int, context: Tensor | None = None) -> Tensor:
        """``n`` samples, or with ``context`` ``(n, C)`` one sample at each context row (the
        target then reads both, ``log p~(x | c)``: amortized variational inference)."""
        if context is None:
            x, log_q = flow.sample_and_log_prob(n)
            log_p = self.target(x)
        else:
            x, log_q = flow.sample_and_log_prob(None, context)
            log_p = self.target(x, context)
        self.n = n
        self.nonfinite.append(torch.stack((log_p.isnan().sum(), log_p.isinf().sum())))
        return (log_q - log_p).mean()

    def cause(self, index: int, step: int, dist: Dist) -> tuple[str | Mention, ...] | None:
        """The message parts blaming the target, when its values at the ``index``-th step since
        the last recording (step ``step``) were not all finite; else None (the flow's
        log-density made the loss non-finite)."""
        nan, inf = dist.all_sum(self.nonfinite[index]).tolist()
        if nan == 0 and inf == 0:
            return None
        counts = " and ".join(
            f"{what} for {k}" for what, k in (("NaN", nan), ("an infinite value", inf)) if k
        )
        return (
            Mention("target_log_density"), f" returned {counts} of {self.n * dist.world_size} "
            f"samples at step {step}, so the loss is not finite. The flow's samples can fall "
            "anywhere: make ", Mention("target_log_density"), " finite for every x (look for "
            "logs of zero or negative numbers, 0/0, and points outside its domain).",
        )


def require_method(model: Any, method: str, fn: str) -> None:
    """Fail unless ``model`` is a module with the ``method`` the loss of ``fn`` calls."""
    if not isinstance(model, nn.Module) or not callable(getattr(model, method, None)):
        raise TypeError(
            f"{fn}() needs a torch.nn.Module with a '{method}' method as 'model', got "
            f"{type(model).__name__}"
        )
