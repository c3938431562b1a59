"""Score saved BernoulliMADEs (model.pt or checkpoint.pt of flowkit mnist) on a binarized MNIST
split or a split file (an .npz key or an .amat): mean NLL in nats with its standard error, for
mask set 0 and the mask ensemble of each model and, given several models, for their uniform
mixture."""

from flowkit.app.mnist import add_eval_arguments as add_arguments
from flowkit.app.mnist import run_eval as run

__all__ = ["add_arguments", "run"]
