"""The VAE experiment: posterior densities, the importance-weighted bound against an exact
log-likelihood, gradients, and the ``flowkit vae --quick`` command on stand-in data."""

import json
import math

import pytest
import torch

from flowkit.app.vae_model import VAE, evaluate


def small_vae(posterior: str, prior: str = "normal", latent: int = 3) -> VAE:
    vae = VAE(
        data_features=6, latent_features=latent, hidden_features=(16,), posterior=posterior,
        prior=prior, flow_hidden_features=(16,), context_features=4,
    ).double()
    for module in (vae.flow, vae.prior):  # leave the identity initialisation of the flows
        if module is not None:
            for p in module.parameters():
                p.data.normal_(0, 0.3)
    return vae


def binary(n: int, d: int = 6) -> torch.Tensor:
    return torch.randint(0, 2, (n, d)).double()


def test_gaussian_posterior_log_density():
    vae, x = small_vae("gaussian"), binary(5)
    z, log_q = vae.sample_posterior(x, k=4)
    mu, log_sigma, h = vae.encode(x)
    expected = torch.distributions.Normal(mu, log_sigma.exp()).log_prob(z).sum(-1)
    assert h is None and z.shape == (4, 5, 3) and log_q.shape == (4, 5)
    torch.testing.assert_close(log_q, expected)


def test_iaf_posterior_log_density_matches_the_slow_direction():
    # log q(z_T) from the one-pass sampler equals N(z_0) + log|dz_0/dz_T| with z_0 recovered
    # by the flow's forward (data-to-noise) direction, which solves sequentially.
    vae, x = small_vae("iaf"), binary(5)
    z, log_q = vae.sample_posterior(x, k=2)
    mu, log_sigma, h = vae.encode(x)
    z0, log_det = vae.flow.transform(z.reshape(10, 3), h.repeat(2, 1))
    normal = torch.distributions.Normal(mu.repeat(2, 1), log_sigma.exp().repeat(2, 1))
    torch.testing.assert_close(log_q.reshape(10), normal.log_prob(z0).sum(-1) + log_det)


def test_maf_prior_enters_the_joint():
    vae, x = small_vae("gaussian", prior="maf"), binary(4)
    z, _ = vae.sample_posterior(x, k=3)
    logits = vae.decoder(z)
    log_px_z = torch.distributions.Bernoulli(logits=logits).log_prob(x.expand(3, -1, -1)).sum(-1)
    expected = log_px_z + vae.prior.log_prob(z.reshape(12, 3)).reshape(3, 4)
    torch.testing.assert_close(vae.log_joint(x, z), expected)


@pytest.mark.parametrize("posterior", ["gaussian", "iaf"])
def test_importance_weighted_bound_approaches_the_exact_log_likelihood(posterior):
    # With one latent dimension log p(x) = log ∫ p(x|z) N(z; 0, 1) dz is a 1-D integral. The
    # proposal is made wider than the posterior (sigma ~ e^0.5 > 1, the prior's scale) so that
    # the importance weights are bounded and k = 20000 samples pin the estimate down.
    vae, x = small_vae(posterior, latent=1), binary(3)
    with torch.no_grad():
        vae.encoder[-1].bias[1] = 0.5  # log sigma
    grid = torch.linspace(-10, 10, 20001, dtype=torch.float64)
    with torch.no_grad():
        log_joint = vae.log_joint(x, grid[:, None, None].expand(-1, 3, 1))  # (G, 3)
    exact = torch.logsumexp(log_joint, 0) + math.log(grid[1] - grid[0])
    g = torch.Generator().manual_seed(0)
    scores = evaluate(vae, x, k=20000, generator=g)
    assert (scores["elbo"] <= exact).all()
    assert (scores["log_px"] >= scores["elbo"]).all()  # log-mean-exp >= mean
    torch.testing.assert_close(scores["log_px"], exact, atol=0.02, rtol=0)


def test_elbo_gradients_reach_encoder_decoder_and_flow():
    vae = small_vae("iaf", prior="maf")
    (-vae.elbo(binary(8)).mean()).backward()
    for name, module in [("encoder", vae.encoder), ("decoder", vae.decoder),
                         ("posterior flow", vae.flow), ("prior", vae.prior)]:
        grads = [p.grad for p in module.parameters()]
        assert all(g is not None for g in grads), name
        assert sum(g.abs().sum() for g in grads) > 0, name


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="'posterior'"):
        VAE(posterior="planar")
    with pytest.raises(ValueError, match="'prior'"):
        VAE(prior="vamp")


def _fake_mnist(monkeypatch, train: int, valid: int, seed: int = 0) -> None:
    """``flowkit vae`` reads random binary images instead of MNIST."""
    import flowkit.app.vae

    g = torch.Generator().manual_seed(seed)
    fake = {s: torch.randint(0, 2, (n, 784), generator=g, dtype=torch.uint8)
            for s, n in [("train", train), ("valid", valid)]}
    monkeypatch.setattr(flowkit.app.vae, "binarized_mnist", lambda split, **kw: fake[split])


def test_quick_command_runs_and_resumes(tmp_path, monkeypatch, capsys):
    from flowkit.app.cli import main

    _fake_mnist(monkeypatch, train=400, valid=150)
    args = ["vae", "--quick", "--out", str(tmp_path), "--quiet", "--threads", "1",
            "--hidden", "32", "--flow-hidden", "32", "--context", "8", "--latent", "4"]
    assert main(args) == 0
    first = json.loads((tmp_path / "results.json").read_text())
    assert set(first) == {"gaussian", "iaf"}
    r = first["iaf"]
    assert r["k"] == 20 and r["eval_images"] == 100 and r["epochs"] == 2
    assert math.isfinite(r["nll"]) and r["nll"] <= r["neg_elbo"]
    assert math.isfinite(r["log_px_gain"])
    assert (tmp_path / "iaf" / "checkpoint.pt").is_file()
    assert main(args) == 2  # without --resume the finished run is not replaced
    assert "pass --resume to continue that run" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0  # finished run: reloaded, cached scores reused
    again = json.loads((tmp_path / "results.json").read_text())
    assert again["iaf"]["nll"] == r["nll"] and again["iaf"]["steps"] == r["steps"]


def test_missing_data_points_to_the_real_options(tmp_path, capsys):
    from flowkit.app.cli import main

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["vae", "--quick", "--root", str(empty), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"binarized MNIST is missing from {empty}" in err
    assert "'--root'" in err and "flowkit mnist --root" in err
    assert f"binarized_mnist('train', root='{empty}')" in err
    assert "download=True" not in err


@pytest.mark.parametrize("option, value", [
    ("--eval-images", "-5"), ("--eval-images", "0"), ("--batch-size", "0"),
    ("--iw-samples", "0"), ("--iw-samples", "-3"), ("--threads", "0"), ("--latent", "0"),
    ("--epochs", "0"), ("--lr", "-1"),
])
def test_bad_numbers_are_refused_before_any_work(tmp_path, capsys, option, value):
    from flowkit.app.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["vae", "--quick", option, value, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert f"argument {option}: should be" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_options_win_over_quick_and_resume_names_a_changed_option(tmp_path, monkeypatch, capsys):
    from flowkit.app.cli import main

    _fake_mnist(monkeypatch, train=300, valid=100)
    args = ["vae", "--quick", "--out", str(tmp_path), "--quiet", "--threads", "1",
            "--variants", "gaussian", "--hidden", "16", "--latent", "2", "--eval-images", "10"]
    assert main([*args, "--epochs", "1", "--iw-samples", "3"]) == 0
    r = json.loads((tmp_path / "results.json").read_text())["gaussian"]
    assert r["epochs"] == 1 and r["k"] == 3 and r["eval_images"] == 10
    capsys.readouterr()
    assert main([*args, "--epochs", "1", "--resume", "--hidden", "8"]) == 2
    err = capsys.readouterr().err
    assert "'--hidden' is [8] but the run in" in err and "used [16]" in err
    assert main([*args, "--epochs", "1", "--resume", "--lr", "0.01"]) == 2
    assert "'--lr' is 0.01" in capsys.readouterr().err
    # --epochs is fixed under the (default) cosine schedule
    assert main([*args, "--resume"]) == 2
    assert "'--epochs' is 2" in capsys.readouterr().err
    # another variant in the same folder, as in docs/vae.md, needs the same settings too
    assert main([*args, "--epochs", "1", "--variants", "iaf", "--latent", "3"]) == 2
    assert "'--latent' is 3 but the run in" in capsys.readouterr().err


def test_resume_may_only_add_epochs_with_the_constant_schedule(tmp_path, monkeypatch, capsys):
    from flowkit.app.cli import main

    _fake_mnist(monkeypatch, train=300, valid=100, seed=1)
    args = ["vae", "--quick", "--out", str(tmp_path), "--quiet", "--threads", "1",
            "--variants", "gaussian", "--hidden", "16", "--latent", "2", "--eval-images", "10",
            "--iw-samples", "2", "--lr-schedule", "constant"]
    assert main([*args, "--epochs", "2"]) == 0
    capsys.readouterr()
    assert main([*args, "--epochs", "1", "--resume"]) == 2
    assert "'--epochs' is 1 but the run in" in capsys.readouterr().err
    assert main([*args, "--epochs", "3", "--resume"]) == 0
    assert json.loads((tmp_path / "results.json").read_text())["gaussian"]["epochs"] == 3
