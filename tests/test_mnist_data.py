"""Tests for demos/mnist_data.py: IDX round trips, MNIST assembly, offline fallback.

None of these touch the network: downloads are either disabled or the mirror
list is replaced by an unreachable local URL.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import pytest

_SPEC = importlib.util.spec_from_file_location(
    "mnist_data", Path(__file__).resolve().parents[1] / "demos" / "mnist_data.py"
)
mnist_data = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(mnist_data)


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
def test_idx_round_trip(tmp_path: Path, suffix: str, dtype: type) -> None:
    array = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4)
    path = tmp_path / f"a.idx{suffix}"
    mnist_data.write_idx(path, array)
    back = mnist_data.read_idx(path)
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, array)


def test_idx_is_big_endian_standard_layout(tmp_path: Path) -> None:
    path = tmp_path / "labels"
    mnist_data.write_idx(path, np.array([1, 2, 3], dtype=np.int32))
    raw = path.read_bytes()
    # magic 0x00000C01 (int32, 1 dim), dim 3, then big-endian values
    assert raw == bytes([0, 0, 0x0C, 1, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3])


def test_idx_gz_is_really_gzipped(tmp_path: Path) -> None:
    path = tmp_path / "a.gz"
    mnist_data.write_idx(path, np.zeros(5, np.uint8))
    assert gzip.decompress(path.read_bytes())[:4] == bytes([0, 0, 8, 1])


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x01\x00\x08\x01",
        b"\x00\x00\x07\x01\x00\x00\x00\x01x",
        b"\x00\x00\x08\x01\x00\x00\x00\x05abc",
    ],
)
def test_read_idx_rejects_bad_files(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "bad"
    path.write_bytes(raw)
    with pytest.raises(ValueError):
        mnist_data.read_idx(path)


def test_write_idx_rejects_unsupported_dtype(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        mnist_data.write_idx(tmp_path / "x", np.zeros(2, np.int64))


def _write_fake_mnist(data_dir: Path, n_train: int, n_test: int, gz: bool) -> tuple:
    rng = np.random.default_rng(0)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for key, name in mnist_data.FILES.items():
        mnist_data.write_idx(data_dir / (name + (".gz" if gz else "")), arrays[key])
    return arrays


@pytest.mark.parametrize("gz", [False, True])
def test_load_mnist_reads_idx_files(tmp_path: Path, gz: bool) -> None:
    arrays = _write_fake_mnist(tmp_path, n_train=60, n_test=7, gz=gz)
    x_train, y_train, x_val, y_val, x_test, y_test = mnist_data.load_mnist(tmp_path, download=False)
    # with fewer than 60k images the validation set is the last sixth
    assert x_train.shape == (50, 1, 28, 28) and x_val.shape == (10, 1, 28, 28)
    assert x_test.shape == (7, 1, 28, 28)
    for x in (x_train, x_val, x_test):
        assert x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0
    for y in (y_train, y_val, y_test):
        assert y.dtype == np.int32
    np.testing.assert_allclose(x_train[3, 0] * 255, arrays["train_images"][3], atol=1e-3)
    np.testing.assert_array_equal(np.concatenate([y_train, y_val]), arrays["train_labels"])
    np.testing.assert_array_equal(y_test, arrays["test_labels"])


def test_load_mnist_uses_10k_validation_on_full_size(tmp_path: Path, monkeypatch) -> None:
    # Shrink the validation constant instead of writing 60k images.
    monkeypatch.setattr(mnist_data, "N_VAL", 4)
    _write_fake_mnist(tmp_path, n_train=60, n_test=3, gz=True)
    x_train, _, x_val, _, _, _ = mnist_data.load_mnist(tmp_path, download=False)
    assert len(x_train) == 56 and len(x_val) == 4


def test_load_mnist_rejects_inconsistent_files(tmp_path: Path) -> None:
    _write_fake_mnist(tmp_path, n_train=12, n_test=3, gz=False)
    mnist_data.write_idx(tmp_path / mnist_data.FILES["test_labels"], np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match="test"):
        mnist_data.load_mnist(tmp_path, download=False)


def _check_fallback(splits: tuple, capsys) -> None:
    x_train, y_train, x_val, y_val, x_test, y_test = splits
    assert "falling back" in capsys.readouterr().out
    assert x_train.shape[1:] == (1, 28, 28) and x_train.dtype == np.float32
    assert len(x_train) + len(x_val) + len(x_test) == 1797  # all sklearn digits
    assert len(x_val) > 200 and len(x_test) > 200
    assert x_train.min() == 0.0 and x_train.max() == 1.0
    assert set(np.unique(y_train)) == set(range(10)) and y_train.dtype == np.int32
    # the 2-pixel frame is empty, as in MNIST
    assert not x_train[:, :, :2].any() and not x_train[:, :, :, -2:].any()


def test_fallback_without_files_and_downloads_disabled(tmp_path: Path, capsys) -> None:
    _check_fallback(mnist_data.load_mnist(tmp_path, download=False), capsys)


def test_fallback_when_download_fails(tmp_path: Path, capsys, monkeypatch) -> None:
    # Port 9 on localhost refuses at once: a failed download without real network access.
    monkeypatch.setattr(mnist_data, "MIRRORS", ("http://127.0.0.1:9/",))
    _check_fallback(mnist_data.load_mnist(tmp_path / "new", download=True, timeout=1), capsys)
    assert not any((tmp_path / "new").iterdir())  # no partial files left behind


def test_partial_files_fall_back(tmp_path: Path, capsys) -> None:
    _write_fake_mnist(tmp_path, n_train=12, n_test=3, gz=False)
    (tmp_path / mnist_data.FILES["test_images"]).unlink()
    _check_fallback(mnist_data.load_mnist(tmp_path, download=False), capsys)
