"""``BatchNorm``: batch normalization as a bijection, with its training-mode caveats."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from flowkit.checkpoint import InvalidBuffer, register_check
from flowkit.transforms.base import Transform
from flowkit.validation import check_float, check_int


class BatchNorm(Transform):
    r"""Batch normalization as a bijection (MAF paper, section 3.4).

    ``forward``: :math:`z = (x - \mu) / \sqrt{v + \epsilon} \cdot e^{\gamma} + \beta`, with
    :math:`\log|\det dz/dx| = \sum_d \gamma_d - \tfrac12 \log(v_d + \epsilon)`, as in the
    paper: :math:`\gamma` is the log of the scale (the parameter ``log_gamma``), :math:`\beta`
    the shift (``beta``).

    **Eval mode**: both directions use the running averages: one fixed, exact bijection.

    **Training mode** (the MAF paper's choice): ``forward`` uses the mean and (biased) variance
    of the batch it is given, and updates the running averages. It is then a different
    bijection for every batch, and the log-density of a row depends on the other rows.
    ``inverse`` has no batch of data to take statistics from (those of the noise mean nothing),
    so it *always* uses the running averages, in both modes. Consequences in training mode:

    * ``inverse(forward(x))`` is not ``x`` (nor are the two log-determinants opposite);
    * sampling (:meth:`flowkit.Flow.sample`) draws from the eval-mode bijection, and
      :meth:`flowkit.Flow.sample_and_log_prob` scores its samples with that inverse's own
      log-determinant: its log-density is the eval-mode density of the samples (exact for the
      distribution sampled from), not the training-mode ``log_prob`` of the same batch, which
      uses the batch's statistics;
    * every training-mode ``forward`` moves the running averages, so the eval-mode model changes.

    Call ``.eval()`` before evaluating densities or sampling.

    Args:
        features: ``D``.
        momentum: weight of the new batch in the running averages.
        eps: added to the variance.
    """

    def __init__(self, features: int, momentum: float = 0.1, eps: float = 1e-5):
        super().__init__()
        self.features = check_int("features", features, 1)
        self.momentum = check_float("momentum", momentum, 0, 1)
        self.eps = check_float("eps", eps, 0, exclusive=True)
        self.log_gamma = nn.Parameter(torch.zeros(self.features))
        self.beta = nn.Parameter(torch.zeros(self.features))
        self.register_buffer("running_mean", torch.zeros(self.features))
        self.register_buffer("running_var", torch.ones(self.features))

    def _statistics(self, x: Tensor | None) -> tuple[Tensor, Tensor]:
        if x is None or not self.training:
            return self.running_mean, self.running_var
        if x.shape[0] < 2:
            raise ValueError(  # reached from Flow.log_prob, a distribution's, fit's: no name
                "BatchNorm in training mode takes statistics over the batch and needs at least "
                f"2 rows, got a batch of shape {tuple(x.shape)}: evaluate single rows in eval "
                "mode (model.eval()), which uses the running averages"
            )
        mean, var = x.mean(0), x.var(0, unbiased=False)
        with torch.no_grad():
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var, self.momentum)
        return mean, var

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        mean, var = self._statistics(x)
        z = (x - mean) * torch.rsqrt(var + self.eps) * self.log_gamma.exp() + self.beta
        log_det = (self.log_gamma - 0.5 * torch.log(var + self.eps)).sum()
        return z, log_det.expand(x.shape[0])

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        mean, var = self._statistics(None)
        x = (z - self.beta) * (-self.log_gamma).exp() * torch.sqrt(var + self.eps) + mean
        log_det = (0.5 * torch.log(var + self.eps) - self.log_gamma).sum()
        return x, log_det.expand(z.shape[0])


@register_check(BatchNorm)
def _check_stored_statistics(module: BatchNorm) -> None:
    """Refuse a stored ``running_var`` that no training gives: a negative variance makes every
    density NaN in evaluation mode; zero is allowed (``eps`` is added)."""
    if (module.running_var < 0).any():
        raise InvalidBuffer("running_var", "non-negative (a variance)")
