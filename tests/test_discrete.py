"""Bernoulli and categorical MADE: exact normalization for every ordering and mask set, mask
ensembles, sampling (same noise, same samples; frequencies match), autoregressive structure,
bad input, save/load."""

import doctest
import itertools
import json
import warnings

import numpy as np
import pytest
import torch

from flowkit import load_model, save_model
from flowkit.distributions import discrete
from flowkit.distributions.discrete import BernoulliMADE, CategoricalMADE
from flowkit.testing import check_autoregressive
from flowkit.train import Callbacks, fit
from flowkit.validation import is_int

BERNOULLI = {
    "natural": dict(order="natural"),
    "reversed-direct": dict(order="reversed", direct_connection=True),
    "explicit-order": dict(order=[3, 7, 0, 9, 1, 2, 8, 4, 6, 5]),
    "random-4-masks": dict(order="random", num_masks=4),
    "connectivity-4-masks": dict(num_masks=4),
    "residual-3-masks": dict(order="random", num_masks=3, residual=True),
    "one-layer-direct-2-masks": dict(hidden_features=(24,), order="random", num_masks=2,
                                     direct_connection=True),  # the MNIST models' shape
}
CATEGORICAL = {
    "natural": dict(order="natural"),
    "reversed-2-masks": dict(order="reversed", num_masks=2),
    "random-3-masks": dict(order="random", num_masks=3),
    "residual-direct-2-masks": dict(hidden_features=(16, 16), order="random", num_masks=2,
                                    residual=True, direct_connection=True),
}


def all_binary(features: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product([0.0, 1.0], repeat=features)), dtype=torch.float64)


def all_categorical(features: int, classes: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(classes), repeat=features)))


def bernoulli(features: int = 10, hidden_features=(24, 24), **kwargs) -> BernoulliMADE:
    model = BernoulliMADE(features, hidden_features=hidden_features, seed=1, **kwargs).double()
    for p in model.parameters():  # larger weights than the default init: peaked conditionals
        torch.nn.init.normal_(p, std=0.7)
    return model


# ------------------------------------------------------------------------ exact normalization


@pytest.mark.parametrize("kwargs", BERNOULLI.values(), ids=BERNOULLI.keys())
def test_bernoulli_sums_to_one_for_every_mask_set_and_the_ensemble(kwargs):
    model = bernoulli(**kwargs)
    x = all_binary(10)
    for k in range(model.num_masks):
        model.set_mask(k)
        assert torch.logsumexp(model.log_prob(x), 0).item() == pytest.approx(0.0, abs=1e-10)
    model.set_mask(0)
    for size in range(1, model.num_masks + 1):
        total = torch.logsumexp(model.log_prob(x, mask_ensemble=size), 0).item()
        assert total == pytest.approx(0.0, abs=1e-10)


def categorical(features: int, classes: int, hidden_features=(16,), **kwargs) -> CategoricalMADE:
    model = CategoricalMADE(features, classes, hidden_features=hidden_features, seed=2, **kwargs)
    for p in model.parameters():  # larger weights than the default init: peaked conditionals
        torch.nn.init.normal_(p, std=0.7)
    return model.double()


@pytest.mark.parametrize("kwargs", CATEGORICAL.values(), ids=CATEGORICAL.keys())
def test_categorical_sums_to_one_for_every_mask_set_and_the_ensemble(kwargs):
    model = categorical(3, 4, **kwargs)
    x = all_categorical(3, 4)
    for k in range(model.num_masks):
        model.set_mask(k)
        assert torch.logsumexp(model.log_prob(x), 0).item() == pytest.approx(0.0, abs=1e-10)
    model.set_mask(0)
    for size in range(1, model.num_masks + 1):
        total = torch.logsumexp(model.log_prob(x, mask_ensemble=size), 0).item()
        assert total == pytest.approx(0.0, abs=1e-10)


def test_categorical_two_features_two_hundred_classes_sums_to_one():
    model = CategoricalMADE(2, classes=200, hidden_features=(32,), seed=0).double()
    log_p = model.log_prob(all_categorical(2, 200))  # all 40000 configurations
    assert log_p.shape == (40000,)
    assert torch.logsumexp(log_p, 0).item() == pytest.approx(0.0, abs=1e-10)


# ------------------------------------------------------------------------ likelihood


def test_bernoulli_log_prob_is_the_sum_of_the_conditionals():
    model = bernoulli(6, order="random", num_masks=2)
    x = all_binary(6)[::3]
    p1 = torch.sigmoid(model.logits(x))
    expected = torch.where(x == 1, p1, 1 - p1).log().sum(-1)
    torch.testing.assert_close(model.log_prob(x), expected)


def test_categorical_log_prob_picks_the_softmax_of_each_feature():
    model = CategoricalMADE(3, classes=5, hidden_features=(16,), seed=0).double()
    x = torch.tensor([[0, 4, 2], [3, 3, 1]])
    log_softmax = torch.log_softmax(model.logits(x), -1)
    rows = [log_softmax[i, [0, 1, 2], x[i]].sum() for i in range(2)]
    torch.testing.assert_close(model.log_prob(x), torch.stack(rows))


def test_mask_ensemble_is_log_mean_exp_of_the_mask_log_likelihoods():
    model = bernoulli(8, order="random", num_masks=3)
    model.set_mask(2)
    x = all_binary(8)[::7]
    per_mask = []
    for k in range(3):
        with model.made.mask_set(k):
            per_mask.append(model.log_prob(x))
    expected = torch.stack(per_mask).exp().mean(0).log()
    torch.testing.assert_close(model.log_prob(x, mask_ensemble=3), expected)
    assert model.made.mask_set_index == 2  # the active set is restored
    torch.testing.assert_close(model.log_prob(x, mask_ensemble=1), per_mask[0])


def test_bernoulli_accepts_bool_integer_and_float_binary_input():
    model = BernoulliMADE(5, hidden_features=(8,))
    x = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0]])
    expected = model.log_prob(x.float())
    for dtype in (torch.bool, torch.uint8, torch.long, torch.float64):
        torch.testing.assert_close(model.log_prob(x.to(dtype)), expected)


# ------------------------------------------------------------------------ sampling


@pytest.mark.parametrize("kwargs", BERNOULLI.values(), ids=BERNOULLI.keys())
def test_bernoulli_samples_equal_the_naive_solver_given_the_same_noise(kwargs):
    model = bernoulli(**kwargs)
    for k in range(model.num_masks):
        model.set_mask(k)
        fast = model.sample(64, generator=torch.Generator().manual_seed(k))
        model.made.solver = "naive"  # the reference solver
        naive = model.sample(64, generator=torch.Generator().manual_seed(k))
        model.made.solver = "fast"
        assert torch.equal(fast, naive)
        assert fast.shape == (64, 10) and fast.dtype == torch.float64
        assert ((fast == 0) | (fast == 1)).all()


@pytest.mark.parametrize("kwargs", CATEGORICAL.values(), ids=CATEGORICAL.keys())
def test_categorical_samples_equal_the_naive_solver_given_the_same_noise(kwargs):
    model = categorical(4, 6, **kwargs).float()
    for k in range(model.num_masks):
        model.set_mask(k)
        fast = model.sample(50, generator=torch.Generator().manual_seed(k))
        model.made.solver = "naive"  # the reference solver
        naive = model.sample(50, generator=torch.Generator().manual_seed(k))
        model.made.solver = "fast"
        assert torch.equal(fast, naive)
        assert fast.dtype == torch.long and fast.min() >= 0 and fast.max() < 6


def chi_square(samples: torch.Tensor, support: torch.Tensor, log_p: torch.Tensor) -> float:
    """Pearson's statistic of the counts of each support row among the samples."""
    counts = (samples[:, None, :] == support[None, :, :]).all(-1).sum(0).double()
    expected = log_p.exp() * samples.shape[0]
    return ((counts - expected) ** 2 / expected).sum().item()


def test_bernoulli_sample_frequencies_match_the_probabilities():
    # 3 features: 8 cells, 7 degrees of freedom; P(chi2_7 > 24.32) = 0.001.
    model = bernoulli(3, order="random", num_masks=2)
    support = all_binary(3)
    for k in range(2):
        model.set_mask(k)
        x = model.sample(20000, generator=torch.Generator().manual_seed(10 + k))
        assert chi_square(x, support, model.log_prob(support)) < 24.32


def test_categorical_sample_frequencies_match_the_probabilities():
    # 2 features x 3 classes: 9 cells, 8 degrees of freedom; P(chi2_8 > 26.12) = 0.001.
    model = CategoricalMADE(2, classes=3, hidden_features=(8,), order="reversed", seed=4).double()
    for p in model.parameters():
        torch.nn.init.normal_(p)
    support = all_categorical(2, 3)
    x = model.sample(20000, generator=torch.Generator().manual_seed(5))
    assert chi_square(x, support, model.log_prob(support)) < 26.12


def test_mask_ensemble_samples_follow_the_mixture_log_prob_scores():
    """Review 38: samples came only from the active set while log_prob(mask_ensemble=K)
    scored the mixture; sample(mask_ensemble=K) draws each row's set uniformly."""
    model = bernoulli(3, order="random", num_masks=3)
    model.set_mask(1)
    support = all_binary(3)
    mixture = model.log_prob(support, mask_ensemble=3)
    x = model.sample(20000, generator=torch.Generator().manual_seed(3), mask_ensemble=3)
    assert chi_square(x, support, mixture) < 24.32  # 7 degrees of freedom, P = 0.001
    assert chi_square(x, support, model.log_prob(support)) > 100  # not the active set's
    assert model.mask_set_index == 1
    categorical = CategoricalMADE(2, classes=3, hidden_features=(8,), order="random",
                                  num_masks=2, context_features=1, seed=4).double()
    for p in categorical.parameters():
        torch.nn.init.normal_(p)
    c = torch.randn(4, 1, dtype=torch.float64)
    assert categorical.sample(5, c, mask_ensemble=2).shape == (5, 4, 2)
    support = all_categorical(2, 3)
    x = categorical.sample(20000, c[0], generator=torch.Generator().manual_seed(5),
                           mask_ensemble=2)
    mixture = categorical.log_prob(support, mask_ensemble=2, context=c[0])
    assert chi_square(x, support, mixture) < 26.12  # 8 degrees of freedom
    with pytest.raises(ValueError, match=r"'mask_ensemble' should be None or an int in \[1, 2\]"):
        categorical.sample(2, c, mask_ensemble=3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models_sample_rare_values_at_their_probability(dtype):
    """Uniforms of the model's own half dtype take 2^11 (2^8) values: a probability of 3.4e-4
    came out 1.7x (6.8x) too often, and a rare class never (review 11). The noise is drawn in
    float32."""
    p = torch.sigmoid(torch.tensor(-8.0)).item()
    n = 200_000
    bern = BernoulliMADE(1, hidden_features=(4,))
    cat = CategoricalMADE(1, classes=2, hidden_features=(4,))
    for model, rare in ((bern, lambda x: x == 1), (cat, lambda x: x == 0)):
        with torch.no_grad():
            for w in model.parameters():
                w.zero_()
            model.made.output.bias[0] = -8.0  # the Bernoulli's logit; the categorical's class 0
        x = model.to(dtype).sample(n, generator=torch.Generator().manual_seed(0))
        count = rare(x).sum().item()
        assert abs(count - n * p) < 5 * (n * p) ** 0.5, (count, n * p)


def test_sampling_is_reproducible_with_a_generator_and_uses_the_global_rng_without_one():
    model = BernoulliMADE(6, hidden_features=(8,))
    a = model.sample(5, generator=torch.Generator().manual_seed(1))
    b = model.sample(5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    torch.manual_seed(3)
    c = model.sample(5)
    torch.manual_seed(3)
    assert torch.equal(c, model.sample(5))


# ------------------------------------------------------------------------ structure


@pytest.mark.parametrize("kwargs", BERNOULLI.values(), ids=BERNOULLI.keys())
def test_bernoulli_made_is_autoregressive_in_every_mask_set(kwargs):
    model = bernoulli(**kwargs)
    for k in range(model.num_masks):
        model.set_mask(k)
        check_autoregressive(model.made)


def test_categorical_logits_depend_only_on_the_one_hot_blocks_of_earlier_features():
    model = CategoricalMADE(4, classes=3, hidden_features=(32, 32), order="random",
                            num_masks=2, direct_connection=True, seed=5).double()
    for k in range(2):
        model.set_mask(k)
        position = torch.empty(4, dtype=torch.long)
        position[model.order] = torch.arange(4)
        one_hot = torch.rand(4, 3, dtype=torch.float64)  # any point: the map is piecewise linear
        jac = torch.autograd.functional.jacobian(lambda v: model.made(v[None])[0], one_hot)
        depends = jac.abs().sum(dim=(1, 3)) > 0  # (output feature, input feature)
        allowed = position[None, :] < position[:, None]
        assert not (depends & ~allowed).any()
        assert depends[allowed].any()


def test_next_mask_cycles_through_the_mask_sets():
    model = BernoulliMADE(5, hidden_features=(8,), num_masks=3, order="random")
    assert [model.next_mask() for _ in range(4)] == [1, 2, 0, 1]
    single = BernoulliMADE(5, hidden_features=(8,))
    assert single.next_mask() == 0 and single.made.mask_set_index == 0


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "x,error,match",
    [
        (torch.full((2, 4), 0.5), ValueError, "'x' should hold binary values.*0.5"),
        (torch.tensor([[0.0, 1.0, float("nan"), 1.0]]), ValueError, "'x' should hold binary.*nan"),
        (torch.full((2, 4), 2), ValueError, "'x' should hold binary values.*2"),
        (torch.zeros(2, 5), ValueError, r"'x' should have shape \(N, 4\)"),
        (torch.zeros(4), ValueError, r"'x' should have shape \(N, 4\)"),
        (torch.zeros(0, 4), ValueError, "'x' is an empty batch"),
        ([[0, 1, 0, 1]], TypeError, "'x' should be a torch.Tensor"),
        (torch.zeros(2, 4, dtype=torch.complex64), TypeError, "'x' should be a real"),
    ],
)
def test_bernoulli_rejects_bad_input(x, error, match):
    with pytest.raises(error, match=match):
        BernoulliMADE(4, hidden_features=(8,)).log_prob(x)


@pytest.mark.parametrize(
    "x,error,match",
    [
        (torch.tensor([[0, 5]]), ValueError, r"class indices in 0\.\.4, found 5"),
        (torch.tensor([[-1, 0]]), ValueError, r"class indices in 0\.\.4, found -1"),
        (torch.tensor([[0.0, 1.0]]), TypeError, "'x' should be an integer tensor"),
        (torch.tensor([[True, False]]), TypeError, "'x' should be an integer tensor"),
        (torch.tensor([[0, 1, 2]]), ValueError, r"'x' should have shape \(N, 2\)"),
    ],
)
def test_categorical_rejects_bad_input(x, error, match):
    with pytest.raises(error, match=match):
        CategoricalMADE(2, classes=5, hidden_features=(8,)).log_prob(x)


@pytest.mark.parametrize("bad", [0, 4, True, 2.0, "all"])
def test_mask_ensemble_must_be_a_count_of_mask_sets(bad):
    model = BernoulliMADE(4, hidden_features=(8,), num_masks=3)
    with pytest.raises(ValueError, match=r"'mask_ensemble' should be None or an int in \[1, 3\]"):
        model.log_prob(torch.zeros(1, 4), mask_ensemble=bad)


def test_mask_ensemble_and_classes_accept_numpy_integers_as_sample_counts_do():
    model = BernoulliMADE(4, hidden_features=(8,), num_masks=3, order="random")
    x = model.sample(np.int64(2), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model.log_prob(x, mask_ensemble=np.int64(2)),
                               model.log_prob(x, mask_ensemble=2))
    categorical = CategoricalMADE(2, classes=np.int64(3), hidden_features=(8,))
    assert categorical.classes == 3 and type(categorical.config["kwargs"]["classes"]) is int


@pytest.mark.parametrize("index", [True, 1.0, -1, 3])
def test_set_mask_names_a_bad_index(index):
    """set_mask(True) and set_mask(1.0) used to fail inside torch (review 5, finding 11)."""
    for model in (BernoulliMADE(4, (8,), num_masks=3), CategoricalMADE(3, 3, (8,), num_masks=3)):
        with pytest.raises(ValueError, match="'index' should be"):
            model.set_mask(index)
        assert model.made.mask_set_index == 0


@pytest.mark.parametrize("n", [0, -1, 2.5, True, None, torch.tensor(3)])
def test_bad_sample_count(n):
    expected = "'n' should be a positive" if is_int(n) else "'n' should be an integer"
    if n is None:
        expected = "'n', the number of samples, is required without a context"
    with pytest.raises(ValueError, match=expected):
        BernoulliMADE(4, hidden_features=(8,)).sample(n)
    with pytest.raises(ValueError, match=expected):
        CategoricalMADE(2, classes=3, hidden_features=(8,)).sample(n)


def test_one_hot_rows_for_a_categorical_are_named_as_such():
    model = CategoricalMADE(3, classes=4, hidden_features=(8,))
    x = torch.tensor([[0, 3, 1]])
    with pytest.raises(ValueError, match=r"'x' of shape \(1, 3, 4\) looks one-hot; pass class "
                       r"indices \(N, 3\) in 0..3: x.argmax\(-1\)"):
        model.log_prob(torch.nn.functional.one_hot(x, 4).float())


@pytest.mark.parametrize("classes", [1, 0, 2.0, True, "3"])
def test_bad_class_count(classes):
    with pytest.raises(ValueError, match="'classes' should be"):
        CategoricalMADE(2, classes=classes)


# ------------------------------------------------------------------------ per-feature classes

MIXED = (2, 5, 3)


def all_mixed(counts=MIXED) -> torch.Tensor:
    return torch.tensor(list(itertools.product(*(range(k) for k in counts))))


def mixed(**kwargs) -> CategoricalMADE:
    model = CategoricalMADE(len(MIXED), classes=list(MIXED), hidden_features=(16,), seed=2,
                            **kwargs)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.7)
    return model.double()


@pytest.mark.parametrize("kwargs", [dict(order="random", num_masks=3),
                                    dict(order="reversed", direct_connection=True),
                                    dict(context_features=2, num_masks=2)],
                         ids=["random-3-masks", "reversed-direct", "context-2-masks"])
def test_per_feature_classes_sum_to_one_over_the_valid_configurations(kwargs):
    """Feature d's softmax runs over its own K_d classes: the 30 valid configurations of
    classes (2, 5, 3) carry all the mass, for every mask set, the ensemble and each context."""
    model = mixed(**kwargs)
    x = all_mixed()
    contexts = [None]
    if model.context_features:
        contexts = [torch.randn(2, dtype=torch.float64) for _ in range(2)]
    for c in contexts:
        for k in range(model.num_masks):
            model.set_mask(k)
            total = torch.logsumexp(model.log_prob(x, context=c), 0).item()
            assert total == pytest.approx(0.0, abs=1e-10)
        model.set_mask(0)
        ensemble = model.log_prob(x, model.num_masks, context=c)
        assert torch.logsumexp(ensemble, 0).item() == pytest.approx(0.0, abs=1e-10)
    logits = model.logits(x, context=contexts[0])
    assert logits.shape == (30, 3, 5)
    assert torch.isinf(logits[:, 0, 2:]).all() and torch.isinf(logits[:, 2, 3:]).all()
    assert torch.isfinite(logits[:, 1]).all() and torch.isfinite(logits[:, 0, :2]).all()


def test_per_feature_classes_sample_only_their_classes_at_their_probabilities():
    model = mixed(order="reversed")
    support = all_mixed()
    x = model.sample(30000, generator=torch.Generator().manual_seed(3))
    assert (x.amax(0) < torch.tensor(MIXED)).all() and (x >= 0).all()
    # 30 cells, 29 degrees of freedom; P(chi2_29 > 58.30) = 0.001
    assert chi_square(x, support, model.log_prob(support)) < 58.30
    fast = model.sample(50, generator=torch.Generator().manual_seed(4))
    model.made.solver = "naive"  # the reference solver, given the same noise
    assert torch.equal(model.sample(50, generator=torch.Generator().manual_seed(4)), fast)


@pytest.mark.parametrize(
    "classes,match",
    [([2, 5], r"'classes' should hold one count per feature \(3\), got 2: \[2, 5\]"),
     ([2, 1, 3], r"'classes\[1\]' should be >= 2, got 1"),
     ([2, 5.0, 3], r"'classes\[1\]' should be an integer >= 2, got 5.0"),
     ("253", r"'classes' should be an integer >= 2 or a sequence of 3 of them"),
     (torch.tensor([[2, 5, 3]]), r"'classes' should be an integer >= 2 or a sequence")],
)
def test_bad_per_feature_classes_are_named(classes, match):
    with pytest.raises(ValueError, match=match):
        CategoricalMADE(3, classes=classes, hidden_features=(8,))


def test_a_class_a_feature_does_not_have_is_named_with_its_column():
    model = CategoricalMADE(3, classes=np.array([2, 5, 3]), hidden_features=(8,))
    assert model.classes == (2, 5, 3) and model.config["kwargs"]["classes"] == [2, 5, 3]
    with pytest.raises(ValueError, match=r"class indices in 0..classes\[d\] - 1 in column d "
                       r"\(classes=\[2, 5, 3\]\), found 4 at row 1, column 2"):
        model.log_prob(torch.tensor([[1, 4, 2], [0, 0, 4]]))


def test_per_feature_classes_save_load_and_move_with_the_model(tmp_path):
    model = mixed(context_features=2, num_masks=2, order="random")
    c = torch.randn(4, 2, dtype=torch.float64)
    x = model.sample(context=c, generator=torch.Generator().manual_seed(0))
    save_model(model, tmp_path / "mixed.pt")
    loaded = load_model(tmp_path / "mixed.pt").double()
    assert loaded.classes == (2, 5, 3) and "classes=[2, 5, 3]" in repr(loaded)
    torch.testing.assert_close(loaded.log_prob(x, context=c), model.log_prob(x, context=c))
    assert "absent" not in model.state_dict()  # rebuilt from the config
    half = loaded.to(torch.float16)
    assert half.absent.dtype == torch.bool
    assert (half.sample(200, c[0].half()) < torch.tensor(MIXED)).all()


# ------------------------------------------------------------------------ conditional models

CONDITIONAL = {
    "natural": dict(order="natural"),
    "random-3-masks": dict(order="random", num_masks=3),
    "reversed-direct": dict(order="reversed", direct_connection=True),
    "residual-2-masks": dict(hidden_features=(16, 16), order="random", num_masks=2,
                             residual=True),
}
CONTEXTS = torch.tensor([[0.0, 0.0, 0.0], [1.5, -2.0, 0.3], [-3.0, 0.5, 2.0], [4.0, 4.0, -4.0]],
                        dtype=torch.float64)


def conditional(kind: str, **kwargs) -> BernoulliMADE | CategoricalMADE:
    """A float64 model with context_features=3 and peaked conditionals: 5 binary features, or 3
    features of 3 classes."""
    kwargs = {"hidden_features": (24,), "seed": 3, **kwargs}
    if kind == "bernoulli":
        model = BernoulliMADE(5, context_features=3, **kwargs)
    else:
        model = CategoricalMADE(3, classes=3, context_features=3, **kwargs)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.7)
    return model.double()


def support(kind: str) -> torch.Tensor:
    return all_binary(5) if kind == "bernoulli" else all_categorical(3, 3)


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
@pytest.mark.parametrize("kwargs", CONDITIONAL.values(), ids=CONDITIONAL.keys())
def test_conditional_models_sum_to_one_for_every_context_and_mask_set(kind, kwargs):
    model = conditional(kind, **kwargs)
    x = support(kind)  # all 2^5 or 3^3 configurations
    for k in range(model.num_masks):
        model.set_mask(k)
        for c in CONTEXTS:
            log_p = model.log_prob(x, context=c)  # a (C,) context serves every row
            assert torch.logsumexp(log_p, 0).item() == pytest.approx(0.0, abs=1e-10)
            torch.testing.assert_close(log_p, model.log_prob(x, context=c.expand(len(x), 3)))
            torch.testing.assert_close(log_p, model.log_prob(x, context=c[None]))
    model.set_mask(0)
    for c in CONTEXTS:
        ensemble = model.log_prob(x, model.num_masks, context=c)
        assert torch.logsumexp(ensemble, 0).item() == pytest.approx(0.0, abs=1e-10)


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
def test_the_context_changes_the_distribution_and_rows_get_their_own(kind):
    model = conditional(kind)
    x = support(kind)
    per_context = torch.stack([model.log_prob(x, context=c) for c in CONTEXTS])
    for i, j in itertools.combinations(range(len(CONTEXTS)), 2):
        assert (per_context[i] - per_context[j]).abs().max() > 0.1
    # row r scored with context r equals the row scored alone with that context
    rows = torch.arange(len(x)) % len(CONTEXTS)
    mixed = model.log_prob(x, context=CONTEXTS[rows])
    torch.testing.assert_close(mixed, per_context[rows, torch.arange(len(x))])


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
@pytest.mark.parametrize("kwargs", CONDITIONAL.values(), ids=CONDITIONAL.keys())
def test_conditional_made_is_autoregressive_and_the_context_reaches_every_feature(kind, kwargs):
    model = conditional(kind, **kwargs)
    x = support(kind)  # every point, with a context per row: no ReLU pattern hides a path
    g = torch.Generator().manual_seed(0)
    context = torch.randn(len(x), 3, dtype=torch.float64, generator=g)
    for k in range(model.num_masks):
        model.set_mask(k)
        check_autoregressive(model.made)  # in x; the context may reach every output
        jac = torch.autograd.functional.jacobian(lambda c: model.logits(x, context=c), context)
        rows = torch.arange(len(x))
        per_row = jac[rows, ..., rows, :]  # (N, D[, K], C): row n's logits by row n's context
        reached = per_row.abs().flatten(start_dim=2).sum(-1).sum(0) > 0  # (D,)
        assert reached.all()  # every feature's conditional reads the context


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
def test_conditional_samples_equal_the_naive_solver_given_the_same_noise(kind):
    model = conditional(kind, order="random", num_masks=2)
    context = CONTEXTS[1:]
    for k in range(2):
        model.set_mask(k)
        fast = model.sample(7, context, generator=torch.Generator().manual_seed(k))
        model.made.solver = "naive"  # the reference solver
        naive = model.sample(7, context, generator=torch.Generator().manual_seed(k))
        model.made.solver = "fast"
        assert fast.shape == (7, 3, model.features) and torch.equal(fast, naive)


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
def test_conditional_sample_frequencies_match_the_probabilities_of_each_context(kind):
    # 3 binary features: 8 cells, 7 degrees of freedom, P(chi2_7 > 24.32) = 0.001;
    # 2 features x 3 classes: 9 cells, 8 degrees of freedom, P(chi2_8 > 26.12) = 0.001.
    if kind == "bernoulli":
        model = BernoulliMADE(3, (16,), order="random", context_features=3, seed=4)
        cells, threshold = all_binary(3), 24.32
    else:
        model = CategoricalMADE(2, 3, (16,), order="reversed", context_features=3, seed=4)
        cells, threshold = all_categorical(2, 3), 26.12
    model = model.double()
    for p in model.parameters():
        torch.nn.init.normal_(p)
    x = model.sample(20000, CONTEXTS[1:], generator=torch.Generator().manual_seed(6))
    assert x.shape == (20000, 3, model.features)
    for b, c in enumerate(CONTEXTS[1:]):
        assert chi_square(x[:, b], cells, model.log_prob(cells, context=c)) < threshold


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
def test_conditional_sample_shapes_follow_the_flows(kind):
    model = conditional(kind)
    d, g = model.features, torch.Generator().manual_seed(0)
    c = CONTEXTS[:2]
    assert model.sample(context=c, generator=g).shape == (2, d)  # one per context row
    assert model.sample(4, c, generator=g).shape == (4, 2, d)
    assert model.sample((4, 5), c, generator=g).shape == (4, 5, 2, d)
    assert model.sample(4, c[0], generator=g).shape == (4, d)  # a (C,) context
    assert model.sample(context=c[0], generator=g).shape == (d,)
    assert model.sample(4, c[None], generator=g).shape == (4, 1, 2, d)
    # the rows of a sample are drawn with their own context row: a sample of row b is a sample
    # of the context alone, from the same noise when it is the only row
    one = model.sample(6, c[1:], generator=torch.Generator().manual_seed(1))
    alone = model.sample(6, c[1], generator=torch.Generator().manual_seed(1))
    assert torch.equal(one[:, 0], alone)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda m, x: m.log_prob(x), ValueError, r"'context' is required: a tensor of shape "
         r"\(\.\.\., 3\)"),
        (lambda m, x: m.sample(2), ValueError, "'context' is required"),
        (lambda m, x: m.logits(x), ValueError, "'context' is required"),
        (lambda m, x: m.log_prob(x, context=CONTEXTS[:3]), ValueError,
         r"'context' should have shape \(2, 3\) \(one row per row of 'x'\), or \(3,\) for every "
         r"row, got \(3, 3\)"),
        (lambda m, x: m.log_prob(x, context=CONTEXTS[:2, :2]), ValueError,
         r"'context' should have shape \(\.\.\., 3\), got \(2, 2\)"),
        (lambda m, x: m.log_prob(x, context=CONTEXTS[None, :2]), ValueError,
         r"'context' should have shape \(2, 3\)"),
        (lambda m, x: m.log_prob(x, context=CONTEXTS[:2].float()), TypeError,
         "'context' should have dtype torch.float64"),
        (lambda m, x: m.log_prob(x, context=CONTEXTS[:2].long()), TypeError,
         "'context' should have dtype torch.float64"),
        (lambda m, x: m.log_prob(x, context=CONTEXTS[:2].tolist()), TypeError,
         "'context' should be a torch.Tensor"),
        (lambda m, x: m.log_prob(x, context=torch.full((2, 3), float("nan"),
                                                        dtype=torch.float64)),
         ValueError, "'context' contains NaN"),
        (lambda m, x: m.sample(2, CONTEXTS[:0]), ValueError, "'context' is an empty batch"),
        (lambda m, x: m.log_prob(x, CONTEXTS[:2]), TypeError,
         r"a context is passed by keyword: log_prob\(x, context=c\)"),
    ],
    ids=["log_prob-missing", "sample-missing", "logits-missing", "rows", "width",
         "three-dims", "dtype", "integer", "list", "nan", "empty", "positional"],
)
@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
def test_a_bad_context_is_named(kind, call, error, match):
    model = conditional(kind)
    with pytest.raises(error, match=match):
        call(model, support(kind)[:2])


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
def test_an_unconditional_model_refuses_a_context_by_name(kind):
    """fit(model, (x, c)) used to fail with a TypeError about _DiscreteMADE.log_prob."""
    import flowkit

    model = (BernoulliMADE(3, (8,)) if kind == "bernoulli" else CategoricalMADE(3, 3, (8,)))
    assert model.context_features == 0
    x, c = (torch.zeros(4, 3) if kind == "bernoulli" else torch.zeros(4, 3, dtype=torch.long),
            torch.zeros(4, 2))
    for call in (lambda: model.log_prob(x, context=c), lambda: model.sample(2, c),
                 lambda: model.logits(x, c)):
        with pytest.raises(ValueError, match="'context' was given but the model has "
                           "context_features=0"):
            call()
    with pytest.raises(ValueError, match="carries a context but the model has "
                       "context_features=0"):
        flowkit.fit(model, (x, c), steps=1, progress=False)


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
def test_fit_trains_a_conditional_model_on_pairs(kind):
    """Three features that copy a label s in {0, 1} with probability 0.9 each, the context
    being +-1 for s. The conditional entropy is 3 H(0.9) = 0.98 nats; ignoring the context
    costs at least log 2 - H(s | x) more (the three features only guess s)."""
    import flowkit

    g = torch.Generator().manual_seed(0)
    s = torch.randint(0, 2, (2000, 1), generator=g)
    flip = torch.rand(2000, 3, generator=g) < 0.1
    x = (s.bool() ^ flip).long()
    if kind == "bernoulli":
        model, x = BernoulliMADE(3, (16,), context_features=1), x.float()
    else:
        model = CategoricalMADE(3, 2, (16,), context_features=1)
    c = 2.0 * s.float() - 1.0
    before = -model.log_prob(x, context=c).mean().item()
    history = flowkit.fit(model, (x, c), steps=150, batch_size=100, lr=2e-2, seed=0,
                          progress=False, device="cpu")
    after = -model.log_prob(x, context=c).mean().item()
    assert before > 1.9 and after < 1.1 and history.train_loss[-1] < before
    assert -model.log_prob(x, context=-c).mean().item() > 5.0  # the wrong context is unlikely


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
def test_conditional_save_and_load_round_trip(kind, tmp_path):
    model = conditional(kind, order="random", num_masks=2)
    model.set_mask(1)
    assert model.config["kwargs"]["context_features"] == 3
    x = support(kind)
    save_model(model, tmp_path / "model.pt")
    loaded = load_model(tmp_path / "model.pt")
    assert type(loaded) is type(model) and loaded.context_features == 3
    assert loaded.config == model.config and loaded.made.mask_set_index == 1
    for c in CONTEXTS:
        torch.testing.assert_close(loaded.log_prob(x, context=c), model.log_prob(x, context=c))
    g = torch.Generator
    assert torch.equal(loaded.sample(5, CONTEXTS, generator=g().manual_seed(0)),
                       model.sample(5, CONTEXTS, generator=g().manual_seed(0)))


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
def test_a_file_saved_before_context_features_loads_as_an_unconditional_model(kind, tmp_path):
    """Files written before the discrete models took a context have no 'context_features' in
    their config; they load as the unconditional model they hold."""
    model = BernoulliMADE(4, (8,), num_masks=2) if kind == "bernoulli" else CategoricalMADE(
        4, 3, (8,), num_masks=2)
    old = {k: v for k, v in model.config["kwargs"].items() if k != "context_features"}
    model.config = {"type": model.config["type"], "kwargs": old}
    save_model(model, tmp_path / "old.pt")
    loaded = load_model(tmp_path / "old.pt")
    assert loaded.context_features == 0 and loaded.config["kwargs"]["context_features"] == 0
    x = model.sample(6, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(loaded.log_prob(x), model.log_prob(x))


# ------------------------------------------------------------------------ save / load, docs


@pytest.mark.parametrize(
    "model",
    [
        BernoulliMADE(6, hidden_features=(8, 8), num_masks=2, order=(5, 4, 3, 0, 1, 2),
                      residual=True, seed=7),
        CategoricalMADE(3, classes=4, hidden_features=[8], num_masks=2, order="random"),
    ],
    ids=["bernoulli", "categorical"],
)
def test_save_and_load_round_trip(model, tmp_path):
    json.dumps(model.config)
    model.set_mask(1)
    x = model.sample(4, generator=torch.Generator().manual_seed(0))
    save_model(model, tmp_path / "model.pt")
    loaded = load_model(tmp_path / "model.pt")
    assert type(loaded) is type(model) and loaded.made.mask_set_index == 1
    torch.testing.assert_close(loaded.log_prob(x), model.log_prob(x))
    torch.testing.assert_close(loaded.log_prob(x, mask_ensemble=2), model.log_prob(x, 2))


def test_docstring_examples_run():
    result = doctest.testmod(discrete, extraglobs={"torch": torch})
    assert result.attempted > 0 and result.failed == 0


def test_ensemble_of_mnist_sized_model_is_finite():
    model = BernoulliMADE(784, hidden_features=(64,), num_masks=4, order="random")
    x = torch.rand(3, 784) < 0.2
    log_p = model.log_prob(x, mask_ensemble=4)
    assert torch.isfinite(log_p).all() and (log_p < 0).all()


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
@pytest.mark.parametrize("where", ["data", "valid"])
def test_fit_refuses_a_bad_value_anywhere_in_array_data_before_the_first_step(kind, where):
    """A bad value in the last row is found before any weight changes (it used to stop the run
    at the step whose batch held it), named with its argument, row and column."""
    import flowkit

    g = torch.Generator().manual_seed(0)
    if kind == "bernoulli":
        model = BernoulliMADE(4, hidden_features=(16,))
        x = (torch.rand(600, 4, generator=g) < 0.5).float()
        x[-1, 2] = 2.0
        expected = rf"'{where}' should hold binary values .*found 2.0 at row 599, column 2"
    else:
        model = CategoricalMADE(4, classes=3, hidden_features=(16,))
        x = torch.randint(0, 3, (600, 4), generator=g)
        x[-1, 2] = 3
        expected = rf"'{where}' should hold class indices in 0..2, found 3 at row 599, column 2"
    good = x[:-1].clone()
    good[-1, 2] = 1
    before = [p.detach().clone() for p in model.parameters()]
    data, valid = (x, good) if where == "data" else (good, x)
    with pytest.raises(ValueError, match=expected):
        flowkit.fit(model, data, valid=valid, epochs=2, batch_size=100, progress=False,
                    device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_fit_warns_when_validation_scores_a_changing_mask_set():
    """Validation data scored with cycling mask sets compare different models (review 51);
    the model's own mask_set() scores one set, as docs/discrete.md advises."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 2, (64, 5), generator=g).float()
    model = BernoulliMADE(5, hidden_features=(16,), num_masks=3, seed=0)
    cycle = Callbacks(after_step=lambda p: p.model.next_mask())
    with pytest.warns(UserWarning, match=r"changed between two validations \(1 then 2\)") as w:
        fit(model, x, valid=x[:16], steps=4, valid_every=1, batch_size=16, seed=0,
            progress=False, callbacks=cycle)
    assert sum("mask set" in str(m.message) for m in w) == 1  # once, of 4 changes

    def nll_of_set_0(m):
        with m.mask_set(0):
            assert m.mask_set_index == 0
            return -m.log_prob(x[:16]).mean().item()

    model.set_mask(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(model, x, valid=nll_of_set_0, steps=4, valid_every=1, batch_size=16, seed=0,
            progress=False, callbacks=cycle)
    model.set_mask(1)
    with model.mask_set(2):
        assert model.mask_set_index == 2
    assert model.mask_set_index == 1
