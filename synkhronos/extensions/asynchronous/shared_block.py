"""A vector in host shared memory that ranks change under a lock, safe against a dying holder.

The lock is ``fcntl.flock`` on the segment's own file in ``/dev/shm``: the kernel
releases it when the holding process dies, however it dies, so nobody waits forever. The
lock belongs to the open file, not the process: each :class:`SharedBlock` opens its own
(so two in one process exclude each other too), and the descriptor is not inherited by
``exec``'d children (workers are started that way). A process that ``os.fork`` s while
holding the lock would share it with its child, so exchanges never fork. What
the dead holder was writing may be half-written, so the segment's header keeps an *owner*
and a *dirty* word: the holder sets dirty on entry and clears it on a clean exit, and the
next rank to take the lock and find it set raises :class:`HolderDied` naming the owner
instead of using the values.

The segment's name starts with the fork's session name, so the session's sweep removes
it whatever happens; :meth:`SharedBlock.unlink` removes it earlier.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from synkhronos.transport.names import SHM_DIR
from synkhronos.transport.shm import ALIGN, Segment

__all__ = ["HolderDied", "SharedBlock", "DIE_HOLDING_LOCK"]

OWNER, DIRTY, SEQUENCE = 0, 1, 2  # header words
HEADER_WORDS = ALIGN // 8
LOCK_POLL_S = 50e-6  # between tries of a busy lock
CHECK_S = 0.05  # between calls of a waiter's check (it reads /proc: not on every try)

DIE_HOLDING_LOCK = "SYNK_TEST_DIE_HOLDING_LOCK"
"""Environment variable (a rank) for tests: that rank kills itself (SIGKILL) right after it
takes a lock and marks the block dirty, as a rank dying mid-exchange would. Read once, when
this module is imported (a worker imports it after the test set the variable)."""
_DIE_RANK = os.environ.get(DIE_HOLDING_LOCK)


class HolderDied(RuntimeError):
    """A rank died (or failed) while holding a block's lock: its values may be half-written."""


class SharedBlock:
    """``size`` values of ``dtype`` in shared memory, plus header words, behind a lock.

    Parameters
    ----------
    name : str
        Segment name (no leading slash); start it with the session's name.
    size : int
        Number of values (ignored when attaching: the segment's size tells).
    dtype : dtype
        Their dtype.
    create : bool
        Create the segment (zeros) rather than attach to it.

    Examples
    --------
    >>> from synkhronos.transport.names import new_session_name
    >>> block = SharedBlock(new_session_name() + "_doc", 3, "float64", create=True)
    >>> with block.locked(rank=0) as values:
    ...     values += 1.5
    >>> block.read(rank=0)
    array([1.5, 1.5, 1.5])
    >>> block.unlink()
    """

    def __init__(self, name: str, size: int, dtype, create: bool):
        self._fd = -1  # set first: __del__ runs even when attaching fails
        dtype = np.dtype(dtype)
        self.name = name
        self.segment = Segment(name, ALIGN + size * dtype.itemsize, create)
        if not create:
            size = (self.segment.size - ALIGN) // dtype.itemsize
        self.header = self.segment.array(np.int64, (HEADER_WORDS,))
        self.values = self.segment.array(dtype, (size,), ALIGN)
        self._fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)

    @property
    def sequence(self) -> int:
        """How many changes were made under the lock (read under the lock); a :meth:`read`
        does not count."""
        return int(self.header[SEQUENCE])

    @contextmanager
    def locked(
        self, rank: int, check: Callable[[], None] | None = None, count: bool = True
    ) -> Iterator[np.ndarray]:
        """Hold the lock as ``rank``; yields the values to read and change in place.

        ``check`` is called while the lock is busy (it raises to give up); with ``count``
        a clean release adds one to :attr:`sequence`. An exception inside the block leaves
        the block dirty: its values may be half-changed.

        Raises
        ------
        HolderDied
            If the previous holder did not release the block cleanly.
        """
        next_check = time.monotonic() + CHECK_S
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if check is not None and time.monotonic() >= next_check:
                    check()
                    next_check = time.monotonic() + CHECK_S
                time.sleep(LOCK_POLL_S)
        try:
            if self.header[DIRTY]:
                raise HolderDied(
                    f"rank {int(self.header[OWNER])} died or failed while holding the lock "
                    f"of {self.name}; its values may be half-written, so they are not used"
                )
            self.header[OWNER], self.header[DIRTY] = rank, 1
            if _DIE_RANK == str(rank):
                os.kill(os.getpid(), signal.SIGKILL)
            yield self.values
            self.header[SEQUENCE] += count
            self.header[DIRTY] = 0
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def read(self, rank: int, check: Callable[[], None] | None = None) -> np.ndarray:
        """A copy of the values, taken under the lock."""
        with self.locked(rank, check, count=False) as values:
            return values.copy()

    def close(self) -> None:
        """Release this process's lock file descriptor (the mapping goes with the object)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def unlink(self) -> None:
        """Close and remove the segment's name (processes still attached keep their map)."""
        self.close()
        self.segment.unlink()

    def __del__(self):
        self.close()
