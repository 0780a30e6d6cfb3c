"""synkhronos.transport.comm.base: what a communicator must implement."""

from __future__ import annotations

import pytest

from synkhronos.transport.comm.base import Communicator
from synkhronos.transport.comm.shm import ShmCommunicator

REQUIRED = {
    "broadcast",
    "scatter",
    "gather",
    "all_gather",
    "reduce",
    "all_reduce",
    "reset",
    "close",
}


def test_a_communicator_must_implement_every_collective():
    assert Communicator.__abstractmethods__ == REQUIRED
    assert not ShmCommunicator.__abstractmethods__

    class Partial(Communicator):
        def close(self) -> None:
            pass

    with pytest.raises(TypeError, match="abstract method"):
        Partial()  # type: ignore[abstract]


class _Loopback(Communicator):
    """One rank alone: every collective hands back what it was given."""

    rank, n_ranks = 0, 1

    def broadcast(self, arrays, root=0):
        return list(arrays)

    def scatter(self, parts, root=0):
        return list(parts[0])

    def gather(self, arrays, root=0):
        return [list(arrays)]

    def all_gather(self, arrays):
        return [list(arrays)]

    def reduce(self, arrays, op, root=0):
        return list(arrays)

    def all_reduce(self, arrays, op, out=None):
        return list(arrays)

    def reset(self):
        pass

    def close(self):
        pass


def test_a_complete_communicator_needs_no_start_of_its_own():
    comm = _Loopback()
    assert comm.start() is None
    assert comm.all_gather([1]) == [[1]]
