"""Hidden nonlinearities: by name (:func:`activation_class`) for the networks whose config a
file stores (the MADEs of :func:`flowkit.MAF` / :func:`flowkit.IAF`,
:class:`flowkit.nn.MLPEmbedding`), which must rebuild them from that name; or also from what
builds one (:func:`build_activation`) for :class:`flowkit.MADE`, whose file stores its weights
only."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

__all__ = ["ActivationSpec", "activation_class", "activation_name", "build_activation"]

ActivationSpec = str | type[nn.Module]

# torch.nn.modules.activation classes that mix units (a MADE needs an elementwise map, or the
# autoregressive property is lost) or need constructor arguments.
_NOT_ELEMENTWISE = {"MultiheadAttention", "Softmax", "Softmax2d", "Softmin", "LogSoftmax", "GLU",
                    "Threshold"}


def activation_class(activation: ActivationSpec) -> type[nn.Module]:
    """A hidden nonlinearity from its name, any activation of :mod:`torch.nn` by its class name
    in any case (``"relu"``, ``"ELU"``, ``"gelu"``, ``"silu"``, ``"tanh"``, ``"leakyrelu"``), or
    that class itself (``nn.ELU``). Only :mod:`torch.nn`'s elementwise activations, so that a
    model's config can store the name and :func:`flowkit.load_model` can rebuild it.

    Raises:
        ValueError: anything else, with the names that are accepted.

    Example:
        >>> activation_class("elu"), activation_class(nn.GELU)
        (<class 'torch.nn.modules.activation.ELU'>, <class 'torch.nn.modules.activation.GELU'>)
    """
    names = {
        name.lower(): cls
        for name, cls in vars(nn.modules.activation).items()
        if isinstance(cls, type) and issubclass(cls, nn.Module)
        and cls.__module__ == nn.modules.activation.__name__ and name not in _NOT_ELEMENTWISE
    }
    if isinstance(activation, str) and activation.lower() in names:
        return names[activation.lower()]
    if isinstance(activation, type) and names.get(activation.__name__.lower()) is activation:
        return activation
    raise ValueError(
        "'activation' should be the name or class of a torch.nn activation (e.g. 'relu', "
        f"'elu', 'gelu', 'silu', 'tanh'; one of {sorted(names)}), got {activation!r} (the "
        "saved config stores the name; a partial or a module of your own goes into a "
        "flowkit.MADE built by hand, whose activation takes any of them)"
    )


def activation_name(activation: ActivationSpec) -> str:
    """What a config stores for ``activation``: its class name (see :func:`activation_class`)."""
    return activation_class(activation).__name__


def build_activation(activation: str | Callable[[], nn.Module]) -> nn.Module:
    """The hidden nonlinearity of :class:`flowkit.MADE`'s ``activation``: a :mod:`torch.nn`
    activation by name (:func:`activation_class`), or what builds an ``nn.Module`` with no
    arguments (a class, a partial, a function of your own)."""
    if isinstance(activation, str):
        activation = activation_class(activation)
    built = None
    if callable(activation) and not isinstance(activation, nn.Module):
        try:
            built = activation()
        except TypeError:  # e.g. torch.tanh, which needs its input
            pass
    if not isinstance(built, nn.Module):
        raise ValueError(
            "'activation' should be the name of a torch.nn activation ('relu', 'elu', ...) or "
            "what builds one with no arguments (nn.ELU, functools.partial(nn.LeakyReLU, 0.2)), "
            f"not a module already built, got {activation!r}"
        )
    return built
