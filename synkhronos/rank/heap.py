"""Every rank's heap: keep freed memory for the next step instead of giving it back.

glibc serves an allocation above a threshold (128 KiB, rising with use to at most 32
MiB) with a fresh ``mmap``, and gives it back to the system when it is freed; memory
freed at the top of the heap goes back too. A compiled PyTensor function allocates its
outputs and intermediates anew at every call, so on a large model each step maps its
arrays again and pays a page fault per 4 KiB on first touch. On the 2-core Zen 5 VM of
``bench/RESULTS.md``, one core, the one-process step of a 784-4096-4096-10 MLP at 128
rows took 248 ms with glibc's defaults and 190 ms with the settings below; SGD's update
of 25M parameters in new arrays took 43.6 against 7.3 ms.

:func:`keep_freed_memory` raises the ``mmap`` threshold and the trim threshold to
:data:`KEEP_BYTES` through glibc's ``mallopt``: allocations up to that size come from the
heap, and up to that much free memory stays at its top. :func:`synkhronos.fork` applies
it to every rank, rank 0 included, and :func:`synkhronos.close` undoes it in rank 0.

The cost is memory. While forked a process keeps what it frees, in rank 0 for the whole
program and not only for synkhronos' arrays (a 900 MiB array freed after copying it into
:func:`synkhronos.data` stays in the process), and the heap can only shrink from its top.
Nothing changes where the environment variable ``SYNK_KEEP_MEMORY`` is ``0``, where the
user set glibc's malloc settings (``MALLOC_*_`` variables, ``glibc.malloc`` tunables),
elsewhere than glibc, and before glibc 2.35 (which refuses an ``mmap`` threshold above 32
MiB).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

KEEP_BYTES = 1 << 30
"""Allocations up to this size come from the heap, and free memory up to it stays."""

KEEP_VAR = "SYNK_KEEP_MEMORY"
"""``0`` leaves glibc's settings alone."""

# mallopt's parameter numbers (malloc.h); the settings while forked, the ``mmap`` threshold
# first (the one glibc may refuse), and those after: where glibc's own adjustment ends up
# with large arrays (mallopt cannot give that adjustment back).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_KEEP = {_M_MMAP_THRESHOLD: KEEP_BYTES, _M_TRIM_THRESHOLD: KEEP_BYTES, _M_TOP_PAD: 64 << 20}
_AFTER = {_M_MMAP_THRESHOLD: 32 << 20, _M_TRIM_THRESHOLD: 64 << 20, _M_TOP_PAD: 128 << 10}


def _glibc() -> ctypes.CDLL | None:
    """The C library if it is glibc, else None (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)  # this process's symbols: the C library's among them
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return libc


def _user_tuned() -> bool:
    """Whether the user set glibc's malloc parameters (theirs stand)."""
    return "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "") or any(
        v.startswith("MALLOC_") and v.endswith("_") for v in os.environ
    )


def keep_freed_memory() -> Callable[[], None] | None:
    """Keep freed memory in this process (module docstring); return what undoes it.

    Returns None, changing nothing, in the cases the module docstring lists. The undo
    gives free memory at the top of the heap back (``malloc_trim``) and sets the
    thresholds glibc's own adjustment reaches with large arrays (``mmap`` 32 MiB, trim 64
    MiB).
    """
    if os.environ.get(KEEP_VAR) == "0" or _user_tuned():
        return None
    libc = _glibc()
    if libc is None or libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES) != 1:
        return None  # nothing was changed
    for param, value in _KEEP.items():
        libc.mallopt(param, value)

    def undo() -> None:
        for param, value in _AFTER.items():
            libc.mallopt(param, value)
        libc.malloc_trim(0)

    return undo
