"""demos/lasagne_mnist.py, a Lasagne-style script, trains to completion on one process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "demos" / "lasagne_mnist.py"


@pytest.mark.slow  # compiling the CNN's graphs with Numba takes about 100 s on a cold cache
def test_lasagne_mnist_trains(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(DEMO), "--epochs", "6", "--samples", "300", "--no-download",
         "--data-dir", str(tmp_path / "no_mnist")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    losses = [float(v) for v in re.findall(r"training loss:\s+([\d.]+)", result.stdout)]
    accuracy = float(re.findall(r"validation accuracy:\s+([\d.]+)", result.stdout)[-1])
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert accuracy > 40  # ten classes: chance is 10 %; 63 % measured


def test_demo_imports_only_the_port() -> None:
    """The script's only synkhronos line is the one replacing ``import lasagne``."""
    lines = DEMO.read_text().splitlines()
    assert [
        line for line in lines if line.startswith(("import ", "from ")) and "synkhronos" in line
    ] == ["from synkhronos.extensions import lasagne"]
