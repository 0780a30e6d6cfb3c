"""First calls one rank at a time, so that the other ranks load the first one's compile.

PyTensor's default mode compiles a function's machine code (Numba) at its first call and
keeps it in an on-disk cache. Ranks making the same first call together would each compile
the same code: n times the CPU time and the memory of one compile, and a large graph's
compile takes minutes and gigabytes. So each rank's first call of a compiled function runs
under an exclusive lock (``flock``) on the session's control segment: the first rank to
take it compiles and fills the cache, the others then load from it.

Rank 0 never waits for the lock: it must stay free to watch the workers, so when a worker
holds the lock it compiles without it, as it would have anyway. Workers wait; the kernel
releases the lock of a process that dies. JAX mode keeps no compiled code on disk, so its
first calls are left to run together.
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
    """

    def __init__(self, fd: int | None, wait: bool):
        self.fd, self.wait = fd, wait

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
