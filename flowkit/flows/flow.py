"""``Flow``: a transform from data to noise plus a base distribution on the noise."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.distributions import constraints

from flowkit.flows.distribution import FlowDistribution
from flowkit.nn.embedding import embedded_features
from flowkit.transforms.base import Compose, Transform
from flowkit.transforms.standardize import Standardize, counting_steps_of
from flowkit.validation import (
    SampleShape,
    broadcast_batch,
    check_batch,
    check_batch_context,
    check_bool,
    check_int,
    check_not_empty,
    check_sample_arguments,
    check_transform_result,
    nonfinite_rows,
    reference,
)


def _autocast_off(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a flow's density or sampling path with ``torch.autocast`` off on the flow's device:
    a flow computes in its own dtype, so that its log-densities are exact to that dtype's
    rounding (under CPU autocast to bfloat16 a trained spline MAF's log-density was off by up to
    1.7 nats and its gradients by more than their size). Use a float32 or float64 flow inside
    autocast regions of your own code; see docs/torch_distributions.md."""

    @functools.wraps(method)
    def run(self: Flow, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self._reference().device.type, enabled=False):
            return method(self, *args, **kwargs)

    return run


class Flow(nn.Module):
    r"""A normalizing flow ``p(x | c) = p_base(T(x; c)) |det dT/dx|``.

    ``transform`` maps data to noise (its ``forward``); sampling runs its ``inverse``.

    Shapes follow :mod:`torch.distributions` (``D = features``, ``C = context_features``):

    * ``flow(context)`` (or ``flow()`` without context) is the lazy distribution
      ``p(. | context)``, a :class:`flowkit.FlowDistribution` with ``event_shape = (D,)`` and
      ``batch_shape = context.shape[:-1]``.
    * ``log_prob(x, context)``: ``x`` is ``(*A, D)``, ``context`` ``(*B, C)``; the batch shapes
      ``A`` and ``B`` broadcast (size-1 axes stretch, so a ``(C,)`` or ``(1, C)`` context serves
      every row). Returns the broadcast shape, ``(N,)`` for ``(N, D)`` and ``(N, C)``.
    * ``sample(sample_shape, context)``: ``(*sample_shape, *context.shape[:-1], D)``;
      ``sample_shape`` is an int ``n`` (``(n,)``) or a tuple. Without context: ``sample(n)`` is
      ``(n, D)``. With ``context`` ``(B, C)``: ``sample(context=context)`` is ``(B, D)`` (one
      per row), ``sample(n, context)`` is ``(n, B, D)``; with ``context`` ``(C,)``,
      ``sample(n, context)`` is ``(n, D)``. ``sample()`` without context is an error (say how
      many); ``sample(())`` is one ``(D,)`` sample.

    No Python loop over contexts: rows are expanded and processed as one batch. Inputs are
    checked here, once per call (type, shape, dtype, device, NaN); the transforms and MADEs
    inside trust the flow. A point with an infinite coordinate is outside the support: its
    log-density is ``-inf``. Nothing is cast: ``x`` and the context must both have the model's
    dtype and device (a float64 context for a float32 flow is a TypeError, as a float64 ``x``
    is); convert the inputs or the model with ``.to()``.

    The context path: the transform and the base read ``h = e(s(c))`` instead of the raw
    context ``c``, where ``s`` is ``standardize_context`` and ``e`` the ``embedding`` (each the
    identity when not given): ``p(x | c) = p_base(T(x; h) | h) |det dT/dx|``, where the base
    reads ``h`` only if it is conditional (it has ``context_features > 0``, e.g.
    :class:`flowkit.distributions.ConditionalDiagonalGaussian`). With ``base_context="raw"``
    the base reads ``s(c)`` instead, and only the transform reads the embedding:
    ``p(x | c) = p_base(T(x; h) | s(c)) |det dT/dx|``. ``context_features`` is the raw width
    ``C`` that callers pass; ``h`` is computed once per distinct context row, before rows are
    expanded. So ``flow.transform`` called directly reads ``h``, not ``c``: map data to the
    base's space with :meth:`to_base`, which passes ``h``.

    Internal protocol: :class:`flowkit.FlowDistribution`, the torch-distribution front end in
    :mod:`flowkit.flows.distribution`, checks its input itself and then calls two unchecked
    methods of the flow, ``_sample_batch(sample_shape, context, log_prob)`` and
    ``_log_prob_batch(x, context, shape, outside)``, which :meth:`sample_and_log_prob` and
    :meth:`log_prob` call after their own checks. They are part of flowkit, not of its API.

    Args:
        transform: data-to-noise transform (e.g. a :class:`flowkit.transforms.Compose`), or
            a list of transforms applied in order (made a ``Compose``).
        base: base distribution with ``features``, ``log_prob(z)`` and ``rsample(n)``; or a
            conditional one with ``context_features``, ``log_prob(z, h)`` and ``rsample(h)``.
            Optional: ``_unchecked_log_prob``, ``log_prob`` without the checks of its
            arguments, which the flow calls on its own ``z`` (a helper of another meaning named
            ``_log_prob`` is not taken for it), and, for a conditional base,
            ``rsample_and_log_prob(h) -> (z, log_prob)``, which :meth:`sample_and_log_prob`
            calls to run the base once.
        standardize_context: applied to every raw context first, a
            :class:`flowkit.transforms.Standardize` of width ``C`` (set from data like any
            other: by the first training-mode call with a context, log-density or sampling, or
            by :func:`flowkit.transforms.set_from_data`).
        embedding: network mapping the (standardized) context ``(N, C)`` to ``(N, H)``, where
            ``H`` is the transform's (and conditional base's) ``context_features`` (see
            :mod:`flowkit.nn.embedding`).
        context_features: ``C``, required with an ``embedding`` (without one it is the
            transform's and base's width and may be left out).
        base_context: what a conditional base reads: ``"embedded"`` (default), the context
            the transform reads, ``e(s(c))``; or ``"raw"``, the context before the embedding,
            ``s(c)`` (the base's own head then maps the context beside the embedding, as an
            encoder gives the mean, the scale and the IAF's context as separate outputs in
            Kingma et al. 2016). Without an embedding the two are the same.
    """

    def __init__(
        self,
        transform: Transform | Sequence[Transform],
        base: nn.Module,
        standardize_context: Standardize | None = None,
        embedding: nn.Module | None = None,
        context_features: int | None = None,
        base_context: Literal["embedded", "raw"] = "embedded",
    ):
        super().__init__()
        if isinstance(transform, list | tuple):  # zuko's Flow((t1, t2), base): their Compose
            transform = Compose(transform)
        if not isinstance(transform, Transform):
            foreign = isinstance(transform, torch.distributions.Transform) or callable(transform)
            raise TypeError(
                f"'transform' should be a flowkit Transform (several: a list, or "
                f"flowkit.transforms.Compose([t1, t2])), got {type(transform).__name__}"
                + ("; a torch.distributions transform, or what builds one (zuko's "
                   "flow.transform), goes in as flowkit.transforms.TorchBijection(t, "
                   "maps='to_noise' or 'to_data')" if foreign else "")
            )
        if not isinstance(getattr(base, "features", None), int):
            raise TypeError(
                "'base' should be a base distribution with 'features' (e.g. "
                f"flowkit.StandardNormal(D)), got {type(base).__name__}"
            )
        if transform.features is not None and transform.features != base.features:
            raise ValueError(
                f"'transform' acts on {transform.features} features but 'base' has "
                f"{base.features}"
            )
        if base_context not in ("embedded", "raw"):
            raise ValueError(f"'base_context' should be 'embedded' or 'raw', got {base_context!r}")
        inner = transform.context_features
        base_width = getattr(base, "context_features", 0)
        # The base reads the context before the embedding: its width is checked against C.
        raw_base = base_context == "raw" and embedding is not None
        if base_context == "raw" and not base_width:
            raise ValueError("'base_context' is 'raw' but 'base' reads no context")
        if raw_base and context_features is not None and base_width != context_features:
            raise ValueError(
                f"'base' reads a context of {base_width} features but 'context_features' is "
                f"{context_features}; with base_context='raw' the base reads the context "
                "before the embedding"
            )
        if base_width and inner and base_width != inner and not raw_base:
            raise ValueError(
                f"'transform' reads a context of {inner} features but 'base' one of "
                f"{base_width}; both read the same (embedded) context"
            )
        if not raw_base:
            inner = inner or base_width
        if embedding is None:
            if context_features is not None and context_features != inner:
                raise ValueError(
                    f"'context_features' is {context_features} but the transform and base read "
                    f"{inner} (pass an 'embedding' to map one width to the other)"
                )
            context_features = inner
        else:
            if inner == 0:
                raise ValueError(
                    "'embedding' was given but the transform reads no context"
                    if raw_base else
                    "'embedding' was given but neither the transform nor the base reads a "
                    "context (their context_features are 0)"
                )
            if context_features is None:
                raise ValueError(
                    "'context_features' (the width of the raw context that the embedding "
                    "reads) is required with an 'embedding'"
                )
            context_features = check_int("context_features", context_features, 1)
            out = embedded_features(embedding, context_features)
            if out != inner:
                readers = "the transform reads" if raw_base else "the transform and base read"
                raise ValueError(
                    f"'embedding' maps the context to {out} features but {readers} {inner}"
                )
        if standardize_context is not None and (
            not isinstance(standardize_context, Standardize)
            or standardize_context.features != context_features
        ):
            raise ValueError(
                "'standardize_context' should be a flowkit.transforms.Standardize of the "
                f"context's width {context_features}, got {standardize_context!r}"
            )
        self.transform = transform
        self.base = base
        self.standardize_context = standardize_context
        if standardize_context is not None:
            standardize_context.role = "context"
        self.embedding = embedding
        self.conditional_base: bool = base_width > 0
        self.base_context = base_context
        self._raw_base = raw_base
        self.features: int = base.features
        self.context_features: int = context_features
        self.config: dict | None = None  # set by the builders, used by flowkit.save_model

    @property
    def support(self) -> constraints.Constraint:
        """Where the density is positive, per row ``(D,)``: the data side of the flow's first
        transform (a :class:`~flowkit.transforms.Logit` of ``bounds``, a
        :class:`~flowkit.transforms.TorchBijection` onto an interval), else ``R^D``.
        :meth:`log_prob` is ``-inf`` outside it."""
        return self.transform.data_support

    def _reference(self) -> Tensor:
        """The first floating-point parameter or buffer: the model's dtype and device."""
        ref = reference(self)
        assert ref is not None, "a flow has floating-point parameters or buffers"
        return ref

    # ---------------------------------------------------- where the context and the base enter

    def _embed(self, context: Tensor) -> Tensor:
        """The context ``(R, C)`` as the transforms read it, ``(R, H)``: every path calls this
        once per distinct context row, before the rows are expanded. With
        ``base_context="raw"`` the base's context ``s(c)`` follows, ``(R, H + C)`` (see
        :meth:`_split`)."""
        if self.standardize_context is not None:
            context = self.standardize_context._forward(context, None)[0]
        if self.embedding is None:
            return context
        h = self.embedding(context)
        return torch.cat([h, context], dim=-1) if self._raw_base else h

    def _split(self, h: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """The rows of :meth:`_embed` as the transform's and the base's contexts."""
        if h is None or not self._raw_base:
            return h, h
        inner = h.shape[-1] - self.context_features
        return h[..., :inner], h[..., inner:]

    def _base_log_prob(self, z: Tensor, h: Tensor | None) -> Tensor:
        """``log p_base(z | h)`` for ``z`` ``(R, D)`` and the base's context ``h``: the base's
        ``_unchecked_log_prob`` where it has one (flowkit's bases do), since ``z`` and ``h``
        are the flow's own; else its ``log_prob``."""
        log_prob = getattr(self.base, "_unchecked_log_prob", self.base.log_prob)
        return log_prob(z, h) if self.conditional_base else log_prob(z)

    def _base_sample(
        self, rows: int, h: Tensor | None, log_prob: bool, noise: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``rows`` reparameterized base draws ``(rows, D)`` given the base's context ``h`` (or
        None) and, with ``log_prob``, their log-density: from a conditional base's
        ``rsample_and_log_prob`` where it has one (its head runs once), else by scoring the
        draws. With ``noise`` ``(rows, D)``, the draws of that standard-normal noise."""
        if noise is not None:
            z = (self.base.from_noise(noise, h) if self.conditional_base
                 else self.base.from_noise(noise))
        elif not self.conditional_base:
            z = self.base.rsample(rows)
        elif log_prob and hasattr(self.base, "rsample_and_log_prob"):
            return self.base.rsample_and_log_prob(h)
        else:
            z = self.base.rsample(h)
        return z, self._base_log_prob(z, h) if log_prob else None

    # ------------------------------------------------ unchecked implementations (checked input)

    def _to_base(
        self, x: Tensor, h: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """``x`` ``(R, D)``, ``h`` ``(R, H)`` (from :meth:`_embed`) or None -> ``z = T(x; h)``
        ``(R, D)``, ``log|det dz/dx|`` ``(R,)`` and the base's context."""
        h, h_base = self._split(h)
        z, log_det = check_transform_result(self.transform, "_forward",
                                            self.transform._forward(x, h), x)
        return z, log_det, h_base

    def _log_prob(self, x: Tensor, h: Tensor | None) -> Tensor:
        """``x`` ``(R, D)``, ``h`` ``(R, H)`` (from :meth:`_embed`) or None -> ``(R,)``."""
        z, log_det, h_base = self._to_base(x, h)
        return self._base_log_prob(z, h_base) + log_det

    @_autocast_off
    def _log_prob_batch(
        self, x: Tensor, context: Tensor | None, shape: torch.Size, outside: Tensor | None
    ) -> Tensor:
        """``x`` ``(*A, D)`` and ``context`` ``(*B, C)`` broadcast to ``shape``; ``outside``
        ``(*A,)`` marks points with infinite entries (log-density ``-inf``). Each distinct
        context row is embedded once. Internal protocol (see the class notes): the caller
        checked ``x`` and ``context``."""
        d = self.features
        if torch.compiler.is_compiling():  # no branch on values: score all, mask infinite rows
            infinite = torch.isinf(x).any(-1, keepdim=True)
            x = x.masked_fill(infinite, 0.0).expand(*shape, d).reshape(-1, d)
            h = None if context is None else self._embed_rows(context, shape)
            log_p = self._log_prob(x, h).reshape(shape)
            return log_p.masked_fill(infinite.squeeze(-1).expand(shape), -math.inf)
        if context is None and outside is None:  # i.i.d.: score each distinct point once
            return self._log_prob(x.reshape(-1, d), None).reshape(x.shape[:-1]).expand(shape)
        x = x.expand(*shape, d).reshape(-1, d)
        h = None if context is None else self._embed_rows(context, shape)
        if outside is None:
            return self._log_prob(x, h).reshape(shape)
        inside = ~outside.expand(shape).reshape(-1)
        log_p = x.new_full((x.shape[0],), -math.inf)
        if inside.any():
            log_p[inside] = self._log_prob(x[inside], None if h is None else h[inside])
        elif torch.is_grad_enabled():
            # no finite row: nothing to run (nor to set a standardization from), but the result
            # keeps a graph to what it depends on, as with finite rows and in torch's
            # distributions: a loss that masks these rows out back-propagates zeros
            tied = [t for t in (*self.parameters(), x, h) if t is not None and t.requires_grad]
            if tied:  # (the points' infinite entries would make 0 * inf = NaN: left out)
                log_p = log_p + sum(t.masked_fill(torch.isinf(t), 0.0).sum() for t in tied) * 0.0
        return log_p.reshape(shape)

    def _embed_rows(self, context: Tensor, shape: tuple[int, ...]) -> Tensor:
        """``context`` ``(*B, C)`` embedded, then broadcast to ``(*shape, H)`` and flattened
        to ``(prod(shape), H)`` (no copy of the context before the embedding)."""
        batch = context.shape[:-1]
        h = self._embed(context.reshape(-1, context.shape[-1]))
        return h.reshape(*batch, h.shape[-1]).expand(*shape, h.shape[-1]).reshape(-1, h.shape[-1])

    @_autocast_off
    def _sample_batch(
        self, sample_shape: torch.Size, context: Tensor | None, log_prob: bool,
        noise: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Samples ``(*sample_shape, *batch, D)`` (``batch = context.shape[:-1]``) and, with
        ``log_prob``, their log-density from the same inverse pass; with ``noise``, the samples
        of that standard-normal noise of the base, one row ``(D,)`` per sample, flattened.
        Internal protocol (see the class notes): the caller checked ``context`` and ``noise``."""
        shape = sample_shape + (() if context is None else context.shape[:-1])
        rows = math.prod(shape)
        if rows == 0:
            ref = self._reference()
            x = torch.empty(*shape, self.features, dtype=ref.dtype, device=ref.device)
            return x, x.new_empty(shape) if log_prob else None
        std = self.standardize_context  # a value set from the contexts sampled at is a look
        eager = not torch.compiler.is_compiling()
        # samples to train through: the standardizations count this flow's steps
        counted = (next((p for p in self.transform.parameters() if p.requires_grad), None)
                   if eager and self.training and torch.is_grad_enabled() else None)
        with counting_steps_of(counted) if counted is not None else nullcontext():
            with std._sampling_pass() if eager and std is not None else nullcontext():
                h, h_base = self._split(
                    None if context is None else self._embed_rows(context, shape))
            z, log_pz = self._base_sample(rows, h_base, log_prob, noise)
            x, log_det = check_transform_result(self.transform, "_inverse",
                                                self.transform._inverse(z, h), z)
        x = x.reshape(*shape, self.features)
        return x, None if log_pz is None else (log_pz - log_det).reshape(shape)

    # ------------------------------------------------------------------------- public methods

    def forward(self, context: Tensor | None = None) -> FlowDistribution:
        """The distribution ``p(. | context)`` as a :class:`flowkit.FlowDistribution`
        (``batch_shape = context.shape[:-1]``); ``flow()`` for an unconditional flow.

        Example:
            >>> import torch, flowkit
            >>> flow = flowkit.MAF(2, layers=2, hidden_features=(8,), context_features=3)
            >>> d = flow(torch.randn(5, 3))
            >>> x = d.sample((4,))
            >>> x.shape, d.log_prob(x).shape
            (torch.Size([4, 5, 2]), torch.Size([4, 5]))
        """
        return FlowDistribution(self, context)

    def embed_context(self, context: Tensor) -> Tensor:
        """The context as the layers read it: ``(*B, C)`` -> ``(*B, H)``, standardized (if the
        flow standardizes its context) and passed through the embedding network (if any;
        ``H = C`` without one). For diagnostics in the space the flow conditions on (sbi's
        ``embedding_net``)."""
        ref = self._reference()
        if self.context_features == 0:
            raise ValueError("the flow is unconditional (context_features=0): it has no context "
                             "to embed")
        context = check_batch_context(context, self.context_features, ref)
        h = self._embed(context.reshape(-1, self.context_features))
        h = self._split(h)[0]
        return h.reshape(*context.shape[:-1], h.shape[-1])

    def log_prob(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Exact log-density ``log p(x | context)``: ``x`` ``(*A, D)``, ``context`` ``(*B, C)``
        with broadcastable ``A`` and ``B``; returns their broadcast shape. ``-inf`` for points
        with an infinite coordinate; NaN is an error."""
        x, context, shape = self._check_points("x", x, context)
        return self._log_prob_batch(x, context, shape, nonfinite_rows("x", x))

    def _check_points(
        self, name: str, x: object, context: object
    ) -> tuple[Tensor, Tensor | None, torch.Size]:
        """Points ``x`` ``(*A, D)`` and ``context`` ``(*B, C)`` given to a public method,
        checked (errors name the points ``name``), with their broadcast batch shape, not
        empty. Their values are left to the caller (:func:`~flowkit.validation.nonfinite_rows`)."""
        ref = self._reference()
        x = check_batch(name, x, self.features, ref)
        context = check_batch_context(context, self.context_features, ref)
        shape = broadcast_batch(name, x, context)
        check_not_empty(name, x, shape)
        return x, context, shape

    def _check_sample(
        self, n: SampleShape, context: Tensor | None
    ) -> tuple[torch.Size, Tensor | None]:
        """The user's ``n`` as a sample shape and their context, checked as given."""
        return check_sample_arguments(n, context, self.context_features, self._reference())

    def rsample(self, n: SampleShape = None, context: Tensor | None = None) -> Tensor:
        """Reparameterized samples (gradients flow to the parameters and the context);
        ``(*sample_shape, *context.shape[:-1], D)``, see the class notes."""
        return self._sample_batch(*self._check_sample(n, context), log_prob=False)[0]

    @torch.no_grad()
    def sample(self, n: SampleShape = None, context: Tensor | None = None) -> Tensor:
        """Samples without gradient tracking; shapes as :meth:`rsample`."""
        return self.rsample(n, context)

    @_autocast_off
    def to_base(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``x`` mapped through the flow's transform into the base's space, ``z = T(x; c)``,
        and ``log|det dz/dx|``, so that ``log p(x | c) = log p_base(z) + log_det`` (a
        conditional base reads its own context); zuko's ``flow(c).transform(x)``. ``x``
        ``(*A, D)`` and ``context`` ``(*B, C)`` broadcast as in :meth:`log_prob`; returns ``z``
        ``(*broadcast(A, B), D)`` and ``log_det`` ``(*broadcast(A, B))``, differentiable.

        The context reaches the transforms as the flow passes it to them: standardized and
        embedded (:meth:`embed_context`). Calling ``flow.transform(x, c)`` with the raw
        context skips both, and with the builders' default (a standardized context) silently
        maps ``x`` under another context. ``z`` is the point the base scores; for a
        base of its own noise map (:meth:`sample_from_noise`) it is not the noise itself. As
        :meth:`log_prob`, a call in training mode sets a standardization still to be set and
        batch-norm layers use (and update) the batch's statistics: call ``flow.eval()`` first
        to map points with fixed layers.

        Raises:
            ValueError: points with an infinite coordinate, or outside the flow's support (a
                flow with ``bounds=``): they have no image in the base's space. (Compiled code
                does not look at the values: there such rows give NaN or ``-inf``.)

        Example:
            >>> import torch, flowkit
            >>> flow = flowkit.MAF(2, layers=2, hidden_features=(8,), context_features=3)
            >>> x, c = torch.randn(5, 2), torch.randn(5, 3)
            >>> z, log_det = flow.to_base(x, c)
            >>> torch.allclose(flow.base.log_prob(z) + log_det, flow.log_prob(x, c))
            True
        """
        return self._to_base_checked(x, context, "x")

    def _to_base_checked(
        self, x: Tensor, context: Tensor | None, name: str
    ) -> tuple[Tensor, Tensor]:
        """:meth:`to_base`, its errors naming the points ``name``."""
        x, context, shape = self._check_points(name, x, context)
        if nonfinite_rows(name, x) is not None:  # (skipped while compiling)
            raise ValueError(f"'{name}' contains infinite values: they have no image in the "
                             "base's space")
        rows = x.expand(*shape, self.features).reshape(-1, self.features)
        h = None if context is None else self._embed_rows(context, shape)
        z, log_det, _ = self._to_base(rows, h)
        if not torch.compiler.is_compiling() and bool((log_det == -math.inf).any()):
            first = int((log_det == -math.inf).nonzero()[0, 0])
            raise ValueError(
                f"'{name}' has points outside the flow's support (the first at row {first} of "
                f"the broadcast batch {tuple(shape)}): they have no image in the base's space")
        return z.reshape(*shape, self.features), log_det.reshape(shape)

    def sample_from_noise(
        self, noise: Tensor, context: Tensor | None = None, *, log_prob: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The samples that the base's standard-normal noise gives, differentiable as
        :meth:`rsample`: a sample is ``x = T^{-1}(z)`` with ``z = mu + sigma * noise`` for the
        base ``N(mu, sigma^2)`` (``mu`` and ``sigma`` from the context for a conditional base;
        ``z = noise`` for the standard normal). ``noise`` ``(*A, D)`` and ``context`` ``(*B, C)``
        broadcast as in :meth:`log_prob`; returns ``(*broadcast(A, B), D)``, and with
        ``log_prob=True`` also the flow's log-density of each sample, ``(*broadcast(A, B))``,
        from the same pass (as :meth:`sample_and_log_prob`).

        ``noise = 0`` gives the image of the base's mode (a deterministic action of a policy:
        ``flow.sample_from_noise(torch.zeros(D), obs)``; not the flow's own mode, which the
        Jacobian moves), ``t * noise`` samples at temperature ``t``, and one fixed ``noise``
        compares models or contexts on common random numbers. Needs a base with a noise map
        (``from_noise``, as flowkit's Gaussian bases have).

        Example:
            >>> import torch, flowkit
            >>> flow = flowkit.IAF(2, layers=2, hidden_features=(8,), context_features=3)
            >>> flow.sample_from_noise(torch.zeros(2), torch.randn(5, 3)).shape
            torch.Size([5, 2])
        """
        if not hasattr(self.base, "from_noise"):
            raise TypeError(f"sample_from_noise needs a base with a noise map (from_noise, as "
                            f"flowkit's Gaussian bases have); {type(self.base).__name__} has none")
        noise, context, shape = self._check_points("noise", noise, context)
        if nonfinite_rows("noise", noise) is not None:
            raise ValueError("'noise' contains infinite values")
        if context is not None:  # a view: the context broadcast to every sample
            context = context.expand(*shape, context.shape[-1])
        rows = noise.expand(*shape, self.features).reshape(-1, self.features)
        x, log_p = self._sample_batch(torch.Size(()) if context is not None else shape, context,
                                      log_prob=check_bool("log_prob", log_prob), noise=rows)
        return x if log_p is None else (x, log_p)

    def sample_and_log_prob(
        self, n: SampleShape = None, context: Tensor | None = None
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
        x, log_p = self._sample_batch(*self._check_sample(n, context), log_prob=True)
        assert log_p is not None
        return x, log_p
