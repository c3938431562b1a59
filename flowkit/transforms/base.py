"""The transform protocol, composition and inversion.

Direction convention (used everywhere in flowkit)
-------------------------------------------------
``forward`` is the *normalizing* direction, data ``x`` to noise ``z``::

    z, log_det = transform(x, context)          # log_det = log|det dz/dx|, shape (N,)
    x, log_det_inv = transform.inverse(z, context)  # log_det_inv = log|det dx/dz|

so that ``log p(x) = log p_base(z) + log|det dz/dx|``. A MAF layer is cheap in ``forward``
(density), an IAF layer is cheap in ``inverse`` (sampling). pyro, TFP, FlowJAX and normflows use
the opposite naming; nflows and zuko use this one.

All transforms act on 2-D tensors: ``x`` of shape ``(N, features)``, ``context`` of shape
``(N, context_features)`` or ``None``. :class:`flowkit.Flow` validates user input and reshapes it;
transforms trust their caller.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn


class Transform(nn.Module):
    """A bijection ``x -> z`` with a tractable log-Jacobian determinant.

    Subclasses implement :meth:`forward` and :meth:`inverse`. A transform that reads a context
    vector sets ``context_features`` to its width; all others leave it at 0.
    """

    context_features: int = 0

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Data to noise. ``x``: ``(N, D)``. Returns ``z``: ``(N, D)`` and
        ``log|det dz/dx|``: ``(N,)``."""
        raise NotImplementedError

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Noise to data. ``z``: ``(N, D)``. Returns ``x``: ``(N, D)`` and
        ``log|det dx/dz|``: ``(N,)``."""
        raise NotImplementedError


class Compose(Transform):
    """Apply transforms in order: ``forward`` runs ``transforms[0]`` first (on the data side),
    ``inverse`` runs them in reverse. Log-determinants add up."""

    def __init__(self, transforms: Iterable[Transform]):
        super().__init__()
        self.transforms = nn.ModuleList(transforms)
        widths = {t.context_features for t in self.transforms} - {0}
        if len(widths) > 1:
            raise ValueError(
                "'transforms' should agree on context_features (or have 0), got "
                f"{sorted(widths)}"
            )
        self.context_features = widths.pop() if widths else 0

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        total = x.new_zeros(x.shape[0])
        for t in self.transforms:
            x, log_det = t(x, context)
            total = total + log_det
        return x, total

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        total = z.new_zeros(z.shape[0])
        for t in reversed(self.transforms):
            z, log_det = t.inverse(z, context)
            total = total + log_det
        return z, total


class Inverse(Transform):
    """Swap the two directions of a transform (e.g. turn a MAF layer into an IAF-like one)."""

    def __init__(self, transform: Transform):
        super().__init__()
        self.transform = transform
        self.context_features = transform.context_features

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.transform.inverse(x, context)

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.transform(z, context)


class Permutation(Transform):
    """Reorder features: ``z = x[:, permutation]``; log-determinant 0.

    Args:
        permutation: a permutation of ``range(features)``.
    """

    def __init__(self, permutation: Tensor | list[int]):
        super().__init__()
        permutation = torch.as_tensor(permutation, dtype=torch.long)
        features = permutation.numel()
        if permutation.dim() != 1 or not torch.equal(
            permutation.sort().values, torch.arange(features)
        ):
            raise ValueError(
                f"'permutation' should be a permutation of range({features}), got "
                f"{permutation.tolist()}"
            )
        self.register_buffer("permutation", permutation)
        self.register_buffer("inverse_permutation", torch.argsort(permutation))

    @classmethod
    def reverse(cls, features: int) -> Permutation:
        """The permutation ``D-1, ..., 0``."""
        return cls(torch.arange(features - 1, -1, -1))

    @classmethod
    def random(cls, features: int, seed: int) -> Permutation:
        """A uniformly random permutation drawn from ``seed`` (independent of the global RNG)."""
        generator = torch.Generator().manual_seed(seed)
        return cls(torch.randperm(features, generator=generator))

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return x[:, self.permutation], x.new_zeros(x.shape[0])

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return z[:, self.inverse_permutation], z.new_zeros(z.shape[0])

    def extra_repr(self) -> str:
        return f"permutation={self.permutation.tolist()}"
