"""Base distributions: log-densities match torch.distributions, draws follow the module."""

import pytest
import torch
from torch.distributions import Independent, Normal

from flowkit.distributions.normal import (
    DiagonalGaussian,
    StandardNormal,
    diagonal_normal_log_prob,
)


def test_log_prob_matches_torch_and_rsample_has_the_modules_shape():
    base = DiagonalGaussian(3).double()
    with torch.no_grad():
        base.loc.normal_()
        base.log_scale.normal_(0, 0.5)
    z = torch.randn(5, 3, dtype=torch.float64)
    reference = Independent(Normal(base.loc, base.log_scale.exp()), 1)
    torch.testing.assert_close(base.log_prob(z), reference.log_prob(z))
    draws = base.rsample(4, torch.Generator().manual_seed(0))
    assert draws.shape == (4, 3) and draws.dtype == torch.float64
    assert isinstance(base.loc, torch.nn.Parameter)
    assert {"loc", "log_scale"} <= set(StandardNormal(2).state_dict())


def test_diagonal_normal_log_prob_matches_torch_per_row_scales():
    """The one Gaussian log-density helper, with a log-scale per row (a conditional base's)."""
    loc = torch.randn(4, 3, dtype=torch.float64)
    log_scale = 0.5 * torch.randn(4, 3, dtype=torch.float64)
    z = torch.randn(4, 3, dtype=torch.float64)
    eps = (z - loc) * torch.exp(-log_scale)
    reference = Independent(Normal(loc, log_scale.exp()), 1).log_prob(z)
    torch.testing.assert_close(diagonal_normal_log_prob(eps, log_scale), reference)


@pytest.mark.parametrize("features", [0, -1, 2.5, "2", True])
def test_bad_features(features):
    with pytest.raises(ValueError, match="'features' should be (an integer )?>= 1, got "):
        DiagonalGaussian(features)
    with pytest.raises(ValueError, match="'features' should be (an integer )?>= 1, got "):
        StandardNormal(features)


def test_learnable_must_be_a_bool():
    with pytest.raises(ValueError, match="'learnable' should be True or False, got 'no'"):
        DiagonalGaussian(2, learnable="no")  # a truthy string used to make it learnable
