"""The RL experiment: the tanh squash and its log-determinant, the two policies' densities and
gradients, and ``flowkit rl --quick`` on Pendulum (needs gymnasium)."""

import json
import math

import pytest
import torch
from torch.distributions import (
    AffineTransform,
    Independent,
    Normal,
    TanhTransform,
    TransformedDistribution,
)

from flowkit import load_model
from flowkit.app.sac import _evaluate
from flowkit.app.sac_policies import FlowPolicy, GaussianPolicy, squash
from flowkit.checkpoint import load_checkpoint

LOW = torch.tensor([-2.0, 0.0], dtype=torch.float64)
HIGH = torch.tensor([2.0, 1.0], dtype=torch.float64)


def test_squash_matches_torch_distributions():
    base = Independent(Normal(torch.zeros(2, dtype=torch.float64), 1.5), 1)
    centre, half = (HIGH + LOW) / 2, (HIGH - LOW) / 2
    squashed = TransformedDistribution(
        base, [TanhTransform(cache_size=1), AffineTransform(centre, half)]
    )
    u = 2 * torch.randn(50, 2, dtype=torch.float64)
    a, log_prob = squash(u, base.log_prob(u), LOW, HIGH)
    assert ((a > LOW) & (a < HIGH)).all()
    torch.testing.assert_close(log_prob, squashed.log_prob(a))


def test_squash_log_det_is_minus_the_log_jacobian():
    u = torch.randn(4, 2, dtype=torch.float64)
    _, log_prob = squash(u, torch.zeros(4, dtype=torch.float64), LOW, HIGH)
    for i in range(4):
        jacobian = torch.autograd.functional.jacobian(
            lambda v: squash(v[None], torch.zeros(1, dtype=torch.float64), LOW, HIGH)[0][0], u[i]
        )
        torch.testing.assert_close(log_prob[i], -torch.linalg.slogdet(jacobian).logabsdet)


def test_squash_is_finite_where_the_naive_formula_is_not():
    # 1 - tanh(±30)^2 rounds to 0 in float64; log(1 - tanh(u)^2) = log 4 - 2|u| + O(e^{-2|u|})
    u = torch.tensor([[-30.0, 0.3]], dtype=torch.float64)
    _, log_prob = squash(u, torch.zeros(1, dtype=torch.float64), LOW, HIGH)
    expected = -(math.log(2) + math.log(4) - 60) - (
        math.log(0.5) + math.log(1 - math.tanh(0.3) ** 2)
    )
    torch.testing.assert_close(log_prob, torch.tensor([expected], dtype=torch.float64))


def test_gaussian_policy_density_and_gradients():
    policy = GaussianPolicy(3, 2, (16,)).double()
    obs = torch.randn(7, 3, dtype=torch.float64)
    u, log_prob = policy.sample_and_log_prob(obs)
    mu, log_sigma = policy._params(obs)
    torch.testing.assert_close(log_prob, Normal(mu, log_sigma.exp()).log_prob(u).sum(-1))
    assert torch.equal(policy.deterministic(obs), mu)
    (u.sum() + log_prob.sum()).backward()
    assert all(p.grad is not None for p in policy.parameters())


@pytest.mark.parametrize("transformer", ["spline", "affine"])
def test_flow_policy_log_prob_of_its_samples_is_exact(transformer):
    torch.manual_seed(1)
    policy = FlowPolicy(3, 2, (16, 16), layers=2, transformer=transformer).double()
    for p in policy.parameters():  # leave the identity initialisation
        p.data.normal_(0, 0.2)
    obs = torch.randn(6, 3, dtype=torch.float64)
    u, log_prob = policy.sample_and_log_prob(obs)
    assert u.shape == (6, 2) and log_prob.shape == (6,)
    # the density of the same points through the flow's slow (data-to-noise) direction
    torch.testing.assert_close(log_prob, policy.flow.log_prob(u, context=obs))
    (u.sum() + log_prob.sum()).backward()  # reparameterized: gradients reach every layer
    assert all(p.grad is not None for p in policy.parameters())
    assert policy.deterministic(obs).shape == (6, 2)


def test_flow_policy_deterministic_action_is_the_sample_of_zero_noise():
    """Review 29: the evaluation action passed the raw observation to the layers, skipping the
    flow's standardization of its context; now it is what sampling gives for zero noise."""
    torch.manual_seed(0)
    policy = FlowPolicy(3, 2, (16,), layers=2, transformer="affine")
    for p in policy.parameters():  # leave the identity initialisation
        p.data.normal_(0, 0.2)
    obs = torch.randn(64, 3) * 20.0 + 100.0  # observations far from unit scale
    policy.sample_and_log_prob(obs)  # training mode: sets the context standardization
    policy.eval()
    base = policy.flow.base
    base.rsample = lambda n: torch.zeros(n, 2)  # noise of zero
    torch.testing.assert_close(policy.deterministic(obs), policy.flow.sample(context=obs))


def test_quick_command_on_pendulum(tmp_path):
    gym = pytest.importorskip("gymnasium")
    from flowkit.app.cli import main

    args = ["rl", "--quick", "--out", str(tmp_path), "--quiet"]
    assert main(args) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == {"gaussian", "iaf"}
    for s in summary.values():
        assert s["eval_steps"] == [150] and math.isfinite(s["final_return_mean"])
        assert -2000 < s["final_return_mean"] <= 0  # Pendulum's rewards are in [-16.3, 0]
    run = json.loads((tmp_path / "iaf-seed0.json").read_text())
    assert run["config"]["flow_transformer"] == "spline" and run["config"]["steps"] == 150
    # the saved policies are the trained ones: their zero-noise actions give the recorded
    # final return again; the IAF's file is a flowkit model file
    gaussian = GaussianPolicy(3, 1, (32, 32))
    load_checkpoint(tmp_path / "gaussian-seed0.pt").restore(gaussian)
    flow_policy = FlowPolicy(3, 1, (32, 32))
    flow_policy.flow = load_model(tmp_path / "iaf-seed0.pt")
    obs = torch.randn(4, 3)
    u, log_prob = flow_policy.flow.sample_and_log_prob(context=obs)
    torch.testing.assert_close(log_prob, flow_policy.flow.log_prob(u, context=obs))
    low, high = torch.tensor([-2.0]), torch.tensor([2.0])
    for name, policy in [("gaussian", gaussian), ("iaf", flow_policy)]:
        final_return = _evaluate(gym.make("Pendulum-v1"), policy, low, high, 1, 10_000)
        assert final_return == summary[name]["final_return_mean"], name
    assert main([*args, "--resume"]) == 0  # finished runs are read back, not rerun
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


@pytest.mark.parametrize("option, value", [
    ("--threads", "0"), ("--steps", "0"), ("--eval-every", "0"), ("--seeds", "0"),
    ("--flow-layers", "0"), ("--hidden", "0"), ("--lr", "-1"),
])
def test_bad_numbers_are_refused_naming_the_option(tmp_path, capsys, option, value):
    from flowkit.app.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["rl", "--quick", option, value, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert f"argument {option}: should be" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--env", "CartPole-v1"],
     "'--env' 'CartPole-v1' has a Discrete action space: SAC here needs a continuous"),
    (["--steps", "100"], "'--steps' should be more than the 100 steps of random actions"),
])
def test_runs_that_cannot_train_are_refused_before_any_training(tmp_path, capsys, argv, message):
    pytest.importorskip("gymnasium")
    from flowkit.app.cli import main

    assert main(["rl", "--quick", *argv, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_options_win_over_quick_and_a_rerun_does_not_replace_results(tmp_path, capsys):
    pytest.importorskip("gymnasium")
    from flowkit.app.cli import main

    args = ["rl", "--quick", "--policies", "gaussian", "--out", str(tmp_path), "--quiet"]
    assert main([*args, "--steps", "110", "--hidden", "8", "--eval-every", "55"]) == 0
    run = json.loads((tmp_path / "gaussian-seed0.json").read_text())
    assert run["config"]["steps"] == 110 and run["config"]["hidden"] == [8]
    assert run["eval_steps"] == [55, 110] and run["config"]["start_steps"] == 100
    before = (tmp_path / "gaussian-seed0.json").stat().st_mtime_ns
    capsys.readouterr()
    assert main(args) == 2  # without --resume the finished run is kept
    assert "summary.json' exists: pass --resume" in capsys.readouterr().err
    assert (tmp_path / "gaussian-seed0.json").stat().st_mtime_ns == before
    assert main([*args, "--resume"]) == 2  # the --quick steps differ from the run's 110
    assert "was run with steps 110, not 150 (set by --steps)" in capsys.readouterr().err
