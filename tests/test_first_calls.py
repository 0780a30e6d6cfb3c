"""First calls take the session's compile lock one rank at a time (rank/first_calls.py).

The test holds the lock itself, through its own opening of the control segment, and
watches who waits: a rank's first call of a compiled variant waits for the lock, in
every mode; later calls take no lock. Compiles are logged.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.rank import compiled, first_calls, rewritten_graphs
from synkhronos.session import launch
from synkhronos.transport.shm import SHM_DIR

HOLD_S = 0.5


@pytest.fixture
def session():
    # A worker left waiting by a wrong lock is asleep: the watchdog names it, no hang.
    synk.fork(2, backend="cpu", timeout=5.0)
    yield launch.current()
    synk.close()


def _held_lock(session):
    """The compile lock, held through a file description of the test's own."""
    fd = os.open(os.path.join(SHM_DIR, session.control.segment.name), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _release_later(fd: int, seconds: float) -> threading.Thread:
    def release():
        time.sleep(seconds)
        fcntl.flock(fd, fcntl.LOCK_UN)

    thread = threading.Thread(target=release)
    thread.start()
    return thread


def test_workers_wait_for_the_lock_on_first_calls_only(session, rng):
    x = pt.matrix("x")
    c = float(np.random.default_rng().uniform(2.0, 3.0))  # unseeded: never called before
    graph = (pt.tanh(x) * c).sum(axis=1)
    f = synk.function([x], (graph, "gather"))
    reference = pytensor.function([x], graph)
    synk.distribute()  # compile (rewrite) first: only the first call is timed
    fd = _held_lock(session)
    try:
        data = rng.normal(size=(7, 3))
        start = time.monotonic()
        releaser = _release_later(fd, HOLD_S)
        got = f(data)  # both ranks wait for the lock
        waited = time.monotonic() - start
        releaser.join()
        np.testing.assert_allclose(got, reference(data))
        assert waited >= HOLD_S * 0.9, waited

        # XLA's programs are kept on disk too: a JAX-mode first call waits as well.
        # (Built before the lock is taken again: rank 0 compiles it to check it.)
        jax_f = synk.function([x], (graph, "gather"), mode="JAX")
        fcntl.flock(fd, fcntl.LOCK_EX)  # held: a second call must not wait
        np.testing.assert_allclose(f(data[:5]), reference(data[:5]))

        start = time.monotonic()
        releaser = _release_later(fd, HOLD_S)
        # JAX's 64-bit mode follows floatX (float32 after a GPU-rank session, say).
        np.testing.assert_allclose(jax_f(data), reference(data), rtol=1e-5)
        waited = time.monotonic() - start
        releaser.join()
        assert waited >= HOLD_S * 0.9, waited
    finally:
        os.close(fd)


def test_a_variant_called_before_takes_no_lock_at_its_first_call(rng):
    """In a later run (here a later session), a variant whose first call was made before
    finds its machine code in the cache: its first call does not wait for the lock."""
    x = pt.matrix("x")
    c = float(np.random.default_rng().uniform(2.0, 3.0))  # unseeded: never called before
    data = rng.normal(size=(7, 3))
    want = (np.tanh(data) * c).sum(axis=1)
    hold = {0: HOLD_S, 1: 30.0}  # the second run would wait the whole 30 s for the lock
    for run in range(2):
        synk.fork(2, backend="cpu", timeout=60.0)
        try:
            f = synk.function([x], ((pt.tanh(x) * c).sum(axis=1), "gather"))
            synk.distribute()
            fd = _held_lock(launch.current())
            releaser = threading.Timer(hold[run], fcntl.flock, (fd, fcntl.LOCK_UN))
            try:
                start = time.monotonic()
                releaser.start()
                got = f(data)
                waited = time.monotonic() - start
            finally:
                releaser.cancel()
                os.close(fd)
        finally:
            synk.close()
        np.testing.assert_allclose(got, want)
        if run == 0:
            assert waited >= HOLD_S * 0.9, waited
        else:
            assert waited < hold[run] * 0.9, waited


def test_a_rank_waiting_for_the_lock_longer_than_the_timeout_is_not_hung(rng):
    """A worker waiting for another rank's compile (minutes, for a large graph) tells rank
    0 it is alive: the watchdog, here at 1 s, does not declare it hung."""
    synk.fork(2, backend="cpu", timeout=1.0)
    try:
        x = pt.matrix("x")
        f = synk.function([x], (pt.exp(x).sum(axis=1) * 2.5, "gather"))
        synk.distribute()
        fd = _held_lock(launch.current())
        try:
            releaser = _release_later(fd, 3.0)
            data = rng.normal(size=(5, 3))
            got = f(data)
            releaser.join()
        finally:
            os.close(fd)
        np.testing.assert_allclose(got, np.exp(data).sum(axis=1) * 2.5)
    finally:
        synk.close()


def test_a_form_is_compiled_at_its_first_use_only(session, rng):
    x = pt.matrix("x")
    w = pytensor.shared(np.zeros(3), name="w")
    f = synk.function([x], (x.sum(), "sum"), updates=[(w, w + x.sum(axis=0))])
    synk.distribute()
    compiled = session.state.functions[f._spec.fid]
    assert compiled._compiled == {}  # checked in rank 0 when built; compiled by none yet
    step = synk.chain(f, ("broadcast", w))
    data = rng.normal(size=(5, 3))
    step(data)  # a chain applies the updates a later step reads as they run: that form
    assert list(compiled._compiled) == [("plain", False)]
    f(data)  # a call's updates wait until every rank computed it: its own form
    assert set(compiled._compiled) == {("plain", False), ("plain", True)}
    # Each rank adds its own rows' sums: rank 0 has the first 3 of 5, twice.
    np.testing.assert_allclose(w.get_value(), 2 * data[:3].sum(axis=0))


def test_compiles_are_logged_with_their_size_and_time(caplog, rng):
    x = pt.matrix("x")
    with caplog.at_level(logging.INFO, logger="synkhronos.rank.compiled"):
        synk.fork(2, backend="cpu")  # before the fork: the workers send what it lets by
        try:
            f = synk.function([x], (pt.tanh(x).sum(axis=1), "gather"), name="logged")
            f(rng.normal(size=(5, 3)))
        finally:
            synk.close()
    lines = [(getattr(r, "rank", 0), r.getMessage()) for r in caplog.records]
    for rank in (0, 1):
        mine = [message for r, message in lines if r == rank]
        start = next(m for m in mine if "compiling function 'logged' (plain)" in m)
        assert re.search(r"\(\d+ nodes, mode ", start), start
        assert any(re.search(r"done compiling function 'logged'.* in \d+\.\d s", m) for m in mine)
        assert any("done first call of function 'logged' (plain)" in m for m in mine), mine


def test_a_long_compile_says_it_is_still_going(caplog, monkeypatch):
    monkeypatch.setattr(compiled, "PROGRESS_S", 0.01)
    with caplog.at_level(logging.INFO, logger="synkhronos.rank.compiled"):
        with compiled.compiling("compiling a test"):
            deadline = time.monotonic() + 60  # a hang guard only
            while not any("still compiling a test (" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline
                time.sleep(0.01)
    assert caplog.records[-1].getMessage().startswith("synkhronos: done compiling a test in ")


def _graphs_holding(value: float, paths: set) -> list:
    """Those of the stored graphs at ``paths`` that hold the constant ``value``: this
    test's, not those that tests in other processes store in the same folder meanwhile."""
    marks = [np.asarray(value, dtype).tobytes() for dtype in ("f8", "f4")]
    mine = []
    for path in paths:
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # another process's graph, replaced meanwhile
            continue
        if any(mark in data for mark in marks):
            mine.append(path)
    return sorted(mine)


def test_a_waiting_worker_rewrites_a_chains_later_function_ahead(rng):
    x = pt.matrix("x")
    c = float(np.random.default_rng().uniform(0.5, 1.5))  # unseeded: no cache has the graphs
    w = pytensor.shared(np.zeros(3), name="w")
    synk.fork(2, backend="cpu", timeout=60.0)  # longer than the lock is held at most
    try:
        first = synk.function([x], updates=[(w, w + c * x.sum(axis=0))], name="first")
        later = synk.function([], updates=[(w, pt.tanh(w) * (1 + c))], name="later")
        step = synk.chain(first, ("all_reduce", [w]), later)
        synk.distribute()
        before = set(rewritten_graphs.folder().glob("*.pkl"))
        ahead: list = []
        early: list = []  # the first function's graphs stored while the lock was held

        def new_graphs(value: float) -> list:
            return _graphs_holding(value, set(rewritten_graphs.folder().glob("*.pkl")) - before)

        def release_once_the_later_is_stored(fd: int) -> None:
            # Both ranks wait for the lock to rewrite the first function; rank 1, a worker,
            # meanwhile rewrites the later function (its constant is 1 + c) and stores it.
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline and not ahead:
                ahead[:] = new_graphs(1 + c)
                time.sleep(0.05)
            early[:] = new_graphs(c)
            fcntl.flock(fd, fcntl.LOCK_UN)

        fd = _held_lock(launch.current())
        try:
            releaser = threading.Thread(target=release_once_the_later_is_stored, args=(fd,))
            releaser.start()
            data = rng.normal(size=(5, 3))
            step(data)
            releaser.join()
        finally:
            os.close(fd)
        got = w.get_value()
    finally:
        synk.close()
    assert len(ahead) == 1, "the later function was not stored while rank 1 waited"
    assert early == [], "a rank rewrote the first function while the lock was held"
    # Nobody rewrote it again: its graph is the one rank 1 stored; the first one's is new.
    assert new_graphs(1 + c) == ahead
    assert len(new_graphs(c)) == 1
    # Ranks 0 and 1 sum 3 and 2 rows; the all-reduce averages.
    np.testing.assert_allclose(got, np.tanh(c * data.sum(axis=0) / 2) * (1 + c))


def test_a_waiting_worker_works_through_its_queue_while_the_lock_is_taken(tmp_path, caplog):
    path = tmp_path / "lock"
    path.write_bytes(b"")
    holder, mine = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    done = []

    def fail():
        done.append("fail")
        raise RuntimeError("broken piece")

    def release():
        done.append("release")
        fcntl.flock(holder, fcntl.LOCK_UN)

    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        worker = first_calls.FirstCalls(mine, lambda: None)
        worker.meanwhile.update({"a": fail, "b": release, "c": lambda: done.append("c")})
        with caplog.at_level(logging.DEBUG, logger=first_calls.__name__):
            with worker.one_at_a_time():
                with pytest.raises(BlockingIOError):  # the worker holds the lock now
                    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # The failing piece is dropped, logged; none is done once the lock is free.
        assert done == ["fail", "release"] and list(worker.meanwhile) == ["c"]
        assert "broken piece" in caplog.text
        with worker.one_at_a_time():
            pass
        assert done == ["fail", "release"]
        # A waiting rank with nothing queued polls, calling its check between tries.
        checks = []
        rank0 = first_calls.FirstCalls(mine, lambda: checks.append(time.monotonic()))
        fcntl.flock(holder, fcntl.LOCK_EX)
        releaser = threading.Timer(0.3, fcntl.flock, (holder, fcntl.LOCK_UN))
        releaser.start()
        with rank0.one_at_a_time():
            with pytest.raises(BlockingIOError):
                fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        releaser.join()
        assert len(checks) >= 3 and checks[-1] - checks[0] >= 0.15
        assert done == ["fail", "release"]

        def give_up():
            raise RuntimeError("a worker died")

        fcntl.flock(holder, fcntl.LOCK_EX)  # held for good: the check ends the wait
        with pytest.raises(RuntimeError, match="a worker died"):
            with first_calls.FirstCalls(mine, give_up).one_at_a_time():
                pass
    finally:
        os.close(holder)
        os.close(mine)
