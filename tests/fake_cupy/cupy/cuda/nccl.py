"""Fake ``cupy.cuda.nccl``: CuPy's NCCL bindings, run between CPU processes.

Same names, signatures, constants (from CuPy's ``cupy_backends/cuda/libs/nccl.pxd``) and
argument conversions as CuPy's Cython module: pointers, counts, datatypes, ops, roots and
streams must be integers, the unique id a tuple of 128 C ``char`` values. Collectives
really move data between processes: each communicator maps a POSIX shared-memory segment
with one slot per rank and a semaphore barrier, both named from the unique id (and
``$FAKE_NCCL_PREFIX``, "fakenccl" by default), and reads and writes the buffers at the raw
pointers it is given. Calls run at once, also inside ``groupStart``/``groupEnd`` (every
rank issues them in the same order). Unlike NCCL, a mismatch between ranks' calls, a pointer
outside any live fake-CuPy buffer, or a rank that never comes (``$FAKE_NCCL_TIMEOUT``
seconds, default 60) raises :class:`NcclError` instead of hanging or corrupting memory.
"""

from __future__ import annotations

import ctypes
import mmap
import operator
import os

import numpy as np
import posix_ipc

NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_INT8 = NCCL_CHAR = 0
NCCL_UINT8 = 1
NCCL_INT32 = NCCL_INT = 2
NCCL_UINT32 = 3
NCCL_INT64 = 4
NCCL_UINT64 = 5
NCCL_FLOAT16 = NCCL_HALF = 6
NCCL_FLOAT32 = NCCL_FLOAT = 7
NCCL_FLOAT64 = NCCL_DOUBLE = 8
NCCL_BFLOAT16 = 9

available = True

_UNIQUE_ID_BYTES = 128
_DTYPES = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32,
           NCCL_UINT32: np.uint32, NCCL_INT64: np.int64, NCCL_UINT64: np.uint64,
           NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32, NCCL_FLOAT64: np.float64}
_UFUNCS = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum,
           NCCL_MIN: np.minimum, NCCL_AVG: np.add}
_ERRORS = {1: "NCCL_ERROR_UNHANDLED_CUDA_ERROR", 2: "NCCL_ERROR_SYSTEM_ERROR",
           3: "NCCL_ERROR_INTERNAL_ERROR", 4: "NCCL_ERROR_INVALID_ARGUMENT",
           5: "NCCL_ERROR_INVALID_USAGE"}
_ALLREDUCE, _REDUCE, _BROADCAST = 1, 2, 3
_SLOT = 1 << 20  # bytes per rank per round; larger buffers go in several rounds
_DESC = 8  # int64 words describing a rank's current call
_INT_MAX = 2**31 - 1


class NcclError(RuntimeError):
    """An NCCL status other than success (CuPy's ``NcclError``)."""

    def __init__(self, status: int, detail: str = ""):
        self.status = status
        super().__init__(f"{_ERRORS.get(status, status)}: {detail}")

    def __reduce__(self):
        return (type(self), (self.status,))


# ---- argument conversion, as Cython converts Python objects to C types ---------------------
def _integer(value, name: str, lo: int, hi: int, ctype: str) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"an integer is required for {name} ({ctype}), "
                        f"got {type(value).__name__}") from None
    if not lo <= value <= hi:
        raise OverflowError(f"{name}={value} does not fit in {ctype}")
    return value


def _int(value, name: str) -> int:
    return _integer(value, name, -_INT_MAX - 1, _INT_MAX, "int")


def _intptr(value, name: str) -> int:
    return _integer(value, name, -(2**63), 2**63 - 1, "intptr_t")


def _size_t(value, name: str) -> int:
    return _integer(value, name, 0, 2**64 - 1, "size_t")


# ---- module functions ---------------------------------------------------------------------
def get_build_version() -> int:
    return 22703


def get_version() -> int:
    return 22703


def get_unique_id() -> tuple:
    """128 random C ``char`` values (signed), as CuPy returns ``ncclUniqueId``."""
    return tuple(int(c) for c in np.frombuffer(os.urandom(_UNIQUE_ID_BYTES), np.int8))


_group_depth = 0


def groupStart() -> None:
    global _group_depth
    _group_depth += 1


def groupEnd() -> None:
    global _group_depth
    if _group_depth == 0:
        raise NcclError(5, "groupEnd without groupStart")
    _group_depth -= 1


def _memory(ptr: int, nbytes: int, write: bool) -> np.ndarray:
    """The bytes at ``ptr``, once checked to lie inside one live fake-CuPy buffer."""
    import cupy

    for start, size, writable in list(cupy._live.values()):
        if start <= ptr and ptr + nbytes <= start + size:
            if write and not writable:
                raise NcclError(4, f"writing {nbytes} bytes at {ptr:#x}, memory a DLPack "
                                   f"producer owns (read-only)")
            return np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(ptr))
    raise NcclError(4, f"{nbytes} bytes at {ptr:#x} are not inside any live buffer")


class NcclCommunicator:
    """One rank's communicator (``ncclCommInitRank``); returns once every rank has joined.

    Parameters
    ----------
    ndev : int
        Number of ranks.
    commId : tuple
        The unique id from :func:`get_unique_id`, the same on every rank.
    rank : int
        This rank, in ``0..ndev-1``.
    """

    def __init__(self, ndev, commId, rank):
        self._comm = 0
        ndev, rank = _int(ndev, "ndev"), _int(rank, "rank")
        if not isinstance(commId, tuple):
            raise TypeError(f"Argument 'commId' has incorrect type (expected tuple, got "
                            f"{type(commId).__name__})")
        assert len(commId) == _UNIQUE_ID_BYTES
        raw = bytes(_integer(c, "commId[i]", -128, 127, "char") & 0xFF for c in commId)
        if not 0 <= rank < ndev:
            raise NcclError(4, f"rank {rank} is not in 0..{ndev - 1}")
        self._n, self._rank, self._calls = ndev, rank, 0
        self._timeout = float(os.environ.get("FAKE_NCCL_TIMEOUT", "60"))
        self._name = f"{os.environ.get('FAKE_NCCL_PREFIX', 'fakenccl')}_{raw[:8].hex()}"
        # Every rank creates or attaches, whichever comes first: no rank waits for another
        # to create them, and the barrier below makes sure all have them before any unlink.
        size = ndev * (_DESC * 8 + _SLOT)
        shm = posix_ipc.SharedMemory("/" + self._name, posix_ipc.O_CREAT, size=size)
        try:
            self._map = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        self._sems = [posix_ipc.Semaphore(f"/{self._name}_{r}", posix_ipc.O_CREAT,
                                          initial_value=0) for r in range(ndev)]
        self._desc = np.ndarray((ndev, _DESC), np.int64, self._map)
        self._slots = np.ndarray((ndev, _SLOT), np.uint8, self._map, ndev * _DESC * 8)
        self._comm = 1
        self._barrier()

    @property
    def comm(self) -> int:
        return self._comm

    def rank_id(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._n

    def device_id(self) -> int:
        return 0

    def destroy(self) -> None:
        """Release this rank's handle and unlink the shared names (any rank may: every
        rank has opened them once initialisation returned)."""
        if not self._comm:
            return
        self._comm = 0
        names = [(posix_ipc.unlink_shared_memory, "/" + self._name)]
        names += [(posix_ipc.unlink_semaphore, s.name) for s in self._sems]
        for sem in self._sems:
            sem.close()
        for unlink, name in names:
            try:
                unlink(name)
            except posix_ipc.ExistentialError:
                pass  # another rank was first

    abort = destroy

    def __del__(self):
        if getattr(self, "_comm", 0):
            self.destroy()

    # ---- collectives ---------------------------------------------------------------------
    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        self._collective(_ALLREDUCE, sendbuf, recvbuf, count, datatype, op, None, stream)

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        self._collective(_REDUCE, sendbuf, recvbuf, count, datatype, op, root, stream)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        self._collective(_BROADCAST, sendbuff, recvbuff, count, datatype, None, root, stream)

    def bcast(self, buff, count, datatype, root, stream):
        self._collective(_BROADCAST, buff, buff, count, datatype, None, root, stream)

    def _collective(self, kind, send, recv, count, datatype, op, root, stream) -> None:
        send, recv = _intptr(send, "sendbuf"), _intptr(recv, "recvbuf")
        count, datatype = _size_t(count, "count"), _int(datatype, "datatype")
        op = -1 if op is None else _int(op, "op")
        root = -1 if root is None else _int(root, "root")
        _intptr(stream, "stream")
        if not self._comm:
            raise NcclError(4, "communicator destroyed")
        if datatype not in _DTYPES or (kind != _BROADCAST and op not in _UFUNCS):
            raise NcclError(4, f"datatype {datatype} or op {op} is not supported")
        if kind != _ALLREDUCE and not 0 <= root < self._n:
            raise NcclError(4, f"root {root} is not in 0..{self._n - 1}")
        if count == 0:
            return  # NCCL returns at once for empty collectives
        dtype = np.dtype(_DTYPES[datatype])
        nbytes = count * dtype.itemsize
        sends = kind != _BROADCAST or self._rank == root
        writes = kind != _REDUCE or self._rank == root
        src = _memory(send, nbytes, write=False).view(dtype) if sends else None
        dst = _memory(recv, nbytes, write=True).view(dtype) if writes else None
        self._calls += 1
        self._desc[self._rank] = (self._calls, kind, count, datatype, op, root, 0, 0)
        per_round = _SLOT // dtype.itemsize
        for lo in range(0, count, per_round):
            hi = min(count, lo + per_round)
            if sends:
                self._slots[self._rank, :(hi - lo) * dtype.itemsize].view(dtype)[:] = src[lo:hi]
            self._barrier()
            if lo == 0:
                self._check_calls()
            if writes:
                self._combine(kind, op, root, dtype, hi - lo, dst[lo:hi])
            self._barrier()  # slots are read: the next round or call may write them

    def _check_calls(self) -> None:
        """Every rank raises when the ranks' calls differ (NCCL would hang or corrupt)."""
        if not (self._desc == self._desc[0]).all():
            rows = "; ".join(f"rank {r}: {list(d[:6])}" for r, d in enumerate(self._desc))
            raise NcclError(5, f"ranks' calls differ [call#, kind, count, datatype, op, "
                               f"root]: {rows}")

    def _combine(self, kind, op, root, dtype, n, out) -> None:
        slots = [self._slots[r, :n * dtype.itemsize].view(dtype) for r in range(self._n)]
        if kind == _BROADCAST:
            out[:] = slots[root]
            return
        acc = slots[0].copy()
        for part in slots[1:]:  # in rank order, the same result on every rank
            _UFUNCS[op](acc, part, out=acc)
        if op == NCCL_AVG:
            np.copyto(acc, acc / self._n, casting="unsafe")
        out[:] = acc

    def _barrier(self) -> None:
        for r, sem in enumerate(self._sems):
            if r != self._rank:
                sem.release()
        for _ in range(self._n - 1):
            try:
                self._sems[self._rank].acquire(self._timeout)
            except posix_ipc.BusyError:
                raise NcclError(2, f"rank {self._rank}: no word from the other ranks in "
                                   f"{self._timeout} s") from None
