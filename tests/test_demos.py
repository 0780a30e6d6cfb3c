"""Every demo runs to completion as a script, with sizes small enough for CI.

Each demo runs in its own interpreter, as a user would run it, so that its
``synk.fork()`` / ``synk.close()`` cannot interfere with other tests. The MNIST
runs use an empty data directory with downloads disabled: the offline
fallback data, and never the network. The ResNet-50 demo, the longest, has a file of
its own (test_resnet50_demo.py), so that the test processes take the two in parallel.
"""

from __future__ import annotations

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
