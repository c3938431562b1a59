"""Checkpoint files: model round trips, atomic writes, and clear errors on bad files (see also
tests/test_file_faults.py: bit flips, truncation, I/O faults, locks, kill -9)."""

from __future__ import annotations

import collections
import enum
import io
import json
import os
import re
import struct
import zipfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import flowkit
from flowkit.checkpoint import (
    CheckpointError,
    CheckpointWriteError,
    InvalidBuffer,
    LegacyFormatWarning,
    load_checkpoint,
    load_model,
    register_check,
    register_model,
    save_checkpoint,
    save_model,
)
from flowkit.checkpoint.format import MAGIC, write_file
from flowkit.checkpoint.registry import model_config

MODELS = {
    "maf": lambda: flowkit.MAF(2, hidden_features=(8,), layers=2),
    "iaf-conditional": lambda: flowkit.IAF(
        3, hidden_features=(8,), layers=2, context_features=2, permutation="random", seed=3
    ),
    "maf-batchnorm": lambda: flowkit.MAF(2, hidden_features=(8,), layers=3, batch_norm=True),
    "iaf-lu-linear": lambda: flowkit.IAF(3, hidden_features=(8,), layers=3, lu_linear=True,
                                         transformer="spline"),
}


@pytest.fixture(params=sorted(MODELS), ids=sorted(MODELS))
def trained_flow(request) -> flowkit.Flow:
    """A flow moved away from its initialisation (identity at init would hide weight bugs)."""
    flow = MODELS[request.param]()
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.1 * torch.randn_like(p))
    flow.train()
    context = torch.randn(64, flow.context_features) if flow.context_features else None
    flow.log_prob(torch.randn(64, flow.features), context)  # batch norm: move running stats
    return flow


def test_round_trip_same_log_prob_and_samples(trained_flow, tmp_path):
    path = tmp_path / "flow.pt"
    save_model(trained_flow, path)
    loaded = load_model(path)
    trained_flow.eval()
    assert type(loaded) is type(trained_flow) and not loaded.training
    c = torch.randn(5, trained_flow.context_features) if trained_flow.context_features else None
    x = torch.randn(5, trained_flow.features)
    assert torch.equal(loaded.log_prob(x, c), trained_flow.log_prob(x, c))
    torch.manual_seed(7)
    a = trained_flow.sample(5, c)
    torch.manual_seed(7)
    assert torch.equal(loaded.sample(5, c), a)


@pytest.mark.parametrize("name", ["maf-batchnorm", "bernoulli"])
def test_float64_models_come_back_in_float64(name, tmp_path):
    """The rebuilt model takes the dtype of the saved weights (it used to be rebuilt in the
    default float32 and the float64 weights rounded into it)."""
    bernoulli = name == "bernoulli"
    model = flowkit.BernoulliMADE(4, hidden_features=(8,)) if bernoulli else MODELS[name]()
    model = model.double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-9 * torch.randn_like(p))  # digits that float32 cannot hold
    save_model(model, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt")
    assert all(t.dtype == torch.float64 for t in loaded.state_dict().values()
               if t.is_floating_point())
    x = torch.randint(0, 2, (5, 4)).double() if bernoulli else torch.randn(5, 2).double()
    assert torch.equal(loaded.log_prob(x), model.eval().log_prob(x))


NUMPY_ARGUMENTS = {
    "maf": lambda: flowkit.MAF(
        np.int64(2), hidden_features=(np.int64(8),), layers=np.int32(2), transformer="spline",
        transformer_kwargs={"bins": np.int64(4), "bound": np.float32(3.0)},
    ),
    "iaf": lambda: flowkit.IAF(2, hidden_features=[np.int64(8)] * 2, layers=np.int64(2)),
    "categorical": lambda: flowkit.CategoricalMADE(
        3, classes=4, hidden_features=(np.int64(8),), order=torch.tensor([2, 0, 1])
    ),
}


@pytest.mark.parametrize("name", sorted(NUMPY_ARGUMENTS))
def test_numpy_and_tensor_arguments_are_stored_as_json(name, tmp_path):
    """Every registered constructor stores its arguments through one normaliser
    (registry.model_config), so numpy integers, arrays and tensors save as plain JSON (save_model
    used to refuse int64)."""
    model = NUMPY_ARGUMENTS[name]()
    assert json.loads(json.dumps(model.config)) == model.config
    save_model(model, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt")
    x = torch.randint(0, 4, (5, 3)) if name == "categorical" else torch.randn(5, 2)
    assert torch.equal(loaded.log_prob(x), model.eval().log_prob(x))


def test_model_config_normalises_nested_values():
    config = model_config(
        "MAF", a=np.int64(1), b=(np.float64(0.5), [np.bool_(True)]), c={"d": torch.tensor([1, 2])},
        e=np.zeros((2, 1), dtype=np.int32), f="x", g=None,
    )
    assert config == {
        "type": "MAF",
        "kwargs": {"a": 1, "b": [0.5, [True]], "c": {"d": [1, 2]}, "e": [[0], [0]], "f": "x",
                   "g": None},
    }
    assert type(config["kwargs"]["a"]) is int and type(config["kwargs"]["b"][1][0]) is bool


def test_load_model_map_location_moves_the_model(tmp_path):
    save_model(MODELS["maf"](), tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt", map_location="cpu")
    assert all(p.device.type == "cpu" for p in loaded.parameters())


def test_discrete_model_round_trip(tmp_path):
    model = flowkit.BernoulliMADE(6, hidden_features=(16,))
    save_model(model, tmp_path / "b.pt")
    x = torch.randint(0, 2, (4, 6)).float()
    assert torch.equal(load_model(tmp_path / "b.pt").log_prob(x), model.eval().log_prob(x))


# ------------------------------------------------------------------------------------- bad files


def _truncated(path):
    save_model(MODELS["maf"](), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _extended(path):
    save_model(MODELS["maf"](), path)
    data = path.read_bytes()
    path.write_bytes(data[:100] + bytes(8) + data[100:])  # 8 bytes too many in the payload


def _header_only(path):
    path.write_bytes(MAGIC[:5])


def _random_bytes(path):
    path.write_bytes(os.urandom(2048))


def _foreign_torch_file(path):
    torch.save({"weights": torch.ones(3)}, path)


def _foreign_tensor(path):
    torch.save(torch.ones(3), path)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def _pickle_with_code(path):
    torch.save({"flowkit_format": 1, "payload": _Evil()}, path)


def _future_version(path):
    save_model(MODELS["maf"](), path)
    data = bytearray(path.read_bytes())
    data[len(MAGIC)] = 3  # the format version, a little-endian uint32 after the magic
    path.write_bytes(bytes(data))


def _checksummed_foreign_payload(path):
    write_file({"weights": torch.ones(3)}, path)  # intact bytes, contents not a checkpoint


BAD_FILES = {
    "truncated": (_truncated, r"is damaged: its last bytes are not a length field \(the file "
                  r"has \d+ bytes\) \(the file was truncated"),  # (not a nonsense length)
    "extended": (_extended, "is damaged: its length field says .* bytes but the file has"),
    "header-only": (_header_only, "is truncated: 5 bytes"),
    "random-bytes": (_random_bytes, "is not a flowkit file"),
    "foreign-dict": (_foreign_torch_file, "holding a dict with 'flowkit_format': 1, got a dict"),
    "foreign-tensor": (_foreign_tensor, "holding a dict with 'flowkit_format': 1, got Tensor"),
    "arbitrary-pickle": (_pickle_with_code, "could not be read as a flowkit checkpoint of forma"),
    "future-version": (_future_version, "is a flowkit file of format 3; this flowkit reads"),
    "foreign-payload": (_checksummed_foreign_payload, "should be a dict with the keys 'kind'"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_bad_file_gives_checkpoint_error_naming_the_path(kind, tmp_path):
    path = tmp_path / f"{kind}.pt"
    make, expected = BAD_FILES[kind]
    make(path)
    for load in (load_checkpoint, load_model):
        with pytest.raises(CheckpointError, match=expected) as info:
            load(path)
        assert str(path) in str(info.value)
        assert isinstance(info.value, ValueError)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint file at") as info:
        load_model(tmp_path / "nope.pt")
    assert str(tmp_path / "nope.pt") in str(info.value)
    with pytest.raises(CheckpointError, match=r"no checkpoint file at .* \(a folder there\)"):
        load_model(tmp_path)


def _model_file(path, config, state=None):
    """A file with intact bytes (a valid checksum) holding ``config`` and ``state``."""
    state = MODELS["maf"]().state_dict() if state is None else state
    write_file(
        {"kind": "model", "model": {"config": config, "state_dict": state}, "extra": {}}, path
    )


@pytest.mark.parametrize(
    "name", ["NoSuchFlow", "save_model", "_private", "os", "Flow.__init__", "checkpoint"]
)
def test_unknown_or_unsafe_type_is_refused_before_calling_anything(name, tmp_path):
    _model_file(tmp_path / "m.pt", {"type": name, "kwargs": {"path": str(tmp_path / "x")}})
    with pytest.raises(CheckpointError, match=f"type '{name}'.*not a model constructor.*"
                       "registered: BernoulliMADE, CategoricalMADE, IAF, MAF"):
        load_model(tmp_path / "m.pt")
    assert not (tmp_path / "x").exists()


def test_weights_that_do_not_fit_the_config(tmp_path):
    config = dict(MODELS["maf"]().config)
    config["kwargs"] = {**config["kwargs"], "hidden_features": [9]}
    _model_file(tmp_path / "m.pt", config)
    with pytest.raises(CheckpointError, match="do not fit a MAF"):
        load_model(tmp_path / "m.pt")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"features": "abc"}, "'features': 'abc'"), ({"bogus": 1}, "keyword argument 'bogus'")],
    ids=["wrong-type", "unknown"],
)
def test_config_the_constructor_refuses(kwargs, message, tmp_path):
    config = MODELS["maf"]().config
    _model_file(tmp_path / "m.pt", {**config, "kwargs": {**config["kwargs"], **kwargs}})
    with pytest.raises(CheckpointError, match=f"cannot be built from the stored config.*{message}"):
        load_model(tmp_path / "m.pt")


@pytest.mark.parametrize("value", [[1.0, 2.0], 3, None], ids=["list", "int", "none"])
def test_weights_that_are_not_tensors(value, tmp_path):
    flow = MODELS["maf"]()
    state = dict(flow.state_dict())
    key = next(iter(state))
    state[key] = value
    _model_file(tmp_path / "m.pt", flow.config, state)
    with pytest.raises(CheckpointError, match=f"stored weight '{key}' should be a tensor"):
        load_model(tmp_path / "m.pt")


def _tampered(flow, path, key, change):
    """Write ``flow`` to ``path`` with ``change`` applied to its buffer ``key`` (and a valid
    checksum: what a file edited by someone who recomputed it would hold)."""
    state = dict(flow.state_dict())
    state[key] = change(state[key].clone())
    _model_file(path, flow.config, state)


MADE_KEY = "transform.transforms.1.made"  # after the Standardize
TAMPERING = {
    "output-mask": (f"{MADE_KEY}.output.mask", lambda m: torch.ones_like(m), "output.mask"),
    "hidden-mask": (f"{MADE_KEY}.hidden.0.mask", lambda m: 1 - m, "hidden.0.mask"),
    "mask-index": (f"{MADE_KEY}.mask_index", lambda i: i + 3, r"mask_index' should be in \[0, 1\)"),
    "orders": (f"{MADE_KEY}.orders", lambda o: torch.zeros_like(o), "orders' should be perm"),
    "permutation": ("transform.transforms.2.permutation", lambda p: torch.zeros_like(p),
                    "transforms.2.permutation' should be a permutation"),
    "inverse-permutation": ("transform.transforms.2.inverse_permutation", lambda p: p.flip(0),
                            "inverse_permutation' should be the inverse"),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_tampered_structural_buffers_are_refused(case, tmp_path):
    """Masks, orderings and permutations are buffers in the file; a model loaded with a mask
    other than its degrees give would silently not be autoregressive (its densities wrong)."""
    key, change, message = TAMPERING[case]
    flow = flowkit.MAF(3, hidden_features=(8,), layers=2, permutation="random", seed=1)
    _tampered(flow, tmp_path / "m.pt", key, change)
    with pytest.raises(CheckpointError, match=message) as info:
        load_model(tmp_path / "m.pt")
    assert str(tmp_path / "m.pt") in str(info.value) and "stored buffer" in str(info.value)


def test_a_negative_running_variance_is_refused(tmp_path):
    """Review 46: a batch norm with a negative running variance gave NaN densities silently."""
    flow = flowkit.MAF(3, hidden_features=(8,), layers=2, batch_norm=True)
    key = next(k for k in flow.state_dict() if k.endswith("running_var"))
    _tampered(flow, tmp_path / "m.pt", key, lambda v: -v)
    with pytest.raises(CheckpointError, match="running_var' should be non-negative"):
        load_model(tmp_path / "m.pt")


def test_a_mask_set_other_than_the_first_is_accepted(tmp_path):
    made = flowkit.BernoulliMADE(4, hidden_features=(8,), num_masks=3, order="random")
    made.made.set_mask(2)
    save_model(made, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt")
    x = torch.randint(0, 2, (5, 4)).float()
    assert loaded.made.mask_set_index == 2
    assert torch.equal(loaded.log_prob(x), made.eval().log_prob(x))


def test_model_without_config_cannot_be_saved_with_save_model(tmp_path):
    with pytest.raises(CheckpointError, match="has no 'config'") as info:
        save_model(nn.Linear(2, 2), tmp_path / "l.pt")
    assert "holds a model" not in str(info.value)
    assert not (tmp_path / "l.pt").exists()

    class Wrapper(nn.Module):  # as sbi's estimator holds the flow in .net (review 36)
        def __init__(self):
            super().__init__()
            self.head, self.net = nn.Linear(2, 2), flowkit.MAF(2, layers=1, hidden_features=(4,))

    with pytest.raises(CheckpointError, match=r"holds a model that can be saved, 'net': "
                       r"flowkit.save_model\(model.net, path\)"):
        save_model(Wrapper(), tmp_path / "w.pt")


def test_model_without_config_is_saved_and_restored_with_checks(tmp_path):
    """An application's own module (no registered constructor): save_checkpoint keeps its
    weights, Checkpoint.restore puts them back and checks them like load_model."""
    net = nn.Linear(2, 2)
    save_checkpoint(tmp_path / "l.pt", "my-app", model=net, extra={"epoch": 3})
    ckpt = load_checkpoint(tmp_path / "l.pt", kind="my-app")
    assert ckpt.version == 2 and ckpt.extra == {"epoch": 3} and ckpt.model["config"] is None
    other = nn.Linear(2, 2)
    ckpt.restore(other)
    assert torch.equal(other.weight, net.weight)
    with pytest.raises(CheckpointError, match="without a 'config'.*load_checkpoint"):
        load_model(tmp_path / "l.pt")
    with pytest.raises(CheckpointError, match="do not fit a Linear"):
        ckpt.restore(nn.Linear(3, 2))
    with pytest.raises(CheckpointError, match="of kind 'my-app', expected kind 'training'"):
        load_checkpoint(tmp_path / "l.pt", kind="training")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nonfinite_weights_are_refused_unless_allowed(bad, tmp_path):
    flow = MODELS["maf"]()
    key = next(k for k, v in flow.state_dict().items() if v.is_floating_point())
    with torch.no_grad():
        flow.state_dict()[key].view(-1)[0] = bad
    save_model(flow, tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match=f"stored weight '{key}' holds 1 NaN or infinite.*"
                       "allow_nonfinite=True") as info:
        load_model(tmp_path / "m.pt")
    assert str(tmp_path / "m.pt") in str(info.value)
    for flag in ("yes", 1, None):  # a flag, checked like the others: not any truthy value
        with pytest.raises(ValueError, match=f"'allow_nonfinite' should be True or False, got "
                           f"{flag!r}"):
            load_model(tmp_path / "m.pt", allow_nonfinite=flag)
        with pytest.raises(ValueError, match="'allow_nonfinite' should be True or False"):
            load_checkpoint(tmp_path / "m.pt").restore(flow, allow_nonfinite=flag)
    loaded = load_model(tmp_path / "m.pt", allow_nonfinite=True)
    torch.testing.assert_close(loaded.state_dict()[key], flow.state_dict()[key], rtol=0, atol=0,
                               equal_nan=True)


def test_save_model_path_errors_name_the_argument(tmp_path):
    flow = MODELS["maf"]()
    with pytest.raises(TypeError, match="'path' should be a file path .*got NoneType None"):
        save_model(flow, None)
    with pytest.raises(ValueError, match=f"'{tmp_path}' is a folder; pass a file inside it"):
        save_model(flow, tmp_path)
    with pytest.raises(ValueError, match="got an empty string"):
        save_model(flow, "")
    for folder, end in ((f"{tmp_path}/out/", "a separator"), (f"{tmp_path}/out/.", "'.'")):
        # a folder meant, that does not exist yet: a file named 'out' was written before
        with pytest.raises(ValueError, match=re.escape(f"'path' should be a file path, but "
                           f"'{folder}' names a folder (it ends with {end}); pass a file inside "
                           f"it, e.g. '{folder}") + "/?model.pt'"):
            save_model(flow, folder)
    with pytest.raises(TypeError, match="'model' should be a torch.nn.Module, got str"):
        save_model("flow", tmp_path / "m.pt")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("map_location", "error", "message"),
    [
        ("bogus", ValueError, "'map_location' should be a device such as 'cpu'"),
        (3.5, TypeError, "'map_location' should be None, a device"),
        ("meta", ValueError, "'map_location' is 'meta', which holds no values .* pass a device"),
        (torch.device("meta"), ValueError, r"'map_location' is device\(type='meta'\), which"),
        pytest.param("cuda:7", ValueError, "this machine has [0-9]+ CUDA device", marks=(
            pytest.mark.skipif(torch.cuda.device_count() > 7, reason="has 8 GPUs"))),
    ],
    ids=["bogus", "float", "meta", "meta-device", "missing-gpu"],
)
def test_bad_map_location_is_not_reported_as_a_corrupt_file(map_location, error, message,
                                                             tmp_path):
    save_model(MODELS["maf"](), tmp_path / "m.pt")
    with pytest.raises(error, match=message) as info:
        load_model(tmp_path / "m.pt", map_location=map_location)
    assert not isinstance(info.value, CheckpointError)


@pytest.mark.parametrize("path", [None, 123, b"m.pt", ""], ids=["None", "int", "bytes", "empty"])
def test_load_path_errors_name_the_argument_as_save_model_does(tmp_path, path):
    """pathlib's 'expected str, bytes or os.PathLike object, not NoneType' named nothing; "" read
    as the folder '.'."""
    flow = MODELS["maf"]()
    with pytest.raises((TypeError, ValueError)) as saving:
        save_model(flow, path)
    for load in (load_model, load_checkpoint):
        with pytest.raises(type(saving.value), match=r"^'path' should be a file path") as info:
            load(path)
        assert str(info.value) == str(saving.value)


def test_objects_flowkit_does_not_read_are_named_without_torchs_advice(tmp_path):
    """torch's weights_only refusal carried terminal escapes and the advice to load with
    weights_only=False, which a load_model caller cannot follow (and which would run the file's
    code): the message names the object's type and says what the file is."""
    flow = MODELS["maf"]()
    torch.save(flow, tmp_path / "pickled.pt")  # a whole pickled model, a zip like format 1
    write_file({"kind": "test", "model": None, "extra": {"c": np.float64(0.5)}},
               tmp_path / "np.pt")  # what save_checkpoint wrote before it refused np.float64
    cases = {"pickled.pt": "could not be read as a flowkit checkpoint of format 1: it holds an "
                           "object of type flowkit.flows.flow.Flow, which flowkit does not read",
             "np.pt": "passed its checksum but its contents could not be loaded: it holds an "
                      "object of type numpy.*, which flowkit does not read"}
    for name, message in cases.items():
        for load in (load_checkpoint, load_model):
            with pytest.raises(CheckpointError, match=message) as info:
                load(tmp_path / name)
            text = str(info.value)
            assert "\x1b" not in text and "weights_only" not in text, text
            assert text.endswith("the file is not a flowkit file, or holds objects flowkit does "
                                 "not read") and "\n" not in text, text


def test_files_of_format_1_still_load_with_every_check_and_a_warning(tmp_path):
    """Files written before checksums (format 1: a bare torch.save of a dict with
    'flowkit_format': 1) load, with a LegacyFormatWarning; their contents get every check."""
    flow = MODELS["maf"]()
    legacy = {"flowkit_format": 1, "kind": "model",
              "model": {"config": flow.config, "state_dict": flow.state_dict()}}
    torch.save(legacy, tmp_path / "old.pt")
    with pytest.warns(LegacyFormatWarning, match="format 1.*without a checksum"):
        loaded = load_model(tmp_path / "old.pt")
    x = torch.randn(4, 2)
    assert torch.equal(loaded.log_prob(x), flow.eval().log_prob(x))
    with pytest.warns(LegacyFormatWarning):
        ckpt = load_checkpoint(tmp_path / "old.pt", kind="model")
    assert ckpt.version == 1 and ckpt.extra == {}
    state = dict(flow.state_dict())
    key = "transform.transforms.1.made.output.mask"
    state[key] = torch.ones_like(state[key])
    torch.save({**legacy, "model": {"config": flow.config, "state_dict": state}},
               tmp_path / "tampered.pt")
    with pytest.warns(LegacyFormatWarning), pytest.raises(CheckpointError, match="output.mask"):
        load_model(tmp_path / "tampered.pt")
    save_model(loaded, tmp_path / "old.pt")  # saving again writes format 2
    assert load_checkpoint(tmp_path / "old.pt").version == 2


def test_a_bit_flipped_in_a_record_of_a_format_1_file_names_the_record(tmp_path):
    """Format 1 has no checksum, but each zip record carries a CRC-32 that torch's loader does
    not check: a flipped bit inside the weights (which loaded as other weights before) is a
    CheckpointError naming the record; a cut file is one too."""
    flow = MODELS["maf"]()
    torch.save({"flowkit_format": 1, "kind": "model",
                "model": {"config": flow.config, "state_dict": flow.state_dict()}},
               tmp_path / "old.pt")
    data = (tmp_path / "old.pt").read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        record = next(i for i in archive.infolist() if i.filename.endswith("/data/0"))
    names, extra = struct.unpack_from("<HH", data, record.header_offset + 26)
    start = record.header_offset + 30 + names + extra  # the record's bytes: a float32 weight
    flipped = bytearray(data)
    flipped[start + 2] ^= 0x40
    (tmp_path / "flipped.pt").write_bytes(bytes(flipped))
    for load in (load_checkpoint, load_model):
        with pytest.raises(CheckpointError, match=re.escape(f"'{tmp_path / 'flipped.pt'}' is "
                           f"damaged: its zip record '{record.filename}' does not match the "
                           "CRC-32")):
            load(tmp_path / "flipped.pt")
    (tmp_path / "cut.pt").write_bytes(data[: len(data) - 30])
    with pytest.raises(CheckpointError, match="starts as a zip archive .* truncated or damaged"):
        load_checkpoint(tmp_path / "cut.pt")


def test_config_must_be_json(tmp_path):
    flow = MODELS["maf"]()
    flow.config = {"type": "MAF", "kwargs": {"features": torch.tensor(2)}}
    with pytest.raises(CheckpointError, match="JSON-serialisable"):
        save_model(flow, tmp_path / "m.pt")


# ---------------------------------------------------------------------------------- atomicity


def test_failed_save_keeps_the_existing_file(tmp_path, monkeypatch):
    path = tmp_path / "flow.pt"
    flow = MODELS["maf"]()
    save_model(flow, path)
    good = path.read_bytes()

    def crash(obj, f, *args, **kwargs):
        f.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(CheckpointWriteError, match=f"could not write '{path}': disk full \\(the "
                       "previous file was kept\\)"):
        save_model(flow, path)
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flow.pt"]  # no temporary left over


def test_extra_entries_must_be_plain_and_a_refused_save_does_not_clobber(tmp_path):
    path = tmp_path / "a.pt"
    save_checkpoint(path, "test", extra={"x": torch.ones(2)})
    with pytest.raises(TypeError, match=r"extra\['f'\]\[0\] should hold tensors and plain"):
        save_checkpoint(path, "test", extra={"f": [lambda: 0]})
    with pytest.raises(TypeError, match=r"extra\['a'\] should hold .*got ndarray"):
        save_checkpoint(path, "test", extra={"a": np.zeros(2)})
    with pytest.raises(TypeError, match="'kind' should be a non-empty string"):
        save_checkpoint(path, "", extra={})
    assert torch.equal(load_checkpoint(path).extra["x"], torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt"]


class _Level(enum.IntEnum):
    LOW = 1


class _Name(str):
    pass


_Pair = collections.namedtuple("_Pair", "a b")

# values of every kind a caller may put in 'extra', the subclasses of plain types among them
_LEAF_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=5),
    st.floats(allow_nan=False), st.sampled_from([torch.float64, torch.device("cpu")]),
    st.lists(st.integers(0, 4), max_size=3).map(torch.Size),
    st.lists(st.floats(-1e3, 1e3), max_size=4).map(torch.tensor),
    st.builds(lambda n: torch.arange(n, dtype=torch.int16), st.integers(0, 3)),
    st.builds(lambda n: nn.Parameter(torch.ones(n)), st.integers(0, 3)),
    st.floats(-1e3, 1e3).map(np.float64), st.sampled_from([_Level.LOW, _Name("a"), np.int64(2),
                                                             np.float32(0.5)]),
)
_EXTRA_VALUES = st.recursive(
    _LEAF_VALUES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
        st.builds(_Pair, inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers(-3, 3)), inner, max_size=3),
        st.dictionaries(st.text(max_size=3), inner, max_size=2).map(collections.OrderedDict),
        st.dictionaries(st.text(max_size=3), inner, max_size=2).map(
            lambda d: collections.defaultdict(int, d)),
    ),
    max_leaves=8,
)


def _same(a, b) -> bool:
    """``b`` is ``a`` read back: the same types all the way down, equal values."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.dictionaries(st.text(max_size=3), _EXTRA_VALUES, max_size=3))
def test_a_file_that_save_checkpoint_accepts_always_loads(tmp_path, extra):
    """save_checkpoint refuses (a TypeError naming where in 'extra') whatever
    torch.load(weights_only=True) would not read back, subclasses of plain types included
    (np.float64, an IntEnum, a str subclass, a namedtuple, a defaultdict); what it writes,
    load_checkpoint gives back with the same types and values."""
    path = tmp_path / "a.pt"
    path.unlink(missing_ok=True)
    try:
        save_checkpoint(path, "test", extra=extra)
    except TypeError as e:
        assert str(e).startswith("extra[")
        assert not path.exists()
        return
    assert _same(load_checkpoint(path, kind="test").extra, extra)


@pytest.mark.parametrize(
    "value, named",
    [
        (np.float64(0.25), r"numpy.float64, a subclass of float .*store float\(value\)"),
        (_Level.LOW, r"_Level, a subclass of int .*store int\(value\)"),
        (_Name("x"), r"_Name, a subclass of str .*store str\(value\)"),
        (_Pair(1, 2), r"_Pair, a subclass of tuple .*store tuple\(value\)"),
    ],
    ids=["np.float64", "IntEnum", "str-subclass", "namedtuple"],
)
def test_subclasses_of_plain_types_are_refused_at_save_naming_the_key(tmp_path, value, named):
    with pytest.raises(TypeError, match=r"^extra\['c'\]\[1\] is a .*" + named):
        save_checkpoint(tmp_path / "a.pt", "test", extra={"c": [1.0, value]})
    with pytest.raises(TypeError, match=r"^extra\['d'\] should have str or int keys"):
        save_checkpoint(tmp_path / "a.pt", "test", extra={"d": {_Level.LOW: 1}})
    assert not (tmp_path / "a.pt").exists()


def test_save_checkpoint_creates_parent_folders(tmp_path):
    save_checkpoint(tmp_path / "a" / "b" / "c.pt", "test")
    ckpt = load_checkpoint(tmp_path / "a" / "b" / "c.pt")
    assert (ckpt.kind, ckpt.model, ckpt.extra) == ("test", None, {})


# ------------------------------------------------------------------------------------ registry


@register_model("TestRegistryScale")
class _Scale(nn.Module):
    """A model of an application: a registered constructor and a registered buffer check."""

    def __init__(self, features: int, init: float = 1.0, **options: int):
        super().__init__()
        self.log_scale = nn.Parameter(torch.full((features,), init).log())
        self.register_buffer("sign", torch.ones(features))


@register_check(_Scale)
def _check_sign(module: _Scale) -> None:
    if not bool((module.sign.abs() == 1).all()):
        raise InvalidBuffer("sign", "+1 or -1 everywhere")


def test_a_registered_application_model_is_saved_rebuilt_and_checked(tmp_path):
    model = _Scale(np.int64(3), init=2.0, extra=np.int32(4))
    assert model.config == {"type": "TestRegistryScale",
                            "kwargs": {"features": 3, "init": 2.0, "extra": 4}}
    save_model(model, tmp_path / "s.pt")
    loaded = load_model(tmp_path / "s.pt")
    assert type(loaded) is _Scale and torch.equal(loaded.log_scale, model.log_scale)
    model.sign[1] = 0.5
    with pytest.raises(CheckpointError, match=r"'model' holds a buffer 'sign' that should be "
                       r"\+1 or -1"):  # its check runs on a save too
        save_model(model, tmp_path / "s.pt")
    _tampered(model, tmp_path / "s.pt", "sign", lambda sign: sign)  # a file written otherwise
    with pytest.raises(CheckpointError, match=r"stored buffer 'sign' should be \+1 or -1"):
        load_model(tmp_path / "s.pt")


def test_registering_a_name_twice_or_a_constructor_with_args_is_refused():
    with pytest.raises(ValueError, match="'MAF' is already registered"):
        register_model("MAF")(lambda features: nn.Linear(features, 1))
    with pytest.raises(TypeError, match="cannot take \\*args"):
        register_model("TestRegistryArgs")(lambda *sizes: nn.Linear(*sizes))
    with pytest.raises(ValueError, match="_Scale already has a registered check"):
        register_check(_Scale)(lambda module: None)


def test_a_subclass_of_a_registered_class_is_not_saved_as_its_parent(tmp_path):
    """It would come back as the parent class: it must register itself."""

    class Sub(flowkit.BernoulliMADE):
        pass

    assert getattr(Sub(4, hidden_features=(8,)), "config", None) is None
    with pytest.raises(CheckpointError, match="has no 'config'"):
        save_model(Sub(4, hidden_features=(8,)), tmp_path / "m.pt")


# ------------------------------------------------------------------ config versions


def test_a_spline_flow_of_config_version_1_loads_with_identity_tails(tmp_path):
    """Files written before the spline's tails became linear by default (config version 1, no
    'version' key) rebuild their splines with identity tails, give the same densities, and
    resume as the model built today with those tails."""
    for build in (flowkit.MAF, flowkit.IAF):
        old = build(2, layers=2, hidden_features=(8,), transformer="spline",
                    transformer_kwargs={"bins": 4, "tails": "identity"}, standardize=False)
        old.config = {"type": old.config["type"],
                      "kwargs": {**old.config["kwargs"], "transformer_kwargs": {"bins": 4}}}
        x = torch.randn(5, 2)
        path = tmp_path / f"{build.__name__}.pt"
        save_model(old, path)
        loaded = load_model(path)
        tails = {m.transformer.tails for m in loaded.modules() if hasattr(m, "transformer")}
        assert tails == {"identity"}
        assert loaded.config["version"] == 3
        assert loaded.config["kwargs"]["transformer_kwargs"] == {"tails": "identity", "bins": 4}
        assert torch.equal(loaded.log_prob(x), old.eval().log_prob(x))


def test_a_file_saved_before_lu_linear_existed_loads_without_it(tmp_path):
    old = flowkit.MAF(2, layers=2, hidden_features=(8,), lu_linear=False)
    kwargs = dict(old.config["kwargs"])
    del kwargs["lu_linear"]
    old.config = {**old.config, "kwargs": kwargs}
    save_model(old, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt")
    assert loaded.config["kwargs"]["lu_linear"] is False
    x = torch.randn(5, 2)
    assert torch.equal(loaded.log_prob(x), old.eval().log_prob(x))


@pytest.mark.parametrize("build", [flowkit.MAF, flowkit.IAF])
def test_a_file_of_the_first_config_version_restores_into_the_model_it_rebuilds(build, tmp_path):
    """A version-1 config (no 'version', none of the arguments added since: lu_linear, bounds,
    base_context) restores into the model built from its upgraded arguments, as load_model
    builds it (review 20: base_context was missing from the added arguments, so restore
    refused every such file)."""
    from flowkit.checkpoint import load_checkpoint
    from flowkit.checkpoint.registry import upgraded_config

    old = build(2, layers=2, hidden_features=(8,), standardize=False, lu_linear=False)
    kwargs = {k: v for k, v in old.config["kwargs"].items()
              if k not in ("lu_linear", "bounds", "base_context")}
    old.config = {"type": old.config["type"], "kwargs": kwargs}
    save_model(old, tmp_path / "m.pt")
    ckpt = load_checkpoint(tmp_path / "m.pt")
    rebuilt = build(**upgraded_config(ckpt.model["config"], "m.pt")["kwargs"])
    ckpt.restore(rebuilt)
    x = torch.randn(5, 2)
    assert torch.equal(rebuilt.eval().log_prob(x), old.eval().log_prob(x))


def test_a_new_spline_flow_records_its_version_and_has_linear_tails(tmp_path):
    flow = flowkit.MAF(2, layers=1, hidden_features=(8,), transformer="spline")
    assert flow.config["version"] == 3
    assert flow.transform.transforms[1].transformer.tails == "linear"
    save_model(flow, tmp_path / "m.pt")
    assert load_model(tmp_path / "m.pt").config == flow.config


def test_a_config_version_from_a_newer_flowkit_is_refused(tmp_path):
    config = {**MODELS["maf"]().config, "version": 4}
    _model_file(tmp_path / "m.pt", config)
    with pytest.raises(CheckpointError, match="config version 4, written by a newer flowkit"):
        load_model(tmp_path / "m.pt")


@pytest.mark.parametrize("version", [0, "2", 2.0, True], ids=["zero", "str", "float", "bool"])
def test_a_malformed_config_version_is_refused(version, tmp_path):
    config = {**MODELS["maf"]().config, "version": version}
    with pytest.raises(CheckpointError, match="an integer 'version' >= 1"):
        _model_file(tmp_path / "m.pt", config)
        load_model(tmp_path / "m.pt")


def test_a_disk_full_inside_torch_save_is_a_write_error_naming_the_file(tmp_path, monkeypatch):
    # torch's zip writer turns an OSError of the file object into a RuntimeError of its own
    import flowkit.checkpoint.format as fmt

    path = tmp_path / "flow.pt"
    flow = MODELS["maf"]()
    save_model(flow, path)
    good = path.read_bytes()
    real_write = fmt._Hashing.write

    def full_after_100_bytes(self, data):
        if self.size > 100:
            self.sha.update(data)
            self.size += len(data)
            self.error = self.error or OSError(28, "No space left on device")
            raise self.error
        return real_write(self, data)

    monkeypatch.setattr(fmt._Hashing, "write", full_after_100_bytes)
    with pytest.raises(CheckpointWriteError, match=f"could not write '{path}': No space left"):
        save_model(flow, path)
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flow.pt"]


def test_a_parent_that_is_a_file_is_named(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(CheckpointWriteError, match="'.*afile' is a file, not a folder"):
        save_model(MODELS["maf"](), tmp_path / "afile" / "sub" / "m.pt")


def test_weights_of_another_shape_are_listed(tmp_path):
    """A model with a config is refused by its differing arguments; one without (an
    application's own module) by the weights that do not fit."""
    save_model(flowkit.MAF(2, hidden_features=(8,), layers=1), tmp_path / "m.pt")
    other = flowkit.MAF(2, hidden_features=(9,), layers=1)
    with pytest.raises(CheckpointError, match=r"written for a MAF with \{'hidden_features': "
                       r"\[8\]\}, not for this MAF with \{'hidden_features': \[9\]\}"):
        load_checkpoint(tmp_path / "m.pt").restore(other)
    other.config = None
    with pytest.raises(CheckpointError, match=r"6 of another shape \(first '.*': \(1, 8\) in the "
                       r"file, \(1, 9\) in the model\)"):
        load_checkpoint(tmp_path / "m.pt").restore(other)
    deeper = flowkit.MAF(2, hidden_features=(8, 8), layers=1)
    deeper.config = None
    with pytest.raises(CheckpointError, match=r"weight\(s\) missing from the file \(first"):
        load_checkpoint(tmp_path / "m.pt").restore(deeper)


@pytest.mark.parametrize(
    "other, difference",
    [
        (lambda: flowkit.IAF(2, hidden_features=(8,), layers=2, lu_linear=True),
         r"a MAF, not for this IAF"),
        (lambda: flowkit.MAF(2, hidden_features=(8,), layers=2, activation="Tanh"),
         r"a MAF with \{'activation': 'ReLU'\}, not for this MAF with \{'activation': 'Tanh'\}"),
        (lambda: flowkit.MAF(2, hidden_features=(8,), layers=2,
                             transformer_kwargs={"log_scale_bound": 5.0}),
         r"a MAF with \{'transformer_kwargs': .*, not for this MAF with \{'transformer_kwargs': "
         r"\{'log_scale_bound': 5.0\}\}"),
    ],
    ids=["iaf", "activation", "log_scale_bound"],
)
def test_restore_refuses_a_model_of_another_config_with_the_same_shapes(tmp_path, other,
                                                                         difference):
    """Checkpoint.restore compares the file's config with the model's as fit(resume=True) does
    (check_same_config): a MAF's weights fit these models' shapes, and would give other
    densities. The model is refused before any weight is loaded."""
    torch.manual_seed(0)
    save_model(flowkit.MAF(2, hidden_features=(8,), layers=2, activation="ReLU"),
               tmp_path / "m.pt")
    model = other()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"'.*m.pt' was written for " + difference +
                       ": restore it into the model it was written for"):
        load_checkpoint(tmp_path / "m.pt").restore(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_restore_ignores_the_seed_that_only_drew_what_the_file_replaces(tmp_path):
    """The seed drew the initial weights, masks and permutations, which the file's weights and
    buffers replace: a model of another seed restores to the saved densities (review 20: it was
    refused as another configuration)."""
    saved = flowkit.MAF(2, hidden_features=(8,), layers=2, permutation="random", seed=0)
    save_model(saved, tmp_path / "m.pt")
    other = flowkit.MAF(2, hidden_features=(8,), layers=2, permutation="random", seed=5)
    load_checkpoint(tmp_path / "m.pt").restore(other)
    x = torch.randn(5, 2)
    assert torch.equal(other.eval().log_prob(x), saved.eval().log_prob(x))


def test_a_compiled_model_is_saved_as_the_model_it_wraps(trained_flow, tmp_path):
    compiled = torch.compile(trained_flow, backend="eager")
    save_model(compiled, tmp_path / "m.pt")
    stored = load_checkpoint(tmp_path / "m.pt").model["state_dict"]
    assert not any(k.startswith("_orig_mod") for k in stored)
    x = torch.randn(5, trained_flow.features)
    c = torch.randn(5, trained_flow.context_features) if trained_flow.context_features else None
    expected = trained_flow.eval().log_prob(x, c)
    assert torch.equal(load_model(tmp_path / "m.pt").log_prob(x, c), expected)
    # a compiled model reads the file too (its weights are those of a fresh model before)
    fresh = torch.compile(flowkit.load_model(tmp_path / "m.pt"), backend="eager")
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    load_checkpoint(tmp_path / "m.pt").restore(fresh)
    assert torch.equal(fresh.eval().log_prob(x, c), expected)


def test_a_float64_model_is_rebuilt_in_float64(tmp_path):
    """A box narrower than float32 resolves (built under a float64 default dtype) loads under
    the float32 default: load_model builds a float64 file's model in float64 (review 20: its
    Logit refused the bounds, checked in float32)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        flow = flowkit.MAF(1, layers=1, hidden_features=(4,), bounds=([1.0], [1.0 + 1e-9]))
    finally:
        torch.set_default_dtype(previous)
    save_model(flow, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt")
    assert torch.get_default_dtype() == previous
    x = torch.tensor([[1.0 + 5e-10]], dtype=torch.float64)
    assert torch.equal(loaded.log_prob(x), flow.eval().log_prob(x))


def test_a_model_whose_buffers_a_load_would_refuse_is_not_saved(tmp_path):
    """Review 38: `o = made.order; o[0] = 3` wrote into the stored orderings; save_model then
    wrote a file that load_model refused. order is a copy now, and a save runs the checks a
    load runs."""
    model = flowkit.BernoulliMADE(4, hidden_features=(8,), seed=0)
    order = model.order
    order[0] = 3
    assert model.order.tolist() == [0, 1, 2, 3]
    with torch.no_grad():
        model.made.orders[0, 0] = 3  # written in place
    with pytest.raises(CheckpointError, match="'model' holds a buffer 'made.orders' that should "
                       "be permutations of range\\(features\\).*would not load"):
        save_model(model, tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()


def test_weights_are_not_cast_on_restore_nor_lost_on_save(tmp_path):
    """Review 57: float64 weights restored into a float16 model became inf, a float64 run
    resumed as float32 without a word, a model of mixed dtypes came back in one, and a meta
    model failed in torch's code."""
    model = flowkit.MAF(2, hidden_features=(8,), layers=1).double()
    save_checkpoint(tmp_path / "c.pt", "x", model=model)
    with pytest.raises(CheckpointError, match="holds float64 weights .* the model float16 ones"):
        load_checkpoint(tmp_path / "c.pt").restore(
            flowkit.MAF(2, hidden_features=(8,), layers=1).half())
    assert next(flowkit.load_model(tmp_path / "c.pt").parameters()).dtype == torch.float64
    mixed = flowkit.MAF(2, hidden_features=(8,), layers=1, learnable_base=True)
    mixed.base.double()
    with pytest.raises(ValueError, match=r"'model' mixes float32 .* and float64 \('base"):
        flowkit.save_model(mixed, tmp_path / "m.pt")
    with pytest.raises(ValueError, match="on the meta device"):
        flowkit.save_model(flowkit.MAF(2, hidden_features=(8,), layers=1).to("meta"),
                           tmp_path / "meta.pt")
    with pytest.raises(ValueError, match=r"extra\['a'\] is a tensor on the meta device"):
        save_checkpoint(tmp_path / "e.pt", "x", extra={"a": torch.empty(2, device="meta")})
    assert not (tmp_path / "meta.pt").exists() and not (tmp_path / "e.pt").exists()


def test_another_class_is_named_without_its_arguments(tmp_path):
    flowkit.save_model(flowkit.BernoulliMADE(4, (8,)), tmp_path / "b.pt")
    with pytest.raises(CheckpointError, match=r"written for a BernoulliMADE, not for this MAF: "):
        load_checkpoint(tmp_path / "b.pt").restore(flowkit.MAF(4, hidden_features=(8,), layers=1))


def test_a_path_starting_with_a_tilde_is_the_home_folder(tmp_path, monkeypatch):
    """It made a folder named '~' in the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    flow = flowkit.MAF(2, hidden_features=(8,), layers=1)
    flowkit.save_model(flow, "~/flow.pt")
    assert (tmp_path / "home" / "flow.pt").is_file() and not (tmp_path / "~").exists()
    flowkit.load_model("~/flow.pt")
    flowkit.fit(flow, torch.randn(64, 2), steps=1, checkpoint_dir="~/run", progress=False)
    assert (tmp_path / "home" / "run" / "checkpoint.pt").is_file()
