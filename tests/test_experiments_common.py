"""Helpers shared by the experiments: mean with standard error, and the plain MLP."""

import math
import statistics

import pytest
import torch
from torch import nn

from flowkit.app.common import mean_se, mlp


def test_mean_se_is_the_mean_and_sample_std_over_sqrt_n():
    values = [0.5, 2.0, -1.25, 3.0, 7.5]
    mean, se = mean_se(torch.tensor(values))
    assert mean == pytest.approx(statistics.fmean(values), rel=1e-12)
    assert se == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)), rel=1e-12)


def test_mean_se_accepts_tensors_that_need_gradients():
    x = torch.tensor([1.0, 2.0, 4.0], requires_grad=True) * 2
    mean, se = mean_se(x)
    assert isinstance(mean, float) and isinstance(se, float)
    assert mean == pytest.approx(14 / 3)


def test_mean_se_of_one_value_has_no_standard_error():
    mean, se = mean_se(torch.tensor([2.0]))
    assert mean == 2.0 and math.isnan(se)


@pytest.mark.parametrize("activation", [nn.ReLU, nn.ELU])
def test_mlp_has_an_activation_between_linear_layers_only(activation):
    net = mlp([3, 5, 4, 2], activation)
    kinds = [type(m) for m in net]
    assert kinds == [nn.Linear, activation, nn.Linear, activation, nn.Linear]
    assert [(m.in_features, m.out_features) for m in net if isinstance(m, nn.Linear)] == [
        (3, 5), (5, 4), (4, 2)
    ]
    assert net(torch.randn(7, 3)).shape == (7, 2)


def test_mlp_without_hidden_layers_is_one_linear_layer():
    net = mlp([3, 2], nn.ReLU)
    assert [type(m) for m in net] == [nn.Linear]


def test_mlp_needs_two_sizes():
    with pytest.raises(ValueError, match="'sizes' should have at least 2"):
        mlp([3], nn.ReLU)
