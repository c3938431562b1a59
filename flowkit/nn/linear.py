"""The masked linear layer of MADE: ``y = x (W * M)^T + b`` with a cached product."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flowkit.nn.optimizer_steps import steps_of
from flowkit.nn.scratch import has_storage
from flowkit.validation import check_bool, check_int


class MaskedLinear(nn.Linear):
    r"""A linear layer ``y = x (W \odot M)^T + b`` with a fixed binary mask ``M``.

    The mask is a floating-point buffer of shape ``(out_features, in_features)``: it follows
    ``.to(device/dtype)`` and is saved in the ``state_dict``.

    Without autograd (under ``torch.no_grad()`` or ``torch.inference_mode()``, or with a frozen
    weight) the product ``W \odot M`` is cached (:meth:`masked_weight`), so evaluation and
    sampling do the arithmetic of a dense layer and nothing else. The cache is dropped when the
    weight or the mask changes: in-place writes (``set_mask``, ``load_state_dict``,
    ``nn.init``, optimizers) are seen through the tensors' version counters, fused optimizers
    (which write without bumping them) through a count of the ``torch.optim`` steps whose
    parameters include the weight (steps of other models' optimizers keep it), ``.to()`` and
    reassignment through the storage. A forward pass with autograd drops it too. Writes through
    ``weight.data`` (the soft target update of SAC code, ``tp.data.copy_(tau * p.data + ...)``,
    an EMA, a re-initialisation) bump no counter: they are seen by comparing up to
    :data:`FINGERPRINT` entries of the weight, spread over the unmasked ones, with their values
    when the product was cached, which catches every update that moves the weights as a whole.
    After writing only a few entries through ``weight.data``, call :meth:`clear_cache`, or
    :func:`flowkit.nn.clear_caches` for every masked layer of a model.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        in_features = check_int("in_features", in_features, 1)
        out_features = check_int("out_features", out_features, 1)
        super().__init__(in_features, out_features, check_bool("bias", bias))
        self.register_buffer("mask", torch.ones(out_features, in_features))
        self._cache: _Cache | None = None

    def set_mask(self, mask: Tensor) -> None:
        """Copy ``mask`` into the mask buffer (keeping its dtype and device).

        Args:
            mask: binary, shape ``(out_features, in_features)`` like :attr:`weight`: a ``bool``
                tensor, or numbers that are all 0 or 1 (checked, which reads the values back
                from the device: pass ``bool`` masks on hot paths).
        """
        if mask.shape != self.weight.shape:
            raise ValueError(
                f"'mask' should have shape {tuple(self.weight.shape)} (out_features, "
                f"in_features), got {tuple(mask.shape)}"
            )
        if mask.dtype != torch.bool and not ((mask == 0) | (mask == 1)).all():
            raise ValueError("'mask' should be binary (bool, or all entries 0 or 1)")
        self.mask.copy_(mask)

    def clear_cache(self) -> None:
        """Forget the cached ``W * M`` (needed only after writes through ``weight.data``)."""
        self._cache = None

    def cached(self) -> object | None:
        """The cached ``W * M`` with what identified ``W`` and ``M`` then (one object, the same
        for as long as the cache is valid), or None (see :mod:`flowkit.nn.caches`)."""
        return self._cache

    def cache_key(self) -> tuple[int, ...] | None:
        """What identifies the current ``W`` and ``M``: storage addresses, version counters and
        the number of ``torch.optim`` steps that updated ``W`` so far; None for tensors without
        storage (inside ``torch.func`` transforms), which are never cached."""
        if not (has_storage(self.weight) and has_storage(self.mask)):
            return None
        return (self.weight.data_ptr(), self.mask.data_ptr(), self.weight._version,
                self.mask._version,
                steps_of(self.weight))

    def masked_weight(self) -> Tensor:
        r"""``W \odot M``, shape ``(out_features, in_features)``; cached when no gradient is
        needed (see the class docstring)."""
        if torch.compiler.is_compiling():
            return self.weight * self.mask
        if torch.is_grad_enabled() and self.weight.requires_grad:
            self._cache = None
            return self.weight * self.mask
        state = self.cache_key()
        cache = self._cache
        if (
            cache is not None
            and cache.state == state
            and (torch.is_inference_mode_enabled() or not cache.product.is_inference())
            and (self._capturing() or torch.equal(torch.take(self.weight.detach(), cache.where),
                                                  cache.values))
        ):
            return cache.product
        with torch.no_grad():
            product = self.weight * self.mask
            where = _spread(self.mask)
            values = torch.take(self.weight.detach(), where)
        # The cache holds W and M themselves so that their storage cannot be freed and reused
        # at the same address while the cache lives.
        keep = (self.weight.detach(), self.mask)
        self._cache = None if state is None else _Cache(state, product, keep, where, values)
        return product

    def _capturing(self) -> bool:
        """Whether a CUDA graph that reads this layer is being recorded
        (:class:`flowkit.GraphedSampler`): reading the fingerprint back to the host is not
        allowed then, and the cache is trusted on its state alone (the sampler checks the
        weights' state before each replay)."""
        return self.weight.is_cuda and torch.cuda.is_current_stream_capturing()

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.masked_weight(), self.bias)

    def _apply(self, fn, recurse=True):  # .to(), .double(), .cuda(), ...: drop the cache
        self._cache = None
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:  # pickling and deepcopy leave the cache behind
        state = self.__dict__.copy()
        state["_cache"] = None
        return state


FINGERPRINT = 64
"""Entries of the weight compared on each use of a cached product (see :class:`MaskedLinear`)."""


class _Cache(NamedTuple):
    """A cached ``W * M``: what identified ``W`` and ``M`` then (:meth:`MaskedLinear.cache_key`),
    the product, the tensors it was made from, and :data:`FINGERPRINT` entries of ``W``
    (flat positions ``where``, their ``values`` then)."""

    state: tuple[int, ...]
    product: Tensor
    keep: tuple[Tensor, Tensor]
    where: Tensor
    values: Tensor


def _spread(mask: Tensor) -> Tensor:
    """Flat positions of up to :data:`FINGERPRINT` unmasked entries, spread evenly (masked-out
    entries get no gradient, so an update through ``.data`` may leave them as they were)."""
    unmasked = mask.flatten().nonzero().squeeze(1)
    if unmasked.numel() <= FINGERPRINT:
        return unmasked
    pick = torch.linspace(0, unmasked.numel() - 1, FINGERPRINT, device=mask.device)
    return unmasked[pick.round().long()]


