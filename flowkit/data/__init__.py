"""Datasets and target densities.

* :mod:`flowkit.data.toy`: sampled 2-D datasets, with exact densities and entropies for some;
* :mod:`flowkit.data.energy`: the energies U1--U4 of Rezende & Mohamed (2015), their
  normalizers, and the same targets with a wall instead of a box edge (for reverse-KL fits);
* :mod:`flowkit.data.mnist`: binarized MNIST with the standard fixed binarization;
* :mod:`flowkit.data.arrays`: arrays read from ``.npy`` and ``.npz`` files.
"""

from flowkit.data.arrays import read_arrays
from flowkit.data.energy import (
    ENERGIES,
    ENERGY_BOXES,
    WALL,
    energy_log_density,
    energy_log_normalizer,
    walled_log_density,
    walled_log_normalizer,
)
from flowkit.data.mnist import SPLITS, binarized_mnist, data_root, load_split_file
from flowkit.data.toy import (
    TOY_BOX,
    TOY_DATASETS,
    Box,
    box_grid,
    has_exact_density,
    sample_toy,
    toy_entropy,
    toy_log_prob,
)

__all__ = [
    "ENERGIES",
    "ENERGY_BOXES",
    "SPLITS",
    "TOY_BOX",
    "TOY_DATASETS",
    "WALL",
    "Box",
    "binarized_mnist",
    "box_grid",
    "data_root",
    "energy_log_density",
    "energy_log_normalizer",
    "has_exact_density",
    "load_split_file",
    "read_arrays",
    "sample_toy",
    "toy_entropy",
    "toy_log_prob",
    "walled_log_density",
    "walled_log_normalizer",
]
