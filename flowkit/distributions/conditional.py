r"""A base distribution whose mean and scale depend on the context.

With it, a conditional flow :math:`x = T^{-1}(z; c)` starts from
:math:`z \sim \mathcal N(\mu(c), \operatorname{diag} \sigma(c)^2)` instead of
:math:`\mathcal N(0, I)`: the variational posterior of a VAE with an IAF
(:math:`z_0 = \mu(x) + \sigma(x) \odot \epsilon`, then the IAF layers) is one
:func:`flowkit.IAF` with ``conditional_base=True``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from flowkit.distributions.normal import diagonal_normal_log_prob, standard_normal_noise
from flowkit.nn.embedding import MLPEmbedding
from flowkit.validation import check_int, check_width, nonfinite_rows, reference

__all__ = ["ConditionalDiagonalGaussian"]


class ConditionalDiagonalGaussian(nn.Module):
    r"""``N(mu(c), diag(exp(log_sigma(c)))^2)`` over ``D`` features given a context ``c``.

    ``[mu(c), log_sigma(c)] = head(c)``, a linear map of the context (or an MLP with ReLU
    hidden layers, a :class:`flowkit.nn.MLPEmbedding`), with :class:`torch.nn.Linear`'s random
    initialisation. (A head that starts at zero, the base ``N(0, I)`` for every context, would
    make a VAE's posterior start equal to its prior and carry no information about ``x``;
    measured in ``docs/vae_tutorial.md``.)

    .. math::

        \log p(z \mid c) = \sum_{d=1}^{D} \Big[-\tfrac12 \Big(\frac{z_d - \mu_d(c)}
        {\sigma_d(c)}\Big)^2 - \log \sigma_d(c) - \tfrac12 \log 2\pi\Big].

    Samples are reparameterized: ``z = mu(c) + sigma(c) * eps``, ``eps ~ N(0, I)``, so gradients
    reach the head and the context.

    Shapes: ``context`` is ``(N, C)``, ``z`` is ``(N, D)``; log-densities are ``(N,)``.

    Args:
        features: ``D``.
        context_features: ``C``, the width of the context the head reads.
        hidden_features: hidden widths of the head (``()``: linear).

    Example:
        >>> import torch
        >>> base = ConditionalDiagonalGaussian(2, context_features=3)
        >>> c = torch.randn(5, 3)
        >>> z, log_p = base.rsample_and_log_prob(c)
        >>> z.shape, log_p.shape
        (torch.Size([5, 2]), torch.Size([5]))
        >>> torch.allclose(log_p, base.log_prob(z, c))
        True
    """

    def __init__(self, features: int, context_features: int,
                 hidden_features: Sequence[int] = ()):
        super().__init__()
        self.features = check_int("features", features, 1)
        self.context_features = check_int("context_features", context_features, 1)
        self.head = MLPEmbedding(self.context_features, 2 * self.features, hidden_features)

    def loc_and_log_scale(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """``mu(c)`` and ``log sigma(c)``, each ``(N, D)``, for a context ``(N, C)``."""
        context = check_width("context", context, self.context_features, reference(self))
        return self._loc_and_log_scale(context)

    def _loc_and_log_scale(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`loc_and_log_scale` without the check of ``context``."""
        loc, log_scale = self.head(context).chunk(2, dim=-1)
        return loc, log_scale

    def log_prob(self, z: Tensor, context: Tensor) -> Tensor:
        """``log p(z | context)``: ``z`` ``(N, D)``, ``context`` ``(N, C)`` -> ``(N,)``."""
        z, context = self._check_rows(z, context)
        nonfinite_rows("z", z)  # raises on NaN; infinite rows come out -inf
        nonfinite_rows("context", context)
        return self._unchecked_log_prob(z, context)

    def _check_rows(self, z: Tensor, context: Tensor) -> tuple[Tensor, Tensor]:
        """``z`` ``(N, D)`` and ``context`` ``(N, C)`` of the head's dtype and device."""
        like = reference(self)
        z = check_width("z", z, self.features, like)
        context = check_width("context", context, self.context_features, like)
        if z.shape[0] != context.shape[0]:
            raise ValueError(
                f"'z' has {z.shape[0]} rows but 'context' has {context.shape[0]}; pass one "
                "context per row"
            )
        return z, context

    def _unchecked_log_prob(self, z: Tensor, context: Tensor) -> Tensor:
        """:meth:`log_prob` without the checks (a flow's own ``z`` and context, see
        :class:`flowkit.Flow`'s ``base``)."""
        loc, log_scale = self._loc_and_log_scale(context)
        eps = (z - loc) * torch.exp(-log_scale)
        return diagonal_normal_log_prob(eps, log_scale)

    def rsample_and_log_prob(
        self, context: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """One reparameterized draw per context row, ``(N, D)``, and its log-density ``(N,)``
        (from the noise, without recomputing the head)."""
        loc, log_scale = self.loc_and_log_scale(context)
        eps = standard_normal_noise(loc.shape, loc, generator)
        z = loc + eps * torch.exp(log_scale)
        return z, diagonal_normal_log_prob(eps, log_scale)

    def rsample(self, context: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One reparameterized draw per context row: ``(N, C)`` -> ``(N, D)``."""
        return self.rsample_and_log_prob(context, generator)[0]

    def from_noise(self, eps: Tensor, context: Tensor) -> Tensor:
        """The draws ``mu(c) + sigma(c) * eps`` of standard-normal noise ``eps`` ``(N, D)``,
        one per context row ``(N, C)``."""
        loc, log_scale = self._loc_and_log_scale(context)
        return loc + eps * torch.exp(log_scale)

    def extra_repr(self) -> str:
        return f"features={self.features}, context_features={self.context_features}"
