"""Named POSIX shared-memory segments, array messages inside them, and clean-up.

Every name this package creates starts with the session prefix, so that one sweep of
``/dev/shm`` (:func:`sweep`) removes whatever a session left, whichever rank made it; the
prefix holds rank 0's pid, so names left by a program that died can be told from those of
a live one (:func:`sweep_dead`). Segments are allocated in full when created
(``posix_fallocate``): POSIX shared memory is otherwise allocated lazily, and touching a
page that a full ``/dev/shm`` cannot back kills the process with SIGBUS.
"""

from __future__ import annotations

import atexit
import errno
import mmap
import os
import re
import secrets

import numpy as np
import posix_ipc

SHM_DIR = "/dev/shm"
NAME_PREFIX = "synk"
ALIGN = 64  # bytes; array starts in a message are aligned for SIMD loads

# dtype codes travel as integers in control words: index into this table.
DTYPES = tuple(
    np.dtype(d)
    for d in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
)
DTYPE_CODES = {d: i for i, d in enumerate(DTYPES)}
MAX_NDIM = 8
DESC_WORDS = 3 + MAX_NDIM  # dtype code, ndim, byte offset, shape


class SharedMemoryFull(MemoryError):
    """``/dev/shm`` has not enough free space for a segment synkhronos needs."""


def free_bytes() -> int:
    """Bytes free in ``/dev/shm`` for this user."""
    stat = os.statvfs(SHM_DIR)
    return stat.f_bavail * stat.f_frsize


def _full_error(name: str, size: int, free: int) -> SharedMemoryFull:
    return SharedMemoryFull(
        f"synkhronos needs a shared-memory segment of {_mib(size)} ({name}) but {SHM_DIR} has "
        f"{_mib(free)} free; free space there, enlarge it (e.g. docker run --shm-size=8g), "
        f"or use smaller arrays")


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def new_session_name() -> str:
    """A fresh, unique prefix for one fork's segments and semaphores."""
    return f"{NAME_PREFIX}_{os.getpid()}_{secrets.token_hex(4)}"


_process_prefix: str | None = None


def process_prefix() -> str:
    """This process's name prefix, made on first use; an exit hook sweeps it."""
    global _process_prefix
    if _process_prefix is None:
        _process_prefix = new_session_name()
        atexit.register(sweep, _process_prefix)
    return _process_prefix


def dtype_code(dtype) -> int:
    """The integer code of ``dtype``; ``TypeError`` for dtypes that cannot travel."""
    try:
        return DTYPE_CODES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"synkhronos cannot share arrays of dtype {np.dtype(dtype)}") from None


def sweep(session: str) -> list[str]:
    """Unlink every segment and semaphore named ``<session>_...``.

    Returns the names removed. Safe to call from several processes at once.
    """
    removed = []
    stem = session + "_"
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for entry in entries:
        try:
            if entry.startswith(stem):
                posix_ipc.unlink_shared_memory("/" + entry)
            elif entry.startswith("sem." + stem):
                posix_ipc.unlink_semaphore("/" + entry[4:])
            else:
                continue
        except posix_ipc.ExistentialError:
            continue
        removed.append(entry)
    return removed


_OWNER = re.compile(rf"^(?:sem\.)?{NAME_PREFIX}_(\d+)_")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def sweep_dead() -> list[str]:
    """Unlink every synkhronos name in ``/dev/shm`` whose owner (rank 0's pid) is gone.

    Names of live processes are left alone, so programs running side by side are safe.
    Returns the names removed.
    """
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    dead = set()
    for entry in entries:
        match = _OWNER.match(entry)
        if match and not _pid_alive(int(match.group(1))):
            dead.add(entry[4:] if entry.startswith("sem.") else entry)
    removed = []
    for stem in sorted({"_".join(name.split("_")[:3]) for name in dead}):
        removed += sweep(stem)
    return removed


class Segment:
    """One mapped shared-memory segment.

    Parameters
    ----------
    name : str
        POSIX name without the leading slash.
    size : int
        Bytes to allocate when ``create`` is true; ignored when attaching.
    create : bool
        Create (exclusively) rather than attach to an existing segment.
    keep_fd : bool
        Keep the segment's file descriptor open as :attr:`fd` (for ``flock``; closed by
        :meth:`close_fd`), rather than closing it once mapped.
    """

    def __init__(self, name: str, size: int = 0, create: bool = False,
                 keep_fd: bool = False):
        size = max(int(size), ALIGN)
        if create and size > free_bytes():
            raise _full_error(name, size, free_bytes())
        flags = posix_ipc.O_CREX if create else 0
        shm = posix_ipc.SharedMemory("/" + name, flags, size=size if create else 0)
        try:
            if create:
                self._allocate(shm, size)
            self.size = shm.size
            self.map = mmap.mmap(shm.fd, self.size)
        except BaseException:
            shm.close_fd()
            raise
        if not keep_fd:
            shm.close_fd()
        self.fd: int | None = shm.fd if keep_fd else None
        self.name = name

    def close_fd(self) -> None:
        """Close the file descriptor kept with ``keep_fd`` (the mapping stays)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    @staticmethod
    def _allocate(shm: posix_ipc.SharedMemory, size: int) -> None:
        """Back every page now: an error here instead of a SIGBUS at first touch."""
        try:
            os.posix_fallocate(shm.fd, 0, size)
        except OSError as error:
            if error.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                return  # a file system without fallocate: the free-space check must do
            shm.unlink()
            if error.errno == errno.ENOSPC:
                raise _full_error(shm.name.lstrip("/"), size, free_bytes()) from None
            raise

    def array(self, dtype, shape, offset: int = 0) -> np.ndarray:
        """A numpy view of the segment's bytes starting at ``offset``."""
        return np.ndarray(shape, dtype=dtype, buffer=self.map, offset=offset)

    def unlink(self) -> None:
        """Remove the name; the memory lives on while any process still maps it."""
        try:
            posix_ipc.unlink_shared_memory("/" + self.name)
        except posix_ipc.ExistentialError:
            pass


class GrowingSegment:
    """A segment that one process writes and may reallocate; others follow it.

    A reallocation creates ``<base>_<generation+1>`` and unlinks the old name. Readers learn
    the generation from control words and re-attach when it changes.
    """

    def __init__(self, base: str):
        self.base = base
        self.generation = -1
        self.segment: Segment | None = None

    @property
    def size(self) -> int:
        return 0 if self.segment is None else self.segment.size

    def reserve(self, nbytes: int, oversize: float = 1.0) -> None:
        """(Owner) make room for ``nbytes``, reallocating only when it does not fit."""
        if self.segment is not None and self.segment.size >= nbytes:
            return
        old = self.segment
        # Create before counting the generation: a failure (a full /dev/shm) leaves the
        # old segment in use.
        self.segment = Segment(f"{self.base}_{self.generation + 1}", int(nbytes * oversize),
                               True)
        self.generation += 1
        if old is not None:
            old.unlink()

    def follow(self, generation: int) -> None:
        """(Reader) attach to ``generation`` if not attached to it already."""
        if generation != self.generation:
            self.segment = Segment(f"{self.base}_{generation}")
            self.generation = generation

    def unlink(self) -> None:
        if self.segment is not None:
            self.segment.unlink()

    def release(self) -> None:
        """(Owner) unlink and forget the segment; the next reserve allocates anew."""
        self.unlink()
        self.segment = None


def message_words(max_arrays: int) -> int:
    """Control words needed by a message header holding up to ``max_arrays`` arrays."""
    return 2 + max_arrays * DESC_WORDS


class Mailbox:
    """Arrays written by one owner into a growing segment, described in control words.

    Header layout (int64 words): ``[generation, n_arrays, desc_0, desc_1, ...]`` with each
    descriptor ``[dtype code, ndim, byte offset, shape...]``.

    Parameters
    ----------
    base : str
        Name stem of the data segment.
    header : numpy.ndarray
        The int64 control words reserved for this mailbox (shared by every rank).
    """

    def __init__(self, base: str, header: np.ndarray):
        self.data = GrowingSegment(base)
        self.header = header
        self.max_arrays = (len(header) - 2) // DESC_WORDS

    def post(self, arrays, oversize: float = 1.25, copy: bool = True) -> list[np.ndarray]:
        """(Owner) describe ``arrays`` in the header and copy them into the segment.

        Returns the views in the segment; with ``copy=False`` they are left for the caller
        to fill (with only the parts others will read, say).
        """
        arrays = [np.asarray(a) for a in arrays]
        if len(arrays) > self.max_arrays:
            raise ValueError(f"cannot send more than {self.max_arrays} arrays in one message")
        # Descriptors are built as one Python list and written with one numpy assignment:
        # word-by-word writes into the header cost more than the rest of a small message.
        words, offsets, end = [], [], 0
        for a in arrays:
            if a.ndim > MAX_NDIM:
                raise ValueError(f"cannot send arrays of more than {MAX_NDIM} dimensions")
            words += [dtype_code(a.dtype), a.ndim, end, *a.shape]
            words += [0] * (MAX_NDIM - a.ndim)
            offsets.append(end)
            end += -(-a.nbytes // ALIGN) * ALIGN
        self.data.reserve(end, oversize)
        self.header[1] = len(arrays)
        self.header[2: 2 + len(words)] = words
        segment = self.data.segment
        views = []
        for a, offset in zip(arrays, offsets, strict=True):
            view = segment.array(a.dtype, a.shape, offset)
            if copy and a.nbytes:
                view[...] = a
            views.append(view)
        self.header[0] = self.data.generation
        return views

    def _descriptors(self) -> list[list[int]]:
        words = self.header[2: 2 + int(self.header[1]) * DESC_WORDS].tolist()
        return [words[i: i + DESC_WORDS] for i in range(0, len(words), DESC_WORDS)]

    def offsets(self) -> list[int]:
        """Byte offsets of the arrays last posted."""
        return [desc[2] for desc in self._descriptors()]

    def read(self) -> list[np.ndarray]:
        """(Anyone) views of the arrays last posted; copy them to keep them."""
        if not self.header[1]:
            return []  # nothing to attach to (STOP reads this way after its names are gone)
        self.data.follow(int(self.header[0]))
        segment = self.data.segment
        return [segment.array(DTYPES[code], tuple(shape[:ndim]), offset)
                for code, ndim, offset, *shape in self._descriptors()]
