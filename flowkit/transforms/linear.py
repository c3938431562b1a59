r"""``LULinear``: a learned invertible linear map, ``z = W x + b`` with ``W = L U``.

Autoregressive layers separated by fixed permutations mix features only through the order in
which the layers read them; a learned linear map between them lets the flow rotate and shear
its features too (Kingma and Dhariwal's 1x1 convolutions in "Glow", 2018; the ``LULinear`` of
nflows and sbi's neural spline flows).

``W`` is kept in its LU factorization, which makes both directions and the log-determinant
cheap and exact: ``L`` is lower triangular with ones on its diagonal and ``U`` upper triangular
with a positive diagonal ``exp(log_diagonal)``, so ``det W = prod exp(log_diagonal) > 0`` and

.. math::

    \log |\det \partial z / \partial x| = \sum_d \mathrm{log\_diagonal}_d,

the same for every row. ``inverse`` solves the two triangular systems (no matrix inverse is
formed). Every invertible matrix of positive determinant is ``P L U`` for some permutation
``P``; put a :class:`~flowkit.transforms.Permutation` before this transform for the ``P``.
At construction ``W`` is the identity and ``b = 0``, so a flow starts as it would without it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from flowkit.transforms.base import Transform, float32_if_half
from flowkit.validation import check_int


class LULinear(Transform):
    r"""``z = x W^T + b``, ``W = L U`` (see the module notes), learned.

    Args:
        features: ``D``.

    Parameters: ``lower`` ``(D, D)`` (its part below the diagonal is ``L``'s), ``upper``
    ``(D, D)`` (its part above the diagonal is ``U``'s), ``log_diagonal`` ``(D,)`` (``U``'s
    diagonal is its exponential), ``bias`` ``(D,)``. The entries of ``lower`` and ``upper`` on
    and beyond the diagonal are not read (their gradients are zero).

    ``forward``: ``x`` ``(N, D)`` to ``z = x W^T + b``, ``log|det dz/dx| = sum(log_diagonal)``
    for every row. ``inverse``: ``x = (z - b) W^{-T}`` by two triangular solves,
    ``log|det dx/dz| = -sum(log_diagonal)``.

    Example:
        >>> import torch
        >>> t = LULinear(3)
        >>> x = torch.randn(4, 3)
        >>> z, log_det = t(x)              # the identity at construction
        >>> torch.equal(z, x), log_det.tolist()
        (True, [0.0, 0.0, 0.0, 0.0])
    """

    def __init__(self, features: int):
        super().__init__()
        self.features = check_int("features", features, 1)
        d = self.features
        self.lower = nn.Parameter(torch.zeros(d, d))
        self.upper = nn.Parameter(torch.zeros(d, d))
        self.log_diagonal = nn.Parameter(torch.zeros(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def factors(self) -> tuple[Tensor, Tensor]:
        """``(L, U)``, each ``(D, D)``: ``L`` unit lower triangular, ``U`` upper triangular
        with diagonal ``exp(log_diagonal)``."""
        eye = torch.eye(self.features, dtype=self.lower.dtype, device=self.lower.device)
        return torch.tril(self.lower, -1) + eye, self._upper()

    def _upper(self) -> Tensor:
        return torch.triu(self.upper, 1) + torch.diag(torch.exp(self.log_diagonal))

    def weight(self) -> Tensor:
        """``W = L U = U + L' U`` with ``L'`` the part of ``L`` below the diagonal, ``(D, D)``."""
        upper = self._upper()
        return torch.addmm(upper, torch.tril(self.lower, -1), upper)

    def _log_det(self, x: Tensor) -> Tensor:
        return self.log_diagonal.sum().expand(x.shape[0])

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        if x.shape[0] >= self.features:  # form W once: D^3 + N D^2 multiply-adds
            return torch.addmm(self.bias, x, self.weight().T), self._log_det(x)
        # fewer rows than features: x W^T = y + y L'^T with y = x U^T, 2 N D^2 (at D = 784 a
        # single row through W took 28x as long as the MAF without the maps)
        y = x @ self._upper().T
        return torch.addmm(y + self.bias, y, torch.tril(self.lower, -1).T), self._log_det(x)

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        # x W^T = z - b with W^T = U^T L^T: solve y L^T = z - b, then x U^T = y (L's unit
        # diagonal is implied by unitriangular=True, which reads no diagonal). The solves have
        # no float16/bfloat16 kernels on the CPU: those run in float32.
        dtype, compute = z.dtype, float32_if_half(z.dtype)
        y = torch.linalg.solve_triangular(
            torch.tril(self.lower, -1).T.to(compute), (z - self.bias).to(compute), upper=True,
            left=False, unitriangular=True,
        )
        x = torch.linalg.solve_triangular(self._upper().T.to(compute), y, upper=False, left=False)
        return x.to(dtype), -self._log_det(z)

    def extra_repr(self) -> str:
        return f"features={self.features}"
