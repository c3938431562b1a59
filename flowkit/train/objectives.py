r"""The training losses, and the wrapper that makes a loss a module for the training engine.

* :func:`nll`: the mean negative log-likelihood of a batch, for :func:`~flowkit.train.fit`;
* :class:`NegElbo`: the negative evidence lower bound of the flow's own samples, for
  :func:`~flowkit.train.fit_reverse_kl`;
* :class:`Objective`: a loss as the ``forward`` of a module (see there why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn


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
    the unnormalised :math:`\log \tilde p`."""

    def __init__(self, target_log_density: Callable[[Tensor], Tensor]):
        self.target = target_log_density

    def __call__(self, flow: nn.Module, n: int) -> Tensor:
        x, log_q = flow.sample_and_log_prob(n)
        return (log_q - self.target(x)).mean()


def require_method(model: Any, method: str, fn: str) -> None:
    """Fail unless ``model`` is a module with the ``method`` the loss of ``fn`` calls."""
    if not isinstance(model, nn.Module) or not callable(getattr(model, method, None)):
        raise TypeError(
            f"{fn}() needs a torch.nn.Module with a '{method}' method as 'model', got "
            f"{type(model).__name__}"
        )
