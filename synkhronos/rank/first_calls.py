"""Compiles and first calls one rank at a time, so that the other ranks load the first
one's work.

Every stage of a compile keeps its result on disk: the rewritten graph
(:mod:`synkhronos.rank.rewritten_graphs`), the C code of each op (CVM), the machine code
of the whole graph (Numba, compiled at the first call), XLA's program (JAX mode, at the
first call). Ranks doing the same stage together would each do the same work: n times the
CPU time and the memory of one, and for a large graph that takes minutes and gigabytes.
So each rank compiles a function, and makes its first call, under an exclusive lock
(``flock``) on the session's control segment: the first rank to take it does the work and
fills the caches, the others then load from them.

Rank 0 never waits for the lock: it must stay free to watch the workers, so when a worker
holds the lock it compiles without it, as it would have anyway. Workers wait; the kernel
releases the lock of a process that dies. A worker that finds the lock taken first does
the work queued in :attr:`FirstCalls.meanwhile` (a chain's later functions, rewritten
ahead, and their C modules compiled: :mod:`synkhronos.rank.chain_part`), one piece at a
time, as long as the lock stays taken (:meth:`FirstCalls.held_by_another`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)


class FirstCalls:
    """The lock that first calls of a rank's compiled functions take.

    Parameters
    ----------
    fd : int or None
        An open file descriptor of a file every rank of the session opened (the control
        segment); None takes no lock.
    wait : bool
        Wait for the lock (workers), or go on without it when another rank holds it
        (rank 0).
    share : (int, int)
        This rank's index and the number of ranks that compile each function together:
        each compiles its share of a graph's C modules
        (:mod:`synkhronos.rank.c_modules`).
    """

    def __init__(self, fd: int | None, wait: bool, share: tuple[int, int] = (0, 1)):
        self.fd, self.wait, self.share = fd, wait, share
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

    def _take(self) -> bool:
        """Take the lock, waiting if :attr:`wait`; whether this rank holds it now."""
        assert self.fd is not None
        if self._try():
            return True
        if not self.wait:
            return False  # rank 0, and a worker compiles: compile alongside it
        while self.meanwhile:
            key = next(iter(self.meanwhile))
            try:
                self.meanwhile.pop(key)()
            except Exception as error:  # noqa: BLE001 - the compile that needs it reports it
                logger.debug("synkhronos: work done while waiting failed (%s)", error)
            if self._try():
                return True
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return True

    @contextlib.contextmanager
    def one_at_a_time(self) -> Iterator[None]:
        """Hold the lock, as far as :attr:`wait` allows, for the enclosed first call."""
        if self.fd is None or not self._take():
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
