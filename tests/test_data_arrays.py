"""flowkit.data.read_arrays: numbers only, in this machine's byte order, damage named."""

from __future__ import annotations

import numpy as np
import pytest

from flowkit.data import read_arrays


def test_arrays_come_back_native_and_equal(tmp_path):
    x = np.random.default_rng(0).normal(size=(5, 2))
    np.save(tmp_path / "x.npy", x.astype(">f8"))
    np.savez(tmp_path / "xc.npz", x=x.astype(">f8"), c=np.arange(5))
    (got,) = read_arrays(tmp_path / "x.npy").values()
    assert got.dtype.isnative and np.array_equal(got, x)
    both = read_arrays(tmp_path / "xc.npz")
    assert sorted(both) == ["c", "x"] and np.array_equal(both["x"], x)


def test_damaged_files_and_objects_are_named(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((100, 3)))
    data = (tmp_path / "a.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.npz' cannot be read as a numpy \.npz file"):
        read_arrays(tmp_path / "cut.npz")
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match=r"o\.npy' holds Python objects"):
        read_arrays(tmp_path / "o.npy")


def test_what_is_not_an_array_file_is_named_as_what_it_is(tmp_path):
    """A missing file or a folder was "damaged or truncated", and a CSV "held Python objects"
    (every other name was opened as an .npz)."""
    with pytest.raises(ValueError, match=r"existing file, got '.*nope\.npy' \(no such file\)"):
        read_arrays(tmp_path / "nope.npy")
    (tmp_path / "d.npz").mkdir()
    with pytest.raises(ValueError, match=r"\(a folder\)"):
        read_arrays(tmp_path / "d.npz")
    (tmp_path / "x.csv").write_text("1,2\n3,4\n")
    with pytest.raises(ValueError, match=r"should name a \.npy or \.npz file, got '.*x\.csv'"):
        read_arrays(tmp_path / "x.csv")
    with pytest.raises(TypeError, match="'path' should be a file path"):
        read_arrays(None)
