"""synkhronos.transport.channel within one process: the control block, commands, replies and
failures, and the waits on semaphores."""

from __future__ import annotations

import numpy as np
import pytest

from synkhronos.transport.channel import (
    MAX_ARRAYS,
    NOTE_BYTES,
    Channel,
    ControlBlock,
    Failure,
    RemoteError,
    WorkerDied,
    check_count,
    drain,
    failure_error,
    semaphore,
    wait,
)
from synkhronos.transport.names import NameTaken, new_session_name, sweep
from synkhronos.transport.protocol import FORGET_DATA, Collective, Command, Status
from synkhronos.transport.shm import SharedMemoryFull


@pytest.fixture
def session():
    name = new_session_name()
    yield name
    sweep(name)


def _no_peer_died() -> None:
    pass


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


def test_waits_check_their_peers_while_blocked_and_drain_clears(session):
    sem = semaphore(f"{session}_s", create=True)
    with pytest.raises(NameTaken):
        semaphore(f"{session}_s", create=True)
    calls = []

    def peer_died():
        calls.append(1)
        if len(calls) == 2:
            raise WorkerDied("rank 1 ended")

    with pytest.raises(WorkerDied, match="rank 1 ended"):
        wait(sem, peer_died)
    assert len(calls) == 2
    for _ in range(3):
        sem.release()
    wait(sem, peer_died)  # a pending release: no check
    drain(sem)
    assert sem.value == 0
    sem.close()


def test_failures_name_every_rank_and_an_aborted_rank_is_no_failure(session):
    control = ControlBlock(session, 3, create=True)
    rank0 = Channel(session, 0, 3, control, _no_peer_died)
    workers = [
        Channel(session, r, 3, ControlBlock(session, 3, create=False), _no_peer_died)
        for r in (1, 2)
    ]
    rank0.send(Command.CALL)
    for w in workers:
        w.receive()
    workers[0].report(aborted=True)
    workers[1].report(ValueError("two"))
    [failure] = rank0.wait_done()
    assert failure.rank == 2 and control.status(1)[0] == Status.ABORTED
    both = failure_error([Failure(1, "one", False), failure])
    assert isinstance(both, RemoteError) and "rank 1 failed:\none" in str(both)
    assert "rank 2 failed:" in str(both) and "ValueError: two" in str(both)
    with pytest.raises(ValueError, match="my outputs: 513 arrays .* at most 512"):
        check_count(MAX_ARRAYS + 1, "my outputs")
    check_count(MAX_ARRAYS, "my outputs")
