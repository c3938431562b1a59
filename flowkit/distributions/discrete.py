r"""Autoregressive models of discrete vectors: Bernoulli-MADE and categorical MADE.

A MADE (:class:`flowkit.MADE`) gives, in one pass, the parameters of every conditional of an
ordering ``o``, so the exact likelihood of a vector is one pass away:

.. math::

    \log p(x) = \sum_{i=1}^{D} \log p\big(x_{o_i} \mid x_{o_1}, \dots, x_{o_{i-1}}\big).

:class:`BernoulliMADE` puts a Bernoulli on each conditional (binary data, e.g. binarized MNIST),
:class:`CategoricalMADE` a softmax over ``K`` classes (inputs one-hot encoded).

**Context.** With ``context_features = C > 0`` the models are conditional,
:math:`p(x \mid c) = \prod_i p(x_{o_i} \mid x_{o_1}, \dots, x_{o_{i-1}}, c)`: the context
``c`` enters the MADE beside ``x`` with degree 0 (:class:`flowkit.MADE`'s
``context_features``). ``log_prob(x, context=c)`` (keyword only: the second positional
argument is ``mask_ensemble``) takes ``c`` of shape ``(N, C)``, one row per row of ``x``, or
``(C,)`` (or ``(1, C)``) for every row; ``sample`` follows
:class:`flowkit.Flow`: ``sample(context=c)`` with ``c`` ``(B, C)`` is ``(B, D)``, one sample
per row, ``sample(n, c)`` is ``(n, B, D)``, and a ``(C,)`` context gives ``(n, D)``.

**Mask sets.** With ``num_masks = K > 1`` the MADE holds ``K`` mask sets (different orderings
when ``order="random"``, different hidden connectivity when ``hidden_degrees="random"``). Order-
and connectivity-agnostic training (Germain et al. 2015, sec. 4) moves to the next set after
every optimizer step: call :meth:`next_mask` after ``optimizer.step()``, cycling
``0, 1, ..., K-1, 0, ...``. Each set defines a valid model ``p_k``; at test time
``log_prob(x, mask_ensemble=K)`` scores the uniform mixture of the first ``K`` of them,

.. math::

    \log \frac{1}{K} \sum_{k=1}^{K} p_k(x) = \operatorname{logsumexp}_k \log p_k(x) - \log K,

which is a normalized distribution (an average of probabilities, not of logits).

**Sampling** is exact ancestral sampling in the active set's ordering. All randomness is drawn
up front (uniforms for the Bernoulli, Gumbel noise for the categorical; in float32 at least,
also for float16 and bfloat16 models, whose own uniforms are too coarse for small
probabilities), and the samples are the solution of ``x_d = step(made(x)_d, noise_d)``, found
by :func:`flowkit.nn.inversion.solve`; so any exact solver gives the same samples from the same
noise.

References:
    MADE: Masked Autoencoder for Distribution Estimation (Germain et al., 2015).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flowkit.checkpoint import register_model
from flowkit.nn.inversion import OneHot, solve
from flowkit.nn.made import MADE
from flowkit.nn.masks import HiddenDegrees, OrderSpec
from flowkit.validation import (
    SampleShape,
    check_batch_context,
    check_features,
    check_int,
    check_sample_arguments,
    is_int,
)

__all__ = ["BernoulliMADE", "CategoricalMADE"]



def _class_counts(classes: object, features: int) -> tuple[int, ...]:
    """``classes`` of :class:`CategoricalMADE` as one count per feature: an integer ``K >= 2``
    for every feature, or a sequence (list, tuple, 1-D array or tensor) of ``features`` such
    integers."""
    if is_int(classes):
        return (check_int("classes", classes, 2),) * features
    if isinstance(classes, Tensor | np.ndarray) and classes.ndim == 1:
        classes = classes.tolist()  # its floats, if any, are refused below
    if not isinstance(classes, list | tuple):
        raise ValueError("'classes' should be an integer >= 2 or a sequence of "
                         f"{features} of them, got {classes!r}")
    if len(classes) != features:
        raise ValueError(f"'classes' should hold one count per feature ({features}), got "
                         f"{len(classes)}: {list(classes)}")
    return tuple(check_int(f"classes[{d}]", k, 2) for d, k in enumerate(classes))


def _first_bad(x: Tensor, good: Tensor) -> str:
    """The first entry of ``x`` ``(N, D)`` where ``good`` is False, with its row and column."""
    row, column = (~good).nonzero()[0].tolist()
    return f"{x[row, column].item()} at row {row}, column {column}"


class _DiscreteMADE(nn.Module):
    """What the Bernoulli and categorical models share: the MADE, its mask sets,
    the mask ensemble and the checks. Subclasses define :meth:`check_data` and
    :meth:`_log_prob`; :func:`flowkit.fit` calls ``check_data(data, "data")`` on a whole
    training array before the first step."""

    made: MADE

    def __init__(self, made: MADE):
        super().__init__()
        self.made = made
        self.features: int = made.features
        self.context_features: int = made.context_features

    @property
    def num_masks(self) -> int:
        """Number of mask sets."""
        return self.made.num_masks

    @property
    def mask_set_index(self) -> int:
        """Index of the active mask set."""
        return self.made.mask_set_index

    @property
    def order(self) -> Tensor:
        """Ordering of the active mask set: ``order[i]`` is the ``i``-th feature, ``(D,)``."""
        return self.made.order

    def set_mask(self, index: int) -> None:
        """Activate mask set ``index``, an integer in ``[0, num_masks)`` (anything else is a
        ValueError naming ``index``)."""
        self.made.set_mask(index)

    @contextlib.contextmanager
    def mask_set(self, index: int) -> Iterator[_DiscreteMADE]:
        """Temporarily evaluate with mask set ``index`` (checked as in :meth:`set_mask`);
        restores the active set afterwards (:meth:`flowkit.MADE.mask_set`)."""
        with self.made.mask_set(index):
            yield self

    def next_mask(self) -> int:
        """Move to the next mask set (``k -> (k + 1) mod num_masks``); returns its index.

        The training schedule of order/connectivity-agnostic training: call it once after
        every optimizer step. A no-op when ``num_masks == 1``.
        """
        return self.made.next_mask()

    def _reference(self) -> Tensor:
        return self.made.output.weight

    def check_data(self, x: object, name: str = "x") -> Tensor:
        """``x`` checked (shape, dtype, values: binary, or category indices; errors name
        ``name``) and cast for the MADE. :func:`flowkit.fit` calls it on the whole of array
        data and validation data (on the first batch of a DataLoader or sampling function),
        so that a wrong domain is named before training."""
        raise NotImplementedError

    def _context(self, context: object, rows: int) -> Tensor | None:
        """The context of ``rows`` rows of ``x``, checked (dtype, device, NaN; errors name
        ``'context'``): ``(rows, C)``, or ``(C,)`` / ``(1, C)`` for every row, returned as
        ``(rows, C)``; None for an unconditional model (which refuses a context)."""
        context = check_batch_context(context, self.context_features, self._reference())
        if context is None:
            return None
        c = self.context_features
        if context.dim() > 2 or (context.dim() == 2 and context.shape[0] not in (1, rows)):
            raise ValueError(
                f"'context' should have shape ({rows}, {c}) (one row per row of 'x'), or "
                f"({c},) for every row, got {tuple(context.shape)}"
            )
        return context.expand(rows, c)

    def _sample_shape(
        self, n: SampleShape, context: object
    ) -> tuple[torch.Size, Tensor | None]:
        """The shape of the samples without ``D``, ``(*sample_shape, *context.shape[:-1])``,
        and the context of each of its ``rows``, ``(rows, C)`` (None without context).
        ``n`` is an int, a tuple, or None (one sample per context row)."""
        sample_shape, context = check_sample_arguments(
            n, context, self.context_features, self._reference()
        )
        if context is None:
            return sample_shape, None
        shape = sample_shape + context.shape[:-1]
        c = self.context_features
        return shape, context.expand(*shape, c).reshape(-1, c)

    def _log_prob(self, x: Tensor, context: Tensor | None) -> Tensor:
        raise NotImplementedError

    def log_prob(
        self, x: Tensor, mask_ensemble: int | None = None, *, context: Tensor | None = None
    ) -> Tensor:
        r"""Exact log-probability of each row of ``x``, :math:`\log p(x \mid c)`, shape
        ``(N,)``.

        Args:
            x: ``(N, D)`` data (see the class docstring for the accepted values).
            mask_ensemble: ``None`` scores with the active mask set (one MADE pass). An integer
                ``K`` scores the uniform mixture over mask sets ``0..K-1`` (``K`` passes):
                :math:`\operatorname{logsumexp}_k \log p_k(x) - \log K`. The active set is
                restored afterwards. This is an evaluation quantity: it is computed without
                gradient tracking (switching masks between passes would invalidate the graph).
            context: keyword only; required when ``context_features > 0``, an error otherwise.
                ``(N, C)``, one row per row of ``x``, or ``(C,)`` for every row; the model's
                dtype and device, finite.
        """
        x = self.check_data(x)
        if isinstance(mask_ensemble, Tensor):
            raise TypeError(
                "'mask_ensemble' should be None or an int, got a tensor; a context is passed "
                "by keyword: log_prob(x, context=c)"
            )
        context = self._context(context, x.shape[0])
        if mask_ensemble is None:
            return self._log_prob(x, context)
        self._check_ensemble(mask_ensemble)
        per_mask = []
        with torch.no_grad():
            for k in range(mask_ensemble):
                with self.made.mask_set(k):
                    per_mask.append(self._log_prob(x, context))
        return torch.logsumexp(torch.stack(per_mask), dim=0) - math.log(mask_ensemble)

    def _check_ensemble(self, mask_ensemble: object) -> None:
        if not is_int(mask_ensemble) or not 1 <= mask_ensemble <= self.num_masks:
            raise ValueError(
                f"'mask_ensemble' should be None or an int in [1, {self.num_masks}] "
                f"(num_masks={self.num_masks}), got {mask_ensemble!r}"
            )

    @torch.no_grad()
    def _sample(
        self, n: SampleShape, context: Tensor | None, generator: torch.Generator | None,
        mask_ensemble: int | None,
    ) -> Tensor:
        """:meth:`sample` of a subclass: ``(*shape, D)`` from :meth:`_draw`, with the active
        mask set or, with ``mask_ensemble = K``, each row from a set drawn uniformly among
        ``0..K-1`` (the mixture :meth:`log_prob` scores with the same ``K``)."""
        shape, context = self._sample_shape(n, context)
        rows = math.prod(shape)
        if mask_ensemble is not None:
            self._check_ensemble(mask_ensemble)
        if mask_ensemble is None or rows == 0:
            return self._draw(rows, context, generator).reshape(*shape, self.features)
        sets = torch.randint(mask_ensemble, (rows,), generator=generator,
                             device=self._reference().device)
        x: Tensor | None = None
        for k in range(mask_ensemble):
            picked = (sets == k).nonzero().flatten()
            if len(picked):
                with self.made.mask_set(k):
                    draws = self._draw(len(picked), None if context is None else
                                       context[picked], generator)
                x = draws.new_empty(rows, self.features) if x is None else x
                x[picked] = draws
        assert x is not None
        return x.reshape(*shape, self.features)

    def _draw(self, rows: int, context: Tensor | None,
              generator: torch.Generator | None) -> Tensor:
        """``rows`` samples ``(rows, D)`` from the active mask set, given ``context``
        ``(rows, C)`` (or None)."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        context = f"context_features={self.context_features}, " if self.context_features else ""
        return f"{context}num_masks={self.num_masks}"


@register_model(added={"context_features": 0})  # files saved before it: unconditional
class BernoulliMADE(_DiscreteMADE):
    r"""A MADE with a Bernoulli output per feature, for binary vectors ``x in {0, 1}^D``.

    .. math::

        \log p(x) = \sum_d \big[x_d \log \sigma(\ell_d) + (1 - x_d) \log \sigma(-\ell_d)\big],
        \qquad \ell = \mathrm{MADE}(x),

    where ``\ell_d`` (:meth:`logits`) depends only on the features before ``d`` in the ordering.

    ``x`` may be a float, integer or bool tensor of shape ``(N, D)`` on the model's device; its
    values must be exactly 0 or 1 (anything else, NaN included, is an error, never rounded).
    :meth:`sample` returns floats in the model's dtype.

    Args:
        features: ``D``.
        hidden_features: hidden layer sizes of the MADE.
        num_masks: number of mask sets (see the module docstring).
        order: ``"natural"``, ``"reversed"``, ``"random"`` (a new one per mask set) or a
            permutation, ``order[i]`` being the ``i``-th feature.
        hidden_degrees: ``"random"`` (new connectivity per mask set) or ``"even"``.
        residual: residual masked blocks after the first hidden layer (equal layer sizes).
        direct_connection: add a masked linear map from the inputs to the logits.
        seed: seed of the orderings and hidden degrees.
        context_features: ``C``, the width of a conditioning vector (0: unconditional); see
            the module docstring for the shapes.

    Example:
        >>> model = BernoulliMADE(6, hidden_features=(32,), num_masks=4, order="random")
        >>> x = model.sample(5, generator=torch.Generator().manual_seed(0))
        >>> x.shape, model.log_prob(x).shape, model.log_prob(x, mask_ensemble=4).shape
        (torch.Size([5, 6]), torch.Size([5]), torch.Size([5]))
        >>> conditional = BernoulliMADE(6, hidden_features=(32,), context_features=2)
        >>> c = torch.randn(3, 2)
        >>> x = conditional.sample(context=c)  # one sample per context row
        >>> x.shape, conditional.log_prob(x, context=c).shape, conditional.sample(4, c).shape
        (torch.Size([3, 6]), torch.Size([3]), torch.Size([4, 3, 6]))
    """

    def __init__(
        self,
        features: int,
        hidden_features: Sequence[int] = (500,),
        num_masks: int = 1,
        order: OrderSpec = "natural",
        hidden_degrees: HiddenDegrees = "random",
        residual: bool = False,
        direct_connection: bool = False,
        seed: int = 0,
        context_features: int = 0,
    ):
        made = MADE(
            features, hidden_features, params_per_feature=1, context_features=context_features,
            order=order, hidden_degrees=hidden_degrees, num_masks=num_masks, seed=seed,
            direct_connection=direct_connection, residual=residual,
        )
        super().__init__(made)

    def check_data(self, x: object, name: str = "x") -> Tensor:
        ref = self._reference()
        x = check_features(name, x, self.features, ref, floating=False)
        if x.is_complex():
            raise TypeError(
                f"'{name}' should be a real (float, int or bool) tensor, got dtype {x.dtype}"
            )
        binary = (x == 0) | (x == 1)
        # torch.compile cannot trace a data-dependent branch: compiled code skips this check.
        if not torch.compiler.is_compiling() and not binary.all():
            raise ValueError(f"'{name}' should hold binary values (0 or 1, as float, int or "
                             f"bool), found {_first_bad(x, binary)}")
        return x.to(ref.dtype)

    def logits(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        r"""Logits ``\ell`` of the conditionals, ``p(x_d = 1 | x_{<d}, c) = \sigma(\ell_d)``;
        ``x`` ``(N, D)`` -> ``(N, D)`` (``context`` as in :meth:`log_prob`)."""
        x = self.check_data(x)
        return self.made._forward(x, self._context(context, x.shape[0])).squeeze(-1)

    def _log_prob(self, x: Tensor, context: Tensor | None) -> Tensor:
        logits = self.made._forward(x, context).squeeze(-1)
        return -F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(-1)

    def sample(
        self,
        n: SampleShape = None,
        context: Tensor | None = None,
        generator: torch.Generator | None = None,
        mask_ensemble: int | None = None,
    ) -> Tensor:
        """Exact samples (floats 0/1) from the active mask set's model,
        ``(*sample_shape, *context.shape[:-1], D)``: ``sample(n)`` is ``(n, D)``; with a context
        ``(B, C)``, ``sample(context=c)`` is ``(B, D)`` and ``sample(n, c)`` ``(n, B, D)``.

        Uniforms ``u`` ``(rows, D)`` are drawn first; feature ``d`` is then ``u_d < p(x_d = 1 |
        x_{<d}, c)``, solved in the model's ordering (compared as ``logit(u_d) < logit_d``,
        which costs no sigmoid per step).

        Args:
            n: number of samples (an int), a sample shape (a tuple), or None for one sample per
                context row.
            context: ``(..., C)``, required when ``context_features > 0``.
            generator: a :class:`torch.Generator` on the model's device (default: the global
                one).
            mask_ensemble: ``K`` draws each sample from a mask set chosen uniformly among
                ``0..K-1``: samples of the mixture that :meth:`log_prob` scores with the same
                ``K`` (default: the active set's model).
        """
        return self._sample(n, context, generator, mask_ensemble)

    def _draw(self, rows: int, context: Tensor | None,
              generator: torch.Generator | None) -> Tensor:
        ref = self._reference()
        u = torch.rand(rows, self.features, generator=generator, device=ref.device,
                       dtype=_noise_dtype(ref.dtype))

        threshold = torch.logit(u)

        def step(params: Tensor, index: Tensor) -> Tensor:
            return (threshold.index_select(1, index) < params[..., 0]).to(ref.dtype)

        like = torch.empty(rows, self.features, device=ref.device, dtype=ref.dtype)
        return solve(self.made, step, like, context)

    def extra_repr(self) -> str:
        return f"features={self.features}, " + super().extra_repr()


def _noise_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the samplers draw their uniforms in: the model's, but at least float32.
    Uniforms of float16 (bfloat16) take 2^11 (2^8) values, so probabilities below that grid
    would be rounded: a probability of 3e-4 came out 1.7x (6.8x) too often."""
    return torch.promote_types(dtype, torch.float32)


@register_model(added={"context_features": 0})
class CategoricalMADE(_DiscreteMADE):
    r"""A MADE with a softmax over ``K`` classes per feature, for ``x in {0..K-1}^D``, or over
    ``K_d`` classes for feature ``d`` (``classes=[K_1, ..., K_D]``: a table whose columns have
    different numbers of levels).

    Inputs are one-hot encoded, ``(N, D, K)`` with ``K = max_d K_d``; the ``K`` input units of a
    feature share its degree, and the ``K`` logits of feature ``d`` see only the features before
    ``d``. The softmax of feature ``d`` runs over its own ``K_d`` classes (the logits of classes
    ``K_d..K-1``, which it does not have, are ``-inf``):

    .. math::

        \log p(x) = \sum_d \log \operatorname{softmax}(\ell_{d, 0..K_d-1})_{x_d},
        \qquad \ell = \mathrm{MADE}(\mathrm{onehot}(x)) \in \mathbb{R}^{D \times K}.

    ``x`` must be an integer tensor ``(N, D)`` with values in ``0..K_d-1`` in column ``d``;
    :meth:`sample` returns ``torch.long``. Arguments as :class:`BernoulliMADE`
    (``context_features`` included), plus ``classes``: ``K`` for every feature, or a sequence of
    ``D`` counts, each at least 2. The context enters the MADE after the one-hot inputs.

    Example:
        >>> model = CategoricalMADE(2, classes=200, hidden_features=(64,))
        >>> x = model.sample(3, generator=torch.Generator().manual_seed(0))
        >>> x.dtype, model.log_prob(x).shape
        (torch.int64, torch.Size([3]))
        >>> table = CategoricalMADE(3, classes=[2, 5, 3], hidden_features=(16,))
        >>> table.logits(torch.tensor([[1, 4, 2]]))[0, 0].isinf()  # feature 0 has two classes
        tensor([False, False,  True,  True,  True])
    """

    def __init__(
        self,
        features: int,
        classes: int | Sequence[int],
        hidden_features: Sequence[int] = (500,),
        num_masks: int = 1,
        order: OrderSpec = "natural",
        hidden_degrees: HiddenDegrees = "random",
        residual: bool = False,
        direct_connection: bool = False,
        seed: int = 0,
        context_features: int = 0,
    ):
        counts = _class_counts(classes, features)
        width = max(counts)
        made = MADE(
            features, hidden_features, params_per_feature=width, inputs_per_feature=width,
            context_features=context_features, order=order, hidden_degrees=hidden_degrees,
            num_masks=num_masks, seed=seed, direct_connection=direct_connection,
            residual=residual,
        )
        super().__init__(made)
        self.classes: int | tuple[int, ...] = counts[0] if is_int(classes) else counts
        self.class_counts = counts  # K_d, per feature
        self.width = width  # K = max_d K_d: the one-hot inputs and logits per feature
        # classes k >= K_d of feature d, which it does not have (None when every K_d = K);
        # not saved: the config rebuilds it
        limits = torch.tensor(counts)
        absent = torch.arange(width) >= limits[:, None]
        self.register_buffer("limits", limits, persistent=False)
        self.register_buffer("absent", absent if absent.any() else None, persistent=False)

    def _range(self) -> str:
        """The values ``x`` may hold, for messages."""
        if self.absent is None:
            return f"class indices in 0..{self.width - 1}"
        return (f"class indices in 0..classes[d] - 1 in column d "
                f"(classes={list(self.class_counts)})")

    def check_data(self, x: object, name: str = "x") -> Tensor:
        if isinstance(x, Tensor) and x.dim() == 3 and x.shape[1:] == (self.features,
                                                                          self.width):
            raise ValueError(
                f"'{name}' of shape {tuple(x.shape)} looks one-hot; pass class indices "
                f"(N, {self.features}) in 0..{self.width - 1}: {name}.argmax(-1)"
            )
        x = check_features(name, x, self.features, self._reference(), floating=False)
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(
                f"'{name}' should be an integer tensor of {self._range()}, got dtype {x.dtype}"
            )
        inside = (x >= 0) & (x < self.limits)
        if not torch.compiler.is_compiling() and not inside.all():  # as in BernoulliMADE
            raise ValueError(f"'{name}' should hold {self._range()}, "
                             f"found {_first_bad(x, inside)}")
        return x.long()

    def _one_hot(self) -> OneHot:
        """The input encoding, in the model's current dtype (the solver recognises it and
        adds one weight row per feature instead of multiplying by a one-hot vector)."""
        return OneHot(self.width, self._reference().dtype)

    def logits(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        r"""Unnormalized logits ``(N, D, K)`` of the conditionals ``p(x_d | x_{<d}, c)``
        (``context`` as in :meth:`log_prob`); ``-inf`` at the classes ``k >= K_d`` that feature
        ``d`` does not have."""
        x = self.check_data(x)
        return self._logits(x, self._context(context, x.shape[0]))

    def _logits(self, x: Tensor, context: Tensor | None) -> Tensor:
        logits = self.made._forward(self._one_hot()(x), context)
        return logits if self.absent is None else logits.masked_fill(self.absent, -math.inf)

    def _log_prob(self, x: Tensor, context: Tensor | None) -> Tensor:
        log_p = torch.log_softmax(self._logits(x, context), dim=-1)
        return log_p.gather(-1, x.unsqueeze(-1)).squeeze(-1).sum(-1)

    def sample(
        self,
        n: SampleShape = None,
        context: Tensor | None = None,
        generator: torch.Generator | None = None,
        mask_ensemble: int | None = None,
    ) -> Tensor:
        """Exact samples (``torch.long``) from the active mask set's model, shaped as
        :meth:`BernoulliMADE.sample`'s.

        Gumbel noise ``g`` ``(rows, D, K)`` is drawn first; feature ``d`` is then
        ``argmax_k (logits_{d,k} + g_{d,k})`` (the Gumbel-max trick), solved in the ordering.

        Args:
            n: number of samples, a sample shape, or None (one per context row).
            context: ``(..., C)``, required when ``context_features > 0``.
            generator: a :class:`torch.Generator` on the model's device.
            mask_ensemble: as in :meth:`BernoulliMADE.sample`.
        """
        return self._sample(n, context, generator, mask_ensemble)

    def _draw(self, rows: int, context: Tensor | None,
              generator: torch.Generator | None) -> Tensor:
        ref = self._reference()
        noise = _noise_dtype(ref.dtype)
        u = torch.rand(rows, self.features, self.width, generator=generator,
                       device=ref.device, dtype=noise)
        gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(noise).tiny)))
        if self.absent is not None:  # a class a feature does not have is never the argmax
            gumbel.masked_fill_(self.absent, -math.inf)

        def step(params: Tensor, index: Tensor) -> Tensor:
            return (params + gumbel[:, index]).argmax(-1)

        like = torch.zeros(rows, self.features, dtype=torch.long, device=ref.device)
        return solve(self.made, step, like, context, encode=self._one_hot())

    def extra_repr(self) -> str:
        classes = list(self.classes) if isinstance(self.classes, tuple) else self.classes
        return f"features={self.features}, classes={classes}, " + super().extra_repr()
