"""GPU ranks (on CPU devices without a GPU, as in ``test_gpu.py``) when a rank dies inside
an XLA collective or between calls: rank 0 gets ``WorkerDied`` within seconds, ``close()``
returns within seconds and leaves nothing behind, JAX does not end rank 0's process, and
the next fork runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

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
def test_a_rank_killed_on_3_ranks_leaves_rank_0_running_and_close_fast():
    """In a child process, so that JAX ending it shows as its exit status: a rank killed
    inside an all-reduce, then in a new session one killed between calls."""
    if not gpu.on_cpu_devices() and len(gpu.visible_gpus()) < 3:
        pytest.skip("needs 3 GPUs")
    root = Path(__file__).resolve().parents[1]
    code = "from tests.test_gpu_faults import kill_and_close; kill_and_close()"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=240
    )
    assert child.returncode == 0, child.stderr[-3000:]
    # gloo writes to stdout too
    reports = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    assert [r["when"] for r in reports] == ["mid", "idle"]
    for report in reports:
        assert report["raised"] == f"synkhronos worker rank {report['victim']} died (signal 9)"
        assert report["raised_s"] < 10 and report["close_s"] < 20  # hang guards, not latencies
        assert report["running"] == [] and report["names"] == []


def kill_and_close() -> None:
    """Rank 1 of 3 killed in an all-reduce, close; a new fork, its sum right, rank 2 killed
    between calls, close: one JSON line per session on stdout (the child process of the
    test above)."""
    for when, victim in (("mid", 1), ("idle", 2)):
        n = synk.fork(3 if gpu.on_cpu_devices() else None, backend="gpu")
        session = launch.current()
        # Large enough that the all-reduce still runs when the kill lands.
        w = pytensor.shared(np.arange(1 << 20, dtype="float32"), name=f"w_{when}")
        synk.function([], w.sum())
        synk.all_reduce(w, "sum")  # compiled, and the ranks connected
        np.testing.assert_array_equal(synk.get_value(0, w), np.arange(1 << 20) * n)
        process = session.processes[victim - 1]
        if when == "mid":
            comm, wait = session.state.comm, session.state.comm.wait

            def kill_then_wait(arrays, wait=wait, pid=process.pid):
                os.kill(pid, signal.SIGKILL)  # every rank passed the exchange before it
                wait(arrays)

            comm.wait = kill_then_wait
        else:
            process.kill()
            process.wait()
        start, raised = time.monotonic(), None
        try:
            synk.all_reduce(w, "sum")
        except synk.WorkerDied as error:
            raised = str(error).split(";")[0]
        raised_s, start = time.monotonic() - start, time.monotonic()
        synk.close()
        report = {
            "when": when,
            "victim": victim,
            "raised": raised,
            "raised_s": raised_s,
            "close_s": time.monotonic() - start,
            "running": [p.pid for p in session.processes if p.poll() is None],
            "names": shm_entries(session.name),
        }
        print(json.dumps(report), flush=True)


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
        # end; gloo's does, see the test above): here it waits until released; close()
        # gives up after LEAVE_BOUND_S.
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
