"""Smoke test of demos/vae_tutorial.py (tiny networks, synthetic images), and the exactness of
its posterior's log-density against the flow's slow direction."""

import importlib.util
import math
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "demos" / "vae_tutorial.py"


def load_tutorial():
    spec = importlib.util.spec_from_file_location("vae_tutorial", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_trains_and_scores(capsys):
    result = load_tutorial().main(["--quick", "--seed", "1"])
    assert result["epochs"] == 1 and result["k"] == 5
    for key in ("neg_elbo_all_valid", "neg_elbo", "nll"):
        assert math.isfinite(result[key])
    assert result["nll"] <= result["neg_elbo"] + 1e-6  # L_k >= ELBO for the same samples
    assert '"nll"' in capsys.readouterr().out


def test_log_weights_use_the_exact_posterior_density():
    tutorial = load_tutorial()
    torch.manual_seed(0)
    vae = tutorial.VAE(pixels=6, latent=2, hidden=8).double()
    x = torch.randint(0, 2, (3, 6)).double()
    h = vae.encoder(x)
    z, log_q = vae.posterior.sample_and_log_prob(5, h)
    slow = vae.posterior.log_prob(z.reshape(15, 2), h.expand(5, -1, -1).reshape(15, 8))
    torch.testing.assert_close(log_q.reshape(15), slow, atol=1e-9, rtol=0)
    assert vae.log_weights(x, k=5).shape == (5, 3)
