r"""Embedding networks: a learned map of a flow's context, ``(..., C_raw) -> (..., C)``.

A conditional flow :math:`p(x \mid c)` reads its context through every layer (each MADE
concatenates it to its input) and, with a conditional base, through the base. An embedding
network :math:`h = e(c)` is applied once to the raw context before any of them and trained with
the flow, so the flow conditions on :math:`h` (for example a summary of a long simulation
output in simulation-based inference).

Any :class:`torch.nn.Module` that maps ``(N, C_raw)`` to ``(N, C)`` can be a flow's embedding
(the ``embedding`` argument of :func:`flowkit.MAF` and :func:`flowkit.IAF`). Saving is where
they differ: :func:`flowkit.save_model` stores a model as the arguments of its constructor, so
only the built-in :class:`MLPEmbedding` is rebuilt by :func:`flowkit.load_model` on its own;
a flow with any other embedding is saved with its weights and the name of the embedding's class,
and is loaded with ``flowkit.load_model(path, embedding=MyNet(...))``, the network built again
by the caller (its weights then come from the file).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from flowkit.checkpoint import register_model
from flowkit.nn.activation import ActivationSpec, activation_class, activation_name
from flowkit.nn.modes import evaluating
from flowkit.validation import check_batch, check_int, reference

__all__ = ["MLPEmbedding", "build_embedding", "embedded_features", "embedding_config"]


@register_model(store={"activation": activation_name})
class MLPEmbedding(nn.Module):
    r"""A multilayer perceptron ``(..., in_features) -> (..., out_features)``.

    :math:`h = W_L\,a(\cdots a(W_1 c + b_1) \cdots) + b_L`, with activation :math:`a` after
    every layer but the last (the output is linear).

    Args:
        in_features: ``C_raw``, the width of the raw context.
        out_features: ``C``, the width the flow reads.
        hidden_features: hidden widths (``()``: one linear layer).
        activation: the hidden nonlinearity, a :mod:`torch.nn` activation by name (``"relu"``,
            ``"elu"``, ``"tanh"``, ...) or class, as the builders' ``activation`` (see
            :func:`flowkit.nn.activation.activation_class`).

    Example:
        >>> import torch
        >>> embedding = MLPEmbedding(10, 4, hidden_features=(32,))
        >>> embedding(torch.randn(7, 3, 10)).shape
        torch.Size([7, 3, 4])
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden_features: Sequence[int] = (64, 64),
        activation: ActivationSpec = "relu",
    ):
        super().__init__()
        self.in_features = check_int("in_features", in_features, 1)
        self.out_features = check_int("out_features", out_features, 1)
        if isinstance(hidden_features, str | bytes) or not isinstance(hidden_features, Sequence):
            raise ValueError(
                f"'hidden_features' should be a sequence of widths, got {hidden_features!r}"
            )
        hidden = [check_int("hidden_features", h, 1) for h in hidden_features]
        activation_cls = activation_class(activation)
        sizes = [self.in_features, *hidden, self.out_features]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            if i > 0:
                layers.append(activation_cls())
            layers.append(nn.Linear(a, b))
        self.net = nn.Sequential(*layers)

    def forward(self, context: Tensor) -> Tensor:
        """``(..., in_features)`` -> ``(..., out_features)``."""
        return self.net(check_batch("context", context, self.in_features, None))


_BUILT_IN: dict[str, type[nn.Module]] = {"MLPEmbedding": MLPEmbedding}


def embedding_config(embedding: nn.Module) -> dict[str, Any]:
    """What a flow's ``config`` stores for its embedding: the built-in embedding's own config
    (``{"type": "MLPEmbedding", "kwargs": {...}}``), or ``{"custom": "module.Class",
    "structure": repr(network)}`` for any other network, which :func:`build_embedding` refuses
    to rebuild (the loader compares the network it is given with both)."""
    if type(embedding) in _BUILT_IN.values():  # a subclass is a custom network
        return embedding.config  # set by register_model
    return {"custom": f"{type(embedding).__module__}.{type(embedding).__qualname__}",
            "structure": repr(embedding)}


def build_embedding(spec: nn.Module | dict[str, Any]) -> nn.Module:
    """The embedding a builder was given: a module as it is, or a stored config rebuilt.

    Raises:
        ValueError: a config of a custom network (it cannot be rebuilt from a file: pass the
            network to :func:`flowkit.load_model` as ``embedding``) or a malformed config.
    """
    if isinstance(spec, nn.Module):
        return spec
    if isinstance(spec, dict) and "custom" in spec:
        raise ValueError(
            f"the flow was saved with a custom embedding network ({spec['custom']}), which "
            "cannot be rebuilt from a file: build it again and pass it, "
            "flowkit.load_model(path, embedding=network) (the weights come from the file)"
        )
    if (
        isinstance(spec, dict)
        and spec.get("type") in _BUILT_IN
        and isinstance(spec.get("kwargs"), dict)
    ):
        return _BUILT_IN[spec["type"]](**spec["kwargs"])
    raise ValueError(
        "'embedding' should be an nn.Module mapping (N, context_features) to (N, C) or the "
        f"config of a built-in embedding ({{'type': 'MLPEmbedding', 'kwargs': ...}}), got "
        f"{spec!r}"
    )


def embedded_features(embedding: nn.Module, in_features: int) -> int:
    """The width ``C`` of ``embedding``'s output for inputs of width ``in_features``: its
    ``out_features`` if it is an :class:`MLPEmbedding`, else found by calling it once on a
    ``(1, in_features)`` tensor of zeros, without gradients and in evaluation mode (its
    training mode is restored after).

    Raises:
        ValueError: an :class:`MLPEmbedding` whose ``in_features`` differs, or a network that
            does not return a ``(1, C)`` tensor (or fails) on that input.
    """
    if isinstance(embedding, MLPEmbedding):
        if embedding.in_features != in_features:
            raise ValueError(
                f"'embedding' takes in_features={embedding.in_features} but the flow has "
                f"context_features={in_features}"
            )
        return embedding.out_features
    like = reference(embedding)
    probe = torch.zeros(1, in_features) if like is None else like.new_zeros(1, in_features)
    try:
        with evaluating(embedding):
            out = embedding(probe)
    except Exception as e:
        raise ValueError(
            f"'embedding' ({type(embedding).__name__}) should map (N, {in_features}) to (N, C) "
            f"(the flow's context_features is {in_features}), but it failed on a (1, "
            f"{in_features}) input: {type(e).__name__}: {e}"
        ) from e
    if not isinstance(out, Tensor) or out.dim() != 2 or out.shape[0] != 1 or out.shape[1] < 1:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(
            f"'embedding' ({type(embedding).__name__}) should map (N, {in_features}) to (N, C), "
            f"but for a (1, {in_features}) input it returned {got}"
        )
    return int(out.shape[1])
