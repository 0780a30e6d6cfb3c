"""synkhronos.transport.comm.shm in one process: each rank a thread with its own
communicator, every collective against numpy on uneven sizes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from synkhronos.transport.channel import Aborted, ControlBlock
from synkhronos.transport.comm.shm import ShmCommunicator, check_same_layouts
from synkhronos.transport.names import new_session_name, sweep

N_RANKS = 3


def _fine() -> None:
    pass


@pytest.fixture
def comms():
    session = new_session_name()
    control = ControlBlock(session, N_RANKS, create=True)
    made = [ShmCommunicator(session, 0, N_RANKS, control, _fine)]
    for r in range(1, N_RANKS):
        other = ControlBlock(session, N_RANKS, create=False)
        made.append(ShmCommunicator(session, r, N_RANKS, other, _fine))
    yield made
    sweep(session)


def _on_every_rank(comms, step):
    """``step(comm)`` run by every rank at once; each rank's result (or exception)."""
    with ThreadPoolExecutor(len(comms)) as pool:
        futures = [pool.submit(step, c) for c in comms]
        return [f.exception(timeout=20) or f.result() for f in futures]


@pytest.mark.parametrize("op", ["avg", "sum", "prod", "max", "min"])
def test_reductions_match_numpy(comms, op, rng):
    # 11 and 2 elements over 3 ranks: uneven chunks, and a rank with no chunk of the second.
    data = [
        [rng.normal(size=(11,)), rng.integers(-9, 9, size=(2, 1)).astype(np.int32)] for _ in comms
    ]
    want = [
        getattr(np, {"avg": "mean"}.get(op, op))(np.stack([d[i] for d in data]), axis=0)
        for i in range(2)
    ]
    want[1] = np.trunc(want[1]).astype(np.int32)

    def step(c):
        out = [np.zeros_like(a) for a in data[c.rank]]
        given = c.all_reduce(data[c.rank], op, out=out)
        return given is out, c.all_reduce(data[c.rank], op), c.reduce(data[c.rank], op, root=1)

    for rank, (same, everyone, at_root) in enumerate(_on_every_rank(comms, step)):
        assert same
        for got in (everyone, at_root) if rank == 1 else (everyone,):
            np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
            np.testing.assert_array_equal(got[1], want[1])
            assert got[1].dtype == np.int32 and got[1].shape == (2, 1)
        assert rank == 1 or at_root is None


def test_moving_collectives_follow_one_another(comms, rng):
    parts = [[rng.normal(size=(r + 1, 2)), np.arange(r + 3)] for r in range(N_RANKS)]

    def step(c):
        mine = [np.full(c.rank + 1, c.rank, np.int16)]
        return (
            c.broadcast(parts[2] if c.rank == 2 else None, root=2),
            c.scatter(parts if c.rank == 1 else None, root=1),
            c.gather(mine, root=0),
            c.all_gather(mine),
        )

    results = _on_every_rank(comms, step)
    everyone = [[np.full(r + 1, r, np.int16)] for r in range(N_RANKS)]
    for rank, (cast, scattered, gathered, all_gathered) in enumerate(results):
        for got, want in [(cast, parts[2]), (scattered, parts[rank])]:
            assert len(got) == len(want)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w)
        for got in [all_gathered, gathered] if rank == 0 else [all_gathered]:
            assert [[a.tolist() for a in box] for box in got] == [
                [a.tolist() for a in box] for box in everyone
            ]
        assert rank == 0 or gathered is None


def test_unequal_layouts_raise_on_every_rank_and_abort_is_seen(comms):
    def step(c):
        return c.all_reduce([np.zeros(4 if c.rank == 2 else 5)], "sum")

    errors = _on_every_rank(comms, step)
    assert all(isinstance(e, ValueError) and "rank 2 has" in str(e) for e in errors)
    with pytest.raises(ValueError, match="same number of arrays"):
        comms[0].scatter([[np.zeros(1)], [], [np.zeros(1)]])
    comms[0].reset()
    comms[0].control.set_abort(True)
    with pytest.raises(Aborted, match="another rank failed"):
        comms[1].barrier()  # no peer ever comes: the abort flag ends the wait
    comms[0].control.set_abort(False)
    comms[0].reset()
    assert [s.value for s in comms[0].barrier_sems] == [0] * N_RANKS
    check_same_layouts([[("f", (2,))]] * 3)
