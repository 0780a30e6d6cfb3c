"""Compiles and first calls one rank at a time, so that the other ranks load the first
one's work.

Every stage of a compile keeps its result on disk: the rewritten graph
(:mod:`synkhronos.rank.rewritten_graphs`), the C code of each op (CVM), the machine code
of the whole graph (Numba, compiled at the first call), XLA's program (JAX mode, at the
first call). Ranks doing the same stage together would each do the same work: n times the
CPU time and the memory of one, and for a large graph that takes minutes and gigabytes.
So each rank compiles a function, and makes its first call, under an exclusive lock
(``flock``) on the session's control segment: the first rank to take it does the work and
fills the caches, the others then load from them. (Rank 0 once compiled alongside a
worker that held the lock: for a cold MNIST demo that was a tenth of its CPU time.) A
variant whose first call was made before, in this run or an earlier one (a mark beside its
stored graph says so: :mod:`synkhronos.rank.compiled`), finds its machine code in the
cache: its first call takes no lock.

A rank waits for the lock by polling it, and calls its ``check`` in between: rank 0 checks
the workers (one that dies releases the lock, one that makes no progress is named by the
watchdog), so it never hangs on a worker; a worker bumps its heartbeat (rank 0 then knows
it alive, however long the wait) and checks that rank 0 is. Nothing a rank does under the
lock waits for another rank: no collective runs inside a first call. A worker that finds
the lock taken first does the work queued in :attr:`FirstCalls.meanwhile` (a chain's later
functions, rewritten ahead, and their C modules compiled:
:mod:`synkhronos.rank.chain_part`), one piece at a time, as long as the lock stays taken
(:meth:`FirstCalls.held_by_another`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import time
from collections.abc import Callable, Iterator

from synkhronos.transport.channel import POLL_S

logger = logging.getLogger(__name__)

FIRST_POLL_S = 0.001
"""The first pause between two tries of a taken lock; each pause doubles, up to
:data:`~synkhronos.transport.channel.POLL_S` (a short compile's waiters go on soon after
it, a long one's poll a few times a second)."""


class FirstCalls:
    """The lock that first calls of a rank's compiled functions take.

    Parameters
    ----------
    fd : int or None
        An open file descriptor of a file every rank of the session opened (the control
        segment); None takes no lock.
    check : callable
        Called between tries while this rank waits for the lock; raises to give up.
    share : (int, int)
        This rank's index and the number of ranks that compile each function together:
        each compiles its share of a graph's C modules
        (:mod:`synkhronos.rank.c_modules`).
    """

    def __init__(self, fd: int | None, check: Callable[[], None], share: tuple[int, int] = (0, 1)):
        self.fd, self.check, self.share = fd, check, share
        self.meanwhile: dict[object, Callable[[], object]] = {}
        """Work a waiting worker does while another rank holds the lock, by a key of the
        queuer's choosing (a piece queued twice is done once); a piece that fails is
        logged and dropped (its function's compile, later, reports the error)."""

    def _try(self) -> bool:
        """Take the lock if it is free, without waiting; whether this rank took it."""
        assert self.fd is not None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def held_by_another(self) -> bool:
        """Whether another rank holds the lock now (tried without waiting, and let go at
        once if this rank got it)."""
        if self.fd is None:
            return False
        if self._try():
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            return False
        return True

    def _take(self) -> None:
        """Take the lock: at once if it is free, else after the work queued meanwhile,
        polling."""
        assert self.fd is not None
        if self._try():
            return
        while self.meanwhile:
            key = next(iter(self.meanwhile))
            try:
                self.meanwhile.pop(key)()
            except Exception as error:  # noqa: BLE001 - the compile that needs it reports it
                logger.debug("synkhronos: work done while waiting failed (%s)", error)
            if self._try():
                return
        pause = FIRST_POLL_S
        while not self._try():
            self.check()
            time.sleep(pause)
            pause = min(2 * pause, POLL_S)

    @contextlib.contextmanager
    def one_at_a_time(self) -> Iterator[None]:
        """Hold the lock for the enclosed compile or first call."""
        if self.fd is None:
            yield
            return
        self._take()
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
