"""Score a saved Bernoulli-MADE on binarized MNIST: mean NLL in nats per image with its standard
error, for mask set 0 and for the uniform mixture of the model's mask sets (a mask ensemble).

The data are a standard split (``--split``, via :func:`flowkit.data.binarized_mnist`) or any split
file (``--file``: an ``.npz`` array named by ``--key``, or an ``.amat`` text file). The code lives
in :mod:`flowkit.experiments.mnist`; this module is the ``flowkit mnist-eval`` subcommand.
"""

from flowkit.experiments.mnist import add_eval_arguments as add_arguments
from flowkit.experiments.mnist import run_eval as run

__all__ = ["add_arguments", "run"]
