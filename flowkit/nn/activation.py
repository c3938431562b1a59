"""Hidden nonlinearities by name, for the networks whose config a file stores (the MADEs of
:func:`flowkit.MAF` / :func:`flowkit.IAF`, :class:`flowkit.nn.MLPEmbedding`)."""

from __future__ import annotations

from torch import nn

__all__ = ["ActivationSpec", "activation_class", "activation_name"]

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
        f"'elu', 'gelu', 'silu', 'tanh'; one of {sorted(names)}), got {activation!r}"
    )


def activation_name(activation: ActivationSpec) -> str:
    """What a config stores for ``activation``: its class name (see :func:`activation_class`)."""
    return activation_class(activation).__name__
