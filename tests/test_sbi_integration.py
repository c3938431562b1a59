"""flowkit.integrations.sbi against the installed sbi (skipped without it)."""

import pickle
import warnings

import pytest
import torch

import flowkit

sbi = pytest.importorskip("sbi")

from sbi.inference import NLE, NPE  # noqa: E402
from sbi.utils import BoxUniform  # noqa: E402

from flowkit import MLPEmbedding  # noqa: E402
from flowkit.integrations.sbi import FlowkitEstimator, likelihood_nn, posterior_nn  # noqa: E402
from flowkit.transforms import Standardize  # noqa: E402


def simulations(n=400, seed=0):
    """theta ~ U[-3, 3]^2, x = (theta_0 + theta_1, theta_0 - theta_1, 5 theta_0) + noise: data on
    scales far from 1 so that z-scoring matters."""
    g = torch.Generator().manual_seed(seed)
    theta = 6 * torch.rand(n, 2, generator=g) - 3
    x = torch.stack([theta[:, 0] + theta[:, 1], theta[:, 0] - theta[:, 1], 5 * theta[:, 0]], -1)
    return theta, 10 + 3 * x + 0.1 * torch.randn(n, 3, generator=g)


def trained_weights(estimator, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in estimator.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return estimator


@pytest.mark.parametrize("model", ["maf", "iaf"])
def test_shapes_follow_sbis_conventions(model):
    theta, x = simulations()
    est = trained_weights(posterior_nn(model, layers=2, hidden_features=(16,))(theta, x))
    assert isinstance(est, FlowkitEstimator)
    assert est.input_shape == (2,) and est.condition_shape == (3,)
    assert est.log_prob(theta[:7].expand(5, 7, 2), x[:7]).shape == (5, 7)
    assert est.log_prob(theta[:7], x[:7]).shape == (1, 7)
    assert est.log_prob(theta[:7].expand(5, 7, 2), x[:1]).shape == (5, 7)  # broadcast B = 1
    assert est.loss(theta[:7], x[:7]).shape == (7,)
    assert est.sample((4, 3), x[:5]).shape == (4, 3, 5, 2)
    samples, log_q = est.sample_and_log_prob((6,), x[:5])
    assert samples.shape == (6, 5, 2) and log_q.shape == (6, 5)
    torch.testing.assert_close(log_q, est.log_prob(samples, x[:5]), atol=1e-4, rtol=1e-4)


def test_log_prob_is_a_normalized_density_in_the_original_units():
    """z-scoring enters with its log-determinant: the density over theta (scaled by 6 and
    shifted) integrates to one for a fixed condition."""
    theta, x = simulations()
    est = trained_weights(posterior_nn("maf", layers=2, hidden_features=(16,))(theta, x))
    est = est.double()
    axis = torch.linspace(-12, 12, 321, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(axis, axis, indexing="ij"), -1).reshape(-1, 2)
    with torch.no_grad():
        density = est.log_prob(grid, x[:1].double()).exp().reshape(321, 321)
    total = torch.trapezoid(torch.trapezoid(density, axis), axis).item()
    assert abs(total - 1) < 2e-3, total


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """sbi's trainers write TensorBoard logs into ./sbi-logs: keep them out of the checkout."""
    monkeypatch.chdir(tmp_path)


def test_npe_trains_and_samples_a_posterior():
    theta, x = simulations(600)
    prior = BoxUniform(-3 * torch.ones(2), 3 * torch.ones(2))
    builder = posterior_nn("maf", layers=2, hidden_features=(16,), transformer="spline")
    inference = NPE(prior, density_estimator=builder, show_progress_bars=False)
    estimator = inference.append_simulations(theta, x).train(max_num_epochs=3)
    assert isinstance(estimator, FlowkitEstimator)
    posterior = inference.build_posterior(estimator)
    samples = posterior.sample((50,), x=x[0], show_progress_bars=False)
    assert samples.shape == (50, 2)
    assert posterior.log_prob(samples, x=x[0]).shape == (50,)
    restored = pickle.loads(pickle.dumps(estimator))  # sbi users pickle posteriors
    torch.testing.assert_close(restored.log_prob(theta[:5], x[:5]),
                               estimator.log_prob(theta[:5], x[:5]))
    flowkit.save_model(estimator.net, "flow.pt")  # the flow, its standardization included
    loaded = flowkit.load_model("flow.pt")
    torch.testing.assert_close(loaded.log_prob(theta[:5], x[:5]),
                               estimator.net.eval().log_prob(theta[:5], x[:5]), rtol=0, atol=0)


def test_nle_models_x_given_theta():
    theta, x = simulations(600)
    prior = BoxUniform(-3 * torch.ones(2), 3 * torch.ones(2))
    builder = likelihood_nn("maf", layers=2, hidden_features=(16,))
    inference = NLE(prior, density_estimator=builder, show_progress_bars=False)
    estimator = inference.append_simulations(theta, x).train(max_num_epochs=3)
    assert estimator.input_shape == (3,) and estimator.condition_shape == (2,)
    assert estimator.log_prob(x[:4], theta[:4]).shape == (1, 4)
    standardize_x = estimator.net.transform.transforms[0]  # the builders' data Standardize
    torch.testing.assert_close(standardize_x.shift, x[inference.train_indices].mean(0))
    torch.testing.assert_close(estimator.net.standardize_context.shift,
                               theta[inference.train_indices].mean(0))


def test_embedding_network_is_trained_with_the_flow():
    theta, x = simulations()
    embedding = MLPEmbedding(3, 4, hidden_features=(8,))
    est = posterior_nn("maf", layers=2, hidden_features=(16,), embedding=embedding)(theta, x)
    assert est.net.embedding is embedding
    trained_weights(est)  # the MADEs' output layers start at zero: no gradient to the context
    est.loss(theta[:10], x[:10]).mean().backward()
    assert embedding.net[0].weight.grad.abs().sum() > 0


def test_embedding_net_is_the_condition_as_the_layers_read_it():
    """sbi's diagnostics call embedding_net on raw conditions: it standardizes and embeds them
    as the flow does, with or without an embedding network, for conditions of any shape."""
    theta, x = simulations()
    embedding = MLPEmbedding(3, 4, hidden_features=(8,))
    est = posterior_nn("maf", layers=2, hidden_features=(16,), embedding=embedding)(theta, x)
    standardized = est.net.standardize_context(x[:5])[0]
    torch.testing.assert_close(est.embedding_net(x[:5]), embedding(standardized))
    plain = posterior_nn("maf", layers=2, hidden_features=(16,))(theta, x)
    torch.testing.assert_close(plain.embedding_net(x[:5]), standardized)
    images = x.repeat(1, 4).reshape(-1, 1, 3, 4)  # (N, 1, 3, 4) conditions
    shaped = posterior_nn("maf", layers=2, hidden_features=(8,))(theta, images)
    assert shaped.embedding_net(images[:5]).shape == (5, 12)


def test_a_users_network_for_shaped_conditions_gets_its_shape_back_with_unflatten():
    """The recipe of the module docstring: nn.Unflatten in front of a network that wants images."""
    theta, x = simulations()
    images = x.repeat(1, 4).reshape(-1, 1, 3, 4)
    cnn = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 2), torch.nn.Flatten(), torch.nn.Linear(12, 3))
    embedding = torch.nn.Sequential(torch.nn.Unflatten(1, (1, 3, 4)), cnn)
    est = posterior_nn("maf", layers=2, hidden_features=(8,), embedding=embedding)(theta, images)
    assert est.log_prob(theta[:6], images[:6]).shape == (1, 6)
    assert est.sample((2,), images[:3]).shape == (2, 3, 2)


def test_misuse_is_named_in_sbis_terms():
    theta, x = simulations()
    build = posterior_nn("maf", layers=2, hidden_features=(8,))
    est = build(theta, x)
    with pytest.raises(ValueError, match="'input' of batch shape \\(3,\\) and 'condition' of "
                                         "batch shape \\(5,\\) do not broadcast"):
        est.log_prob(theta[:3], x[:5])
    assert est.sample((0,), x[:5]).shape == (0, 5, 2)  # empty, as torch's distributions
    samples, log_q = est.sample_and_log_prob((0, 2), x[:5])
    assert samples.shape == (0, 2, 5, 2) and log_q.shape == (0, 2, 5)
    bad = x.clone()
    bad[[3, 7]] = float("nan")
    with pytest.raises(ValueError, match="the simulations' x holds NaN or Inf values in 2 of"):
        build(theta, bad)
    with pytest.raises(ValueError, match="the simulations' theta holds NaN"):
        likelihood_nn("maf", layers=2, hidden_features=(8,))(bad[:, :2], theta)
    boxed = posterior_nn("maf", layers=2, hidden_features=(8,), bounds=([-1.0, -1.0], [1, 1]))
    with pytest.raises(ValueError, match="'bounds' should contain every simulated theta: "):
        boxed(theta, x)  # theta lies in [-3, 3]^2
    # an open end (None), which the builders take: a TypeError before (review 24)
    half = posterior_nn("maf", layers=2, hidden_features=(8,), bounds=([-5.0, None], [None, 5]))
    half(theta, x)
    with pytest.raises(ValueError, match="'bounds' should contain every simulated theta: "):
        posterior_nn("maf", layers=2, hidden_features=(8,), bounds=([0.0, None], [None, None]))(
            theta, x)


def test_z_score_options_as_sbi_takes_them():
    """Review 36: the iid-trials recipe (Unflatten in front of sbi's
    PermutationInvariantEmbedding) moved log q by 0.61 nats when the trials were reordered,
    since each trial slot was standardized by its own statistics; z_score_x="structured" (one
    mean and scale over all of x's values) keeps it invariant, "none" leaves a side as given,
    "independent" is the default."""
    from sbi.neural_nets.embedding_nets import FCEmbedding, PermutationInvariantEmbedding

    trials, n = 8, 300
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(n, 2, generator=g)
    x = theta[:, None, :1] * torch.linspace(0.5, 2.0, trials)[:, None] + torch.randn(
        n, trials, 1, generator=g)
    torch.manual_seed(0)
    embedding = torch.nn.Sequential(
        torch.nn.Unflatten(1, (trials, 1)),
        PermutationInvariantEmbedding(FCEmbedding(1, 10, num_hiddens=16), 10, output_dim=4))
    perm = torch.randperm(trials, generator=g)
    shifts = {}
    for z_score in ("independent", "structured", "none"):
        est = trained_weights(posterior_nn("maf", embedding=embedding, layers=2,
                                           hidden_features=(16,), z_score_x=z_score)(theta, x))
        moved = (est.log_prob(theta[:50], x[:50]) - est.log_prob(theta[:50], x[:50, perm]))
        assert (moved.abs().max() < 1e-5) == (z_score != "independent"), z_score
        shifts[z_score] = est.net.standardize_context.shift
    assert shifts["structured"].unique().numel() == 1
    torch.testing.assert_close(shifts["structured"][0], x.mean().double().float())
    assert not shifts["none"].any()
    est = posterior_nn("maf", layers=2, hidden_features=(8,), z_score_theta=None)(theta, x[:, :, 0])
    data = next(t for t in est.net.transform.transforms if isinstance(t, Standardize))
    assert not data.shift.any() and (data.scale == 1).all()
    likelihood = likelihood_nn("maf", layers=2, hidden_features=(8,), z_score_x="structured",
                               z_score_theta="none")(theta, x[:, :, 0])
    assert next(t for t in likelihood.net.transform.transforms
                if isinstance(t, Standardize)).shift.unique().numel() == 1
    assert not likelihood.net.standardize_context.shift.any()
    # with bounds=, the standardization reads the logit of the rows: set from them (review 40)
    positive = x[:, :, 0].exp()
    bounded = likelihood_nn("maf", layers=2, hidden_features=(8,), z_score_x="structured",
                            bounds=([0.0] * trials, [None] * trials))(theta, positive)
    data = next(t for t in bounded.net.transform.transforms if isinstance(t, Standardize))
    z = data(bounded.net.transform.transforms[0](positive)[0])[0]
    assert abs(float(z.mean())) < 1e-4 and abs(float(z.std()) - 1) < 1e-3


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: posterior_nn(z_score_x="structure"), ValueError,
         r"'z_score_x' should be one of \('independent', 'structured', 'none'\)"),
        (lambda: posterior_nn(z_score_y="none"), ValueError, "'z_score_y' is not an option"),
        (lambda: posterior_nn(z_score_x="independent", standardize=False), ValueError,
         "adjust the builders' per-element standardization"),
        (lambda: posterior_nn(embedding_net=torch.nn.Identity()), TypeError,
         r"'embedding_net': not options of flowkit.MAF; sbi's names: 'embedding_net' "
         r"\(flowkit: embedding=\)"),
        (lambda: posterior_nn("iaf", num_transforms=3, num_bins=4), TypeError,
         r"'num_transforms', 'num_bins': not options of flowkit.IAF.*'num_transforms' "
         r"\(flowkit: layers=\), 'num_bins' \(flowkit: transformer_kwargs=\{'bins': ...\}\)"),
        (lambda: posterior_nn(hiden_features=(8,)), TypeError,
         "'hiden_features': not options of flowkit.MAF; its options: layers, hidden_features"),
        (lambda: posterior_nn(hidden_features=50), ValueError,  # sbi's int, refused here
         r"'hidden_features' should be a sequence of layer sizes"),
    ],
)
def test_options_sbi_users_type(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_likelihood_bounds_name_the_simulators_support():
    theta, x = simulations()
    with pytest.raises(ValueError, match="give the bounds of the support of the simulator's"):
        likelihood_nn("maf", layers=2, hidden_features=(8,),
                      bounds=([0.0] * 3, [None] * 3))(theta, x - 20)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: posterior_nn("nsf"), "'model' should be one of"),
        (lambda: posterior_nn(features=2), "'features' is set by the builder"),
        (lambda: posterior_nn(embedding=None, context_features=3),
         "'context_features' is set by the builder"),
    ],
)
def test_bad_builder_options(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_posterior_on_the_priors_box():
    """bounds=(low, high) through the builder: samples inside the box, -inf outside it, and
    the standardization set from the mapped simulations."""
    low, high = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 5.0])
    prior = BoxUniform(low, high)
    theta = prior.sample((200,))
    x = theta + 0.1 * torch.randn(200, 2)
    estimator = posterior_nn("maf", layers=2, hidden_features=(8,), transformer="spline",
                             bounds=(low, high))(theta, x)
    samples = estimator.sample((100,), x[:3])
    assert ((samples > low) & (samples < high)).all()
    outside = torch.tensor([[[0.0, 6.0], [2.0, 1.0], [0.0, 1.0]]])
    log_q = estimator.log_prob(outside, x[:3])
    assert (log_q[0, :2] == float("-inf")).all() and torch.isfinite(log_q[0, 2])
    logit = estimator.net.transform.transforms[0]
    assert type(logit).__name__ == "Logit" and torch.equal(logit.low, low)


def test_errors_name_sbis_arguments():
    """sbi calls them input and condition; the flow's own names, 'x' and 'context', were
    what its errors said (review 10)."""
    estimator = posterior_nn("maf", layers=1, hidden_features=(8,))(torch.randn(50, 2),
                                                                  torch.randn(50, 3))
    theta, x = torch.randn(5, 2), torch.randn(5, 3)
    nan = torch.full((5, 2), float("nan"))
    cases = [
        (lambda: estimator.log_prob(theta, x.double()), TypeError, "'condition' should have dtype"),
        (lambda: estimator.log_prob(theta.double(), x), TypeError, "'input' should have dtype"),
        (lambda: estimator.log_prob(nan, x), ValueError, "'input' contains NaN"),
        (lambda: estimator.log_prob(theta, x * float("nan")), ValueError, "'condition' contains"),
        (lambda: estimator.loss(nan, x), ValueError, "'input' contains NaN"),
        (lambda: estimator.sample((3,), x.double()), TypeError, "'condition' should have dtype"),
        (lambda: estimator.sample_and_log_prob((3,), x * float("nan")), ValueError,
         "'condition' contains"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()
    theta[0, 0] = float("inf")  # outside the support: -inf, as the flow gives it
    assert estimator.log_prob(theta, x)[0, 0] == float("-inf")


def test_standardization_is_the_builders_set_from_the_simulations():
    """One mechanism: the flow's own Standardize modules, set from the batch sbi passes; a
    parameter constant over the simulations is only shifted; standardize=False builds none."""
    theta, x = simulations()
    theta[:, 1] = 0.5
    est = posterior_nn(layers=2, hidden_features=(16,))(theta, x)
    standardize_theta = est.net.transform.transforms[0]
    torch.testing.assert_close(standardize_theta.shift, theta.mean(0))
    torch.testing.assert_close(standardize_theta.scale[1], torch.tensor(1.0))
    torch.testing.assert_close(est.net.standardize_context.shift, x.mean(0))
    plain = posterior_nn(layers=2, hidden_features=(16,), standardize=False)(theta, x)
    assert plain.net.standardize_context is None
    assert not any(isinstance(m, Standardize) for m in plain.modules())


def test_a_single_simulation_is_warned_of_in_sbis_terms():
    """With one row in sbi's training split the warning was set_from_data's, about a
    'batches' argument the user never passed; structured z-scoring has a spread to measure."""
    theta, x = simulations(n=1)
    make = posterior_nn(layers=1, hidden_features=(8,))
    with pytest.warns(UserWarning, match="single simulation.*standardization of theta and x"):
        make(theta, x)
    make = posterior_nn(layers=1, hidden_features=(8,), z_score_x="structured")
    with pytest.warns(UserWarning, match="standardization of theta takes") as seen:
        make(theta, x)
    assert not any("'batches'" in str(w.message) for w in seen)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        posterior_nn(layers=1, hidden_features=(8,), standardize=False)(theta, x)


def test_simulations_of_two_dtypes_are_named_as_theta_and_x():
    """Review 48: the builder called outside sbi with float32 theta and float64 x named the
    flow's 'context' and a model that did not exist yet."""
    theta, x = simulations(n=50)
    with pytest.raises(TypeError, match=r"theta \(torch.float32\) and x \(torch.float64\) "
                       "should have one dtype"):
        posterior_nn(layers=1, hidden_features=(8,))(theta, x.double())


def test_full_standardization_of_theta_is_set_from_the_simulations():
    """standardize='full' passes through to the builder: theta's correlation divided out,
    the condition standardized per element."""
    theta, x = simulations()
    theta = torch.stack([theta[:, 0], theta[:, 0] + 0.3 * theta[:, 1]], 1)
    est = posterior_nn(layers=2, hidden_features=(16,), standardize="full")(theta, x)
    standardize_theta = est.net.transform.transforms[0]
    assert standardize_theta.covariance == "full"
    assert est.net.standardize_context.covariance == "diagonal"
    z, _ = standardize_theta(theta)
    assert torch.corrcoef(z.T)[0, 1].abs() < 0.05 < torch.corrcoef(theta.T)[0, 1].abs()


def test_the_spline_takes_sbi_nsfs_bin_temperature_unless_given():
    """posterior_nn's spline divides its raw bin widths and heights by sqrt(H), H the MADEs'
    last hidden width, as sbi's NSF does (measured better on six sbibm tasks); a temperature
    the user gives, and every other transformer option, is kept; the affine flow has none; the
    saved flow rebuilds with it."""
    from flowkit.transforms import RationalQuadraticSpline

    theta, x = simulations()

    def temperatures(est):
        return {m.transformer.bin_temperature for m in est.net.modules()
                if isinstance(getattr(m, "transformer", None), RationalQuadraticSpline)}

    default = posterior_nn(transformer="spline", layers=2)(theta, x)
    assert temperatures(default) == {8.0}  # the builders' hidden (64, 64)
    narrow = posterior_nn(transformer="spline", layers=2, hidden_features=(32, 50),
                          transformer_kwargs={"bins": 4})(theta, x)
    assert temperatures(narrow) == {50**0.5}
    assert narrow.net.config["kwargs"]["transformer_kwargs"] == {"bins": 4,
                                                                 "bin_temperature": 50**0.5}
    given = likelihood_nn(transformer="spline", layers=2,
                          transformer_kwargs={"bin_temperature": 1.0})(theta, x)
    assert temperatures(given) == {1.0}
    affine = posterior_nn(layers=2)(theta, x)
    assert "transformer_kwargs" not in affine.net.config["kwargs"] or not affine.net.config[
        "kwargs"]["transformer_kwargs"]


def test_making_a_builder_leaves_torchs_random_state_alone():
    """posterior_nn builds a small flow to check its options' values: not from the global
    generator a user seeded for the simulations and training."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    posterior_nn("maf", layers=2, hidden_features=(8,), transformer="spline")
    torch.testing.assert_close(torch.rand(3), expected)
