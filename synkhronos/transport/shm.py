"""Named POSIX shared-memory segments, and array messages inside them.

Every name is made under the session's or the process's prefix
(:mod:`synkhronos.transport.names`: unguessable, private, swept once their program is dead).
Segments are allocated in full when created (``posix_fallocate``): POSIX shared memory is
otherwise allocated lazily, and touching a page that a full ``/dev/shm`` cannot back kills
the process with SIGBUS. A segment that must grow is made anew under the next free
generation (:class:`GrowingSegment`), so a name someone else took is skipped.
"""

from __future__ import annotations

import errno
import mmap
import os

import numpy as np
import posix_ipc

from synkhronos.transport.names import NAME_ATTEMPTS, SHM_DIR, NameTaken, taken

ALIGN = 64  # bytes; array starts in a message are aligned for SIMD loads

# dtype codes travel as integers in control words: index into this table.
DTYPES = tuple(
    np.dtype(d)
    for d in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
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
        f"or use smaller arrays"
    )


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def dtype_code(dtype) -> int:
    """The integer code of ``dtype``; ``TypeError`` for dtypes that cannot travel."""
    try:
        return DTYPE_CODES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise TypeError(f"synkhronos cannot share arrays of dtype {dtype}") from None


def check_travels(dtype, ndim: int, what: str) -> None:
    """Refuse, naming ``what``, an array that the wire protocol cannot carry: a dtype
    outside :data:`DTYPES` (``TypeError``) or more than :data:`MAX_NDIM` dimensions
    (``ValueError``).

    Examples
    --------
    >>> check_travels("float32", 9, "output 0")
    Traceback (most recent call last):
    ...
    ValueError: output 0 has 9 dimensions; arrays sent between ranks have at most 8
    """
    if np.dtype(dtype) not in DTYPE_CODES:
        raise TypeError(
            f"{what} has dtype {np.dtype(dtype)}, which cannot be sent between "
            f"ranks (they take {', '.join(d.name for d in DTYPES)})"
        )
    if ndim > MAX_NDIM:
        raise ValueError(
            f"{what} has {ndim} dimensions; arrays sent between ranks have at most {MAX_NDIM}"
        )


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

    def __init__(self, name: str, size: int = 0, create: bool = False, keep_fd: bool = False):
        size = max(int(size), ALIGN)
        if create and size > free_bytes():
            raise _full_error(name, size, free_bytes())
        flags = posix_ipc.O_CREX if create else 0
        try:
            shm = posix_ipc.SharedMemory("/" + name, flags, mode=0o600, size=size if create else 0)
        except posix_ipc.ExistentialError:
            if create:
                raise taken(name) from None
            raise
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

    @property
    def attached(self) -> Segment:
        """The segment, once :meth:`reserve` or :meth:`follow` made or found it."""
        if self.segment is None:
            raise RuntimeError(f"{self.base}: no segment reserved or followed yet")
        return self.segment

    def reserve(self, nbytes: int, oversize: float = 1.0) -> None:
        """(Owner) make room for ``nbytes``, reallocating only when it does not fit.

        Generations whose name someone else took are skipped (readers learn the generation
        from the control words); :class:`~synkhronos.transport.names.NameTaken` after
        :data:`~synkhronos.transport.names.NAME_ATTEMPTS` of them.
        """
        if self.segment is not None and self.segment.size >= nbytes:
            return
        old = self.segment
        # Create before counting the generation: a failure (a full /dev/shm) leaves the
        # old segment in use.
        for tries in range(1, NAME_ATTEMPTS + 1):
            name = f"{self.base}_{self.generation + tries}"
            try:
                self.segment = Segment(name, int(nbytes * oversize), True)
                break
            except NameTaken:
                if tries == NAME_ATTEMPTS:
                    raise taken(name, tries) from None
        self.generation += tries
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
        self.header[2 : 2 + len(words)] = words
        segment = self.data.attached
        views = []
        for a, offset in zip(arrays, offsets, strict=True):
            view = segment.array(a.dtype, a.shape, offset)
            if copy and a.nbytes:
                view[...] = a
            views.append(view)
        self.header[0] = self.data.generation
        return views

    def _descriptors(self) -> list[list[int]]:
        words = self.header[2 : 2 + int(self.header[1]) * DESC_WORDS].tolist()
        return [words[i : i + DESC_WORDS] for i in range(0, len(words), DESC_WORDS)]

    def offsets(self) -> list[int]:
        """Byte offsets of the arrays last posted."""
        return [desc[2] for desc in self._descriptors()]

    def read(self) -> list[np.ndarray]:
        """(Anyone) views of the arrays last posted; copy them to keep them."""
        if not self.header[1]:
            return []  # nothing to attach to (STOP reads this way after its names are gone)
        self.data.follow(int(self.header[0]))
        segment = self.data.attached
        return [
            segment.array(DTYPES[code], tuple(shape[:ndim]), offset)
            for code, ndim, offset, *shape in self._descriptors()
        ]
