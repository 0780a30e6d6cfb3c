"""demos/synkhronos_style_mnist.py, a program in the original Synkhronos' style, trains.

It runs as a user runs it, in its own interpreter, on the offline digits fallback
(never the network), compiled in FAST_COMPILE through PyTensor's own flags so that
it takes seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "demos" / "synkhronos_style_mnist.py"


def test_synkhronos_style_mnist_trains(tmp_path: Path) -> None:
    env = {**os.environ, "PYTENSOR_FLAGS": "mode=FAST_COMPILE"}
    result = subprocess.run(
        [
            sys.executable,
            str(DEMO),
            "--ranks",
            "2",
            "--epochs",
            "3",
            "--no-download",
            "--data-dir",
            str(tmp_path / "no_mnist"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-5000:]}"
    out = result.stdout
    assert "falling back" in out
    assert "Starting training on 2 ranks" in out
    val = [float(a) for a in re.findall(r"validation accuracy:\s+([\d.]+) %", out)]
    assert len(val) == 3 and val[-1] > val[0] - 1.0
    test_acc = float(re.search(r"test accuracy:\s+([\d.]+) %", out).group(1))
    assert test_acc > 85.0, out  # a 10-class digits MLP; chance is 10 %
