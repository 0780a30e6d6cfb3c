"""``bench/gpu_check.py --quick`` runs: the script that checks, on the first machine with a
GPU, what only a GPU can decide is exercised here on every run (on CPU devices without a
GPU, as the other GPU tests), and its verdict is checked row by row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("jax")


@pytest.mark.gpu
def test_gpu_check_quick_gives_a_verdict_per_check(tmp_path):
    out = tmp_path / "verdict.txt"
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--quick", "--budget", "900", "--out", str(out)],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    text = done.stdout + done.stderr
    assert done.returncode == 0, text  # 0: no row failed; a crash writes no verdict
    verdict = out.read_text().splitlines()
    assert verdict[0].startswith("synkhronos GPU check, CPU devices")
    rows = {line.split()[0]: line.split()[1] for line in verdict[1:]}
    on_cpu = {
        "nvidia_smi": "SKIP",
        "nccl_dead_peer": "SKIP",
        "stale_communicators": "SKIP",
        "resnet": "SKIP",
    }
    assert rows == {
        name: on_cpu.get(name, "PASS")
        for name in (
            "refork",
            "jax_first",
            "nvidia_smi",
            "memory",
            "training_function",
            "determinism",
            "close_after_kill",
            "nccl_dead_peer",
            "stale_communicators",
            "figures",
            "resnet",
        )
    }, text
    assert "needs >=2 GPUs" in text and "digests equal" in text
    assert "1.00 x shared" in text  # no second copy of the shared variables
