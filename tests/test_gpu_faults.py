"""GPU ranks (on CPU devices without a GPU, as in ``test_gpu.py``) when a rank dies inside
an XLA collective: rank 0 gets ``WorkerDied`` within seconds, ``close()`` leaves nothing
behind, and the next fork runs."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from synkhronos.rank.backends import gpu
from synkhronos.session import launch
from tests.conftest import shm_entries

pytest.importorskip("jax")


@pytest.mark.gpu
def test_a_rank_killed_mid_collective_gives_worker_died(monkeypatch):
    threads = set(threading.enumerate())
    n = synk.fork(2 if gpu.on_cpu_devices() else None, backend="gpu")
    session = launch.current()
    victim = session.processes[-1]
    try:
        w = pytensor.shared(np.ones(1 << 20, "float32"), name="w_fault")
        synk.function([], w.sum())
        synk.distribute()
        synk.all_reduce(w, "sum")  # compiled, and the ranks connected
        comm = session.state.comm
        wait = comm.wait

        def kill_then_wait(arrays):
            # Rank 0 dispatched the all-reduce: every rank passed the exchange before it.
            os.kill(victim.pid, signal.SIGKILL)
            wait(arrays)

        monkeypatch.setattr(comm, "wait", kill_then_wait)
        start = time.monotonic()
        with pytest.raises(synk.WorkerDied, match=rf"rank {n - 1} died \(signal 9\)"):
            synk.all_reduce(w, "sum")
        assert time.monotonic() - start < 60  # a hang guard, not a latency figure
        with pytest.raises(RuntimeError, match="broken"):
            synk.all_reduce(w, "sum")
    finally:
        synk.close()
    assert all(p.poll() is not None for p in session.processes)
    assert shm_entries(session.name) == []
    assert set(threading.enumerate()) <= threads  # nothing keeps the interpreter alive
    # JAX's runtime was left cleanly: a new session joins it afresh.
    synk.fork(2 if gpu.on_cpu_devices() else None, backend="gpu")
    try:
        v = pytensor.shared(np.arange(3, dtype="float32"), name="v_fault")
        synk.function([], v.sum())
        synk.all_reduce(v, "sum")
        np.testing.assert_array_equal(synk.get_value(0, v), np.arange(3) * n)
    finally:
        synk.close()
