"""MNIST loading for the demos, with an offline fallback.

:func:`load_mnist` reads the four standard IDX files (plain or gzipped) from a
directory, downloads them there if they are missing, and, when neither works
(no files, no network), falls back to scikit-learn's bundled 8x8 digits
upsampled to 28x28, so the demos always have something meaningful to train on.
"""

from __future__ import annotations

import gzip
import os
import struct
import urllib.request
from pathlib import Path

import numpy as np

__all__ = ["MIRRORS", "FILES", "read_idx", "write_idx", "load_mnist"]

MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# IDX type codes (third byte of the magic number) and their big-endian dtypes.
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_CODES = {dt.newbyteorder("="): code for code, dt in _IDX_DTYPES.items()}

N_VAL = 10_000  # the last 10k of the 60k training images form the validation set


def _open(path: Path, mode: str):
    """Open ``path`` through gzip when its name ends in ``.gz``."""
    return gzip.open(path, mode) if path.suffix == ".gz" else open(path, mode)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the MNIST container format), plain or gzipped.

    Parameters
    ----------
    path : str or os.PathLike
        File to read; a name ending in ``.gz`` is decompressed.

    Returns
    -------
    numpy.ndarray
        The array, in native byte order.

    Raises
    ------
    ValueError
        If the header is not a valid IDX header or the payload size does not
        match it.
    """
    path = Path(path)
    with _open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file")
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    payload = raw[4 + 4 * ndim :]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(payload) != expected:
        raise ValueError(f"{path}: expected {expected} data bytes, found {len(payload)}")
    return np.frombuffer(payload, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file, gzipped when ``path`` ends in ``.gz``.

    Parameters
    ----------
    path : str or os.PathLike
        Destination file.
    array : numpy.ndarray
        Array of dtype uint8, int8, int16, int32, float32 or float64, with at
        most 255 dimensions.
    """
    array = np.asarray(array)
    native = array.dtype.newbyteorder("=")
    if native not in _IDX_CODES:
        raise ValueError(f"dtype {array.dtype} cannot be stored in an IDX file")
    code = _IDX_CODES[native]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with _open(Path(path), "wb") as f:
        f.write(header + np.ascontiguousarray(array, dtype=_IDX_DTYPES[code]).tobytes())


def _find(data_dir: Path, name: str) -> Path | None:
    """Return the plain or gzipped copy of ``name`` in ``data_dir``, if any."""
    for candidate in (data_dir / name, data_dir / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _download(data_dir: Path, name: str, timeout: float) -> Path | None:
    """Fetch ``name.gz`` from the first mirror that answers; ``None`` if none does."""
    data_dir.mkdir(parents=True, exist_ok=True)
    target = data_dir / f"{name}.gz"
    partial = target.with_suffix(".gz.part")
    for mirror in MIRRORS:
        try:
            with urllib.request.urlopen(mirror + target.name, timeout=timeout) as response:
                partial.write_bytes(response.read())
        except OSError:  # URLError, timeouts and HTTP errors are all OSErrors
            continue
        # Rename only once complete, so an interrupted download is never read as data.
        partial.replace(target)
        return target
    partial.unlink(missing_ok=True)
    return None


def _to_float_images(images: np.ndarray) -> np.ndarray:
    """uint8 N x 28 x 28 -> float32 N x 1 x 28 x 28 in [0, 1]."""
    return (images.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)


def _load_idx_set(paths: dict[str, Path]) -> tuple[np.ndarray, ...]:
    arrays = {key: read_idx(path) for key, path in paths.items()}
    for kind in ("train", "test"):
        images, labels = arrays[f"{kind}_images"], arrays[f"{kind}_labels"]
        if images.shape[1:] != (28, 28) or len(images) != len(labels):
            raise ValueError(
                f"MNIST {kind} files are inconsistent: images {images.shape}, labels {labels.shape}"
            )
    x_train = _to_float_images(arrays["train_images"])
    y_train = arrays["train_labels"].astype(np.int32)
    n_train = len(x_train) - min(N_VAL, len(x_train) // 6)
    return (
        x_train[:n_train],
        y_train[:n_train],
        x_train[n_train:],
        y_train[n_train:],
        _to_float_images(arrays["test_images"]),
        arrays["test_labels"].astype(np.int32),
    )


def _load_digits_fallback(seed: int = 0) -> tuple[np.ndarray, ...]:
    """scikit-learn's 1797 8x8 digits, shaped like MNIST and split about 4:1:1.

    Each pixel becomes a 3x3 block (24x24) and a 2-pixel border is added,
    which mirrors how MNIST digits sit inside their 28x28 frame.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # pixel values are 0..16
    images = np.kron(images, np.ones((1, 3, 3), dtype=np.float32))
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))[:, None]
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    images, labels = images[order], labels[order]
    n_hold = len(images) // 6  # ~300 each for validation and test
    n_train = len(images) - 2 * n_hold
    return (
        images[:n_train],
        labels[:n_train],
        images[n_train : n_train + n_hold],
        labels[n_train : n_train + n_hold],
        images[n_train + n_hold :],
        labels[n_train + n_hold :],
    )


def load_mnist(
    data_dir: str | os.PathLike = "data/mnist",
    download: bool = True,
    timeout: float = 10.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Load MNIST, downloading it if needed, else fall back to sklearn's digits.

    Parameters
    ----------
    data_dir : str or os.PathLike
        Directory holding (or to receive) the four IDX files, each either
        plain or ``.gz``.
    download : bool
        Try the mirrors in :data:`MIRRORS` for missing files. With ``False``
        the network is never touched.
    timeout : float
        Seconds to wait on each download attempt.

    Returns
    -------
    x_train, y_train, x_val, y_val, x_test, y_test : numpy.ndarray
        Images as float32 arrays of shape (N, 1, 28, 28) scaled to [0, 1],
        labels as int32 arrays of shape (N,). Real MNIST gives 50k/10k/10k;
        the fallback gives about 1200/300/300 upsampled 8x8 digits.
    """
    data_dir = Path(data_dir)
    paths: dict[str, Path] = {}
    for key, name in FILES.items():
        path = _find(data_dir, name)
        if path is None and download:
            path = _download(data_dir, name, timeout)
        if path is None:
            print(
                f"MNIST not found in {data_dir} (and "
                f"{'could not be downloaded' if download else 'downloads disabled'}); "
                "falling back to scikit-learn's 8x8 digits upsampled to 28x28."
            )
            return _load_digits_fallback()
        paths[key] = path
    return _load_idx_set(paths)
