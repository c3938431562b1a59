"""Checks users can run on their own models: autoregressive structure, exact Jacobians, and the
transform protocol (:func:`check_transform`, for transforms of one's own)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn

from flowkit.validation import (
    check_int,
    check_permutation,
    check_transform_result,
    reference,
)


def jacobian(fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """Jacobian of ``fn`` at every row of ``x``: ``(N, out..., D)`` for ``x`` of shape
    ``(N, D)``, computed row by row with autograd: ``fn`` maps one row ``(D,)`` to its output.
    For a flowkit transform, which takes batches, wrap it as
    ``lambda row: transform(row[None])[0][0]``."""
    return torch.stack([torch.autograd.functional.jacobian(fn, row) for row in x])


def check_autoregressive(
    model: nn.Module,
    order: Tensor | None = None,
    context_features: int | None = None,
    samples: int = 3,
    seed: int = 0,
) -> None:
    """Assert that output ``d`` of ``model`` depends only on inputs before ``d`` in ``order``.

    The model maps ``(N, D)`` to ``(N, D)`` or ``(N, D, P)`` (a :class:`flowkit.MADE` does);
    with ``m = model.inputs_per_feature > 1`` (e.g. one-hot blocks) it maps ``(N, D, m)``, and
    output ``d`` must not depend on any of the ``m`` inputs of a later feature. The check
    differentiates every output with respect to every input (in float64, on a copy of the
    model, at ``samples`` random points; real-valued inputs, also in place of one-hot ones)
    and fails if any derivative that the ordering forbids is non-zero, naming the output and
    the input feature.

    Args:
        model: the network; called as ``model(x)`` or ``model(x, context)``.
        order: ``order[i]`` is the ``i``-th feature; defaults to ``model.order``.
        context_features: defaults to ``model.context_features`` (0 if absent).
        samples: number of random input points.
        seed: seed of the random points.

    Raises:
        AssertionError: if an output depends on an input at or after its own position.
    """
    samples = check_int("samples", samples, 1)
    seed = check_int("seed", seed, 0)
    if order is None and not hasattr(model, "order"):
        raise TypeError(
            f"'model' ({type(model).__name__}) has no 'order': pass order=. This checks a strictly "
            "autoregressive network (a MADE: output d sees inputs before d only); a flow layer, "
            "whose output d also sees input d, is checked with check_transform"
        )
    model = copy.deepcopy(model).double()
    order = check_permutation("order", model.order if order is None else order)
    if context_features is None:
        context_features = getattr(model, "context_features", 0)
    context_features = check_int("context_features", context_features, 0)
    features = order.numel()
    m = getattr(model, "inputs_per_feature", 1)
    feature_shape = (features,) if m == 1 else (features, m)
    position = torch.empty_like(order)
    position[order] = torch.arange(features)
    allowed = position[None, :] < position[:, None]  # allowed[d, j]: output d may see input j
    generator = torch.Generator().manual_seed(seed)
    ref = reference(model, floating=False)
    device = torch.device("cpu") if ref is None else ref.device
    x = torch.randn(samples, *feature_shape, generator=generator, dtype=torch.float64)
    x = x.to(device)
    context = torch.randn(samples, context_features, generator=generator, dtype=torch.float64)
    context = context.to(device)

    def fn(row: Tensor, c: Tensor) -> Tensor:
        out = model(row[None]) if context_features == 0 else model(row[None], c[None])
        return out[0].reshape(features, -1)

    for row, c in zip(x, context, strict=True):
        jac = torch.autograd.functional.jacobian(lambda r, c=c: fn(r, c), row)  # (D, P, D[, m])
        depends = (jac != 0).transpose(1, 2).flatten(2).any(-1).cpu()  # (D out, D in)
        bad = (depends & ~allowed).nonzero()
        if len(bad):
            d, j = bad[0].tolist()
            raise AssertionError(
                f"output {d} depends on input {j}, but input {j} is not before output {d} in "
                f"the ordering {order.tolist()} ({len(bad)} forbidden dependencies in all)"
            )


def check_transform(
    transform: nn.Module,
    x: Tensor,
    context: Tensor | None = None,
    atol: float = 1e-8,
) -> None:
    """Assert that ``transform`` follows flowkit's transform protocol at the rows of ``x``
    ``(N, D)``: ``forward`` and ``inverse`` return ``(y, log_det)`` with ``y`` of the input's
    shape and ``log_det`` ``(N,)``, ``inverse(forward(x)) = x``, the two log-determinants are
    opposite, and ``log_det`` is ``log|det dz/dx|`` computed by autograd. Runs in float64 and
    evaluation mode on a copy (a data-dependent initialisation is left as it is: set it first).

    Example:
        >>> import torch
        >>> from flowkit.transforms import Transform
        >>> class Cube(Transform):  # z = x + x^3 / 3 elementwise; its inverse by bisection
        ...     def _forward(self, x, context):
        ...         return x + x**3 / 3, torch.log1p(x**2).sum(-1)
        ...     def _inverse(self, z, context):
        ...         lo, hi = -torch.ones_like(z) * 10, torch.ones_like(z) * 10
        ...         for _ in range(100):
        ...             mid = (lo + hi) / 2
        ...             low = mid + mid**3 / 3 < z
        ...             lo, hi = torch.where(low, mid, lo), torch.where(low, hi, mid)
        ...         x = (lo + hi) / 2
        ...         return x, -torch.log1p(x**2).sum(-1)
        >>> check_transform(Cube(), torch.randn(5, 3))

    Args:
        transform: a :class:`flowkit.transforms.Transform`.
        x: the rows to check at.
        context: ``(N, C)`` for a transform that reads one.
        atol: tolerance of every comparison, in float64.

    Raises:
        AssertionError: naming what failed and by how much.
    """
    t = copy.deepcopy(transform).double().eval()
    x = x.detach().double()
    c = None if context is None else context.detach().double()
    name = type(transform).__name__

    def pair(method: str, result: object, given: Tensor) -> tuple[Tensor, Tensor]:
        try:
            return check_transform_result(transform, method, result, given)
        except ValueError as e:
            raise AssertionError(str(e)) from None

    z, log_det = pair("forward", t(x, c), x)
    back, log_det_inverse = pair("inverse", t.inverse(z, c), z)
    error = (back - x).abs().max().item()
    assert error <= atol * (1 + x.abs().max().item()), (
        f"{name}: inverse(forward(x)) differs from x by up to {error:.3g}")
    gap = (log_det + log_det_inverse).abs().max().item()
    assert gap <= atol * (1 + log_det.abs().max().item()), (
        f"{name}: the log-determinants of forward and inverse are not opposite (sums up to "
        f"{gap:.3g})")
    for i in range(len(x)):
        row_context = None if c is None else c[i : i + 1]
        jac = torch.autograd.functional.jacobian(
            lambda row, rc=row_context: t(row[None], rc)[0][0], x[i])
        expected = torch.linalg.slogdet(jac).logabsdet.item()
        got = log_det[i].item()
        assert abs(got - expected) <= atol * (1 + abs(expected)), (
            f"{name}: log_det of row {i} is {got:.10g}, autograd's log|det dz/dx| is "
            f"{expected:.10g}")

