"""Dead workers, interrupted scripts: never a hang, nothing left in /dev/shm or running."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import synkhronos as synk
from synkhronos.session import launch
from tests.conftest import shm_entries
from tests.graphs import x


def test_function_before_fork_and_bad_backend():
    with pytest.raises(RuntimeError, match="fork"):
        synk.function([x], x.sum())
    with pytest.raises(RuntimeError, match="fork"):
        synk.backend()
    with pytest.raises(ValueError, match="backend"):
        synk.fork(2, backend="tpu")
    with pytest.raises(ValueError, match="n_parallel"):
        synk.fork(0, backend="cpu")


def test_killed_worker_is_reported_within_seconds():
    synk.fork(2, backend="cpu")
    session = launch.current()
    try:
        f = synk.function([x], x.sum())
        f(np.ones((4, 3)))
        os.kill(session.processes[0].pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(synk.WorkerDied, match="rank 1 died \\(signal 9\\)"):
            f(np.ones((4, 3)))
        assert time.monotonic() - start < 30  # a hang guard, not a latency figure
        with pytest.raises(RuntimeError, match="broken"):
            f(np.ones((4, 3)))
    finally:
        synk.close()
    assert not shm_entries(session.name)


SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np, pytensor.tensor as pt
    import synkhronos as synk
    synk.fork(2, backend="cpu")
    x = pt.matrix("x")
    f = synk.function([x], x.sum())
    f(np.ones((4, 3), dtype=x.dtype))
    print("ready", flush=True)
    how = sys.argv[1]
    if how == "close":
        synk.close()
    elif how == "raise":
        raise RuntimeError("user error")
    elif how in ("sigint", "sigkill"):
        while True:
            f(np.ones((4, 3), dtype=x.dtype))
""")


def _leftovers(pid: int) -> tuple[list, str]:
    prefix = f"synk_{pid}_"
    procs = subprocess.run(
        ["pgrep", "-f", f"synkhronos.worker {prefix}"], capture_output=True, text=True
    ).stdout
    return shm_entries(prefix), procs


@pytest.mark.parametrize("how", ["close", "exit", "raise", "sigint", "sigkill"])
def test_no_leftovers_after_script_ends(tmp_path, how):
    script = tmp_path / "user.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert proc.stdout.readline().strip() == "ready"
    if how == "sigint":
        proc.send_signal(signal.SIGINT)
    elif how == "sigkill":
        proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_leftovers(proc.pid)):
        time.sleep(0.1)
    assert _leftovers(proc.pid) == ([], "")
    if how == "sigint":
        assert "KeyboardInterrupt" in proc.stderr.read()


def test_close_right_after_fork_stops_workers_cleanly():
    """STOP as the first command: the names are gone before the workers read it."""
    from synkhronos.session import launch

    synk.fork(2, backend="cpu")
    session = launch.current()
    synk.close()
    assert [p.returncode for p in session.processes] == [0]
    assert shm_entries(session.name) == []
