"""Fake ``cupy.cuda``: the current stream. NCCL is :mod:`cupy.cuda.nccl`, imported on use
as in CuPy."""

from __future__ import annotations

__all__ = ["Stream", "get_current_stream"]


class Stream:
    """A CUDA stream handle; the fake NCCL finishes every call before returning.

    Parameters
    ----------
    ptr : int
        The ``cudaStream_t`` value (0: the legacy default stream, CuPy's ``Stream.null``).
    """

    null: Stream

    def __init__(self, ptr: int = 0):
        self.ptr = ptr
        self.synchronized = 0  # calls to synchronize(), for tests that care

    def synchronize(self) -> None:
        self.synchronized += 1


Stream.null = Stream(0)


def get_current_stream(device_id: int = -1) -> Stream:
    """CuPy's current stream: the null stream unless a stream was made current."""
    return Stream.null
