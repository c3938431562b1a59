"""A ``torch.distributions.Transform`` (zuko's transforms are ones) inside a flowkit flow."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor
from torch.distributions import Transform as TorchTransform

from flowkit.transforms.base import Transform


class TorchBijection(Transform):
    r"""A bijection written as a :class:`torch.distributions.Transform` ``T``, as a flowkit
    transform (data to noise is ``forward``, see :mod:`flowkit.transforms.base`).

    The two libraries read such a ``T`` in opposite directions, so say which one it is:

    * ``maps="to_noise"``: ``z = T(x)``, data to noise, as zuko's flows apply their transforms
      (``zuko.flows.Flow.transform``, after building it with a context:
      ``flow.transform(c)``). ``forward`` is ``T``, ``log_det = log|dT/dx|``.
    * ``maps="to_data"``: ``x = T(z)``, noise to data, as
      :class:`torch.distributions.TransformedDistribution` applies its transforms.
      ``forward`` is ``T.inv``, with ``log_det = -log|dT/dz|`` at ``z = T^{-1}(x)``.

    Rows outside the data's side of ``T`` (its domain for ``to_noise``, its range for
    ``to_data``: data outside ``(-1, 1)`` under a ``TanhTransform``) or without a finite image
    (its edges) get ``log_det = -inf``,
    so their log-density under a flow is ``-inf``, as with :class:`flowkit.transforms.Logit`.

    ``T`` acts on ``(N, D)`` rows: elementwise (``T.domain.event_dim == 0``, its
    log-determinant summed over the ``D`` features) or on vectors (``event_dim == 1``). It
    reads no context, and its tensors are not this module's parameters: a ``T`` built from
    the parameters of a module of yours trains with that module, which a flow of yours must
    then hold too.

    Args:
        transform: the torch bijection (``T.bijective`` must be true).
        maps: ``"to_noise"`` or ``"to_data"`` (no default: the libraries disagree).

    Example:
        >>> import torch
        >>> from torch.distributions import AffineTransform
        >>> t = TorchBijection(AffineTransform(loc=1.0, scale=2.0), maps="to_data")
        >>> z, log_det = t(torch.tensor([[3.0, 5.0]]))   # x = 1 + 2 z
        >>> z, log_det
        (tensor([[1., 2.]]), tensor([-1.3863]))
    """

    def __init__(self, transform: TorchTransform, maps: Literal["to_noise", "to_data"]):
        super().__init__()
        if not isinstance(transform, TorchTransform):
            raise TypeError(f"'transform' should be a torch.distributions.Transform, got "
                            f"{type(transform).__name__}")
        if not transform.bijective:
            raise ValueError(f"'transform' should be a bijection (its .bijective is False): "
                             f"{transform!r}")
        event_dim = transform.domain.event_dim
        if event_dim not in (0, 1) or transform.codomain.event_dim != event_dim:
            raise ValueError(
                f"'transform' should act elementwise or on vectors (event_dim 0 or 1 on both "
                f"sides), got event_dim {event_dim} -> {transform.codomain.event_dim}")
        if maps not in ("to_noise", "to_data"):
            raise ValueError(f"'maps' should be 'to_noise' (z = T(x), zuko's flows) or "
                             f"'to_data' (x = T(z), torch's TransformedDistribution), got "
                             f"{maps!r}")
        self.transform = transform
        self.maps = maps

    def _log_det(self, inputs: Tensor, outputs: Tensor) -> Tensor:
        """``log|det dT/d inputs|`` per row, ``(N,)``."""
        log_det = self.transform.log_abs_det_jacobian(inputs, outputs)
        if self.transform.domain.event_dim == 0:
            log_det = log_det.expand_as(inputs).sum(-1)
        return log_det

    def _map(self, inputs: Tensor, forward: bool) -> tuple[Tensor, Tensor]:
        """``T`` (``forward``) or ``T^{-1}``, with the log-determinant of that direction."""
        t = self.transform
        if forward:
            outputs = t(inputs)
            return outputs, self._log_det(inputs, outputs)
        outputs = t.inv(inputs)
        return outputs, -self._log_det(outputs, inputs)

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        z, log_det = self._map(x, self.maps == "to_noise")
        # Rows outside the data's side of T (its domain, or its range for to_data), or on its
        # edge (tanh's range is checked as [-1, 1], atanh(1) is inf), have no finite image:
        # z 0 and log_det -inf there, so that their log-density is -inf, as with Logit.
        support = self.transform.domain if self.maps == "to_noise" else self.transform.codomain
        inside = support.check(x)
        if support.event_dim == 0:
            inside = inside.all(-1)
        inside = inside & torch.isfinite(z).all(-1) & torch.isfinite(log_det)
        return z.masked_fill(~inside[:, None], 0.0), log_det.masked_fill(~inside, -math.inf)

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        return self._map(z, self.maps == "to_data")

    def extra_repr(self) -> str:
        return f"{self.transform!r}, maps={self.maps!r}"
