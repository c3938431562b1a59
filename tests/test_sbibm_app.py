"""'flowkit sbibm' end to end on a tiny budget (skipped without sbi and sbibm)."""

import json

import pytest

pytest.importorskip("sbi")
pytest.importorskip("sbibm")

from flowkit.app import cli, sbibm  # noqa: E402


def test_tiny_run_writes_results_and_reuses_them(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sbibm"
    argv = ["sbibm", "--tasks", "two_moons", "--models", "flowkit-maf", "--simulations", "200",
            "--max-epochs", "2", "--samples", "50", "--observations", "1", "2", "--threads", "1",
            "--out", str(out)]
    assert cli.main(argv) == 0
    run = json.loads((out / "two_moons" / "seed0" / "flowkit-maf.json").read_text())
    assert set(run["c2st"]) == {"1", "2"} and all(0 <= v <= 1 for v in run["c2st"].values())
    assert run["epochs"] == 2 and run["epoch_seconds"] > 0  # --max-epochs 2
    assert "| two_moons |" in (out / "results.md").read_text()
    assert cli.main(argv) == 0  # reused, not trained again
    assert "flowkit-maf: C2ST" not in capsys.readouterr().out.split("wrote")[-1]
    changed = [a if a != "50" else "60" for a in argv]
    assert cli.main(changed) == 2
    assert "pick another --out" in capsys.readouterr().err
    # A result of the model's earlier settings is not reused either.
    monkeypatch.setitem(sbibm.MODELS, "flowkit-maf", {**sbibm.MODELS["flowkit-maf"], "layers": 2})
    assert cli.main(argv) == 2
    assert "'layers': 2" in capsys.readouterr().err
    monkeypatch.undo()
    # A result written before the MAF's LU-linear maps became its default (its spec has no
    # lu_linear: none were built) is the pinned model's, and is reused (review 28).
    path = out / "two_moons" / "seed0" / "flowkit-maf.json"
    run = json.loads(path.read_text())
    assert run["spec"].pop("lu_linear") is False
    path.write_text(json.dumps(run))
    assert cli.main(argv) == 0


def test_spline_results_from_before_the_bin_temperature_are_the_pinned_models(tmp_path):
    """The spline models pin bin_temperature=1.0 since posterior_nn's spline takes sbi NSF's
    sqrt(H); a result recorded before, whose spec names none, was run with 1.0 and is reused;
    one of another temperature is not."""
    import argparse

    spec = json.loads(json.dumps(sbibm.MODELS["flowkit-spline-defaults-lu"]))
    assert spec["transformer_kwargs"] == {"bin_temperature": 1.0}
    args = argparse.Namespace(simulations=10, samples=5, max_epochs=None, observations=[1])
    record = {"model": "flowkit-spline-defaults-lu", "simulations": 10, "samples": 5,
              "max_epochs": None, "c2st": {"1": 0.5}, "epochs": 3,
              "spec": {k: v for k, v in spec.items() if k != "transformer_kwargs"}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    assert sbibm._reuse(path, args)["c2st"] == {"1": 0.5}
    record["spec"]["transformer_kwargs"] = {"bin_temperature": 8.0}
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="pick another --out"):
        sbibm._reuse(path, args)


def test_timing_mode_measures_every_model(tmp_path):
    out = tmp_path / "timing"
    argv = ["sbibm", "--timing", "2", "--tasks", "two_moons", "--models", "flowkit-maf",
            "sbi-maf", "--simulations", "100", "--threads", "1", "--quiet", "--out", str(out)]
    assert cli.main(argv) == 0
    timing = json.loads((out / "timing.json").read_text())
    assert set(timing["two_moons"]) == {"flowkit-maf", "sbi-maf"}
    assert all(t > 0 for t in timing["two_moons"].values())


@pytest.mark.parametrize("name", sorted(sbibm.MODELS))
def test_every_model_builds_a_density_estimator(name):
    """Each model of the table, built as the command builds it, gives finite log-densities and
    samples of sbi's shapes."""
    import torch
    from sbi.utils import BoxUniform

    torch.manual_seed(0)
    prior = BoxUniform(torch.full((2,), -4.0), torch.full((2,), 4.0))  # holds theta below
    theta, x = torch.randn(64, 2), torch.randn(64, 3)
    estimator = sbibm._builder(name, seed=0, prior=prior)(theta, x)
    log_prob = estimator.log_prob(theta[None], x)
    assert log_prob.shape == (1, 64) and torch.isfinite(log_prob).all()
    assert estimator.sample((5,), x[:2]).shape == (5, 2, 2)


def test_a_box_model_needs_a_prior_on_a_box():
    import torch

    prior = torch.distributions.MultivariateNormal(torch.zeros(2), torch.eye(2))
    with pytest.raises(ValueError, match="'flowkit-spline-defaults-box' fits the prior's box, "
                       "but this task's prior .* is not on a box"):
        sbibm._builder("flowkit-spline-defaults-box", seed=0, prior=prior)


def test_max_epochs_caps_the_epochs_and_an_older_result_of_one_more_is_refused(tmp_path, capsys):
    out = tmp_path / "sbibm"
    argv = ["sbibm", "--tasks", "two_moons", "--models", "flowkit-maf", "--simulations", "100",
            "--max-epochs", "2", "--samples", "20", "--observations", "1", "--threads", "1",
            "--quiet", "--out", str(out)]
    assert cli.main(argv) == 0
    path = out / "two_moons" / "seed0" / "flowkit-maf.json"
    run = json.loads(path.read_text())
    assert run["max_epochs"] == 2 and run["epochs"] == 2
    path.write_text(json.dumps({**run, "epochs": 3}))  # as written before the correction
    assert cli.main(argv) == 2
    assert "trained 3 epochs under --max-epochs 2" in capsys.readouterr().err
    assert cli.main([*argv[:-1], str(tmp_path / "one"), "--max-epochs", "1"]) == 2
    assert "'--max-epochs' should be >= 2 (sbi trains at least 2 epochs), got 1" in (
        capsys.readouterr().err)


def test_a_models_train_keywords_reach_sbis_train():
    class Inference:
        def train(self, **options):
            self.options = options
            return "estimator"

    inference = Inference()
    assert sbibm._train(inference, "flowkit-spline-res-cb-noclip", 5) == "estimator"
    assert inference.options == {"clip_max_norm": None, "max_num_epochs": 4}
    sbibm._train(inference, "sbi-nsf", None)
    assert inference.options == {}
