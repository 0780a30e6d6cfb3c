"""One program everywhere (issue #34): ranks trained from cold compile caches hold
bit-identical parameters and optimizer state, for every update rule, on each CPU backend.

With PyTensor's default Numba fast-math flags they did not: the rank that compiled ran its
fresh code, the one that loaded the cache ran the cached object code, 1 ulp apart
(rank/compiled.py's docstring). Each run is a fresh process with an empty compile folder
(tests/cold_cache_training.py).

Nor did they where the program set ``pytensor.config.mode`` after ``synk.fork()``: the
workers compiled in the mode they started with. Rank 0's settings now travel with each
graph (``GraphSpec.settings``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.api import mode_choice
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


@pytest.mark.parametrize("mode", ["FAST_COMPILE", "CVM"])
def test_a_mode_configured_after_fork_is_every_ranks(ranks, mode, rng):
    """``pytensor.config.mode`` set by the program after ``synk.fork()`` (the workers
    started in PyTensor's default mode) is the mode of every rank: log(1 + x) of a tiny x
    is 0 where the graph is not rewritten to log1p (FAST_COMPILE) and x where it is (the
    default and CVM), so a rank in another mode gives other values."""
    x = pt.vector("x")
    tiny = rng.uniform(1e-22, 1e-20, size=7)
    with pytensor.config.change_flags(mode=mode):
        f = synk.function([x], pt.log(1 + x), collect_modes="gather")
        got = f(tiny)
        want = pytensor.function([x], pt.log(1 + x))(tiny)
    assert (want == 0.0).all() == (mode == "FAST_COMPILE")  # the modes differ here
    np.testing.assert_array_equal(got, want)
    # The graph built under the mode keeps it when the program has changed it again.
    np.testing.assert_array_equal(f(tiny[:5]), want[:5])


def test_a_configured_mode_is_kept_for_a_large_graph(monkeypatch):
    """A mode named in PyTensor's configuration is a mode the user names: a large graph
    keeps it rather than compiling op by op."""
    x = pt.vector("x")
    monkeypatch.setattr(mode_choice, "LARGE_GRAPH_NODES", 1)
    assert mode_choice.choose(None, None, [x], [x + 1], "f") == mode_choice.LARGE_GRAPH_MODE
    with pytensor.config.change_flags(mode="FAST_COMPILE"):
        assert mode_choice.choose(None, None, [x], [x + 1], "f") is None
    with pytensor.config.change_flags(linker="py"):
        assert mode_choice.choose(None, None, [x], [x + 1], "f") is None
