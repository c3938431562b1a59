"""How `fit` builds its optimizer (flowkit.train.options.make_optimizer)."""

import pytest
import torch

from flowkit.train.options import make_optimizer


@pytest.mark.parametrize("name", ["adam", "adamw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adam_is_fused_and_steps_as_the_loop_does(name: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(7, 5, dtype=dtype)) for _ in range(2)]
    looped = [torch.nn.Parameter(w.detach().clone()) for w in weights]
    fused = make_optimizer(name, weights, 1e-2)
    reference = type(fused)(looped, lr=1e-2)
    assert fused.defaults["fused"] is True
    for _ in range(5):
        for w, v in zip(weights, looped, strict=True):
            w.grad = torch.sin(w.detach() * 3)
            v.grad = torch.sin(v.detach() * 3)
        fused.step()
        reference.step()
    for w, v in zip(weights, looped, strict=True):
        torch.testing.assert_close(w, v)


def test_sgd_and_callables_are_left_as_given() -> None:
    weight = [torch.nn.Parameter(torch.zeros(3))]
    assert not make_optimizer("sgd", weight, 0.1).defaults.get("fused")
    built = make_optimizer(lambda p, lr: torch.optim.Adam(p, lr=lr), weight, 0.1)
    assert not built.defaults["fused"]


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_weight_decay_reaches_the_named_optimizer(name: str) -> None:
    weight = [torch.nn.Parameter(torch.ones(3))]
    opt = make_optimizer(name, weight, 0.1, weight_decay=0.5)
    assert opt.defaults["weight_decay"] == 0.5
    weight[0].grad = torch.zeros(3)
    opt.step()  # a zero gradient: only the decay moves the weights, towards zero
    assert (weight[0] < 1).all()
