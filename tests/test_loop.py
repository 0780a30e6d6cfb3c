"""synkhronos.worker.loop without a worker process: rank 0's and a worker's channel in
this process, the loop's receiving (the command word's flags) and running of commands."""

from __future__ import annotations

import numpy as np
import pytest

from synkhronos.transport import trace
from synkhronos.transport.channel import Aborted, Channel, ControlBlock
from synkhronos.transport.names import new_session_name, sweep
from synkhronos.transport.protocol import (
    DISCARD_UPDATES,
    FORGET_DATA,
    TIMELINE,
    Command,
    Status,
)
from synkhronos.worker import loop


class _State:
    """What the loop asks of a rank's state: the last call's updates, applied or dropped."""

    def __init__(self):
        self.pending: dict = {}
        self.applied = 0

    def apply_pending(self):
        self.applied += 1
        self.pending.clear()


class _Views:
    def __init__(self):
        self.forgotten: list = []

    def forget(self, ids):
        self.forgotten += np.asarray(ids).tolist()

    def view(self, descriptor):
        return descriptor


@pytest.fixture
def pair():
    session = new_session_name()
    control = ControlBlock(session, 2, create=True)
    rank0 = Channel(session, 0, 2, control, lambda: None)
    worker = Channel(session, 1, 2, ControlBlock(session, 2, create=False), lambda: None)
    yield session, rank0, worker
    trace.stop()
    sweep(session)


def test_receive_applies_or_drops_updates_and_forgets_data(pair):
    session, rank0, worker = pair
    state, views = _State(), _Views()
    state.pending["w"] = 1
    rank0.send(Command.CALL | DISCARD_UPDATES, [np.arange(3)])
    code, arrays = loop._receive(worker, state, views, session, 1)
    assert code == Command.CALL and len(arrays) == 1
    assert state.applied == 0 and not state.pending  # dropped, not applied
    state.pending["w"] = 2
    rank0.send(Command.COLLECTIVE | FORGET_DATA, [np.arange(3), np.array([4, 9])])
    code, arrays = loop._receive(worker, state, views, session, 1)
    assert code == Command.COLLECTIVE and [a.tolist() for a in arrays] == [[0, 1, 2]]
    assert state.applied == 1 and views.forgotten == [4, 9]
    assert not trace.running()


def test_the_timeline_flag_starts_and_stops_recording(pair):
    session, rank0, worker = pair
    state, views = _State(), _Views()
    rank0.send(Command.ROUTINE | TIMELINE)
    assert loop._receive(worker, state, views, session, 1)[0] == Command.ROUTINE
    assert trace.running()
    rank0.send(Command.ROUTINE)
    loop._receive(worker, state, views, session, 1)
    assert not trace.running()
    names = [e["name"] for e in trace.collect(session, 2)]
    assert names == ["process_name", "wait for command"]


def test_a_command_replies_or_reports_its_failure(pair):
    session, rank0, worker = pair
    state, views = _State(), _Views()

    def aborted(state, arrays, resolve):
        raise Aborted("another rank failed")

    def failing(state, arrays, resolve):
        raise KeyError("missing")

    handlers = {
        Command.CALL: lambda state, arrays, resolve: [resolve(arrays[0]) * 2],
        Command.COLLECTIVE: aborted,
        Command.ROUTINE: failing,
    }
    rank0.send(Command.CALL, [np.array([1, 2])])
    loop._run_command(worker, handlers, Command.CALL, state, [np.array([1, 2])], views)
    assert rank0.wait_done() == [] and rank0.reply_arrays(1)[0].tolist() == [2, 4]
    for code, status, text in [
        (Command.COLLECTIVE, Status.ABORTED, None),
        (Command.ROUTINE, Status.FAILED, "KeyError: 'missing'"),
        (Command.CHAIN, Status.FAILED, "unknown synkhronos command 5"),
    ]:
        rank0.control.set_abort(False)
        rank0.send(code)
        loop._run_command(worker, handlers, int(code), state, [], views)
        failures = rank0.wait_done()
        assert rank0.control.status(1)[0] == status
        assert [text in f.text for f in failures] == ([] if text is None else [True])
