"""One program everywhere (issue #34): ranks trained from cold compile caches hold
bit-identical parameters and optimizer state, for every update rule, on each CPU backend.

With PyTensor's default Numba fast-math flags they did not: the rank that compiled ran its
fresh code, the one that loaded the cache ran the cached object code, 1 ulp apart
(rank/compiled.py's docstring). Each run is a fresh process with an empty compile folder
(tests/cold_cache_training.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import cold_cache_training

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", "jax-cpu"])
def test_cold_caches_leave_ranks_bit_identical(backend, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, cold_cache_training.__file__, backend, str(tmp_path / "compiledir")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,  # a hang guard: compiling took 2 to 7 minutes on a loaded 2-core VM
        check=False,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    differences = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(differences) == set(cold_cache_training.RULES)
    assert differences == dict.fromkeys(cold_cache_training.RULES, 0.0), differences
