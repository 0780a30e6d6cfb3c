"""The compiled NUTS's sum on CPU ranks (a host callback calling the rank's communicator,
:func:`~synkhronos.transport.comm.traced.sum_by_host_traced`): a rank failing or dying
inside the program fails the call on rank 0, saying why; nothing hangs. Each test forks
its own session (a death breaks it)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

pytest.importorskip("jax")

import synkhronos as synk  # noqa: E402 - after the skip
from synkhronos.api import routines  # noqa: E402
from synkhronos.session import launch  # noqa: E402
from tests.conftest import shm_entries  # noqa: E402

STEPS = 20


class _Failing:
    """``comm``, whose all-reduce on rank ``rank`` fails at its ``at``-th call: raises
    ``ValueError``, or with ``die`` ends the process."""

    def __init__(self, comm, rank: int, at: int, die: bool):
        self.comm, self.rank, self.n_ranks = comm, comm.rank, comm.n_ranks
        self.fails = comm.rank == rank
        self.at, self.die, self.calls = at, die, 0

    def all_reduce(self, arrays, op):
        self.calls += 1
        if self.fails and self.calls == self.at:
            if self.die:
                os._exit(3)
            raise ValueError(f"all-reduce {self.calls} failed on purpose")
        return self.comm.all_reduce(arrays, op)


def looped_sum_routine(state, how: np.ndarray) -> list:
    """(Every CPU rank) ``STEPS`` sums over the ranks by a host callback inside a
    ``lax.fori_loop`` of one program, under ``vmap`` (2 rows at once), as the compiled
    NUTS runs them on CPU ranks; ``how`` is ``[failing rank, failing call, die]`` (no
    failure where the call is 0)."""
    import jax
    from jax import lax

    from synkhronos.extensions.pymc.compiled import _OnHost

    comm = _Failing(state.comm, int(how[0]), int(how[1]), bool(how[2]))
    ranks = _OnHost(comm)

    def body(arrays: list) -> list:
        loop = lambda x: lax.fori_loop(0, STEPS, lambda _, v: ranks.sum(v) * 0.5, x)  # noqa: E731
        return [jax.vmap(loop)(arrays[0])]

    start = np.arange(6.0).reshape(2, 3) + state.rank
    (summed,), _ = ranks.compile_and_run(body, [start])
    return [np.asarray(summed), np.array([comm.calls])]


def test_host_sum_loops_under_vmap():
    """Every rank gets the same sums, one all-reduce per step for both rows."""
    synk.fork(2, backend="cpu")
    try:
        replies = routines.run(looped_sum_routine, np.array([0, 0, 0]))
    finally:
        synk.close()
    # The first step halves x + (x + 1) (ranks 0 and 1); every later one, twice that.
    want = np.arange(6.0).reshape(2, 3) + 0.5
    assert all(r[0].tobytes() == replies[0][0].tobytes() for r in replies)
    assert np.array_equal(replies[0][0], want)
    assert [int(r[1][0]) for r in replies] == [STEPS, STEPS]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_failing_sum_fails_the_call_and_the_session_lives(rank):
    """A rank's all-reduce raising inside the program fails it there; the other ranks
    give up theirs (the command is aborted) and rank 0 raises, naming the error; the
    session goes on."""
    synk.fork(2, backend="cpu")
    try:
        with pytest.raises(Exception, match="failed on purpose") as raised:
            routines.run(looped_sum_routine, np.array([rank, 5, 0]))
        assert rank == 0 or isinstance(raised.value, synk.RemoteError)
        replies = routines.run(looped_sum_routine, np.array([0, 0, 0]))
        assert [int(r[1][0]) for r in replies] == [STEPS, STEPS]
    finally:
        synk.close()


def test_a_rank_dying_in_the_program_is_reported():
    synk.fork(2, backend="cpu")
    name = launch.current().name
    try:
        start = time.monotonic()
        with pytest.raises(synk.WorkerDied, match="rank 1 died"):
            routines.run(looped_sum_routine, np.array([1, 5, 1]))
        assert time.monotonic() - start < 60  # a hang guard, not a latency figure
    finally:
        synk.close()
    assert not shm_entries(name)


def apart_routine(state) -> list:
    """(Every CPU rank) one sum over the ranks, which each rank numbers as its own rank:
    as if the ranks' programs had reached different sums."""
    import jax

    from synkhronos.extensions.pymc.compiled import jax_cpu_device
    from synkhronos.transport.comm.traced import sum_by_host_traced

    jax_cpu_device()
    errors: list = []
    program = jax.jit(lambda x: sum_by_host_traced(x, state.comm, state.rank, errors))
    try:
        return [np.asarray(program(np.ones(3)))]
    except Exception:
        raise errors[0] from None


def test_sums_of_programs_gone_apart_are_refused():
    """Ranks at different sums of their programs raise, naming it, rather than add one
    sum's values into another's."""
    synk.fork(2, backend="cpu")
    try:
        with pytest.raises(RuntimeError, match="programs went apart"):
            routines.run(apart_routine)
    finally:
        synk.close()
