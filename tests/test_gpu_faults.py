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
from synkhronos.transport.comm import xla
from tests.conftest import shm_entries

jax = pytest.importorskip("jax")


@pytest.mark.gpu
def test_a_rank_killed_mid_collective_gives_worker_died(monkeypatch):
    threads, env = set(threading.enumerate()), _environment()
    release, shutdown = threading.Event(), jax.distributed.shutdown
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
        # Leaving JAX's runtime may wait for the abandoned collective (NCCL's may never
        # end): here it waits until released; close() gives up after LEAVE_BOUND_S.
        monkeypatch.setattr(xla, "LEAVE_BOUND_S", 0.5)
        monkeypatch.setattr(jax.distributed, "shutdown", lambda: release.wait(60) and shutdown())
    finally:
        start = time.monotonic()
        synk.close()
    assert time.monotonic() - start < 10
    with pytest.raises(RuntimeError, match="still leaving an earlier session"):
        synk.fork(2 if gpu.on_cpu_devices() else None, backend="gpu")
    assert gpu._saved_env == {} and env == _environment()  # refused before changing any
    release.set()
    for thread in xla._leaving:
        thread.join(30)
    monkeypatch.undo()
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
    assert _environment() == env  # what fork set in this process, restored


def _environment() -> dict:
    """What GPU ranks' fork sets in rank 0's process, and close restores."""
    names = ("CUDA_VISIBLE_DEVICES", "XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE")
    return {
        **{name: os.environ.get(name) for name in names},
        "jax_cuda_visible_devices": jax.config.read("jax_cuda_visible_devices"),
        "floatX": pytensor.config.floatX,
    }
