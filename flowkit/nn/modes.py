"""Running a module in evaluation mode for a while, then giving it back its mode."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """Inside the ``with`` block, ``module`` is in evaluation mode (``module.eval()``) and no
    gradients are recorded (:func:`torch.no_grad`); on leaving it, normally or by an exception,
    ``module`` and each of its submodules get back the mode they had on entering (a submodule
    kept in evaluation mode inside a training model stays so).

    Example:
        >>> import torch
        >>> net = torch.nn.Dropout().train()
        >>> with evaluating(net):
        ...     net.training
        False
        >>> net.training
        True
    """
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield module
    finally:
        for m, training in modes:  # parents first: each call sets its subtree, then theirs
            m.train(training)
