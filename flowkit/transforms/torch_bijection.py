"""A ``torch.distributions.Transform`` (zuko's transforms are ones) inside a flowkit flow."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import torch
from torch import Tensor
from torch.distributions import Transform as TorchTransform
from torch.distributions import constraints

from flowkit.transforms.base import Transform


class TorchBijection(Transform):
    r"""A bijection written as a :class:`torch.distributions.Transform` ``T``, as a flowkit
    transform (data to noise is ``forward``, see :mod:`flowkit.transforms.base`).

    The two libraries read such a ``T`` in opposite directions, so say which one it is:

    * ``maps="to_noise"``: ``z = T(x)``, data to noise, as zuko's flows apply their transforms
      (``zuko_flow.transform``). ``forward`` is ``T``, ``log_det = log|dT/dx|``.
    * ``maps="to_data"``: ``x = T(z)``, noise to data, as
      :class:`torch.distributions.TransformedDistribution` applies its transforms.
      ``forward`` is ``T.inv``, with ``log_det = -log|dT/dz|`` at ``z = T^{-1}(x)``.

    **Parameters.** A ``T`` is no module: one built once from tensors keeps those values. To
    train ``T``, pass what builds it instead, called at every use: a module (its parameters
    become this module's, move with ``.to()`` and are saved in the ``state_dict``: zuko's
    unconditional ``zuko_flow.transform`` is one) or a function of no arguments (whose
    parameters your own module must hold).

    **Support.** Data rows outside ``T``'s data side (its domain for ``to_noise``, its range
    for ``to_data``: values outside ``(-1, 1)`` under a ``TanhTransform``), or whose image is
    not finite (``1.0`` under ``tanh``), get ``log_det = -inf``, so a flow gives them
    log-density ``-inf`` (as :class:`flowkit.transforms.Logit` does), with no gradient from
    them. Noise outside ``T``'s noise side (the sign of ``maps`` the wrong way round: normal
    noise into the inverse of a sigmoid) is an error naming ``maps``.

    ``T`` acts on ``(N, D)`` rows: elementwise (``T.domain.event_dim == 0``, its
    log-determinant summed over the ``D`` features) or on vectors (``event_dim == 1``). It
    reads no context (a zuko transform built for one context ``c``, ``zuko_flow.transform(c)``
    with ``c`` of shape ``(C,)``, serves every row).

    Args:
        transform: the torch bijection (``T.bijective`` must be true), or a module or function
            that builds it when called with no arguments.
        maps: ``"to_noise"`` or ``"to_data"`` (no default: the libraries disagree).

    Example:
        >>> import torch
        >>> from torch.distributions import AffineTransform
        >>> t = TorchBijection(AffineTransform(loc=1.0, scale=2.0), maps="to_data")
        >>> z, log_det = t(torch.tensor([[3.0, 5.0]]))   # x = 1 + 2 z
        >>> z, log_det
        (tensor([[1., 2.]]), tensor([-1.3863]))
    """

    def __init__(
        self,
        transform: TorchTransform | Callable[[], TorchTransform],
        maps: Literal["to_noise", "to_data"],
    ):
        super().__init__()
        if maps not in ("to_noise", "to_data"):
            raise ValueError(f"'maps' should be 'to_noise' (z = T(x), zuko's flows) or "
                             f"'to_data' (x = T(z), torch's TransformedDistribution), got "
                             f"{maps!r}")
        self.maps = maps
        if isinstance(transform, TorchTransform):
            self.fixed: TorchTransform | None = _checked(transform)
            self.build: Callable[[], TorchTransform] | None = None
        elif callable(transform):
            self.fixed, self.build = None, transform  # a module is registered as a child
            try:
                built = transform()
            except TypeError as error:
                raise TypeError(f"'transform' should be a torch.distributions.Transform, or a "
                                f"module or function that builds one when called with no "
                                f"arguments; calling it failed: {error}") from error
            _checked(built)
        else:
            raise TypeError(f"'transform' should be a torch.distributions.Transform, or a module "
                            f"or function that builds one, got {type(transform).__name__}")

    def bijection(self) -> TorchTransform:
        """``T`` as it is now (built anew if a builder was given)."""
        return self.fixed if self.build is None else _checked(self.build())

    @property
    def data_support(self) -> constraints.Constraint:
        """``T``'s data side: its domain (``maps="to_noise"``) or its range (``"to_data"``),
        per row (an elementwise ``T``'s side, independent over the features)."""
        side = self._sides(self.bijection())[0]
        return constraints.independent(side, 1) if side.event_dim == 0 else side

    def _sides(self, t: TorchTransform) -> tuple[constraints.Constraint, constraints.Constraint]:
        """``T``'s data side and noise side, as ``maps`` reads it."""
        return (t.domain, t.codomain) if self.maps == "to_noise" else (t.codomain, t.domain)

    def _log_det(self, t: TorchTransform, inputs: Tensor, outputs: Tensor) -> Tensor:
        """``log|det dT/d inputs|`` per row, ``(N,)``."""
        log_det = t.log_abs_det_jacobian(inputs, outputs)
        if t.domain.event_dim == 0:
            log_det = log_det.expand_as(inputs).sum(-1)
        return log_det

    @contextmanager
    def _explained(self, t: TorchTransform, inputs: Tensor) -> Iterator[None]:
        """Name ``T`` and say what a built ``T`` lacks when it fails on ``inputs``."""
        try:
            yield
        except RuntimeError as error:
            if self.build is None:
                raise
            raise RuntimeError(
                f"the {type(t).__name__} that {type(self.build).__name__} built failed on "
                f"rows of shape {tuple(inputs.shape)}: {error}. A transform built without "
                "arguments has no context: for a conditional one (zuko's flow.transform of a "
                "flow with a context) pass a function that gives it its context, "
                "TorchBijection(lambda: zuko_flow.transform(c), ...)") from error

    def _map(self, t: TorchTransform, inputs: Tensor, forward: bool) -> tuple[Tensor, Tensor]:
        """``T`` (``forward``) or ``T^{-1}``, with the log-determinant of that direction."""
        if forward:
            outputs = t(inputs)
            return outputs, self._log_det(t, inputs, outputs)
        outputs = t.inv(inputs)
        return outputs, -self._log_det(t, outputs, inputs)

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        t = self.bijection()
        to_noise = self.maps == "to_noise"
        inside = _inside(self._sides(t)[0], x)
        with self._explained(t, x):
            # Rows outside are replaced by a point inside (the image of the noise 0) before T
            # sees them, so that no NaN reaches the gradients; their results are then discarded.
            with torch.no_grad():
                origin = torch.zeros_like(x[:1])
                safe = t.inv(origin) if to_noise else t(origin)
            z, log_det = self._map(t, torch.where(inside[:, None], x, safe), to_noise)
        inside = inside & torch.isfinite(z).all(-1) & torch.isfinite(log_det)
        return z.masked_fill(~inside[:, None], 0.0), log_det.masked_fill(~inside, -math.inf)

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        t = self.bijection()
        noise_side = self._sides(t)[1]
        if not torch.compiler.is_compiling() and not bool(_inside(noise_side, z).all()):
            other = "to_data" if self.maps == "to_noise" else "to_noise"
            raise ValueError(
                f"noise values fall outside the noise side of {t!r} ({noise_side}), which "
                f"maps={self.maps!r} reads as the noise side: is it maps={other!r}?")
        with self._explained(t, z):
            return self._map(t, z, self.maps == "to_data")

    def extra_repr(self) -> str:
        return f"{self.fixed!r}, maps={self.maps!r}" if self.fixed is not None else (
            f"maps={self.maps!r}")


def _checked(transform: object) -> TorchTransform:
    """``transform`` if it is a bijection :class:`TorchBijection` can read, else the error."""
    if not isinstance(transform, TorchTransform):
        raise TypeError(f"'transform' should build a torch.distributions.Transform, got "
                        f"{type(transform).__name__}")
    if not transform.bijective:
        raise ValueError(f"'transform' should be a bijection (its .bijective is False): "
                         f"{transform!r}")
    event_dim = transform.domain.event_dim
    if event_dim not in (0, 1) or transform.codomain.event_dim != event_dim:
        raise ValueError(
            f"'transform' should act elementwise or on vectors (event_dim 0 or 1 on both "
            f"sides), got event_dim {event_dim} -> {transform.codomain.event_dim}")
    return transform


def _inside(support: torch.distributions.constraints.Constraint, values: Tensor) -> Tensor:
    """Which rows of ``values`` ``(N, D)`` lie in ``support``, ``(N,)``."""
    inside = support.check(values)
    return inside.all(-1) if support.event_dim == 0 else inside
