"""synkhronos.session.session without forking: a one-rank ``Session`` (no worker process
is started) and its command runner, :meth:`Session.execute`, whose one-rank branch runs
rank 0's part with the same checks and settling as a command to workers: a broken session
refused, released ``Data`` forgotten, the updates applied only where the part succeeded,
``verify_every`` counted, a Ctrl-C breaking the session."""

from __future__ import annotations

import numpy as np
import pytensor
import pytest

from synkhronos.session import session as session_module
from synkhronos.session.session import Session
from synkhronos.transport import shared_arrays
from synkhronos.transport.protocol import Command


@pytest.fixture
def alone():
    """A session of one rank on one node: nothing to start but rank 0's own state."""
    session = Session(1, "cpu", None)
    try:
        yield session
    finally:
        session.close()


def test_one_rank_of_one_node_is_alone(alone):
    assert alone.alone and alone.processes == []


def test_one_rank_command_runs_rank_0s_part_and_forgets_released_data(alone):
    shared_arrays.released_ids.append(12345)  # no worker to tell
    try:
        assert alone.execute(Command.CALL, ["message"], lambda a, b: (b, a), (1, 2)) == (2, 1)
    finally:
        released = list(shared_arrays.released_ids)
        shared_arrays.released_ids.clear()
    assert released == []


def test_one_rank_command_applies_updates_only_where_its_part_succeeded(alone):
    w = pytensor.shared(np.zeros(3), name="w")

    def part(value, fail):
        alone.state.pending.append((w, value))
        if fail:
            raise ValueError("rank 0 failed")
        return "done"

    assert alone.execute(Command.CALL, [], part, (np.ones(3), False)) == "done"
    np.testing.assert_array_equal(w.get_value(), np.ones(3))
    with pytest.raises(ValueError, match="rank 0 failed"):
        alone.execute(Command.CALL, [], part, (np.full(3, 5.0), True))
    np.testing.assert_array_equal(w.get_value(), np.ones(3))  # all or none
    assert alone.state.pending == [] and not alone.control.aborted and not alone.broken
    assert alone.execute(Command.CALL, [], lambda: 7) == 7  # the session is still sound


def test_a_broken_session_runs_no_command(alone):
    alone.broken = True
    with pytest.raises(RuntimeError, match="broken"):
        alone.execute(Command.CALL, [], lambda: pytest.fail("ran on a broken session"))
    alone.broken = False  # so that close() sends STOP to no one, as a sound one does


def test_ctrl_c_in_rank_0s_part_breaks_the_session(alone):
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        alone.execute(Command.CALL, [], interrupted)
    assert alone.broken


def test_verify_every_counts_one_rank_calls_and_chains(alone, monkeypatch):
    checks: list = []
    monkeypatch.setattr(session_module, "_periodic_check", lambda: checks.append(alone.calls))
    alone.verify_every = 2
    for code in (Command.CALL, Command.DISTRIBUTE, Command.CHAIN, Command.CALL, Command.CALL):
        alone.execute(code, [], lambda: None)
    assert alone.calls == 4 and checks == [2, 4]  # DISTRIBUTE is no call
