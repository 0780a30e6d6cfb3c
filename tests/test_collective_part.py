"""Every rank's part of a collective, seen from one rank with a fake communicator that
gives the other ranks' side (no fork; the collectives across forked ranks are tested in
test_collectives.py)."""

import types

import numpy as np
import pytensor
import pytest

from synkhronos.rank import collective_part
from synkhronos.rank.backends.base import Backend
from synkhronos.transport.comm.shm import ShmCommunicator
from synkhronos.transport.protocol import Collective
from synkhronos.transport.reduction import COLLECTIVE_OPS

ROWS = 11


class _Comm:
    """One rank's view of ``n_ranks``: ``others`` are the other ranks' contributions."""

    def __init__(self, rank, n_ranks, others=None):
        self.rank, self.n_ranks, self.others, self.calls = rank, n_ranks, others, []

    def scatter(self, parts):
        self.calls.append(("scatter", parts))
        return parts[self.rank] if parts is not None else self.others

    def broadcast(self, values):
        self.calls.append(("broadcast", values))
        return values if self.rank == 0 else self.others

    def all_gather(self, values):
        return [values, *self.others]

    def all_reduce(self, values, op, out=None):
        assert op == "sum"
        got = [v + sum(o[i] for o in self.others) for i, v in enumerate(values)]
        if out is None:
            return got
        for o, g in zip(out, got, strict=True):
            o[...] = g
        return out


def _state(rank, comm, backend=None):
    return types.SimpleNamespace(rank=rank, comm=comm, backend=backend or Backend("cpu", None))


@pytest.mark.parametrize("n_ranks", [2, 3])
def test_scatter_gives_rank_0_its_uneven_share(rng, n_ranks):
    whole = rng.standard_normal((ROWS, 2))
    var = pytensor.shared(np.zeros((1, 2)))
    comm = _Comm(0, n_ranks)
    collective_part.run(_state(0, comm), Collective.SCATTER, [var], values=[whole])
    parts = comm.calls[0][1]
    assert [len(p[0]) for p in parts] == [len(a) for a in np.array_split(whole, n_ranks)]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), whole)
    np.testing.assert_array_equal(var.get_value(), parts[0][0])


def test_all_gather_joins_every_ranks_rows(rng):
    mine, theirs = rng.standard_normal((7, 2)), rng.standard_normal((4, 2))
    var = pytensor.shared(mine.copy())
    got = collective_part.run(_state(1, _Comm(1, 2, [[theirs]])), Collective.ALL_GATHER, [var])
    np.testing.assert_array_equal(var.get_value(), np.concatenate([mine, theirs]))
    assert len(got) == 2


@pytest.mark.parametrize("backend", [Backend("cpu", None), Backend("jax-cpu", "JAX")])
def test_all_reduce_in_place_where_the_backend_allows(rng, backend):
    mine, theirs = rng.standard_normal(5), rng.standard_normal(5)
    var = pytensor.shared(mine.copy())
    storage = var.get_value(borrow=True)
    collective_part.run(_state(0, _Comm(0, 2, [[theirs]]), backend), Collective.ALL_REDUCE,
                        [var], "sum")  # fmt: skip
    np.testing.assert_allclose(var.get_value(), mine + theirs, rtol=1e-15)
    assert (var.get_value(borrow=True) is storage) == backend.writes_in_place


def test_broadcast_and_set_value_on_a_worker(rng):
    sent = rng.standard_normal(3)
    var = pytensor.shared(np.zeros(3))
    collective_part.run(_state(1, _Comm(1, 2, [sent])), Collective.BROADCAST, [var])
    np.testing.assert_array_equal(var.get_value(), sent)
    other = pytensor.shared(np.zeros(3))
    collective_part.run(_state(1, _Comm(1, 3, [sent * 2])), Collective.SET_VALUE, [other],
                        rank=2)  # fmt: skip
    np.testing.assert_array_equal(other.get_value(), 0.0)  # rank 2's, not this one's
    collective_part.run(_state(2, _Comm(2, 3, [sent * 2])), Collective.SET_VALUE, [other],
                        rank=2)  # fmt: skip
    np.testing.assert_array_equal(other.get_value(), sent * 2)


def test_a_worker_decodes_the_command(rng, monkeypatch):
    var = pytensor.shared(np.zeros(2))
    ran = []
    monkeypatch.setitem(collective_part.PARTS, Collective.REDUCE,
                        lambda *args: ran.append(args))  # fmt: skip
    state = types.SimpleNamespace(
        rank=1, comm=_Comm(1, 2), backend=Backend("cpu", None), shared=lambda idx: [var]
    )
    header = np.array([Collective.REDUCE, COLLECTIVE_OPS.index("max"), 0, 1])
    assert collective_part.run_collective(state, [header, np.array([0])]) == []
    ((_, comm, variables, op, rank, values),) = ran
    assert comm is state.comm and variables == [var] and op == "max" and rank == 0


def test_host_path_only_for_communicators_extending_shared_memory():
    plain = _Comm(0, 2)
    assert collective_part.communicator(_state(0, plain), nccl=False) is plain

    class Extended(ShmCommunicator):
        def __init__(self):
            self.rank, self.n_ranks = 0, 2

    extended = Extended()
    assert collective_part.communicator(_state(0, extended), nccl=True) is extended
    host = collective_part.communicator(_state(0, extended), nccl=False)
    assert host is not extended and (host.rank, host.n_ranks) == (0, 2)
