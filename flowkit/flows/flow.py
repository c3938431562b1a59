"""``Flow``: a transform from data to noise plus a base distribution on the noise."""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor, nn

from flowkit.transforms.base import Transform
from flowkit.validation import check_context, check_features, check_n


class Flow(nn.Module):
    r"""A normalizing flow ``p(x | c) = p_base(T(x; c)) |det dT/dx|``.

    ``transform`` maps data to noise (its ``forward``); sampling runs its ``inverse``.

    Shapes (``D = features``, ``C = context_features``):

    * ``log_prob(x, context)``: ``x`` is ``(N, D)``; ``context`` is ``(N, C)`` (one per row) or
      ``(C,)`` (shared by all rows). Returns ``(N,)``.
    * ``sample(n)`` without context: ``(n, D)``.
    * ``sample(n, context)`` with ``context`` ``(C,)``: ``(n, D)``, all given that context.
    * ``sample(context=context)`` with ``context`` ``(B, C)``: ``(B, D)``, one sample per row.
    * ``sample(n, context)`` with ``context`` ``(B, C)``: ``(n, B, D)``, ``n`` per row.

    No Python loop over contexts: rows are expanded and processed as one batch.

    Args:
        transform: data-to-noise transform (e.g. a :class:`flowkit.transforms.Compose`).
        base: base distribution with ``features``, ``log_prob(z)`` and ``rsample(n)``.
    """

    def __init__(self, transform: Transform, base: nn.Module):
        super().__init__()
        if transform.features is not None and transform.features != base.features:
            raise ValueError(
                f"'transform' acts on {transform.features} features but 'base' has "
                f"{base.features}"
            )
        self.transform = transform
        self.base = base
        self.features: int = base.features
        self.context_features: int = transform.context_features
        self.config: dict | None = None  # set by the builders, used by flowkit.save_model

    def _reference(self) -> Tensor:
        """The first floating-point parameter or buffer: the model's dtype and device."""
        tensors = itertools.chain(self.parameters(), self.buffers())
        return next(t for t in tensors if t.is_floating_point())

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Exact log-density ``log p(x | context)``, shape ``(N,)``."""
        ref = self._reference()
        x = check_features("x", x, self.features, ref)
        context = check_context(context, self.context_features, x.shape[0], ref)
        z, log_det = self.transform(x, context)
        return self.base.log_prob(z) + log_det

    def _noise_and_context(
        self, n: int | None, context: Tensor | None
    ) -> tuple[Tensor, Tensor | None, tuple[int, ...]]:
        """Base noise ``(rows, D)``, the context expanded to ``(rows, C)`` (or None) and the
        shape of the samples without their last axis, from the user's ``n`` and ``context``
        (checked as given, before any expansion)."""
        context = check_context(context, self.context_features, None, self._reference())
        if context is None or context.dim() == 1:
            shape: tuple[int, ...] = (check_n(n),)
        elif n is None:
            shape = (context.shape[0],)
        else:
            shape = (check_n(n), context.shape[0])
        rows = math.prod(shape)
        if context is not None:
            context = context.expand(*shape, -1).reshape(rows, -1)
        return self.base.rsample(rows), context, shape

    def rsample(self, n: int | None = None, context: Tensor | None = None) -> Tensor:
        """Reparameterized samples (gradients flow to the parameters); shapes as above."""
        z, context, shape = self._noise_and_context(n, context)
        x, _ = self.transform.inverse(z, context)
        return x.reshape(*shape, self.features)

    @torch.no_grad()
    def sample(self, n: int | None = None, context: Tensor | None = None) -> Tensor:
        """Samples without gradient tracking; shapes as above."""
        return self.rsample(n, context)

    def sample_and_log_prob(
        self, n: int | None = None, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Reparameterized samples and their exact log-density from the same inverse pass
        (one MADE pass per layer for an IAF). Returns ``x`` and ``log p(x)`` shaped as the
        samples without the last axis.

        The log-density uses the log-determinant of the inverse actually applied. It equals
        :meth:`log_prob` of the samples in eval mode; in training mode with
        :class:`flowkit.transforms.BatchNorm` layers (whose ``inverse`` always uses the running
        averages) it is the eval-mode density, which :meth:`log_prob` in training mode (batch
        statistics) is not.
        """
        z, context, shape = self._noise_and_context(n, context)
        log_pz = self.base.log_prob(z)
        x, log_det = self.transform.inverse(z, context)
        return x.reshape(*shape, self.features), (log_pz - log_det).reshape(shape)
