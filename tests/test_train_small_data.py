"""`fit` on a data set of a few dozen rows: the mechanism that keeps a flow from ending overfitted
(validation once per epoch by default, so every step or few when the data are small, and the
weights of the best validation restored). The benchmark behind it is ``flowkit bench-defaults``
(docs/defaults.md); these tests check the mechanism, not the numbers."""

import pytest
import torch

import flowkit
from flowkit.train import fit

QUIET = {"progress": False, "device": "cpu"}


def tiny_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(24, 3, generator=g), torch.randn(200, 3, generator=g)


def tiny_run(restore_best: bool | None, valid_every: int | None = None
             ) -> tuple[flowkit.Flow, torch.Tensor, object]:
    """The builder's default MAF with fit's default lr and schedule on 24 rows of a 3-D Gaussian:
    it fits them within a few steps, then its validation NLL grows by orders of magnitude."""
    x, valid = tiny_data()
    torch.manual_seed(0)
    flow = flowkit.MAF(3)
    h = fit(flow, x, valid=valid, steps=40, batch_size=24, valid_every=valid_every,
            restore_best=restore_best, seed=0, **QUIET)
    return flow, valid, h


@pytest.mark.parametrize("restore_best", [None, True, False])
def test_a_tiny_data_set_is_validated_every_epoch_before_it_overfits(restore_best):
    flow, valid, h = tiny_run(restore_best)
    # 24 rows in batches of 24: an epoch is one step, and the default validates after each
    assert h.valid_steps == list(range(1, 41))
    # the run overfits: the best validation comes early, the last is far worse
    assert h.best_step <= 20 and h.valid_loss[-1] > h.best_valid_loss + 2.0
    assert h.train_loss[-1] < h.best_valid_loss  # it fits its 24 rows better than any other
    with torch.no_grad():
        final = -flow.log_prob(valid).mean().item()
    # with validation data the default (None) ends with the best validation's weights, as
    # restore_best=True does; restore_best=False with the last step's
    expected = h.valid_loss[-1] if restore_best is False else h.best_valid_loss
    assert final == pytest.approx(expected, rel=1e-5)


def test_validation_every_40_steps_misses_the_best_weights_of_a_tiny_data_set():
    """Why the default is once per epoch, not a fixed number of steps (the benchmark's runs of
    the last session validated every 100): at the first validation of a run validated every 40
    steps, the flow of the test above has overfitted already."""
    _, _, per_epoch = tiny_run(restore_best=True)
    _, _, sparse = tiny_run(restore_best=True, valid_every=40)
    assert sparse.valid_steps == [40]
    assert sparse.best_valid_loss > per_epoch.best_valid_loss + 2.0


def test_a_fraction_holding_out_few_rows_warns_and_names_the_count():
    x, _ = tiny_data()
    few = r"valid=0\.1 holds out 2 of the 24 rows for validation"
    with pytest.warns(flowkit.train.DataWarning, match=few) as w:
        fit(flowkit.MAF(3), x, valid=0.1, steps=2, seed=0, **QUIET)
    assert all(r.filename == __file__ for r in w if r.category is flowkit.train.DataWarning)


def test_a_run_whose_first_validation_stays_the_best_warns():
    """The tiny run above overfits from its first step on: the weights returned are step 1's,
    hardly trained, and fit says so, at the caller's line."""
    with pytest.warns(UserWarning, match=r"the first validation \(step 1\) had the lowest "
                      r"validation loss of the 40, and it grew") as w:
        _, _, h = tiny_run(restore_best=None)
    assert h.best_step == h.valid_steps[0] == 1
    assert [r.filename for r in w if "first validation" in str(r.message)] == [__file__]


def test_a_run_on_data_the_flow_fits_from_the_start_does_not_warn(recwarn):
    """A Gaussian, which the standardized flow fits at step 0: here the first validation stays
    the best, by noise, and early stopping ends the run, but the validation loss does not
    grow, so there is nothing to warn about."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2000, 2, generator=g) * torch.tensor([3.0, 0.5]) + 10
    h = fit(flowkit.MAF(2, layers=2, hidden_features=(16,)), x, valid=0.2, steps=400,
            batch_size=128, early_stopping_patience=2, seed=0, **QUIET)
    assert h.best_step == h.valid_steps[0] and len(h.valid_loss) == 3  # the case in question
    assert not [r for r in recwarn if "first validation" in str(r.message)]


def test_a_run_that_improves_on_enough_validation_rows_does_not_warn(recwarn):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 2, generator=g) * torch.tensor([1.0, 0.2])
    h = fit(flowkit.MAF(2), x, valid=0.1, steps=150, seed=0, **QUIET)
    assert h.best_step != h.valid_steps[0]
    assert not [r for r in recwarn if "validation" in str(r.message)]
