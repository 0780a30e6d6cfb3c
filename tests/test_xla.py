"""synkhronos.transport.comm.xla without joining JAX's runtime: the layouts the ranks
exchange, the host path every collective takes for host arrays (ranks as threads), and
the refusals. The device path runs in test_gpu*.py (forked GPU ranks)."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from synkhronos.transport.channel import ControlBlock
from synkhronos.transport.comm import xla
from synkhronos.transport.comm.xla import XlaCommunicator, free_address, signature
from synkhronos.transport.names import new_session_name, sweep

N_RANKS = 3


def test_signatures_name_dtypes_and_shapes_and_read_back():
    arrays = [np.zeros((2, 3), np.float32), np.int8(4), np.zeros((0,), np.complex128)]
    words = signature(arrays)
    assert words.dtype == np.int64
    assert xla._layout(words) == [(a.dtype, np.shape(a)) for a in arrays]
    assert signature([np.zeros(2), np.array(["a"])]).tolist() == [-1]
    assert xla._layout(signature([np.array(["a"])])) is None
    assert xla._layout(signature([])) == []
    assert xla._supported(xla._layout(signature(arrays[:2])))
    assert not xla._supported(xla._layout(signature(arrays)))  # complex: reduced on the host
    assert not xla._supported(None)


def test_free_address_and_no_session_while_one_is_leaving(monkeypatch):
    host, port = free_address().split(":")
    with socket.socket() as probe:
        probe.bind((host, int(port)))  # free a moment ago: free still
    xla.check_not_leaving()
    stuck = threading.Event()
    leaving = threading.Thread(target=stuck.wait)
    leaving.start()
    monkeypatch.setattr(xla, "_leaving", [leaving])
    try:
        with pytest.raises(RuntimeError, match="need a new process"):
            xla.check_not_leaving()
    finally:
        stuck.set()
        leaving.join()
    xla.check_not_leaving()


@pytest.fixture
def comms():
    session = new_session_name()
    made = [
        XlaCommunicator(session, r, N_RANKS, ControlBlock(session, N_RANKS, r == 0), lambda: None)
        for r in range(N_RANKS)
    ]
    yield made
    for c in made:
        c.close()  # never joined: nothing to leave
    sweep(session)


def _on_every_rank(comms, step):
    with ThreadPoolExecutor(len(comms)) as pool:
        futures = [pool.submit(step, c) for c in comms]
        return [f.exception(timeout=20) or f.result() for f in futures]


def test_host_arrays_take_the_host_path(comms, rng):
    data = [[rng.normal(size=(7,)), np.arange(3 + r, dtype=np.int16)] for r in range(N_RANKS)]

    def step(c):
        mine = data[c.rank]
        return (
            c.all_reduce(mine[:1], "avg"),
            c.reduce(mine[:1], "max", root=2),
            c.broadcast(mine if c.rank == 1 else None, root=1),
            c.all_gather(mine),
            c.scatter(data if c.rank == 0 else None),
        )

    stacked = np.stack([d[0] for d in data])
    for rank, (avg, top, cast, gathered, scattered) in enumerate(_on_every_rank(comms, step)):
        np.testing.assert_allclose(avg[0], stacked.mean(0), rtol=1e-12)
        if rank == 2:
            np.testing.assert_array_equal(top[0], stacked.max(0))
        else:
            assert top is None
        for got, want in [
            (cast, data[1]),
            (scattered, data[rank]),
            *zip(gathered, data, strict=True),
        ]:
            assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert all(c.dispatches == 0 for c in comms)  # no XLA program ran


def test_unequal_layouts_raise_on_every_rank_and_an_abandoned_rank_refuses(comms):
    def step(c):
        return c.all_reduce([np.zeros((2, 2) if c.rank == 1 else (4,), np.float32)], "sum")

    errors = _on_every_rank(comms, step)
    assert all(isinstance(e, ValueError) and "rank 1 has" in str(e) for e in errors)
    with pytest.raises(ValueError, match="same number of arrays"):
        comms[0].scatter([[np.zeros(1)], [], [np.zeros(1)]])
    comms[0]._abandoned = True  # as after a peer died within a program
    with pytest.raises(RuntimeError, match="close\\(\\) and fork again"):
        comms[0].run(None, [])
