"""MADE: Masked Autoencoder for Distribution Estimation (Germain et al. 2015).

A MADE is an MLP whose weight matrices are multiplied by binary masks built from unit degrees
(see :mod:`flowkit.nn.masks`), so that output ``d`` depends only on the inputs that come
before ``d`` in an ordering. Here it is a pure *conditioner*: it maps ``x`` of shape
``(..., D)`` to ``P`` parameters per feature, shape ``(..., D, P)``, and knows nothing about
probabilities. The Bernoulli/categorical models and the flow layers put a likelihood or a
bijection on top.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import pairwise

import torch
from torch import Tensor, nn

from flowkit.checkpoint import InvalidBuffer, register_check
from flowkit.checkpoint.registry import warn_on_build
from flowkit.nn import layout, masks, staircase
from flowkit.nn.activation import build_activation
from flowkit.nn.linear import MaskedLinear
from flowkit.nn.masks import HiddenDegrees, OrderSpec
from flowkit.validation import (
    ArgumentError,
    check_bool,
    check_context,
    check_int,
    check_tensor,
    format_shape,
    is_permutation,
)


class MADE(nn.Module):
    r"""Masked autoregressive MLP: ``(..., D)`` inputs to ``(..., D, P)`` parameters.

    ``made(x, context)[..., d, :]`` depends only on ``x[..., j]`` for features ``j`` before
    ``d`` in :attr:`order`, and on all of ``context``.

    Args:
        features: ``D``, the number of autoregressive inputs.
        hidden_features: sizes of the hidden layers, e.g. ``(64, 64)``. May be empty.
        params_per_feature: ``P``, outputs per feature (2 for an affine flow layer, 1 for
            Bernoulli logits, ``K`` for a categorical).
        inputs_per_feature: ``m``, input units per feature, e.g. ``K`` for one-hot encoded
            categorical features. With ``m > 1`` the input has shape ``(..., D, m)``; all ``m``
            units of a feature share its degree.
        context_features: width ``C`` of an optional conditioning vector. Context inputs get
            degree 0, and so do some hidden units of every layer (at least
            ``min(8, max(1, H // 4))`` of a layer of ``H``,
            :data:`flowkit.nn.masks.CONTEXT_UNITS`), so the context reaches every output,
            the first feature's too, also when ``features == 1``.
        order: ``"natural"``, ``"reversed"``, ``"random"``, or a sequence such that
            ``order[i]`` is the ``i``-th feature to be modelled.
        hidden_degrees: ``"random"`` (as in the paper) or ``"even"`` (deterministic). The
            hidden units are stored in order of their degree in the first mask set (a
            relabelling of exchangeable units), so that the block-staircase products read the
            weights in place.
        num_masks: number of mask sets for order/connectivity-agnostic training. Set ``k``
            uses a new random ordering if ``order == "random"`` and new hidden degrees if
            ``hidden_degrees == "random"``. Switch with :meth:`set_mask` / :meth:`next_mask`.
        seed: seed of every random choice above (independent of the global RNG).
        activation: hidden nonlinearity: a :mod:`torch.nn` activation by name (``"relu"``,
            ``"elu"``, ...; :func:`flowkit.nn.activation.activation_class`) or what builds an
            elementwise ``nn.Module`` with no arguments (a class, a ``functools.partial``),
            default :class:`torch.nn.ReLU`.
        direct_connection: add a masked linear map from inputs (and context) to outputs.
        residual: use residual masked blocks ``h <- h + W act(h)`` after the first hidden
            layer (all hidden layers must then have the same size; they share degrees).

    Example:
        >>> made = MADE(3, hidden_features=(16,), params_per_feature=2, order="reversed")
        >>> made(torch.randn(5, 3)).shape
        torch.Size([5, 3, 2])
    """

    def __init__(
        self,
        features: int,
        hidden_features: Sequence[int] = (64, 64),
        params_per_feature: int = 1,
        inputs_per_feature: int = 1,
        context_features: int = 0,
        order: OrderSpec = "natural",
        hidden_degrees: HiddenDegrees = "random",
        num_masks: int = 1,
        seed: int = 0,
        activation: str | Callable[[], nn.Module] = nn.ReLU,
        direct_connection: bool = False,
        residual: bool = False,
    ):
        super().__init__()
        nonlinearity = build_activation(activation)
        features = check_int("features", features, 1)
        if isinstance(hidden_features, str) or not isinstance(hidden_features, Sequence):
            raise ValueError(
                "'hidden_features' should be a sequence of layer sizes, e.g. (64, 64), got "
                f"{hidden_features!r}"
            )
        hidden_features = tuple(
            check_int(f"hidden_features[{i}]", h, 1) for i, h in enumerate(hidden_features)
        )
        params_per_feature = check_int("params_per_feature", params_per_feature, 1)
        inputs_per_feature = check_int("inputs_per_feature", inputs_per_feature, 1)
        context_features = check_int("context_features", context_features, 0)
        num_masks = check_int("num_masks", num_masks, 1)
        seed = check_int("seed", seed, 0)
        direct_connection = check_bool("direct_connection", direct_connection)
        residual = check_bool("residual", residual)
        if residual and getattr(nonlinearity, "inplace", False):
            raise ValueError(
                f"'activation' builds {nonlinearity!r}, which overwrites its input, and "
                "residual=True adds that input (the pre-activation) to the next layer's: pass "
                "the activation without inplace=True"
            )
        if residual and len(set(hidden_features)) != 1:
            raise ValueError(
                "'residual' blocks need hidden layers of one size, got "
                f"hidden_features={hidden_features}"
            )
        if hidden_degrees not in ("random", "even"):
            raise ValueError(
                f"'hidden_degrees' should be 'random' or 'even', got {hidden_degrees!r}"
            )
        random_order = isinstance(order, str) and order == "random"
        if num_masks > 1 and not random_order and hidden_degrees != "random":
            raise ValueError(
                "'num_masks' > 1 needs order='random' or hidden_degrees='random', otherwise "
                "every mask set is the same"
            )
        # hidden degrees lie in [0 with a context else 1, D - 1]: one value leaves no choice
        # (a warning, not an error: files saved before it still load, silently)
        if (num_masks > 1 and (not random_order or features == 1)
                and (not hidden_features or features - 1 <= (0 if context_features else 1))):
            warn_on_build(
                f"'num_masks' > 1 with features={features}, hidden_features="
                f"{tuple(hidden_features)}, context_features={context_features} and "
                f"order={order!r} gives identical mask sets (with "
                f"{'no hidden layers' if not hidden_features else 'one possible degree'} and "
                f"one ordering there is nothing to vary), {num_masks} copies of one model: pass "
                "num_masks=1" + ("" if features == 1 else ", or order='random'"),
                stacklevel=2,
            )
        self.features = features
        self.hidden_features = hidden_features
        self.params_per_feature = params_per_feature
        self.inputs_per_feature = inputs_per_feature
        self.context_features = context_features
        self.num_masks = num_masks
        self.residual = residual
        self.activation = nonlinearity

        widths = (features * inputs_per_feature + context_features, *hidden_features)
        self.hidden = nn.ModuleList(MaskedLinear(a, b) for a, b in pairwise(widths))
        self.output = MaskedLinear(widths[-1], features * params_per_feature)
        self.direct = (
            MaskedLinear(widths[0], features * params_per_feature, bias=False)
            if direct_connection
            else None
        )

        # All mask sets are drawn once, up front, from one seeded generator; only their
        # degrees are stored (a few ints per unit), the masks of the active set are buffers.
        generator = torch.Generator().manual_seed(seed)
        orders, degrees = [], []
        for k in range(num_masks):
            spec = order if k == 0 or random_order else orders[0]
            order_k = masks.ordering(features, spec, generator)
            previous = torch.cat([masks.input_degrees(order_k),
                                  torch.zeros(min(context_features, 1), dtype=torch.long)])
            layers = []
            for i, units in enumerate(hidden_features):
                if residual and i > 0:
                    layers.append(layers[0])
                else:
                    layers.append(masks.hidden_degrees(units, features, previous,
                                                       hidden_degrees, generator))
                previous = layers[-1]
            orders.append(order_k)
            degrees.append(torch.cat([torch.zeros(0, dtype=torch.long), *layers]))  # (sum h,)
        degrees = self._relabel(degrees)
        self.register_buffer("orders", torch.stack(orders))
        self.register_buffer("hidden_degree_sets", torch.stack(degrees))
        # The active set is kept both as a buffer (saved with the masks) and as a Python int
        # (read on every call without a device synchronisation).
        # the active mask set (mask_set_index): saved with the model as the buffer mask_index,
        # and kept as a Python int (_active) so that reading it costs no read from the device
        self.register_buffer("mask_index", torch.zeros((), dtype=torch.long))
        self._active = 0
        self._solver = "fast"
        self._product = "auto"
        self.register_load_state_dict_post_hook(MADE._after_load)
        self.set_mask(0)

    @torch.no_grad()
    def _relabel(self, degrees: list[Tensor]) -> list[Tensor]:
        """Relabel the hidden units so that those of the first mask set are in order of degree:
        the same network (each unit keeps its weights, bias and degree in every set), stored so
        that the block-staircase products (:mod:`flowkit.nn.staircase`) read the weights in
        place. Returns the degree sets ``(sum h,)`` in the new order."""
        sizes = list(self.hidden_features)
        perms = [torch.argsort(d, stable=True) for d in degrees[0].split(sizes)]
        following = [*self.hidden[1:], self.output][: len(self.hidden)]
        for layer, after, perm in zip(self.hidden, following, perms, strict=True):
            layer.weight.copy_(layer.weight[perm])
            layer.bias.copy_(layer.bias[perm])
            after.weight.copy_(after.weight[:, perm])
        return [torch.cat([d[p] for d, p in zip(set_k.split(sizes), perms, strict=True)]
                          or [set_k]) for set_k in degrees]

    # ----------------------------------------------------------------- mask sets

    @staticmethod
    def _after_load(module: MADE, incompatible_keys: object) -> None:
        module._active = int(module.mask_index)

    @property
    def mask_set_index(self) -> int:
        """Index of the active mask set."""
        return self._active

    @property
    def order(self) -> Tensor:
        """Ordering of the active mask set: ``order[i]`` is the ``i``-th feature, ``(D,)`` (a
        copy: the stored orderings change only with the model)."""
        return self.orders[self._active].clone()

    def degrees(self) -> list[Tensor]:
        """Degrees of the active mask set, one tensor per layer: ``[inputs (D m + C,),
        hidden_1, ..., hidden_L]``. Context inputs have degree 0."""
        k = self._active
        inputs = torch.cat([
            masks.input_degrees(self.orders[k]).repeat_interleave(self.inputs_per_feature),
            self.orders.new_zeros(self.context_features),
        ])
        hidden = self.hidden_degree_sets[k].split(list(self.hidden_features))
        return [inputs, *hidden]

    @torch.no_grad()
    def set_mask(self, index: int) -> None:
        """Activate mask set ``index``, an integer (Python or numpy, not a bool) in
        ``[0, num_masks)``; anything else is a ValueError naming ``index``."""
        index = check_int("index", index, 0)
        if index >= self.num_masks:
            raise ArgumentError("index", f"should be in [0, {self.num_masks}), got {index}")
        self.mask_index.fill_(index)
        self._active = index
        degrees = self.degrees()
        for layer, (d_in, d_out) in zip(self.hidden, pairwise(degrees), strict=True):
            layer.set_mask(masks.hidden_mask(d_out, d_in))
        out_degrees = masks.input_degrees(self.order).repeat_interleave(self.params_per_feature)
        self.output.set_mask(masks.output_mask(out_degrees, degrees[-1]))
        if self.direct is not None:
            self.direct.set_mask(masks.output_mask(out_degrees, degrees[0]))

    def next_mask(self) -> int:
        """Cycle to the next mask set (connectivity-agnostic training); returns its index."""
        index = (self._active + 1) % self.num_masks
        if self.num_masks > 1:
            self.set_mask(index)
        return index

    @contextmanager
    def mask_set(self, index: int) -> Iterator[MADE]:
        """Temporarily evaluate with mask set ``index`` (checked as in :meth:`set_mask`);
        restores the active set afterwards."""
        previous = self._active
        self.set_mask(index)
        try:
            yield self
        finally:
            self.set_mask(previous)

    # ------------------------------------------------------------------- forward

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """``x``: ``(..., D)`` (or ``(..., D, m)`` when ``inputs_per_feature = m > 1``),
        ``context``: ``(..., C)`` or ``None``; both with the MADE's dtype and device. Returns
        ``(..., D, P)``. The checks read only shapes, dtypes and devices (no values); the flow
        layers and models that own a MADE call the unchecked :meth:`_forward`."""
        ref = self.output.weight
        m = self.inputs_per_feature
        feature_shape = (self.features,) if m == 1 else (self.features, m)
        x = check_tensor("x", x, ("...", *feature_shape), ref)
        if x.shape[-len(feature_shape) :] != feature_shape:
            raise ValueError(
                f"'x' should have shape {format_shape(('...', *feature_shape))}, got "
                f"{tuple(x.shape)}"
            )
        batch = x.shape[: x.dim() - len(feature_shape)]
        return self._forward(x, check_context(context, self.context_features, batch, ref))

    def _forward(self, x: Tensor, context: Tensor | None) -> Tensor:
        """:meth:`forward` on input its caller checked."""
        if self.inputs_per_feature > 1:
            x = x.flatten(-2)
        if context is not None:
            x = torch.cat([x, context], dim=-1)
        return self._outputs(x).unflatten(-1, (self.features, self.params_per_feature))

    def _outputs(self, x: Tensor) -> Tensor:
        """The outputs ``(..., D P)`` for inputs ``(..., D m + C)`` (features, then context):
        the stages of :func:`flowkit.nn.layout.stages`, through the block staircase of
        :mod:`flowkit.nn.staircase` where it is faster, else through the dense masked
        products; in the MADE's dtype, with ``torch.autocast`` off, as the solver
        (:mod:`flowkit.nn.inversion`) computes the other direction."""
        self.refuse_hooks()
        flat = x.reshape(-1, x.shape[-1])
        with torch.autocast(x.device.type, enabled=False):
            if staircase.applies(self, flat.shape[0]):
                return staircase.forward(self, flat).reshape(*x.shape[:-1], -1)
            return layout.run(self, x, lambda s, i, layer, v: layer(v))

    def refuse_hooks(self) -> None:
        """Refuse module hooks on the masked layers: the staircase and the solver read their
        weights without calling them, so hooks would run on some paths and not on others (and
        the hook-based ``torch.nn.utils.weight_norm``, ``spectral_norm`` and ``prune``, which
        recompute ``weight`` in a pre-hook, would give stale weights)."""
        for m in (*self.hidden, self.output, self.direct):
            if m is not None and (m._forward_pre_hooks or m._forward_hooks):
                label = next(k for k, v in self.named_modules() if v is m)
                raise RuntimeError(
                    f"the MADE's layer '{label}' has forward hooks, which flowkit's products "
                    "do not run (they read the weights directly); for weight or spectral "
                    "normalisation use torch.nn.utils.parametrizations.weight_norm / "
                    "spectral_norm (parametrizations work), not the hook-based "
                    "torch.nn.utils.weight_norm / spectral_norm / prune"
                )

    @property
    def solver(self) -> str:
        """How :func:`flowkit.nn.inversion.solve` solves this MADE's autoregressive equations
        (MAF sampling, IAF density of outside points, discrete sampling): ``"fast"`` (the
        default: about one MADE pass) or ``"naive"`` (the reference, one full pass per feature;
        for tests and benchmarks). A run-time setting, not saved with the model."""
        return self._solver

    @solver.setter
    def solver(self, name: str) -> None:
        if name not in ("fast", "naive"):
            raise ValueError(f"'solver' should be 'fast' or 'naive', got {name!r}")
        self._solver = name

    @property
    def product(self) -> str:
        """How the forward pass computes its masked products: ``"auto"`` (the default: the
        block staircase of :mod:`flowkit.nn.staircase` on the CPU where it is estimated to be
        faster for the layers' shapes and the batch, else the dense ``W * M``; always the dense
        product on a GPU, where the staircase's extra kernel launches were measured 1.7-4x
        slower, docs/performance.md), ``"dense"`` (always ``W *
        M``; a reference for tests and benchmarks) or ``"staircase"`` (always the staircase,
        except while ``torch.compile`` traces). Equal to rounding either way, gradients
        included. A run-time setting, not saved with the model."""
        return self._product

    @product.setter
    def product(self, name: str) -> None:
        if name not in ("auto", "dense", "staircase"):
            raise ValueError(f"'product' should be 'auto', 'dense' or 'staircase', got {name!r}")
        self._product = name

    def extra_repr(self) -> str:
        return (
            f"features={self.features}, hidden_features={self.hidden_features}, "
            f"params_per_feature={self.params_per_feature}, "
            f"context_features={self.context_features}, num_masks={self.num_masks}, "
            f"order={self.order.tolist() if self.features <= 16 else '...'}"
        )


@register_check(MADE)
def _check_stored_masks(made: MADE) -> None:
    """Refuse a MADE whose stored buffers its construction cannot give: orderings that are not
    permutations, an active mask set out of range, or masks other than those that set's stored
    degrees give (a wrong mask breaks the autoregressive property, and every density with it).
    Rebuilds the active set's masks from the stored degrees to compare them."""
    if not all(is_permutation(order) for order in made.orders):
        raise InvalidBuffer("orders", "permutations of range(features)")
    index = int(made.mask_index)
    if not 0 <= index < made.num_masks:
        raise InvalidBuffer("mask_index", f"in [0, {made.num_masks}), got {index}")
    layers = [(name, m) for name, m in made.named_modules() if isinstance(m, MaskedLinear)]
    stored = [m.mask.clone() for _, m in layers]
    made.set_mask(index)
    for (name, m), mask in zip(layers, stored, strict=True):
        if not torch.equal(m.mask, mask):
            raise InvalidBuffer(
                f"{name}.mask",
                f"the mask that the stored orders and degrees give for mask set {index}",
            )
