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
``(N, context_features)`` or ``None``.

Checks happen once, where input enters. ``forward`` and ``inverse`` are the checked entry
points for a user who calls a transform directly: they check the type, width, dtype and device
of ``x`` (or ``z``) and of the context (no values are read), then call ``_forward`` /
``_inverse``, the unchecked implementations that subclasses write. Composite transforms
(:class:`Compose`, :class:`Inverse`) and :class:`flowkit.Flow` (which checks user input itself,
NaN included, and reshapes it) call the unchecked methods of the transforms inside them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.distributions import constraints

from flowkit.checkpoint import InvalidBuffer, register_check
from flowkit.validation import (
    check_context,
    check_int,
    check_permutation,
    check_transform_result,
    check_width,
    is_permutation,
    reference,
)


def float32_if_half(dtype: torch.dtype) -> torch.dtype:
    """The dtype a transform computes in for values of ``dtype``: float32 for float16 and
    bfloat16 (which some CPU kernels lack, and whose resolution some steps lack), else
    ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class Transform(nn.Module):
    """A bijection ``x -> z`` with a tractable log-Jacobian determinant.

    Subclasses implement ``_forward(x, context)`` and ``_inverse(z, context)``, each returning
    the output and the log-determinant ``(N,)``: :meth:`forward` and :meth:`inverse` check
    their input and call them, and :class:`Compose` and :class:`flowkit.Flow`, which check
    once, call them directly. A transform that reads a context vector sets
    ``context_features`` to its width; all others leave it at 0. A transform that acts on a
    fixed number of features sets ``features`` (:class:`flowkit.Flow` checks it against its
    base distribution); one that acts on any width leaves it at ``None``.
    """

    context_features: int = 0
    features: int | None = None

    @property
    def data_support(self) -> constraints.Constraint:
        """Where the data side's rows may lie (``event_dim`` 1): ``R^D`` unless the transform
        maps a smaller set (:class:`~flowkit.transforms.Logit`'s box); rows outside have
        log-density ``-inf`` in a flow that starts with it (:attr:`flowkit.Flow.support`)."""
        return constraints.real_vector

    def forward(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Data to noise, checked. ``x``: ``(N, D)``. Returns ``z``: ``(N, D)`` and
        ``log|det dz/dx|``: ``(N,)``."""
        return self._forward(*self._check("x", x, context))

    def inverse(self, z: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Noise to data, checked. ``z``: ``(N, D)``. Returns ``x``: ``(N, D)`` and
        ``log|det dx/dz|``: ``(N,)``."""
        return self._inverse(*self._check("z", z, context))

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        """:meth:`forward` on input its caller checked."""
        raise NotImplementedError(self._missing("_forward", "forward"))

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        """:meth:`inverse` on input its caller checked."""
        raise NotImplementedError(self._missing("_inverse", "inverse"))

    def _missing(self, method: str, public: str) -> str:
        """Why ``method`` is missing, for the error: a subclass written as nflows' are, with
        ``forward``/``inverse`` overridden, is told where its code goes."""
        name = type(self).__name__
        if getattr(type(self), public) is not getattr(Transform, public):
            return (f"{name} overrides {public}(), but flowkit calls {method}(x, context) -> "
                    f"(y, log_det) inside flows and Compose ({public}() checks the input, then "
                    f"calls {method}()): rename {name}.{public} to {method} (docs/flows.md, "
                    "'Writing a transform')")
        return (f"{name} should implement {method}(x, context) -> (y, log_det) (docs/flows.md, "
                "'Writing a transform')")

    def _check(self, name: str, x: object, context: object) -> tuple[Tensor, Tensor | None]:
        """A direct call's input: ``x`` ``(N, features)`` (any width when ``features`` is
        None) and the context, with the dtype and device of the transform's floating-point
        parameters (if it has any). Reads no values."""
        like = reference(self)
        x = check_width(name, x, self.features, like)
        return x, check_context(context, self.context_features, x.shape[:1], like)


class Compose(Transform):
    """Apply transforms in order: ``forward`` runs ``transforms[0]`` first (on the data side),
    ``inverse`` runs them in reverse. Log-determinants add up. The transforms must agree on
    ``features`` and on ``context_features`` (where they fix them)."""

    def __init__(self, transforms: Iterable[Transform]):
        super().__init__()
        if isinstance(transforms, Transform) or not isinstance(transforms, Iterable):
            raise TypeError(
                "'transforms' should be a list of flowkit Transforms, e.g. Compose([t1, t2]), "
                f"got {type(transforms).__name__}"
            )
        transforms = list(transforms)
        for i, t in enumerate(transforms):
            if not isinstance(t, Transform):
                raise TypeError(
                    f"'transforms[{i}]' should be a flowkit Transform, got {type(t).__name__}"
                )
        self.transforms = nn.ModuleList(transforms)
        self.context_features = _common(self.transforms, "context_features", 0)
        self.features = _common(self.transforms, "features", None)

    @property
    def data_support(self) -> constraints.Constraint:
        """The first transform's (the one that reads the data)."""
        return self.transforms[0].data_support if len(self.transforms) else constraints.real_vector

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        total = None
        for t in self.transforms:
            x, log_det = check_transform_result(t, "_forward", t._forward(x, context), x)
            total = log_det if total is None else total + log_det
        return x, x.new_zeros(x.shape[0]) if total is None else total

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        total = None
        for t in reversed(self.transforms):
            z, log_det = check_transform_result(t, "_inverse", t._inverse(z, context), z)
            total = log_det if total is None else total + log_det
        return z, z.new_zeros(z.shape[0]) if total is None else total


def _common(transforms: Iterable[Transform], name: str, unset: int | None) -> int | None:
    """The one value of attribute ``name`` among ``transforms`` that set it (not ``unset``),
    or ``unset`` if none does; an error if they disagree."""
    values = {getattr(t, name) for t in transforms} - {unset}
    if len(values) > 1:
        raise ValueError(
            f"'transforms' should agree on {name} (or have {unset}), got {sorted(values)}"
        )
    return values.pop() if values else unset


class Inverse(Transform):
    """Swap the two directions of a transform (e.g. turn a MAF layer into an IAF-like one)."""

    def __init__(self, transform: Transform):
        super().__init__()
        if not isinstance(transform, Transform):
            raise TypeError(
                f"'transform' should be a flowkit Transform, got {type(transform).__name__}")
        self.transform = transform
        self.context_features = transform.context_features
        self.features = transform.features

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        return self.transform._inverse(x, context)

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        return self.transform._forward(z, context)


class Permutation(Transform):
    """Reorder features: ``z = x[:, permutation]``; log-determinant 0.

    Args:
        permutation: a permutation of ``range(features)``: integers, e.g. ``[2, 0, 1]``
            (copied).
    """

    def __init__(self, permutation: Tensor | Sequence[int]):
        super().__init__()
        given = check_permutation("permutation", permutation)
        self.features = given.numel()
        self.register_buffer("permutation", given.clone())
        self.register_buffer("inverse_permutation", torch.argsort(self.permutation))

    @classmethod
    def reverse(cls, features: int) -> Permutation:
        """The permutation ``D-1, ..., 0``."""
        features = check_int("features", features, 1)
        return cls(torch.arange(features - 1, -1, -1))

    @classmethod
    def random(cls, features: int, seed: int) -> Permutation:
        """A uniformly random permutation drawn from ``seed`` (independent of the global RNG)."""
        features = check_int("features", features, 1)
        generator = torch.Generator().manual_seed(check_int("seed", seed, 0))
        return cls(torch.randperm(features, generator=generator))

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        return x.index_select(1, self.permutation), x.new_zeros(x.shape[0])

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        return z.index_select(1, self.inverse_permutation), z.new_zeros(z.shape[0])

    def extra_repr(self) -> str:
        return f"permutation={self.permutation.tolist()}"


@register_check(Permutation)
def _check_stored_permutation(module: Permutation) -> None:
    """Refuse stored buffers that no :class:`Permutation` has: ``permutation`` must be a
    permutation and ``inverse_permutation`` its inverse."""
    if not is_permutation(module.permutation):
        raise InvalidBuffer("permutation", "a permutation of range(features)")
    if not torch.equal(module.inverse_permutation, module.permutation.argsort()):
        raise InvalidBuffer("inverse_permutation", "the inverse of 'permutation'")
