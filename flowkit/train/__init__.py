"""Training: maximum likelihood (:func:`fit`), reverse KL (:func:`fit_reverse_kl`), checkpoints,
resume and ``torchrun`` support. See ``docs/training.md``."""

from .distributed import is_main_process, resolve_device
from .history import History
from .loop import CHECKPOINT_NAME, NonFiniteLossError
from .objectives import fit, fit_reverse_kl

__all__ = [
    "CHECKPOINT_NAME",
    "History",
    "NonFiniteLossError",
    "fit",
    "fit_reverse_kl",
    "is_main_process",
    "resolve_device",
]
