"""Tests of flowkit.data.mnist. Nothing here touches the network: URLs are file:// URLs."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from flowkit.data import mnist
from flowkit.data.mnist import (
    PIXELS,
    binarized_mnist,
    data_root,
    download_file,
    load_split_file,
)

SHARED_NPZ = Path(__file__).parents[2] / "shared/data/binarized_mnist.npz"


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No test may reach the real server or the user's cache."""
    monkeypatch.setattr(mnist, "URL", (tmp_path / "nowhere" / "{split}.amat").as_uri())
    monkeypatch.setenv("FLOWKIT_DATA", str(tmp_path / "env-root"))


def _amat_bytes(array: np.ndarray) -> bytes:
    """The layout of Larochelle's files: digits separated by single spaces, one row a line."""
    return b"".join(b" ".join(b"%d" % v for v in row) + b"\n" for row in array)


def _images(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, size=(rows, PIXELS), dtype=np.uint8)


def _serve(monkeypatch, tmp_path: Path, split: str, array: np.ndarray, sha256: str | None = None):
    """Publish ``array`` as the ``split`` file at a file:// URL, with its size and digest."""
    source = tmp_path / "server"
    source.mkdir(exist_ok=True)
    content = _amat_bytes(array)
    (source / f"binarized_mnist_{split}.amat").write_bytes(content)
    monkeypatch.setattr(mnist, "URL", source.as_uri() + "/binarized_mnist_{split}.amat")
    digest = sha256 or hashlib.sha256(content).hexdigest()
    monkeypatch.setitem(mnist._FILES, split, mnist._Remote(len(array), len(content), digest))


def _publish(monkeypatch, split: str, array: np.ndarray) -> None:
    """Make ``array`` the published ``split``: its row count, size and SHA-256."""
    content = _amat_bytes(array)
    digest = hashlib.sha256(content).hexdigest()
    monkeypatch.setitem(mnist._FILES, split, mnist._Remote(len(array), len(content), digest))


# ----------------------------------------------------------------------------- split files


def test_load_amat(tmp_path):
    images = _images(5)
    path = tmp_path / "five.amat"
    path.write_bytes(_amat_bytes(images))
    x = load_split_file(path)
    assert x.dtype == torch.uint8 and x.shape == (5, PIXELS)
    assert np.array_equal(x.numpy(), images)


def test_load_amat_other_whitespace(tmp_path):
    images = _images(2)
    path = tmp_path / "tabs.amat"
    path.write_text("\n".join("\t".join(map(str, row)) + "  " for row in images))  # no final \n
    assert np.array_equal(load_split_file(path).numpy(), images)


_ROWS = _amat_bytes(_images(3)).decode().splitlines()
_CORRUPT = {  # file lines, expected message
    "width": ([_ROWS[0], _ROWS[1][:-2]], "line 2: expected 784 values, got 783"),
    "two": (_ROWS[:2] + ["2" + _ROWS[2][1:]], "line 3: values should be 0 or 1, got '2'"),
    "fraction": (["0.5" + _ROWS[0][1:]], "line 1: values should be 0 or 1, got '0.5'"),
    "letter": ([_ROWS[0], "x" + _ROWS[1][1:]], "line 2: values should be 0 or 1, got 'x'"),
    "blank-line": ([_ROWS[0], "", _ROWS[1]], "line 2: expected 784 values, got 0"),
    "empty": ([], "holds no rows"),
}


@pytest.mark.parametrize("case", _CORRUPT)
def test_load_amat_corrupt(tmp_path, case):
    lines, match = _CORRUPT[case]
    path = tmp_path / "bad.amat"
    path.write_text("".join(line + "\n" for line in lines))
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + re.escape(match)):
        load_split_file(path)


def test_load_npz(tmp_path):
    images = _images(4)
    path = tmp_path / "splits.npz"
    np.savez(path, train=images, valid=images[:2].astype(np.float32))
    assert np.array_equal(load_split_file(path, "train").numpy(), images)
    valid = load_split_file(path, "valid")
    assert valid.dtype == torch.uint8 and np.array_equal(valid.numpy(), images[:2])
    with pytest.raises(ValueError, match="has no array 'test'; it holds train, valid"):
        load_split_file(path, "test")
    with pytest.raises(ValueError, match="holds arrays train, valid; pass 'key'"):
        load_split_file(path)
    single = tmp_path / "single.npz"
    np.savez(single, anything=images)
    assert np.array_equal(load_split_file(single).numpy(), images)


@pytest.mark.parametrize(
    "array, match",
    [
        (np.zeros((3, 783), np.uint8), r"should have shape \(n, 784\), got \(3, 783\)"),
        (np.zeros(784, np.uint8), r"should have shape \(n, 784\), got \(784,\)"),
        (np.full((2, 784), 0.5), "should hold only 0 and 1"),
        (np.full((2, 784), 255, np.uint8), "should hold only 0 and 1"),
    ],
)
def test_load_npz_invalid(tmp_path, array, match):
    path = tmp_path / "bad.npz"
    np.savez(path, train=array)
    with pytest.raises(ValueError, match=re.escape(f"{path}['train']") + " " + match):
        load_split_file(path, "train")


def test_load_wrong_kind(tmp_path):
    with pytest.raises(ValueError, match="should be an .npz or .amat file"):
        load_split_file(tmp_path / "images.csv")
    path = tmp_path / "one.amat"
    path.write_bytes(_amat_bytes(_images(1)))
    with pytest.raises(ValueError, match="'key' applies to .npz files only"):
        load_split_file(path, "train")


# ----------------------------------------------------------------------------- download


def test_download_file(tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(b"0 1\n" * 1000)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    dest = download_file(source.as_uri(), tmp_path / "cache" / "copy.bin", digest)
    assert dest.read_bytes() == source.read_bytes()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["copy.bin"]  # no temporary left


def test_download_checksum_mismatch(tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(b"tampered")
    cache = tmp_path / "cache"
    with pytest.raises(OSError, match="checksum mismatch .* the download was discarded"):
        download_file(source.as_uri(), cache / "copy.bin", "0" * 64)
    assert list(cache.iterdir()) == []


def test_download_failure_leaves_nothing(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(OSError):
        download_file((tmp_path / "missing.bin").as_uri(), cache / "copy.bin", "0" * 64)
    assert list(cache.iterdir()) == []


# ----------------------------------------------------------------------------- binarized_mnist


def test_data_root(monkeypatch, tmp_path):
    assert data_root(tmp_path / "explicit") == tmp_path / "explicit"
    assert data_root() == tmp_path / "env-root"
    monkeypatch.delenv("FLOWKIT_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_root() == tmp_path / "home" / ".cache" / "flowkit"


def test_downloads_then_reads_cache(monkeypatch, tmp_path):
    images = _images(3)
    _serve(monkeypatch, tmp_path, "test", images)
    root = tmp_path / "root"
    x = binarized_mnist("test", root=root)
    assert x.dtype == torch.uint8 and np.array_equal(x.numpy(), images)
    assert (root / "binarized_mnist_test.amat").is_file()
    monkeypatch.setattr(mnist, "URL", "file:///nonexistent/{split}")  # must not be used now
    assert torch.equal(binarized_mnist("test", root=root, download=False), x)


def test_download_bad_checksum_keeps_cache_empty(monkeypatch, tmp_path):
    _serve(monkeypatch, tmp_path, "train", _images(3), sha256="f" * 64)
    root = tmp_path / "root"
    with pytest.raises(OSError, match="checksum mismatch"):
        binarized_mnist("train", root=root)
    assert list(root.iterdir()) == []


def test_env_root(monkeypatch, tmp_path):
    _serve(monkeypatch, tmp_path, "valid", _images(2))
    binarized_mnist("valid")
    assert (tmp_path / "env-root" / "binarized_mnist_valid.amat").is_file()


def test_npz_preferred_then_amat(monkeypatch, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    from_npz, from_amat = _images(2, seed=1), _images(2, seed=2)
    np.savez(root / "binarized_mnist.npz", valid=from_npz)
    (root / "binarized_mnist_valid.amat").write_bytes(_amat_bytes(from_amat))
    (root / "binarized_mnist_test.amat").write_bytes(_amat_bytes(from_amat))
    _publish(monkeypatch, "valid", from_npz)
    _publish(monkeypatch, "test", from_amat)
    assert np.array_equal(binarized_mnist("valid", root=root, download=False).numpy(), from_npz)
    # The npz has no test split: fall back to the .amat file.
    assert np.array_equal(binarized_mnist("test", root=root, download=False).numpy(), from_amat)


def test_a_cached_amat_that_changed_is_refused_when_read(monkeypatch, tmp_path):
    """The published SHA-256 is checked each time the split is read, not only after a download:
    one flipped pixel of the cached file, or other images of the right shape, are refused with
    the file's name and the fix; deleting it and calling again downloads a verified copy."""
    images = _images(3)
    _serve(monkeypatch, tmp_path, "valid", images)
    root = tmp_path / "root"
    cached = root / "binarized_mnist_valid.amat"
    assert np.array_equal(binarized_mnist("valid", root=root).numpy(), images)
    content = bytearray(cached.read_bytes())
    content[0] = ord("1") if content[0] == ord("0") else ord("0")
    for changed in (bytes(content), _amat_bytes(_images(3, seed=9))):
        cached.write_bytes(changed)
        with pytest.raises(ValueError, match=re.escape(f"{cached}: split 'valid' is not the "
                           "published binarized MNIST") + r" .*the file was damaged or replaced "
                           r".*; " + re.escape(f"delete {cached} and call binarized_mnist("
                                               f"'valid', root={str(root)!r}) again")):
            binarized_mnist("valid", root=root, download=False)
    cached.unlink()
    assert np.array_equal(binarized_mnist("valid", root=root).numpy(), images)


def test_an_npz_split_that_is_not_the_published_one_is_refused(monkeypatch, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    images = _images(2)
    _publish(monkeypatch, "valid", images)
    other = images.copy()
    other[1, 5] ^= 1
    np.savez(root / "binarized_mnist.npz", valid=other)
    npz = root / "binarized_mnist.npz"
    with pytest.raises(ValueError, match=re.escape(f"{npz}: split 'valid' is not the published")
                       + r".*" + re.escape(f"delete {npz} (and its other splits, read from .amat "
                                           "files after that) and call binarized_mnist('valid', "
                                           f"root={str(root)!r}) again")):
        binarized_mnist("valid", root=root, download=False)
    np.savez(root / "binarized_mnist.npz", valid=images)
    assert np.array_equal(binarized_mnist("valid", root=root, download=False).numpy(), images)


def test_missing_split_without_download(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    np.savez(root / "binarized_mnist.npz", train=_images(1), valid=_images(1))
    with pytest.raises(FileNotFoundError, match="holds only train, valid; .* does not exist"):
        binarized_mnist("test", root=root, download=False)


def test_wrong_number_of_rows(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    np.savez(root / "binarized_mnist.npz", train=_images(3))
    with pytest.raises(ValueError, match=r"split 'train' should have shape \(50000, 784\)"):
        binarized_mnist("train", root=root)


def test_unknown_split():
    with pytest.raises(ValueError, match="'split' should be one of train, valid, test; got 'val'"):
        binarized_mnist("val")


# ----------------------------------------------------------------------------- the real data

needs_shared = pytest.mark.skipif(not SHARED_NPZ.is_file(), reason=f"no {SHARED_NPZ}")


@needs_shared
def test_shared_npz():
    root = SHARED_NPZ.parent
    for split, rows in (("train", 50_000), ("valid", 10_000)):
        x = binarized_mnist(split, root=root, download=False)
        assert x.shape == (rows, PIXELS) and x.dtype == torch.uint8
        assert 0.12 < x.float().mean() < 0.14  # about 13% of the pixels are on


@needs_shared
def test_shared_valid_matches_published_checksum(tmp_path):
    # Written out in Larochelle's layout, the npz's valid split is byte-for-byte the published
    # file; reading that file back gives the array again.
    valid = load_split_file(SHARED_NPZ, "valid").numpy()
    content = b"\n".join(b" ".join(row) for row in np.where(valid == 1, b"1", b"0")) + b"\n"
    expected = mnist._FILES["valid"]
    assert len(content) == expected.nbytes
    assert hashlib.sha256(content).hexdigest() == expected.sha256
    path = tmp_path / "binarized_mnist_valid.amat"
    path.write_bytes(content)
    assert np.array_equal(load_split_file(path).numpy(), valid)


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", "is not a readable .npz archive"),
        (b"garbage\n", "is not a readable .npz archive"),
        (None, "is not an .npz archive but a single .npy array"),
    ],
    ids=["empty", "text", "npy"],
)
def test_unreadable_npz_names_the_file(tmp_path, content, match):
    root = tmp_path / "root"
    root.mkdir()
    path = root / "binarized_mnist.npz"
    if content is None:
        with open(path, "wb") as f:
            np.save(f, _images(1))
    else:
        path.write_bytes(content)
    for read in (lambda: load_split_file(path, "valid"),
                 lambda: binarized_mnist("valid", root=root, download=False)):
        with pytest.raises(ValueError, match=re.escape(str(path)) + " " + match):
            read()


def test_a_truncated_or_corrupted_npz_names_the_file(tmp_path):
    """zipfile's errors (a bare BadZipFile without the file's name) become ValueErrors naming
    the archive, and the array when only one member is damaged."""
    images = _images(50)
    whole = tmp_path / "whole.npz"
    np.savez(whole, train=images, valid=images[:10])
    data = whole.read_bytes()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=re.escape(str(truncated)) + " is not a readable .npz "
                       r"archive \(truncated or corrupted\?\)"):
        load_split_file(truncated, "valid")
    member = data.index(b"train.npy") + 200  # inside the stored array of 'train'
    corrupted = tmp_path / "corrupted.npz"
    corrupted.write_bytes(data[:member] + bytes(64) + data[member + 64:])
    with pytest.raises(ValueError, match=re.escape(f"{corrupted}['train'] cannot be read")):
        load_split_file(corrupted, "train")


def test_load_split_file_reads_or_names_an_npz_with_a_bit_flipped_anywhere(tmp_path):
    """One bit flipped in each byte of a small .npz (bit i mod 8 of byte i): each file is read
    or refused with a ValueError naming it (a damaged "compression method" field gave zipfile's
    NotImplementedError before)."""
    whole = tmp_path / "whole.npz"
    np.savez(whole, train=_images(2))
    data = whole.read_bytes()
    path = tmp_path / "flipped.npz"
    for offset in range(len(data)):
        path.write_bytes(data[:offset] + bytes([data[offset] ^ (1 << offset % 8)])
                         + data[offset + 1:])
        try:
            load_split_file(path, "train")
        except ValueError as e:
            assert str(path) in str(e), (offset, e)
