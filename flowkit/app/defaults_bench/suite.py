"""The tasks of ``flowkit bench-defaults``: one seeded train / validation / test split per
dataset, shared by every model (see the package docstring for what each task is)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from sklearn import datasets as sk_datasets

from flowkit.data import TOY_DATASETS, has_exact_density, sample_toy, toy_entropy

__all__ = ["REAL", "UNIT_SCALE", "UNIT_SHIFT", "Task", "make_tasks"]

REAL = ("wine", "breast_cancer", "digits", "iris", "diabetes")
UNIT_SCALE, UNIT_SHIFT = 100.0, 1000.0
"""The change of units of the ``x100+1000`` tasks:
``x[:, 0] -> UNIT_SCALE x[:, 0] + UNIT_SHIFT``."""


@dataclass
class Task:
    """One dataset split, shared by every model. Arrays are float32 ``(N, D)``; contexts
    ``(N, C)`` or None. ``log_jacobian`` is ``log|det|`` of the change of units applied to the
    data (subtracted from NLLs to report them in the original units); ``entropy`` the exact
    differential entropy in the original units where known."""

    name: str
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    context: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    log_jacobian: float = 0.0
    entropy: float | None = None
    real: bool = False


def _units(x: np.ndarray) -> np.ndarray:
    y = x.copy()
    y[:, 0] = y[:, 0] * UNIT_SCALE + UNIT_SHIFT
    return y


def _own_and_units(name: str, parts: tuple[np.ndarray, ...], context: tuple | None,
                   entropy: float | None) -> list[Task]:
    """The task at its own scale and after the change of units of its first axis."""
    return [Task(f"{name}:own", *parts, context=context, entropy=entropy),
            Task(f"{name}:x100+1000", *(_units(a) for a in parts), context=context,
                 log_jacobian=math.log(UNIT_SCALE), entropy=entropy)]


def _toy_tasks(name: str, n_train: int, n_test: int, seed: int) -> list[Task]:
    data = sample_toy(name, n_train, seed=seed).numpy()
    test = sample_toy(name, n_test, seed=seed + 1).numpy()
    n_valid = max(1, n_train // 10)
    entropy = toy_entropy(name) if has_exact_density(name) else None
    return _own_and_units(name, (data[n_valid:], data[:n_valid], test), None, entropy)


def _moons_tasks(n_train: int, n_test: int, seed: int) -> list[Task]:
    x, y = sk_datasets.make_moons(n_train + n_test, noise=0.1, random_state=seed)
    x, y = x.astype(np.float32), y.astype(np.float32)[:, None]
    n_valid = max(1, n_train // 10)
    parts = (slice(n_valid, n_train), slice(0, n_valid), slice(n_train, None))
    return _own_and_units("moons|y", tuple(x[p] for p in parts), tuple(y[p] for p in parts),
                          None)


def _load_real(name: str) -> np.ndarray:
    if name == "diabetes":
        return sk_datasets.load_diabetes(scaled=False).data
    return getattr(sk_datasets, f"load_{name}")().data


def _real_tasks(name: str, seed: int) -> list[Task]:
    x = _load_real(name).astype(np.float64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 5
    n_valid = max(1, (len(x) - n_test) // 10)
    test, valid, train = np.split(x[order], [n_test, n_test + n_valid])
    fitted = np.concatenate([train, valid])
    mean, std = fitted.mean(0), fitted.std(0)
    std[std == 0] = 1.0  # as sklearn's StandardScaler does
    f32 = [a.astype(np.float32) for a in (train, valid, test)]
    scaled = [((a - mean) / std).astype(np.float32) for a in (train, valid, test)]
    return [Task(f"{name}:raw", *f32, real=True), Task(f"{name}:std", *scaled, real=True)]


def make_tasks(n_train: int, n_test: int, seed: int) -> list[Task]:
    """Every task of the benchmark, in table order: the toys (``n_train`` rows to fit, a tenth
    of them for validation, ``n_test`` fresh rows to score), the real data sets, ``moons|y``."""
    tasks: list[Task] = []
    for name in TOY_DATASETS:
        tasks += _toy_tasks(name, n_train, n_test, seed)
    for name in REAL:
        tasks += _real_tasks(name, seed)
    return tasks + _moons_tasks(n_train, n_test, seed)
