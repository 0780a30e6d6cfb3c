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
releases the lock of a process that dies.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator


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

    @contextlib.contextmanager
    def one_at_a_time(self) -> Iterator[None]:
        """Hold the lock, as far as :attr:`wait` allows, for the enclosed first call."""
        if self.fd is None:
            yield
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX if self.wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # rank 0, and a worker compiles: compile alongside it
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
