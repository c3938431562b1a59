"""Batch sources for the fit loop: in-memory arrays, DataLoaders, sampling functions, and the
flow's own samples (reverse KL).

Each source hands out the batch of *this process* for a given step and can save and restore its
position, so that a resumed run sees exactly the batches an uninterrupted run would have seen.

* :class:`TensorSource`: the dataset lives on the training device. Epoch ``e`` visits the rows in
  the order ``randperm(N)`` drawn from a generator seeded by ``(seed, e)``; step ``t`` of the
  epoch takes the ``t``-th block of ``batch_size`` rows (the last ``N % batch_size`` rows of the
  permutation are skipped). Under ``torchrun`` process ``r`` of ``W`` takes the ``r``-th
  ``1/W`` of that block, so the global batch is the same for any number of processes. The
  position is a function of the step, so there is no state to save.
* :class:`LoaderSource`: a user's :class:`~torch.utils.data.DataLoader`. To resume mid-epoch it
  records the random state at the start of each epoch, re-creates the epoch's iterator from it and
  skips the batches already used.
* :class:`SamplerSource`: a function ``sample(n, generator) -> x`` or ``-> (x, context)`` that
  draws fresh data every step from a per-process :class:`torch.Generator` on the training device.
* :class:`ReverseKLSource`: no data; each step the flow draws its own samples, and the source
  says how many.

The data they hand out are converted and checked by :mod:`flowkit.train.arrays`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from ..validation import ArgumentError, Mention, check_batch_context
from .arrays import Batch, as_batch, as_tensor, loader_batch, split_pair
from .distributed import Dist


def derive_seed(*keys: int) -> int:
    """A well-mixed 63-bit seed from integer keys (e.g. ``(seed, epoch)`` or ``(seed, rank)``)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1, np.uint64)[0] >> np.uint64(1))


def local_batch_size(batch_size: int, dist: Dist) -> int:
    """This process's share of the global ``batch_size``."""
    if batch_size % dist.world_size:
        raise ValueError(
            f"'batch_size' ({batch_size}) should be divisible by the number of processes "
            f"({dist.world_size})"
        )
    return batch_size // dist.world_size


class TensorSource:
    """Shuffled mini-batches of an in-memory dataset (see the module docstring)."""

    def __init__(self, data: Batch, batch_size: int, seed: int, dist: Dist,
                 holdout: float | str | None = None):
        self.x, self.c = data
        self.holdout = holdout  # fit's valid: the fraction of the rows held out, or "auto"
        n = self.x.shape[0]
        if batch_size > n:
            raise ValueError(
                f"'batch_size' ({batch_size}) exceeds the number of training rows ({n}); "
                f"use batch_size <= {n}"
            )
        self.batch_size, self.seed, self.dist = batch_size, seed, dist
        self.batches_per_epoch = n // batch_size
        self.local = local_batch_size(batch_size, dist)
        self._epoch, self._perm = -1, self.x.new_empty(0, dtype=torch.long)
        self._fingerprint: Tensor | None = None

    def next_batch(self, step: int) -> Batch:
        epoch, i = divmod(step, self.batches_per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
            self._perm = torch.randperm(self.x.shape[0], generator=g).to(self.x.device)
            self._epoch = epoch
        start = i * self.batch_size + self.dist.rank * self.local
        idx = self._perm[start : start + self.local]
        return self.x[idx], None if self.c is None else self.c[idx]

    def state_dict(self) -> dict[str, Any]:
        """No position to keep (the order follows from the seed and step), but what identifies
        the data, for a resumed run to check against: rows, batch size, a fingerprint and the
        fraction held out for validation."""
        if self._fingerprint is None:
            self._fingerprint = _fingerprint(self.x, self.c)
        return {"rows": self.x.shape[0], "batch_size": self.batch_size,
                "fingerprint": self._fingerprint, "holdout": self.holdout}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        if "rows" not in state:  # written before these were recorded
            return
        rows = self.x.shape[0]
        if state["rows"] == rows and torch.allclose(
            state["fingerprint"], self.state_dict()["fingerprint"], rtol=1e-6, atol=1e-9
        ):  # the same training rows, however valid named them (0.1 or "auto")
            check_same_batch_size(state, self.batch_size)
            return
        # other rows: say why first (the default batch size follows the rows)
        if state.get("holdout", self.holdout) != self.holdout:
            raise ArgumentError(
                "valid", "the checkpoint was trained on ", *_held_out(state["holdout"]),
                ", this run on ", *_held_out(self.holdout), ": other rows train; pass ",
                Mention("valid", state["holdout"]), " to resume it",
            )
        raise ArgumentError(
            "data", Mention("data"), f" ({rows} rows) is not the data the checkpoint was "
            f"trained on ({state['rows']} rows"
            + (")" if state["rows"] != rows else ", other values)")
            + ": resume with the same data, or start a new run in another ",
            Mention("checkpoint_dir"),
        )


def _held_out(holdout: float | str | None) -> tuple[str | Mention, ...]:
    """Which rows of ``data`` train, for a message: ``'data' less valid=0.1``, ``'data' less
    what valid='auto' holds out``, or all."""
    if holdout is None:
        return ("all of ", Mention("data"))
    if holdout == "auto":
        return (Mention("data"), " less what ", Mention("valid", holdout), " holds out")
    return (Mention("data"), " less ", Mention("valid", holdout))


def _fingerprint(x: Tensor, c: Tensor | None) -> Tensor:
    """Per-column sums and sums of squares of ``x`` (and of ``c``), in float64 on the CPU: the
    same for the same rows in any order, different for other values. By chunks of rows, so
    no float64 copy of the whole data is made."""
    sums = []
    for t in (x, c):
        if t is not None:
            chunks = [(d.sum(0), d.square().sum(0))
                      for d in (b.double() for b in t.split(8192))]
            sums += [sum(a for a, _ in chunks), sum(q for _, q in chunks)]
    return torch.cat(sums).cpu()


def check_same_batch_size(state: dict[str, Any], batch_size: int) -> None:
    """Refuse to resume a run written with another batch size (recorded as ``batch_size``; a
    state without it, written before it was recorded, passes)."""
    if state.get("batch_size", batch_size) != batch_size:
        raise ArgumentError(
            "batch_size", Mention("batch_size"), f" is {batch_size} but the checkpoint was "
            f"trained with batches of {state['batch_size']}; pass ",
            Mention("batch_size", state["batch_size"]), " to resume it",
        )


def _check_signature(name: str, sample: Callable[..., Any], n: int) -> None:
    """Refuse a sampling function that cannot be called as ``sample(n, generator)``."""
    try:
        signature = inspect.signature(sample)
    except (TypeError, ValueError):  # no signature to read (a builtin): let the call decide
        return
    try:
        signature.bind(n, None)
    except TypeError:
        raise TypeError(
            f"'{name}', a sampling function, should have the signature sample(n, generator): "
            "it is called with the number of rows and a torch.Generator to draw them from, "
            f"but its signature is {signature}"
        ) from None


class SamplerSource:
    """Fresh samples every step from ``sample(n, generator)`` (see the module docstring)."""

    batches_per_epoch = None

    def __init__(
        self,
        sample: Callable[[int, torch.Generator], Any],
        batch_size: int,
        seed: int,
        dist: Dist,
        device: torch.device,
        dtype: torch.dtype,
    ):
        _check_signature("data", sample, batch_size)
        self.sample, self.device, self.dtype = sample, device, dtype
        self.batch_size, self.local = batch_size, local_batch_size(batch_size, dist)
        self.generator = torch.Generator(device=device).manual_seed(derive_seed(seed, dist.rank))

    def next_batch(self, step: int) -> Batch:
        x, c = as_batch("data", *split_pair("data", self.sample(self.local, self.generator)),
                        self.device, self.dtype)
        if x.dim() == 0 or x.shape[0] != self.local:
            raise ValueError(
                f"'data', a sampling function, should return {self.local} rows when asked for "
                f"n={self.local}, got shape {tuple(x.shape)}"
            )
        return x, c

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        check_same_batch_size(state, self.batch_size)
        self.generator.set_state(state["generator"])


def _generators(loader: DataLoader) -> list[torch.Generator]:
    """The generators a DataLoader's iterator draws from, besides torch's global one."""
    gens = [loader.generator, getattr(loader.sampler, "generator", None)]
    return [g for i, g in enumerate(gens) if g is not None and g not in gens[:i]]


def first_batch(name: str, loader: DataLoader, device: torch.device, dtype: torch.dtype) -> Batch:
    """The first batch of ``loader`` as :func:`as_batch` makes it, for checks before training.

    Every random state the iterator draws from (torch's global generators, the loader's own) is
    put back afterwards, so that drawing it changes no result of the run.
    """
    states = [g.get_state() for g in _generators(loader)]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        batch = next(iter(loader), None)
    for g, state in zip(_generators(loader), states, strict=True):
        g.set_state(state)
    if batch is None:
        raise ValueError(f"the DataLoader passed as '{name}' yields no batches")
    return loader_batch(name, batch, device, dtype)


class LoaderSource:
    """Batches of a :class:`~torch.utils.data.DataLoader`, resumable mid-epoch.

    Under ``torchrun`` the loader must use a :class:`~torch.utils.data.DistributedSampler`
    (``set_epoch`` is called for you); its batch size is then per process.
    """

    def __init__(self, loader: DataLoader, dist: Dist, device: torch.device, dtype: torch.dtype):
        sampler = getattr(loader, "sampler", None)
        if dist.enabled and not isinstance(sampler, torch.utils.data.DistributedSampler):
            raise ValueError(
                "under torchrun a DataLoader passed as 'data' must use a DistributedSampler so "
                "that each process sees its own shard (DataLoader(ds, batch_size=b, "
                "sampler=DistributedSampler(ds))), or pass the data as a tensor"
            )
        self.loader, self.device, self.dtype = loader, device, dtype
        try:
            self.batches_per_epoch: int | None = len(loader)
        except TypeError:  # IterableDataset without __len__
            self.batches_per_epoch = None
        self._iter: Iterator[Any] | None = None
        self._epoch, self._position, self._epoch_rng = -1, 0, {}

    def _start_epoch(self, epoch: int) -> None:
        self._epoch, self._position = epoch, 0
        self._epoch_rng = {
            "torch": torch.get_rng_state(),
            "generators": [g.get_state() for g in _generators(self.loader)],
        }
        if hasattr(self.loader.sampler, "set_epoch"):
            self.loader.sampler.set_epoch(epoch)
        self._iter = iter(self.loader)

    def next_batch(self, step: int) -> Batch:
        if self._iter is None:
            self._start_epoch(0)
        assert self._iter is not None
        try:
            batch = next(self._iter)
        except StopIteration:
            if self._position == 0:
                raise ValueError("the DataLoader passed as 'data' yields no batches") from None
            self._start_epoch(self._epoch + 1)
            batch = next(self._iter)
        self._position += 1
        return loader_batch("data", batch, self.device, self.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "position": self._position, "epoch_rng": self._epoch_rng}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Re-create the saved epoch's iterator from its starting random state and skip the
        batches already used. The caller restores the current random state afterwards."""
        if state["epoch"] < 0:
            return
        torch.set_rng_state(state["epoch_rng"]["torch"])
        for g, s in zip(_generators(self.loader), state["epoch_rng"]["generators"], strict=True):
            g.set_state(s)
        self._start_epoch(state["epoch"])
        assert self._iter is not None
        for _ in range(state["position"]):
            next(self._iter)
        self._position = state["position"]


class ReverseKLSource:
    """The "data" of reverse KL (:func:`~flowkit.train.fit_reverse_kl`): each step the flow
    draws ``n`` samples itself (this process's share of ``batch_size``), so a batch is ``(n,)``;
    with ``contexts`` (amortized inference) ``(n, c)``, ``c`` the ``(n, C)`` contexts to draw
    one sample at each, from a per-process generator: rows of a tensor ``(M, C)`` drawn
    uniformly with replacement, or ``contexts(n, generator)``. A resumed run must draw as many
    (as the other sources check)."""

    batches_per_epoch = None

    def __init__(
        self, batch_size: int, n: int,
        contexts: Tensor | Callable[[int, torch.Generator], Tensor] | None = None,
        context_features: int = 0, seed: int = 0, dist: Dist | None = None,
        like: Tensor | None = None,
    ):
        self.batch_size, self.n = batch_size, n
        self.contexts, self.context_features, self.like = contexts, context_features, like
        self.generator: torch.Generator | None = None
        if contexts is not None:
            assert like is not None and dist is not None
            if callable(contexts):
                _check_signature("context", contexts, n)
            self.generator = torch.Generator(device=like.device).manual_seed(
                derive_seed(seed, dist.rank))

    def next_batch(self, step: int) -> tuple[int] | tuple[int, Tensor]:
        if self.contexts is None:
            return (self.n,)
        return self.n, self.draw(self.n, self.generator)

    def draw(self, n: int, generator: torch.Generator | None) -> Tensor:
        """``n`` contexts ``(n, C)``, checked."""
        assert self.contexts is not None and self.like is not None
        if isinstance(self.contexts, Tensor):
            rows = torch.randint(len(self.contexts), (n,), generator=generator,
                                 device=self.like.device)
            return self.contexts.index_select(0, rows.to(self.contexts.device))
        drawn = self.contexts(n, generator)
        if isinstance(drawn, Tensor | np.ndarray):  # on the device, in the flow's dtype
            drawn = as_tensor("context", drawn, self.like.device, self.like.dtype)
        c = check_batch_context(drawn, self.context_features, self.like, "context")
        if c is None or c.shape != (n, self.context_features):
            got = None if c is None else tuple(c.shape)
            raise ValueError(f"'context', a sampling function, should return {n} rows "
                             f"({n}, {self.context_features}) when asked for n={n}, got {got}")
        return c

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"batch_size": self.batch_size}
        if self.generator is not None:
            state["generator"] = self.generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        check_same_batch_size(state, self.batch_size)
        if self.generator is not None:
            if "generator" not in state:
                raise ValueError("the checkpoint is of a run without 'context': resume it "
                                 "with the same arguments")
            self.generator.set_state(state["generator"])
