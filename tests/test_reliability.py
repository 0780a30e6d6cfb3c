"""Failures of every kind end in a clear error within a bounded time, and leave nothing.

Each test checks the error seen, how long it took to see it, and that no worker process
and no ``/dev/shm`` name of the program is left. Rank 0 is run as a script where the test
kills it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import synkhronos as synk
from synkhronos.session import launch
from synkhronos.session.liveness import Watchdog, process_state
from synkhronos.transport import shm
from synkhronos.transport.channel import WorkerHung
from tests.conftest import shm_entries
from tests.graphs import x


def _gone(pid: int) -> bool:
    return process_state(pid)[0] in ("X", "Z")


def _wait_until(condition, limit_s: float) -> float:
    """Seconds until ``condition()`` holds; fails after ``limit_s``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < limit_s, "still not there after the time limit"
        time.sleep(0.02)
    return time.monotonic() - start


def _forked(timeout):
    synk.fork(2, backend="cpu", timeout=timeout)
    session = launch.current()
    f = synk.function([x], (x * 2.0).mean())
    assert f(np.ones((5, 3))) == 2.0  # distributed and compiled: the workers are idle
    return session, f


def _close_and_check(session) -> float:
    """close(); return its duration once no worker and no name of the session is left."""
    start = time.monotonic()
    synk.close()
    took = time.monotonic() - start
    assert all(_gone(p.pid) for p in session.processes)
    assert shm_entries(session.name) == []
    return took


# ---- a rank that hangs or dies while rank 0 needs it ---------------------------------------
def test_stopped_rank_is_named_after_timeout():
    # The first call compiles on the workers for longer than the timeout: a rank that
    # computes is never declared hung.
    session, f = _forked(timeout=1.0)
    os.kill(session.processes[0].pid, signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(WorkerHung, match=r"rank 1 .*no progress for 1 s.*stopped"):
        f(np.ones((5, 3)))
    assert 1.0 <= time.monotonic() - start < 4.0
    with pytest.raises(RuntimeError, match="broken"):
        f(np.ones((5, 3)))
    assert _close_and_check(session) < 2.0  # SIGTERM (and SIGCONT), no 5 s grace


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_timeout_must_be_positive(timeout):
    with pytest.raises(ValueError, match="timeout"):
        synk.fork(2, backend="cpu", timeout=timeout)
    assert launch._session is None


@pytest.mark.parametrize("when", ["idle", "mid-call"])
def test_killed_rank_is_reported(when):
    session, f = _forked(timeout=None)
    pid = session.processes[0].pid
    if when == "idle":
        os.kill(pid, signal.SIGKILL)
        _wait_until(lambda: _gone(pid), 2)
    else:  # the worker holds the command without answering until it is killed
        os.kill(pid, signal.SIGSTOP)
        threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(synk.WorkerDied, match=r"rank 1 died \(signal 9\)"):
        f(np.ones((5, 3)))
    assert time.monotonic() - start < 2.5
    _close_and_check(session)


def test_ctrl_c_during_a_long_call():
    session, f = _forked(timeout=None)
    os.kill(session.processes[0].pid, signal.SIGSTOP)  # the call now waits forever
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        f(np.ones((5, 3)))
    assert time.monotonic() - start < 1.5
    assert session.broken
    assert _close_and_check(session) < 2.0


def test_exception_on_one_rank_only(rng):
    synk.fork(2, backend="cpu")
    session = launch.current()
    try:
        f = synk.function([x], x.reshape((2, -1)).mean())  # needs an even size on each rank
        start = time.monotonic()
        # 7 rows: 4 on rank 0 (12 values), 3 on rank 1 (9 values)
        with pytest.raises(synk.RemoteError, match=r"(?s)rank 1 failed.*total size of new array"):
            f(rng.normal(size=(7, 3)))
        # 5 rows: 3 on rank 0 (9 values), 2 on rank 1
        with pytest.raises(ValueError, match="total size of new array"):
            f(rng.normal(size=(5, 3)))
        assert time.monotonic() - start < 2.0
        assert not session.broken
        xv = rng.normal(size=(8, 3))
        assert np.isclose(f(xv), xv.mean())  # the session goes on
    finally:
        _close_and_check(session)


def test_watchdog_tells_a_computing_process_from_a_sleeping_one():
    burn = "import time\nt = time.time() + 30\nwhile time.time() < t: pass"
    busy = subprocess.Popen([sys.executable, "-c", burn])
    idle = subprocess.Popen(["sleep", "30"])
    beats = [0]
    try:
        time.sleep(0.3)  # both past interpreter start-up
        for pids, heartbeat, hangs in [([busy.pid], lambda r: 0, False),
                                       ([idle.pid], lambda r: beats[0], False),
                                       ([idle.pid], lambda r: 0, True)]:
            dog = Watchdog(pids, heartbeat, timeout=0.3)
            deadline = time.monotonic() + 1.0
            hung = False
            while time.monotonic() < deadline and not hung:
                beats[0] += 1
                try:
                    dog.check()
                except WorkerHung:
                    hung = True
                time.sleep(0.05)
            assert hung == hangs
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()


# ---- rank 0 killed, two programs at once ---------------------------------------------------
SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import pytensor.tensor as pt
    import synkhronos as synk
    from synkhronos.session import launch
    synk.fork(2, backend="cpu", timeout=None)
    x = pt.matrix("x", dtype="float64")
    f = synk.function([x], (pt.tanh(x) ** 2).mean())
    v = np.random.default_rng(0).normal(size=(int(sys.argv[1]), 50))
    want = (np.tanh(v) ** 2).mean()
    assert np.isclose(f(v), want)
    print(launch.current().processes[0].pid, flush=True)
    for _ in range(int(sys.argv[2])):
        assert np.isclose(f(v), want)
    print("ok", flush=True)
""")


def _rank0(tmp_path, rows: int, calls: int) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "user.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, str(script), str(rows), str(calls)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env)
    return proc, int(proc.stdout.readline())


def _no_leftovers(rank0: int, worker: int) -> bool:
    return _gone(worker) and shm_entries(f"synk_{rank0}_") == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_rank0_killed_during_calls(tmp_path, signum):
    proc, worker = _rank0(tmp_path, rows=300, calls=10**6)
    time.sleep(0.2)
    start = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout=10)
    _wait_until(lambda: _no_leftovers(proc.pid, worker), 5)
    assert time.monotonic() - start < 5
    err = proc.stderr.read()
    if signum == signal.SIGTERM:  # closed by rank 0 itself, then the default action
        assert proc.returncode == -signal.SIGTERM
        assert "Traceback" not in err
    elif signum == signal.SIGINT:
        assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, err[-3000:]
    else:
        assert proc.returncode == -signal.SIGKILL


def test_next_fork_sweeps_names_a_dead_program_left(tmp_path):
    proc, worker = _rank0(tmp_path, rows=5, calls=10**6)
    os.kill(worker, signal.SIGSTOP)  # cannot act on rank 0's death, so cannot sweep
    proc.kill()
    proc.wait()
    time.sleep(0.2)
    left = shm_entries(f"synk_{proc.pid}_")
    assert left
    synk.fork(2, backend="cpu")
    session = launch.current()
    assert shm_entries(f"synk_{proc.pid}_") == []
    assert shm_entries(session.name)  # a live program's names are left alone
    os.kill(worker, signal.SIGKILL)
    _close_and_check(session)


def test_sweep_dead_spares_live_programs():
    finished = subprocess.Popen(["true"])
    finished.wait()
    names = [f"synk_{finished.pid}_0dead_f0_x", f"synk_{os.getpid()}_0live_f0_x"]
    for name in names:
        shm.Segment(name, 64, create=True)
    shm.posix_ipc.Semaphore(f"/{names[0]}_sem", shm.posix_ipc.O_CREX)
    try:
        removed = shm.sweep_dead()
        assert sorted(removed) == sorted([names[0], f"sem.{names[0]}_sem"])
        assert shm_entries(names[1]) == [names[1]]
    finally:
        shm.sweep(f"synk_{os.getpid()}_0live")


def test_two_programs_at_once(tmp_path, rng):
    other, other_worker = _rank0(tmp_path, rows=60, calls=200)
    xv = rng.normal(size=(11, 3))
    for _ in range(2):  # the second fork sweeps dead programs' names: none of the other's
        synk.fork(2, backend="cpu")
        session = launch.current()
        f = synk.function([x], (x * x).mean())
        for _ in range(50):
            assert np.isclose(f(xv), (xv * xv).mean())
        _close_and_check(session)
    out, err = other.communicate(timeout=60)
    assert out.strip() == "ok", err
    _wait_until(lambda: _no_leftovers(other.pid, other_worker), 3)


# ---- many sessions; /dev/shm full -----------------------------------------------------------
def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_fork_close_cycles_leave_nothing():
    fds = []
    for _ in range(20):
        synk.fork(2, backend="cpu")
        session = launch.current()
        _close_and_check(session)
        assert [p.returncode for p in session.processes] == [0]
        fds.append(_fds())
    assert fds[-1] <= fds[1], fds


def test_full_dev_shm_is_a_clear_error(monkeypatch):
    free = shm.free_bytes()
    before = shm_entries()
    name = f"synk_{os.getpid()}_0full"
    with pytest.raises(shm.SharedMemoryFull, match=r"GiB .*has .* free"):
        shm.Segment(f"{name}_a", free + 2**30, create=True)  # larger than the space left
    monkeypatch.setattr(shm, "free_bytes", lambda: 2**20)
    with pytest.raises(shm.SharedMemoryFull, match=r"of 7\.6 MiB .*has 1\.0 MiB free"):
        synk.data(np.zeros((1000, 1000)))
    # Past the free-space check, the allocation itself fails (more than /dev/shm's size).
    monkeypatch.setattr(shm, "free_bytes", lambda: 2**62)
    stat = os.statvfs(shm.SHM_DIR)
    with pytest.raises(shm.SharedMemoryFull):
        shm.Segment(f"{name}_b", stat.f_blocks * stat.f_frsize + 2**30, create=True)
    assert shm_entries() == before


# ---- fork and close from other threads ------------------------------------------------------
def test_fork_in_a_thread_that_ends_and_close_in_another():
    # The parent-death signal also fires when the thread that started the workers ends:
    # they must live on while rank 0 does, and close() must work from any thread.
    forked = threading.Thread(target=synk.fork, args=(2,), kwargs={"backend": "cpu"})
    forked.start()
    forked.join()
    session = launch.current()
    time.sleep(1.5)  # past the workers' wait for re-parenting
    assert not any(_gone(p.pid) for p in session.processes)
    f = synk.function([x], ((x * 2.0).sum(), "sum"))
    assert f(np.ones((7, 3))) == 42.0
    closer = threading.Thread(target=synk.close)
    closer.start()
    closer.join()
    assert launch._session is None
    assert all(_gone(p.pid) for p in session.processes)
    assert shm_entries(session.name) == []


def test_own_sigterm_handler_keeps_the_session():
    # A program's SIGTERM handler (a checkpoint on preemption) still finds its ranks.
    script = textwrap.dedent("""
        import signal, numpy as np, pytensor.tensor as pt, synkhronos as synk
        caught = []
        signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
        synk.fork(2, backend="cpu")
        x = pt.vector("x")
        f = synk.function([x], (x.sum(), "sum"))
        signal.raise_signal(signal.SIGTERM)
        print("handled", caught, f(np.arange(5.0)))
        synk.close()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "handled [15] 10.0" in done.stdout


def test_ctrl_c_inside_a_compiled_graph_is_a_keyboard_interrupt():
    # Numba reports an interrupt inside its code as a SystemError caused by it.
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise SystemError("returned a result with an exception set") from interrupt
    except SystemError as error:
        assert isinstance(launch._interrupt_behind(error), KeyboardInterrupt)
    other = ValueError("x")
    assert launch._interrupt_behind(other) is other
