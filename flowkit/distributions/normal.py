"""Base distributions for flows, as modules so that ``.to(device)`` moves their state."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from flowkit.validation import check_bool, check_int, check_width, nonfinite_rows

_LOG_2PI = math.log(2 * math.pi)


def standard_normal_noise(
    shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """Draws of ``N(0, 1)`` of ``shape`` on ``like``'s device and dtype, from ``generator``
    (default: the global one). The keyword is left out without a generator: ``torch.compile``
    cannot trace ``torch.randn(..., generator=None)`` once the batch size is dynamic."""
    options = {} if generator is None else {"generator": generator}
    return torch.randn(shape, device=like.device, dtype=like.dtype, **options)


def diagonal_normal_log_prob(eps: Tensor, log_scale: Tensor) -> Tensor:
    r"""The log-density of a diagonal Gaussian ``N(loc, diag(exp(log_scale))^2)`` at ``z``,
    from the standardized residual ``eps = (z - loc) * exp(-log_scale)``:

    .. math::

        \log p(z) = -\tfrac12 \sum_d \epsilon_d^2 - \sum_d \log s_d - \tfrac{D}{2} \log 2\pi,
        \qquad s_d = e^{\text{log\_scale}_d}.

    Args:
        eps: ``(..., D)``.
        log_scale: ``(D,)`` or ``(..., D)``.

    Returns:
        ``(...)``.
    """
    return -0.5 * (eps**2).sum(-1) - log_scale.sum(-1) - 0.5 * eps.shape[-1] * _LOG_2PI


class DiagonalGaussian(nn.Module):
    r"""``N(loc, diag(exp(log_scale))^2)`` over ``D`` features.

    ``log_prob(z) = sum_d [-(z_d - loc_d)^2 / (2 s_d^2) - log s_d - log(2 pi) / 2]``.

    Args:
        features: ``D``.
        learnable: make ``loc`` and ``log_scale`` parameters (else buffers at 0).
    """

    def __init__(self, features: int, learnable: bool = True):
        super().__init__()
        self.features = check_int("features", features, 1)
        loc, log_scale = torch.zeros(features), torch.zeros(features)
        if check_bool("learnable", learnable):
            self.loc, self.log_scale = nn.Parameter(loc), nn.Parameter(log_scale)
        else:
            self.register_buffer("loc", loc)
            self.register_buffer("log_scale", log_scale)

    def log_prob(self, z: Tensor) -> Tensor:
        """``z``: ``(N, D)`` of the module's dtype and device -> ``(N,)``; ``-inf`` for rows
        with an infinite entry, NaN an error."""
        z = check_width("z", z, self.features, self.loc)
        nonfinite_rows("z", z)  # raises on NaN; infinite rows come out -inf
        return self._unchecked_log_prob(z)

    def _unchecked_log_prob(self, z: Tensor) -> Tensor:
        """:meth:`log_prob` without the check of ``z`` (a flow's own ``z``, see
        :class:`flowkit.Flow`'s ``base``)."""
        eps = (z - self.loc) * torch.exp(-self.log_scale)
        return diagonal_normal_log_prob(eps, self.log_scale)

    def rsample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` reparameterized draws, ``(n, D)``, on the module's device and dtype."""
        n = check_int("n", n, 0)
        return self.from_noise(standard_normal_noise((n, self.features), self.loc, generator))

    def from_noise(self, eps: Tensor) -> Tensor:
        """The draws ``loc + exp(log_scale) * eps`` of standard-normal noise ``eps`` ``(N, D)``."""
        return self.loc + eps * torch.exp(self.log_scale)

    def extra_repr(self) -> str:
        return f"features={self.features}, learnable={isinstance(self.loc, nn.Parameter)}"


class StandardNormal(DiagonalGaussian):
    """``N(0, I)`` over ``D`` features (a :class:`DiagonalGaussian` with fixed buffers)."""

    def __init__(self, features: int):
        super().__init__(features, learnable=False)
