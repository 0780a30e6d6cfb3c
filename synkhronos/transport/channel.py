"""Commands from rank 0 to the workers, and their replies, through shared memory.

Rank 0 writes a command (an integer code plus arrays) into the control segment, releases
each worker's "go" semaphore, and waits on the shared "done" semaphore once per worker.
Workers answer with arrays in their own reply mailbox and a status word. No pickling
happens per command, and every wait polls for dead peers so that nothing hangs; a worker's
polls also bump its heartbeat word, which tells rank 0 that it is alive while it waits
(:mod:`synkhronos.session.liveness`).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import posix_ipc

from synkhronos.transport.names import taken
from synkhronos.transport.protocol import Status
from synkhronos.transport.shm import Mailbox, Segment, SharedMemoryFull, message_words

MAX_ARRAYS = 512  # arrays in one message (function outputs, shared variables in a collective)
NOTE_BYTES = 1024  # a worker's note: its error, when its reply mailbox cannot take it
POLL_S = 0.05  # how often a blocked wait checks that its peers are alive
SPIN_S = 100e-6  # how long a wait polls before it blocks


_OK, _ABORTED, _FAILED, _SHM_FULL = (
    int(s) for s in (Status.OK, Status.ABORTED, Status.FAILED, Status.SHM_FULL)
)


class RemoteError(RuntimeError):
    """An exception raised in a worker, re-raised in rank 0 with the worker's traceback."""


class WorkerDied(RuntimeError):
    """A rank's process ended while rank 0 needed it; the session must be closed."""


class WorkerHung(WorkerDied):
    """A rank made no progress for the fork's ``timeout``; the session must be closed."""


class Aborted(RuntimeError):
    """A collective was abandoned because another rank failed (its error is reported)."""


def check_count(n_arrays: int, what: str, most: int = MAX_ARRAYS) -> None:
    """``ValueError`` naming ``what`` when ``n_arrays`` exceed the ``most`` one message
    carries (:data:`MAX_ARRAYS`, less what the message holds besides)."""
    if n_arrays > most:
        raise ValueError(
            f"{what}: {n_arrays} arrays would travel in one message between "
            f"ranks, which carries at most {most} here"
        )


class Failure(NamedTuple):
    """A worker's failed report: its rank, what it said, and whether ``/dev/shm`` was full."""

    rank: int
    text: str
    shm_full: bool


def failure_error(failures: list[Failure]) -> Exception:
    """The exception rank 0 raises for workers' failures: :class:`SharedMemoryFull` if
    ``/dev/shm`` was full on one of them, else :class:`RemoteError`; each names the ranks."""
    text = "\n".join(f"synkhronos worker rank {f.rank} failed:\n{f.text}" for f in failures)
    if any(f.shm_full for f in failures):
        return SharedMemoryFull(text)
    return RemoteError(text)


class ControlBlock:
    """The control segment's int64 words, carved into named regions.

    Layout: ``[abort flag, command code]``, the command's message header, then per rank
    a status word, a heartbeat word, a note (its length in bytes, then
    :data:`NOTE_BYTES` of text), a reply-mailbox header and a communicator-mailbox
    header, then the header of the communicator's result buffer. Every rank keeps the
    segment's file open (:attr:`Segment.fd <synkhronos.transport.shm.Segment.fd>`): the
    file the ranks lock to compile one at a time (:mod:`synkhronos.rank.first_calls`).
    """

    _NOTE = 2  # a rank's words: status, heartbeat, then the note's length and text
    _MAILBOXES = _NOTE + 1 + NOTE_BYTES // 8

    def __init__(self, session: str, n_ranks: int, create: bool):
        msg = message_words(MAX_ARRAYS)
        self.per_rank = self._MAILBOXES + 2 * msg
        n_words = 2 + msg + n_ranks * self.per_rank + msg
        self.segment = Segment(f"{session}_control", n_words * 8, create, keep_fd=True)
        self.words = self.segment.array(np.int64, (n_words,))
        self.msg = msg
        self.n_ranks = n_ranks

    @property
    def command(self) -> int:
        """The command word: a :class:`~synkhronos.transport.protocol.Command`, maybe or-ed with
        :data:`~synkhronos.transport.protocol.FORGET_DATA`."""
        return int(self.words[1])

    @command.setter
    def command(self, code: int) -> None:
        self.words[1] = int(code)

    def command_header(self) -> np.ndarray:
        return self.words[2 : 2 + self.msg]

    def _rank_words(self, rank: int) -> np.ndarray:
        start = 2 + self.msg + rank * self.per_rank
        return self.words[start : start + self.per_rank]

    def status(self, rank: int) -> np.ndarray:
        return self._rank_words(rank)[0:1]

    def heartbeat(self, rank: int) -> np.ndarray:
        """The word that worker ``rank`` bumps while it waits (see
        :mod:`~synkhronos.session.liveness`)."""
        return self._rank_words(rank)[1:2]

    def note(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s note: its length in bytes, then the text's words."""
        return self._rank_words(rank)[self._NOTE : self._MAILBOXES]

    def write_note(self, rank: int, text: str) -> None:
        """Leave ``text`` (cut to :data:`NOTE_BYTES`) in rank ``rank``'s note."""
        data = text.encode()[:NOTE_BYTES]
        words = self.note(rank)
        words[1:].view(np.uint8)[: len(data)] = np.frombuffer(data, np.uint8)
        words[0] = len(data)

    def read_note(self, rank: int) -> str:
        words = self.note(rank)
        return bytes(words[1:].view(np.uint8)[: int(words[0])]).decode("utf-8", "replace")

    def reply_header(self, rank: int) -> np.ndarray:
        start = self._MAILBOXES
        return self._rank_words(rank)[start : start + self.msg]

    def comm_header(self, rank: int) -> np.ndarray:
        return self._rank_words(rank)[self._MAILBOXES + self.msg :]

    def result_header(self) -> np.ndarray:
        return self.words[len(self.words) - self.msg :]

    @property
    def aborted(self) -> bool:
        return bool(self.words[0])

    def set_abort(self, value: bool) -> None:
        self.words[0] = int(value)


def semaphore(name: str, create: bool) -> posix_ipc.Semaphore:
    """A named semaphore: created (this user's only, with value 0), or attached."""
    if create:
        try:
            return posix_ipc.Semaphore("/" + name, posix_ipc.O_CREX, mode=0o600, initial_value=0)
        except posix_ipc.ExistentialError:
            raise taken("sem." + name) from None
    return posix_ipc.Semaphore("/" + name)


def wait(sem: posix_ipc.Semaphore, check: Callable[[], None]) -> None:
    """Acquire ``sem``, calling ``check`` (which raises to give up) while it stays blocked.

    Spins briefly first: the peer usually answers within microseconds, and a sleeping
    process takes tens of microseconds to wake.
    """
    deadline = time.perf_counter() + SPIN_S
    while time.perf_counter() < deadline:
        try:
            sem.acquire(0)
            return
        except posix_ipc.BusyError:
            pass
    while True:
        try:
            sem.acquire(POLL_S)
            return
        except (posix_ipc.BusyError, posix_ipc.SignalError):
            check()  # SignalError: interrupted; Python's own handler runs after this


def drain(sem: posix_ipc.Semaphore) -> None:
    """Take every pending release of ``sem`` (after an aborted command)."""
    while True:
        try:
            sem.acquire(0)
        except posix_ipc.BusyError:
            return


class Channel:
    """Rank 0's and one worker's end of the command channel.

    Parameters
    ----------
    session : str
        Name prefix of the fork.
    rank, n_ranks : int
        This process's rank and the number of ranks.
    control : ControlBlock
        The shared control words.
    check_alive : callable
        Raises when a peer this rank waits on has died.
    """

    def __init__(
        self,
        session: str,
        rank: int,
        n_ranks: int,
        control: ControlBlock,
        check_alive: Callable[[], None],
    ):
        create = rank == 0
        self.rank, self.n_ranks, self.control = rank, n_ranks, control
        self.check_alive = check_alive
        self.go = [semaphore(f"{session}_go{r}", create) for r in range(1, n_ranks)]
        self.done = semaphore(f"{session}_done", create)
        self.payload = Mailbox(f"{session}_cmd", control.command_header())
        self.replies = [
            Mailbox(f"{session}_reply{r}", control.reply_header(r)) for r in range(n_ranks)
        ]

    # ---- rank 0 -------------------------------------------------------------------------
    def send(self, code: int, arrays=()) -> None:
        """Post a command to every worker."""
        self.payload.post(arrays)
        self.control.command = code
        for go in self.go:
            go.release()

    def wait_done(self) -> list[Failure]:
        """Wait until every worker has reported; return the failures."""
        for _ in self.go:
            wait(self.done, self.check_alive)
        failures = []
        for r in range(1, self.n_ranks):
            # A plain int: comparing a numpy int to an enum member costs microseconds.
            status = int(self.control.status(r)[0])
            if status == _OK or status == _ABORTED:
                continue
            if status == _FAILED:
                text = bytes(self.replies[r].read()[0]).decode("utf-8", "replace")
                failures.append(Failure(r, text, False))
            else:  # FAILED_NOTE, SHM_FULL
                failures.append(Failure(r, self.control.read_note(r), status == _SHM_FULL))
        return failures

    def reply_arrays(self, rank: int) -> list[np.ndarray]:
        """Views of what worker ``rank`` replied to the last command."""
        return self.replies[rank].read()

    # ---- workers -------------------------------------------------------------------------
    def receive(self) -> tuple[int, list[np.ndarray]]:
        """(Worker) block until rank 0 sends a command; return its code and arrays."""
        wait(self.go[self.rank - 1], self.check_alive)
        return self.control.command, self.payload.read()

    def reply(self, arrays) -> None:
        """(Worker) answer the current command with ``arrays``."""
        self.replies[self.rank].post(arrays)

    def report(self, error: BaseException | None = None, aborted: bool = False) -> None:
        """(Worker) tell rank 0 this command is finished: done, failed, or abandoned.

        A failure's traceback goes into the reply mailbox; where that needs shared memory
        it cannot get, or the failure was a full ``/dev/shm``, a note in the control words
        says what happened instead, and the worker lives on.
        """
        status = Status.ABORTED if aborted else Status.OK
        if error is not None:
            self.control.set_abort(True)
            status = self._report_failure(error)
        self.control.status(self.rank)[0] = int(status)
        self.done.release()

    def _report_failure(self, error: BaseException) -> Status:
        if isinstance(error, SharedMemoryFull):
            self.control.write_note(self.rank, str(error))
            return Status.SHM_FULL
        text = "".join(traceback.format_exception(error))
        try:
            self.replies[self.rank].post([np.frombuffer(text.encode(), np.uint8)])
            return Status.FAILED
        except Exception as posting:  # noqa: BLE001 - told to rank 0 in the note
            self.control.write_note(
                self.rank,
                f"{type(error).__name__}: {error}\n(its traceback could not be sent: {posting})",
            )
            return (
                Status.SHM_FULL if isinstance(posting, SharedMemoryFull) else (Status.FAILED_NOTE)
            )
