"""synkhronos.transport.comm.node without MPI or processes: two nodes (2 ranks and 1 rank)
as threads, each node's ranks meeting through shared memory and the leaders through a
stand-in for mpi4py; every collective against numpy over the 3 global ranks."""

from __future__ import annotations

import functools
import sys
import threading
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from synkhronos.transport.channel import ControlBlock
from synkhronos.transport.comm.node import NodeCommunicator
from synkhronos.transport.comm.shm import ShmCommunicator
from synkhronos.transport.names import new_session_name, sweep
from synkhronos.transport.nodes import World

LOCAL_RANKS = [2, 1]
N_GLOBAL = sum(LOCAL_RANKS)


class _Leaders:
    """What the nodes' leaders share: mpi4py's calls used here, met with a thread barrier."""

    def __init__(self, n_nodes: int):
        self.barrier = threading.Barrier(n_nodes, timeout=20)
        self.slots: list = [None] * n_nodes


class _Mpi:
    def __init__(self, leaders: _Leaders, node: int):
        self.leaders, self.node = leaders, node

    def allgather(self, value):
        self.leaders.slots[self.node] = value
        self.leaders.barrier.wait()
        got = list(self.leaders.slots)
        self.leaders.barrier.wait()  # everyone has read: the slots may be written again
        return got

    def bcast(self, value, root=0):
        return self.allgather(value)[root]

    def scatter(self, chunks, root=0):
        return self.allgather(chunks)[root][self.node]

    def Allreduce(self, in_place, array, op):  # noqa: N802 - mpi4py's name
        assert in_place is _MPI.IN_PLACE
        array[...] = functools.reduce(op, self.allgather(array.copy()))

    def Barrier(self):  # noqa: N802 - mpi4py's name
        self.allgather(None)


_MPI = types.SimpleNamespace(
    IN_PLACE=object(), SUM=np.add, PROD=np.multiply, MAX=np.maximum, MIN=np.minimum
)


@pytest.fixture
def comms(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=_MPI))
    leaders, made, sessions = _Leaders(len(LOCAL_RANKS)), [], []
    for node, n_local in enumerate(LOCAL_RANKS):
        session = new_session_name()
        sessions.append(session)
        world = World(node, len(LOCAL_RANKS), LOCAL_RANKS, _Mpi(leaders, node))
        for r in range(n_local):
            control = ControlBlock(session, n_local, create=r == 0)
            local = ShmCommunicator(session, r, n_local, control, lambda: None)
            made.append(NodeCommunicator(local, world.offset, N_GLOBAL, world if r == 0 else None))
    yield made
    for session in sessions:
        sweep(session)


def _on_every_rank(comms, step):
    with ThreadPoolExecutor(len(comms)) as pool:
        futures = [pool.submit(step, c) for c in comms]
        return [f.result(timeout=30) for f in futures]


@pytest.mark.parametrize(
    "op, dtype",
    [
        ("avg", "float64"),
        ("avg", "int32"),
        ("sum", "bool"),
        ("max", "complex128"),
        ("prod", "int64"),
    ],
)
def test_reductions_span_every_node(comms, op, dtype, rng):
    values = [(rng.normal(size=(11,)) * 5 + 1j * rng.normal(size=11)) for _ in comms]
    data = [
        v.astype(dtype) if dtype.startswith("complex") else (v.real - 1).astype(dtype)
        for v in values
    ]
    if dtype == "bool":  # mostly False: an "or" over the ranks has both answers
        data = [rng.random(11) < 0.3 for _ in comms]
    stacked = np.stack(data)
    if op == "avg":
        want = stacked.astype(np.float64).sum(0) / N_GLOBAL
        want = want.astype(dtype) if dtype.startswith("float") else np.trunc(want).astype(dtype)
    else:
        want = {"sum": np.add, "max": np.maximum, "prod": np.multiply}[op].reduce(
            stacked, dtype=stacked.dtype
        )

    def step(c):
        return c.all_reduce([data[c.rank]], op), c.reduce([data[c.rank]], op)

    leaders = {0, LOCAL_RANKS[0]}
    assert [c.rank for c in comms] == list(range(N_GLOBAL))
    for rank, (everyone, at_root) in enumerate(_on_every_rank(comms, step)):
        for got in (everyone, at_root) if rank in leaders else (everyone,):
            assert got[0].dtype == want.dtype
            np.testing.assert_allclose(got[0], want, rtol=1e-12)
        assert rank in leaders or at_root is None


def test_moving_collectives_span_every_node(comms, rng):
    parts = [[rng.normal(size=(r + 2,)), np.arange(r)] for r in range(N_GLOBAL)]

    def step(c):
        mine = [np.full(c.rank + 1, c.rank)]
        return (
            c.broadcast(parts[0] if c.rank == 0 else None),
            c.scatter(parts if c.rank == 0 else None),
            c.gather(mine),
            c.all_gather(mine),
        )

    everyone = [[[r] * (r + 1)] for r in range(N_GLOBAL)]
    for rank, (cast, scattered, gathered, all_gathered) in enumerate(_on_every_rank(comms, step)):
        for got, want in [(cast, parts[0]), (scattered, parts[rank])]:
            assert [g.tolist() for g in got] == [w.tolist() for w in want]
        assert [[a.tolist() for a in box] for box in all_gathered] == everyone
        if rank in (0, LOCAL_RANKS[0]):  # every node's rank 0 gets the gather
            assert [[a.tolist() for a in box] for box in gathered] == everyone
        else:
            assert gathered is None


def test_only_root_0_is_taken(comms):
    for call in (comms[0].broadcast, comms[0].gather, comms[0].scatter):
        with pytest.raises(ValueError, match="take root 0, got 1"):
            call([np.zeros(1)], root=1)
