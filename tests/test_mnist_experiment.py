"""The binarized-MNIST experiment end to end on a tiny generated dataset (seconds, no download):
outputs, exact resume, refusal of changed settings, and the evaluation command."""

import argparse
import functools

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import flowkit
from flowkit.app import mnist, mnist_eval
from flowkit.app.cli import add_common_arguments
from flowkit.checkpoint import load_checkpoint, load_model
from flowkit.distributions.discrete import BernoulliMADE
from flowkit.train import Callbacks, fit, loop


@pytest.fixture
def data(tmp_path):
    """500 training and 100 validation 'images': random strokes, so there is something to learn."""
    rng = np.random.default_rng(0)
    means = rng.random((5, 784)) ** 4
    pick = rng.integers(0, 5, 600)
    images = (rng.random((600, 784)) < means[pick]).astype(np.uint8)
    path = tmp_path / "tiny.npz"
    np.savez(path, train=images[:500], valid=images[500:])
    return path


def parse(module, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` as the CLI does: the module's options plus the common ones."""
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    add_common_arguments(parser, "mnist")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def train(data, out, *extra: str) -> dict:
    argv = ["--data", str(data), "--hidden", "16", "--masks", "2", "--order", "random",
            "--batch-size", "100", "--quiet", "--device", "cpu", "--out", str(out), *extra]
    return mnist.run(parse(mnist, argv))


def test_two_epochs_write_every_output_and_report_nll(data, tmp_path):
    metrics = train(data, tmp_path / "run", "--epochs", "2")
    for name in ("checkpoint.pt", "model.pt", "samples.png", "curves.png", "log.txt"):
        assert (tmp_path / "run" / name).is_file(), name
    valid = metrics["valid"]
    assert valid["images"] == 100 and valid["ensemble"] == 2
    assert 0 < valid["nll"] < 784 * np.log(2) and valid["nll_se"] > 0
    assert np.isfinite(valid["ensemble_nll"])
    assert metrics["epochs_run"] == 2 and metrics["seconds_per_epoch"] > 0
    model = load_model(tmp_path / "run" / "model.pt")
    assert isinstance(model, BernoulliMADE) and model.num_masks == 2


def test_the_first_line_of_the_log_counts_in_words(data, tmp_path):
    """It said "a run of 1 epochs ... 1 threads" (review 11)."""
    threads = torch.get_num_threads()
    try:
        train(data, tmp_path / "run", "--epochs", "1", "--threads", "1")
    finally:
        torch.set_num_threads(threads)
    first = (tmp_path / "run" / "log.txt").read_text().splitlines()[0]
    assert first.startswith("starting a run of 1 epoch: 500 train / 100 valid images on cpu, "
                            "1 thread; ")


def test_resumed_run_ends_with_the_same_weights(data, tmp_path):
    train(data, tmp_path / "whole", "--epochs", "3")
    train(data, tmp_path / "split", "--epochs", "1")
    train(data, tmp_path / "split", "--epochs", "3", "--resume")
    whole = load_checkpoint(tmp_path / "whole" / "checkpoint.pt")
    split = load_checkpoint(tmp_path / "split" / "checkpoint.pt")
    for key, value in whole.model["state_dict"].items():
        assert torch.equal(value, split.model["state_dict"][key]), key
    assert whole.extra["history"]["valid_loss"] == split.extra["history"]["valid_loss"]
    assert len(whole.extra["history"]["valid_loss"]) == 3


def test_the_recipe_is_fit_with_callbacks(data, tmp_path):
    """The same run by hand: fit with mask cycling after each step and the validation NLL of
    mask set 0 gives the weights of 'flowkit mnist' bit for bit."""
    train(data, tmp_path / "run", "--epochs", "2")
    images = np.load(data)
    torch.manual_seed(0)
    model = BernoulliMADE(784, hidden_features=[16], num_masks=2, order="random", seed=0)
    x_train = torch.from_numpy(images["train"])
    loader = DataLoader(TensorDataset(x_train), batch_size=100,
                        sampler=mnist.EpochOrder(x_train.shape[0], seed=0), drop_last=True)

    def valid(m):
        with m.made.mask_set(0):
            return mnist_eval.evaluate(m, torch.from_numpy(images["valid"])).mean().item()

    fit(model, loader, valid=valid, epochs=2, restore_best=True, seed=0, device="cpu",
        lr=1e-3, lr_schedule=None,  # the command's --lr and --lr-schedule defaults
        optimizer=functools.partial(torch.optim.AdamW, weight_decay=0.0, fused=True),
        progress=False,
        callbacks=Callbacks(after_step=lambda p: p.model.next_mask()))
    saved = load_checkpoint(tmp_path / "run" / "checkpoint.pt").model["state_dict"]
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved[key]), key


def test_checkpoint_every_e_epochs_and_at_the_end(data, tmp_path, monkeypatch):
    written = []
    save = loop.save_checkpoint
    monkeypatch.setattr(loop, "save_checkpoint", lambda path, kind, model, extra: (
        written.append(extra["step"]), save(path, kind, model=model, extra=extra)))
    train(data, tmp_path / "every2", "--epochs", "5", "--checkpoint-every", "2")
    assert written == [10, 20, 25]  # 5 steps per epoch
    train(data, tmp_path / "whole", "--epochs", "5")
    whole = load_checkpoint(tmp_path / "whole" / "checkpoint.pt").model["state_dict"]
    every2 = load_checkpoint(tmp_path / "every2" / "checkpoint.pt").model["state_dict"]
    assert all(torch.equal(whole[k], every2[k]) for k in whole)
    with pytest.raises(ValueError, match="'--checkpoint-every' should be >= 1"):
        train(data, tmp_path / "zero", "--epochs", "1", "--checkpoint-every", "0")


def test_resume_refuses_changed_settings_and_a_fresh_run_refuses_an_old_folder(data, tmp_path):
    train(data, tmp_path / "run", "--epochs", "1")
    with pytest.raises(ValueError, match="'--lr' is 0.01"):
        train(data, tmp_path / "run", "--epochs", "2", "--lr", "0.01", "--resume")
    with pytest.raises(ValueError, match="pass --resume"):
        train(data, tmp_path / "run", "--epochs", "2")


def test_resume_of_a_folder_that_mnist_did_not_write_is_refused(data, tmp_path):
    fit(flowkit.MAF(2, hidden_features=(4,), layers=1), torch.randn(64, 2), steps=2,
        batch_size=32, checkpoint_dir=tmp_path / "fit", progress=False, device="cpu")
    with pytest.raises(ValueError, match=r"fit.checkpoint.pt' has no 'settings.json' beside it, "
                       r"so it was not written by 'flowkit mnist'"):
        train(data, tmp_path / "fit", "--epochs", "1", "--resume")


def test_a_diverging_run_names_the_options_to_change(data, tmp_path):
    with pytest.raises(FloatingPointError, match=r"lower the learning rate \(--lr 1000000.0 now\)"):
        train(data, tmp_path / "run", "--epochs", "3", "--lr", "1e6")
    assert not (tmp_path / "run" / "model.pt").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_without_cuda_is_a_clear_error(data, tmp_path):
    with pytest.raises(ValueError, match="'device' is 'cuda' but CUDA is not available"):
        train(data, tmp_path / "run", "--epochs", "1", "--device", "cuda")
    argv = [str(tmp_path / "model.pt"), "--file", str(data), "--key", "valid", "--device", "cuda",
            "--out", str(tmp_path / "eval")]
    with pytest.raises(ValueError, match="CUDA is not available"):
        mnist_eval.run(parse(mnist_eval, argv))


def test_eval_scores_npz_and_amat_files_like_the_model(data, tmp_path, capsys):
    train(data, tmp_path / "run", "--epochs", "1")
    valid = np.load(data)["valid"]
    amat = tmp_path / "valid.amat"
    amat.write_text("\n".join(" ".join(map(str, row)) for row in valid) + "\n")
    model = load_model(tmp_path / "run" / "model.pt")
    with model.made.mask_set(0):
        expected = mnist_eval.nll_stats(mnist_eval.evaluate(model, torch.from_numpy(valid)))
    for source in (["--file", str(data), "--key", "valid"], ["--file", str(amat)]):
        argv = [str(tmp_path / "run" / "model.pt"), *source, "--device", "cpu",
                "--out", str(tmp_path / "eval")]
        result = mnist_eval.run(parse(mnist_eval, argv))
        assert result["nll"] == pytest.approx(expected[0])
        assert result["nll_se"] == pytest.approx(expected[1])
        assert result["ensemble"] == 2
        assert "± " in capsys.readouterr().out


def test_mixture_of_models_is_normalized():
    """The uniform mixture of two models (one with a 3-mask ensemble) sums to 1 over all 2^6
    binary vectors, and lies between the best model and the worst."""
    models = [BernoulliMADE(6, hidden_features=(8,), seed=0).double(),
              BernoulliMADE(6, hidden_features=(8,), num_masks=3, order="random", seed=1).double()]
    for model in models:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
    grid = torch.cartesian_prod(*[torch.tensor([0.0, 1.0], dtype=torch.float64)] * 6)
    nlls = [mnist_eval.evaluate(models[0], grid),
            mnist_eval.evaluate(models[1], grid, mask_ensemble=3)]
    mixture = mnist_eval.mixture_nll(nlls)
    assert (-mixture).exp().sum().item() == pytest.approx(1.0, abs=1e-12)
    assert (mixture <= torch.maximum(*nlls) + 1e-12).all()
    assert (mixture >= torch.minimum(*nlls) - 1e-12).all()


def test_eval_of_several_models_scores_their_mixture(data, tmp_path, capsys):
    train(data, tmp_path / "a", "--epochs", "1")
    train(data, tmp_path / "b", "--epochs", "1", "--seed", "1")
    argv = [str(tmp_path / "a" / "model.pt"), str(tmp_path / "b" / "checkpoint.pt"),
            "--file", str(data), "--key", "valid", "--out", str(tmp_path / "eval")]
    result = mnist_eval.run(parse(mnist_eval, argv))
    valid = torch.from_numpy(np.load(data)["valid"])
    nlls = [mnist_eval.evaluate(load_model(tmp_path / name / "model.pt"), valid, mask_ensemble=2)
            for name in ("a", "b")]
    assert [r["ensemble_nll"] for r in result["models"]] == pytest.approx(
        [n.mean().item() for n in nlls])
    assert result["mixture_nll"] == pytest.approx(mnist_eval.mixture_nll(nlls).mean().item())
    assert result["mixture_nll"] < max(n.mean().item() for n in nlls)
    assert "uniform mixture of the 2 models" in capsys.readouterr().out


@pytest.mark.parametrize(
    "option, match",
    [
        (["--ensemble", "3"], r"'--ensemble' should be at most --masks \(2\), got 3"),
        (["--ensemble", "0"], "'--ensemble' should be >= 1, got 0"),
        (["--subset", "-5"], "'--subset' should be >= 1, got -5"),
        (["--patience", "0"], "'--patience' should be >= 1, got 0"),
        (["--masks", "0"], "'--masks' should be >= 1, got 0"),
    ],
)
def test_bad_options_fail_before_the_data_is_read(tmp_path, option, match):
    """A missing data file proves that the check comes first (not after hours of training)."""
    with pytest.raises(ValueError, match=match):
        train(tmp_path / "missing.npz", tmp_path / "run", "--epochs", "1", *option)


def test_eval_refuses_an_ensemble_larger_than_a_models_mask_sets(data, tmp_path):
    train(data, tmp_path / "run", "--epochs", "1")
    model = str(tmp_path / "run" / "model.pt")
    for ensemble, match in (("3", "at most the 2 mask sets of '.*model.pt', got 3"),
                            ("0", "'--ensemble' should be >= 1, got 0")):
        argv = [model, "--file", str(tmp_path / "missing.npz"), "--ensemble", ensemble,
                "--out", str(tmp_path / "eval")]
        with pytest.raises(ValueError, match=match):
            mnist_eval.run(parse(mnist_eval, argv))


@pytest.mark.parametrize("command, option, value", [
    ("mnist", "--threads", "0"), ("mnist", "--lr", "-1"), ("mnist", "--weight-decay", "-1"),
    ("mnist", "--batch-size", "0"), ("mnist", "--epochs", "0"), ("mnist", "--hidden", "0"),
    ("mnist-eval", "--threads", "0"),
])
def test_bad_numbers_are_one_line_errors_before_any_file_is_written(
    data, tmp_path, capsys, command, option, value
):
    from flowkit.app.cli import main

    out = tmp_path / "run"
    argv = (["mnist", "--data", str(data), "--epochs", "1"] if command == "mnist"
            else ["mnist-eval", str(tmp_path / "model.pt"), "--file", str(data)])
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, option, value, "--out", str(out)])
    assert exit_info.value.code == 2
    assert f"argument {option}: should be" in capsys.readouterr().err
    assert not out.exists()


def test_file_errors_name_the_options(data, tmp_path, capsys):
    from flowkit.app.cli import main

    main(["mnist", "--data", str(data), "--hidden", "8", "--epochs", "1", "--quiet",
          "--out", str(tmp_path / "run")])
    model = str(tmp_path / "run" / "model.pt")
    capsys.readouterr()
    readme = tmp_path / "README.md"
    readme.write_text("not images")
    assert main(["mnist", "--data", str(readme), "--out", str(tmp_path / "bad")]) == 2
    assert "'--data' should be an .npz file with arrays 'train' and 'valid', got" in (
        capsys.readouterr().err)
    assert not (tmp_path / "bad").exists()
    assert main(["mnist-eval", model, "--file", str(data), "--out", str(tmp_path / "e1")]) == 2
    assert "holds arrays train, valid; pass '--key' to pick one" in capsys.readouterr().err
    assert main(["mnist-eval", model, "--file", str(readme), "--out", str(tmp_path / "e2")]) == 2
    assert "'--file' should be an .npz or .amat file, got" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = ["mnist-eval", model, "--root", str(empty), "--no-download", "--split", "test"]
    assert main([*argv, "--out", str(tmp_path / "e3")]) == 2
    err = capsys.readouterr().err
    assert "does not exist; drop --no-download to download it" in err
    assert "download=True" not in err


def test_resume_with_fewer_epochs_is_refused(data, tmp_path):
    train(data, tmp_path / "run", "--epochs", "2")
    model = (tmp_path / "run" / "model.pt").read_bytes()
    with pytest.raises(ValueError, match="'--epochs' is 1 but the run in .* was started for 2; "
                                         "--epochs may only grow"):
        train(data, tmp_path / "run", "--epochs", "1", "--resume")
    assert (tmp_path / "run" / "model.pt").read_bytes() == model


def test_a_run_whose_settings_name_the_former_option_schedule_resumes(data, tmp_path):
    """settings.json of runs started before --schedule became --lr-schedule says "schedule"."""
    import json

    train(data, tmp_path / "run", "--epochs", "1")
    path = tmp_path / "run" / mnist.SETTINGS_NAME
    settings = json.loads(path.read_text())
    settings["schedule"] = settings.pop("lr_schedule")
    path.write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="'--lr-schedule' is 'cosine' but the run in .* used "
                                         "'constant'"):
        train(data, tmp_path / "run", "--epochs", "2", "--lr-schedule", "cosine", "--resume")
    assert train(data, tmp_path / "run", "--epochs", "2", "--resume")["epochs_run"] == 2
