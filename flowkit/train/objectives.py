r"""The training losses, and the wrapper that makes a loss a module for the training engine.

* :func:`nll`: the mean negative log-likelihood of a batch, for :func:`~flowkit.train.fit`;
* :class:`NegElbo`: the negative evidence lower bound of the flow's own samples, for
  :func:`~flowkit.train.fit_reverse_kl`;
* :class:`Objective`: a loss as the ``forward`` of a module (see there why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..validation import Mention
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
        finite, when the loss can tell (:meth:`NegElbo.cause`), else None. A collective under
        ``torchrun``: every process calls it, as they all see the same mean loss."""
        return self.loss.cause(index, step, dist) if isinstance(self.loss, NegElbo) else None

    def recorded(self) -> None:
        """The losses of the steps so far were recorded: forget what the loss kept of them."""
        if isinstance(self.loss, NegElbo):
            self.loss.nonfinite.clear()


def log_prob(model: nn.Module, x: Tensor, context: Tensor | None) -> Tensor:
    """``model.log_prob(x)`` ``(N,)``, with ``context=context`` when there is one (so models
    without a context argument work)."""
    return model.log_prob(x) if context is None else model.log_prob(x, context=context)


def nll(model: nn.Module, x: Tensor, context: Tensor | None) -> Tensor:
    r"""The mean negative log-likelihood of a batch, :math:`-\frac{1}{N}\sum_i \log p(x_i \mid
    c_i)`, in nats per sample."""
    return -log_prob(model, x, context).mean()


class NegElbo:
    r"""The negative ELBO of ``n`` reparameterised samples of the flow,
    :math:`\frac{1}{n}\sum_i [\log q(x_i) - \log \tilde p(x_i)]`, with ``target_log_density``
    the unnormalised :math:`\log \tilde p`.

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

    def __call__(self, flow: nn.Module, n: int) -> Tensor:
        x, log_q = flow.sample_and_log_prob(n)
        log_p = self.target(x)
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
