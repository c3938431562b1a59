"""Training: maximum likelihood (:func:`fit`), reverse KL (:func:`fit_reverse_kl`), their shared
options (:class:`TrainOptions`), callbacks, checkpoints, resume and ``torchrun`` support. See
``docs/training.md``."""

from .arrays import (
    DataWarning,
    PrecisionWarning,
    split_rows,
    warn_if_degenerate,
    warn_if_duplicated,
    warn_if_outlying,
    warn_if_rounded,
    warn_if_skewed,
)
from .baseline import BaselineWarning, gaussian_nll, warn_if_worse_than_gaussian
from .callbacks import Callbacks, Progress
from .checks import DivergenceError, DivergenceWarning, NonFiniteLossError
from .distributed import is_main_process, resolve_device
from .history import History
from .likelihood import (
    MIN_VALID_ROWS,
    auto_valid_rows,
    default_batch_size,
    fit,
    held_out_rows,
)
from .loop import refresh_interval
from .options import DEFAULTS, TrainOptions
from .reverse_kl import fit_reverse_kl
from .session import CHECKPOINT_NAME

__all__ = [
    "BaselineWarning",
    "CHECKPOINT_NAME",
    "DEFAULTS",
    "Callbacks",
    "DataWarning",
    "DivergenceError",
    "DivergenceWarning",
    "History",
    "MIN_VALID_ROWS",
    "NonFiniteLossError",
    "PrecisionWarning",
    "Progress",
    "TrainOptions",
    "auto_valid_rows",
    "refresh_interval",
    "default_batch_size",
    "fit",
    "fit_reverse_kl",
    "gaussian_nll",
    "held_out_rows",
    "is_main_process",
    "resolve_device",
    "split_rows",
    "warn_if_degenerate",
    "warn_if_duplicated",
    "warn_if_outlying",
    "warn_if_rounded",
    "warn_if_skewed",
    "warn_if_worse_than_gaussian",
]
