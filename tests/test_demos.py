"""Every demo runs to completion as a script, with sizes small enough for CI.

Each demo runs in its own interpreter, as a user would run it, so that its
``synk.fork()`` / ``synk.close()`` cannot interfere with other tests. The MNIST
runs use an empty data directory with downloads disabled: the offline
fallback data, and never the network.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMOS = Path(__file__).resolve().parents[1] / "demos"
TIMEOUT_S = 600


def run_demo(name: str, *args: str, cwd: Path) -> str:
    """Run ``demos/<name>`` with ``args``; return its stdout, failing on a non-zero exit."""
    result = subprocess.run(
        [sys.executable, str(DEMOS / name), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=cwd,
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr[-5000:]}"
    return result.stdout


@pytest.mark.parametrize(
    "name", ["basics_reduce.py", "basics_data.py", "basics_collectives.py", "basics_batch_s.py"]
)
def test_basics(name: str, tmp_path: Path) -> None:
    out = run_demo(name, "--ranks", "2", cwd=tmp_path)
    assert out.strip().splitlines()[-1] == "passed"


@pytest.mark.parametrize(
    ("model", "data_mode", "backend"),
    # jax-cpu with data in shared variables: the paper's GPU path, on CPU ranks.
    [("mlp", "data", "cpu"), ("cnn", "shared", "cpu"), ("mlp", "shared", "jax-cpu")],
)
def test_mnist(model: str, data_mode: str, backend: str, tmp_path: Path) -> None:
    out = run_demo(
        "mnist.py",
        *("--model", model, "--data-mode", data_mode, "--ranks", "2", "--epochs", "1"),
        *("--backend", backend),
        *("--train-size", "256", "--batch-size", "32", "--no-download"),
        *("--data-dir", str(tmp_path / "no_mnist"), "--out", str(tmp_path / "out")),
        cwd=tmp_path,
    )
    assert "falling back" in out
    assert "test accuracy" in out and "samples/s" in out
    assert (tmp_path / "out" / f"mnist_{model}_{data_mode}.png").stat().st_size > 0


@pytest.mark.slow
def test_resnet50(tmp_path: Path) -> None:
    out = run_demo(
        "resnet50.py",
        *("--ranks", "2", "--batch-size", "2", "--steps", "1", "--backend", "cpu"),
        cwd=tmp_path,
    )
    assert "images/s in total" in out
    # Every BatchNormLayer's running mean and inv_std: identical on both ranks, and moved.
    count, spread, moved = re.search(
        r"batch-norm running state: (\d+) variables, largest difference between ranks (\S+), "
        r"largest change since initialisation (\S+)", out
    ).groups()
    assert int(count) == 2 * 53  # ResNet-50's 53 BatchNormLayers: mean and inv_std each
    assert float(spread) == 0.0 and float(moved) > 0.0
