"""A CPU stand-in for the parts of CuPy that ``synkhronos.transport.comm.nccl`` uses (tests only).

Put ``tests/fake_cupy`` first on ``PYTHONPATH`` to use it. "Device" memory is host memory:
an :class:`ndarray` wraps a numpy array and shows its address as ``.data.ptr``, so that the
fake NCCL (:mod:`cupy.cuda.nccl`) works on raw pointers as the real one does. Every live
buffer's address range is recorded, with whether it may be written, so that the fake NCCL
can refuse pointers and counts that would run outside a buffer (real NCCL would corrupt
memory or crash) and writes into memory a DLPack producer such as JAX still owns.
"""

from __future__ import annotations

import weakref

import numpy as np

from . import cuda

__all__ = ["cuda", "empty", "from_dlpack", "ndarray"]

_ALIGN = 256  # bytes, as CuPy's allocator aligns device memory
_live: dict[int, tuple[int, int, bool]] = {}  # id(array) -> (address, bytes, writable)


class MemoryPointer:
    """The address of an array's first byte, as ``cupy.cuda.MemoryPointer.ptr``."""

    def __init__(self, ptr: int):
        self.ptr = ptr


class ndarray:
    """A "device" array: a numpy array in host memory.

    Parameters
    ----------
    host : numpy.ndarray
        The memory (C-contiguous).
    writable : bool
        False for memory borrowed from a DLPack producer, which it still owns.
    """

    def __init__(self, host: np.ndarray, writable: bool = True):
        if not host.flags.c_contiguous:
            raise ValueError("the fake CuPy holds C-contiguous arrays only")
        self._host = host
        self.data = MemoryPointer(int(host.ctypes.data))
        _live[id(self)] = (self.data.ptr, host.nbytes, writable)
        weakref.finalize(self, _live.pop, id(self), None)

    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    size = property(lambda self: self._host.size)
    nbytes = property(lambda self: self._host.nbytes)
    ndim = property(lambda self: self._host.ndim)

    def get(self) -> np.ndarray:
        """A host copy (``cupy.ndarray.get``)."""
        return self._host.copy()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        # Real CuPy orders ``stream`` after its current stream; host memory needs nothing,
        # and numpy refuses any stream on the CPU.
        if stream is not None and not isinstance(stream, int):
            raise TypeError(f"stream must be None or an int, got {type(stream).__name__}")
        kwargs = {k: v for k, v in (("max_version", max_version), ("dl_device", dl_device),
                                    ("copy", copy)) if v is not None}
        return self._host.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._host.__dlpack_device__()

    def __repr__(self) -> str:
        return f"fake_cupy.ndarray({self._host!r})"


def empty(shape, dtype=float, order: str = "C") -> ndarray:
    """New uninitialised "device" memory, aligned as CuPy's."""
    if order != "C":
        raise NotImplementedError("the fake CuPy allocates C order only")
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return ndarray(raw[start:start + nbytes].view(dtype).reshape(shape))


def from_dlpack(array, *, device=None, copy=None) -> ndarray:
    """Zero-copy import of a DLPack producer's (JAX's) memory, which stays read-only.

    Host arrays are refused, as by real CuPy, which accepts only device memory; a JAX CPU
    array stands for device memory here.
    """
    if device is not None:
        raise NotImplementedError("from_dlpack() does not support device yet.")
    if isinstance(array, np.ndarray | np.generic):
        raise TypeError("CPU arrays cannot be directly imported to CuPy. "
                        "Use `cupy.array(numpy.from_dlpack(input))` instead.")
    host = np.from_dlpack(array, copy=copy)
    return ndarray(host, writable=bool(copy))
