"""The transport within one process: Mailbox, ControlBlock, Channel, the named protocol."""

from __future__ import annotations

import numpy as np
import pytest

from synkhronos.rank.collective_part import PARTS
from synkhronos.transport.channel import (
    NOTE_BYTES,
    Channel,
    ControlBlock,
    RemoteError,
    failure_error,
)
from synkhronos.transport.names import new_session_name, sweep
from synkhronos.transport.protocol import FORGET_DATA, Collective, Command, Status
from synkhronos.transport.shm import Mailbox, SharedMemoryFull, message_words


@pytest.fixture
def session():
    name = new_session_name()
    yield name
    sweep(name)


def _no_peer_died() -> None:
    pass


def test_mailbox_round_trip_and_growth(session, rng):
    header = np.zeros(message_words(4), np.int64)
    writer, reader = Mailbox(f"{session}_box", header), Mailbox(f"{session}_box", header)
    small = [rng.normal(size=(3, 2)), np.arange(5, dtype=np.int16), np.array(True)]
    writer.post(small)
    got = reader.read()
    assert [g.dtype for g in got] == [a.dtype for a in small]
    for g, a in zip(got, small, strict=True):
        np.testing.assert_array_equal(g, a)
    assert all(o % 64 == 0 for o in reader.offsets())
    generation = int(header[0])
    big = [rng.normal(size=(200, 50))]  # outgrows the segment: a new generation
    writer.post(big)
    assert int(header[0]) == generation + 1
    np.testing.assert_array_equal(reader.read()[0], big[0])
    writer.post([])
    assert reader.read() == []


def test_mailbox_refuses_too_many_arrays(session):
    box = Mailbox(f"{session}_box", np.zeros(message_words(2), np.int64))
    with pytest.raises(ValueError, match="more than 2 arrays"):
        box.post([np.zeros(1)] * 3)


def test_control_block_regions_are_disjoint_and_shared(session):
    n_ranks = 3
    owner = ControlBlock(session, n_ranks, create=True)
    other = ControlBlock(session, n_ranks, create=False)
    regions = [owner.words[0:2], owner.command_header(), owner.result_header()]
    for r in range(n_ranks):
        regions += [
            owner.status(r),
            owner.heartbeat(r),
            owner.note(r),
            owner.reply_header(r),
            owner.comm_header(r),
        ]
    for i, region in enumerate(regions):
        region[...] = i + 1
    assert sum(len(r) for r in regions) == len(owner.words)
    assert (owner.words > 0).all()
    np.testing.assert_array_equal(other.words, owner.words)
    owner.command = Command.CALL | FORGET_DATA
    assert other.command & ~FORGET_DATA == Command.CALL
    other.set_abort(True)
    assert owner.aborted


def test_channel_command_reply_and_failure(session):
    control = ControlBlock(session, 2, create=True)
    rank0 = Channel(session, 0, 2, control, _no_peer_died)
    worker = Channel(session, 1, 2, ControlBlock(session, 2, create=False), _no_peer_died)
    rank0.send(Command.COLLECTIVE, [np.array([Collective.SHAPES, 0, 0], np.int64)])
    code, arrays = worker.receive()
    assert code == Command.COLLECTIVE and arrays[0].tolist() == [8, 0, 0]
    worker.reply([np.array([42])])
    worker.report()
    assert rank0.wait_done() == []
    assert control.status(1)[0] == Status.OK
    assert rank0.reply_arrays(1)[0].tolist() == [42]

    rank0.send(Command.CALL)
    worker.receive()
    try:
        raise KeyError("boom")
    except KeyError as error:
        worker.report(error)
    [(rank, text, shm_full)] = rank0.wait_done()
    assert rank == 1 and "KeyError: 'boom'" in text and not shm_full
    assert control.status(1)[0] == Status.FAILED and control.aborted


def test_a_failure_whose_traceback_cannot_be_sent_is_noted(session, monkeypatch):
    control = ControlBlock(session, 2, create=True)
    rank0 = Channel(session, 0, 2, control, _no_peer_died)
    worker = Channel(session, 1, 2, ControlBlock(session, 2, create=False), _no_peer_died)

    def no_room(arrays):
        raise SharedMemoryFull("no room for 3.0 MiB")

    def no_name(arrays):
        raise OSError("taken")

    for error, post, status in [
        (KeyError("boom"), None, Status.FAILED),
        (KeyError("boom"), no_room, Status.SHM_FULL),
        (KeyError("boom"), no_name, Status.FAILED_NOTE),
        (SharedMemoryFull("needs 9.0 MiB"), None, Status.SHM_FULL),
    ]:
        if post is not None:
            monkeypatch.setattr(worker.replies[1], "post", post)
        rank0.send(Command.CALL)
        worker.receive()
        worker.report(error)
        [failure] = rank0.wait_done()
        monkeypatch.undo()
        assert control.status(1)[0] == status
        assert str(error) in failure.text and failure.shm_full == (status == Status.SHM_FULL)
        raised = failure_error([failure])
        assert isinstance(raised, SharedMemoryFull if failure.shm_full else RemoteError)
        assert "worker rank 1" in str(raised)
    control.write_note(1, "é" * NOTE_BYTES)  # cut to the note's bytes, whole characters or not
    assert control.read_note(1).startswith("é" * (NOTE_BYTES // 2 - 1))


def test_every_collective_kind_has_a_part():
    assert set(PARTS) == set(Collective)
    assert len({f.__name__ for f in PARTS.values()}) == len(Collective)
