"""``bench/gpu_check.py --quick`` runs: the script that prints the GPU figures on a lent GPU
is exercised here on every run (on CPU devices without a GPU, as the other GPU tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("jax")


@pytest.mark.gpu
def test_gpu_check_quick_prints_every_figure():
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--quick"],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for row in (
        "call: synk / plain PyTensor JAX (us)",
        "all_reduce bus bandwidth (GB/s)",
        ", fused, ",
        ", step by step, ",
    ):
        assert row in done.stdout, out
