r"""Autoregressive flow layers: a MADE conditioner plus an elementwise transformer.

With ``tau(.; theta)`` monotonic (see :mod:`flowkit.transforms.elementwise`), a layer maps data
``x`` to noise ``z`` feature by feature, ``z_d = tau(x_d; theta_d)``. What the conditioner
reads decides which direction is cheap:

* **MAF** (Papamakarios et al. 2017): ``theta_d = MADE(x)_d`` reads the *data*.
  ``forward`` (density) is one MADE pass; ``inverse`` (sampling) solves for ``x`` one feature
  at a time, ``D`` passes with the reference solver.
* **IAF** (Kingma et al. 2016): ``theta_d = MADE(z)_d`` reads the *noise*.
  ``inverse`` (sampling) is one pass; ``forward`` (density of a point the flow did not sample)
  solves for ``z`` one feature at a time.

In both cases the Jacobian ``dz/dx`` is triangular in the ordering, so
``log|det dz/dx| = sum_d log|tau'(x_d; theta_d)|``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from flowkit.nn.inversion import solve_with_params
from flowkit.nn.made import MADE
from flowkit.transforms.base import Transform
from flowkit.transforms.elementwise import Affine, Transformer
from flowkit.validation import check_bool

Direction = Literal["maf", "iaf"]


class MaskedAutoregressive(Transform):
    """An autoregressive layer in the MAF or IAF direction.

    Args:
        made: the conditioner; its ``params_per_feature`` must equal the transformer's.
        transformer: e.g. :class:`flowkit.transforms.Affine` or
            :class:`flowkit.transforms.RationalQuadraticSpline`.
        direction: ``"maf"`` (cheap density) or ``"iaf"`` (cheap sampling).
        identity_init: zero the conditioner's output layer so the layer starts as the identity.
    """

    def __init__(
        self,
        made: MADE,
        transformer: Transformer,
        direction: Direction = "maf",
        identity_init: bool = True,
    ):
        super().__init__()
        if made.params_per_feature != transformer.params_per_feature:
            raise ValueError(
                f"'made' gives {made.params_per_feature} parameters per feature but the "
                f"transformer {transformer!r} needs {transformer.params_per_feature}"
            )
        if direction not in ("maf", "iaf"):
            raise ValueError(f"'direction' should be 'maf' or 'iaf', got {direction!r}")
        check_bool("identity_init", identity_init)
        self.made = made
        self.transformer = transformer
        self.direction = direction
        self.features = made.features
        self.context_features = made.context_features
        if identity_init:
            with torch.no_grad():
                made.output.weight.zero_()
                made.output.bias.zero_()
                if made.direct is not None:
                    made.direct.weight.zero_()

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        forward = self.transformer.forward
        z, log_det = forward(x, self._params(x, context, self.direction == "maf", forward))
        return z, log_det.sum(-1)

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        inverse = self.transformer.inverse
        x, log_det = inverse(z, self._params(z, context, self.direction == "iaf", inverse))
        return x, log_det.sum(-1)

    def _params(
        self,
        y: Tensor,
        context: Tensor | None,
        cheap: bool,
        step: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    ) -> Tensor:
        """The transformer's parameters ``(N, D, P)`` for mapping ``y`` ``(N, D)`` with
        ``step`` (the transformer's ``forward`` or ``inverse``). ``cheap``: the MADE reads ``y``,
        one pass. Otherwise it reads the result of ``step``, which is solved for one feature at
        a time; the solver also returns the MADE's outputs at the solution, the parameters."""
        if cheap:
            return self.made._forward(y, context)
        column = _column_reader(y)
        _, params = solve_with_params(
            self.made, lambda p, i: step(column(i), p)[0], y, context, check=False
        )
        return params

    def extra_repr(self) -> str:
        return f"direction={self.direction!r}, transformer={self.transformer!r}"


def _column_reader(t: Tensor) -> Callable[[Tensor], Tensor]:
    """``column(i)``: the columns ``i`` ``(m,)`` of ``t`` ``(N, D)``, ``(N, m)``, read from a
    transposed copy made once, where each is a contiguous row (a solver step reads one column
    per step; gathering it from the rows of ``t`` touches a cache line per row)."""
    rows = t.t().contiguous()
    return lambda i: rows.index_select(0, i).t()


class MaskedAffineAutoregressive(MaskedAutoregressive):
    r"""The layer of the MAF and IAF papers: :class:`MaskedAutoregressive` with the
    :class:`flowkit.transforms.Affine` transformer, ``z_d = (x_d - \mu_d) e^{-\alpha_d}`` with
    ``(\mu_d, \alpha_d)`` from the MADE. A shorthand (nflows has a class of this name): it is
    ``MaskedAutoregressive(made, Affine(log_scale_bound), direction, identity_init)``, which
    the builders make.

    Args:
        made: the conditioner, with ``params_per_feature=2``.
        direction: ``"maf"`` (cheap density) or ``"iaf"`` (cheap sampling).
        log_scale_bound: bound of the log-scale, see :class:`flowkit.transforms.Affine`.
        identity_init: as :class:`MaskedAutoregressive`.

    Example:
        >>> layer = MaskedAffineAutoregressive(MADE(3, (16,), params_per_feature=2), "iaf")
        >>> z, log_det = layer(torch.randn(4, 3))
        >>> z.shape, log_det.shape
        (torch.Size([4, 3]), torch.Size([4]))
    """

    def __init__(
        self,
        made: MADE,
        direction: Direction = "maf",
        log_scale_bound: float = 3.0,
        identity_init: bool = True,
    ):
        super().__init__(made, Affine(log_scale_bound), direction, identity_init)
