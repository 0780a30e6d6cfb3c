"""Every rank's heap: keep freed memory for the next step instead of giving it back.

glibc serves an allocation above a threshold (128 KiB, rising with use to at most 32
MiB) with a fresh ``mmap``, and gives it back to the system when it is freed; memory
freed at the top of the heap goes back too. A compiled PyTensor function allocates its
outputs and intermediates anew at every call, so on a large model each step maps its
arrays again and pays a page fault per 4 KiB on first touch. On the 2-core Zen 5 VM of
``bench/RESULTS.md``, one core, the one-process step of a 784-4096-4096-10 MLP at 128
rows took 254 ms with glibc's defaults and 198 ms with the settings below; SGD's update
of 25M parameters in new arrays took 43.6 against 7.3 ms.

:func:`keep_freed_memory` raises the ``mmap`` threshold and the trim threshold to
:data:`KEEP_BYTES` (allocations up to that size come from the heap, and up to that much
freed memory stays there) through glibc's ``mallopt``. :func:`synkhronos.fork` applies
it to every rank, rank 0 included, unless the environment variable ``SYNK_KEEP_MEMORY``
is ``0``; :func:`synkhronos.close` then sets rank 0's to where glibc's own adjustment
ends up with large arrays (``mmap`` threshold 32 MiB, trim threshold 64 MiB; mallopt
cannot give back the adjustment itself). The cost is memory: a rank keeps as much as its
largest step freed, instead of returning it between steps. Elsewhere than glibc nothing
changes.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

KEEP_BYTES = 1 << 30
"""Allocations up to this size come from the heap, and freed memory up to it stays."""

KEEP_VAR = "SYNK_KEEP_MEMORY"
"""``0`` leaves glibc's settings alone."""

# mallopt's parameter numbers (malloc.h); the settings while forked, and after.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_KEEP = {_M_TRIM_THRESHOLD: KEEP_BYTES, _M_TOP_PAD: 64 << 20, _M_MMAP_THRESHOLD: KEEP_BYTES}
_AFTER = {_M_TRIM_THRESHOLD: 64 << 20, _M_TOP_PAD: 128 << 10, _M_MMAP_THRESHOLD: 32 << 20}


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None elsewhere (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)  # this process's symbols: the C library's among them
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
    except (OSError, AttributeError):
        return None
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def _set(settings: dict[int, int]) -> bool:
    mallopt = _mallopt()
    return mallopt is not None and all(mallopt(k, v) == 1 for k, v in settings.items())


def keep_freed_memory() -> Callable[[], None] | None:
    """Keep freed memory in this process (module docstring); return what undoes it.

    Returns None, changing nothing, when ``SYNK_KEEP_MEMORY`` is ``0`` or the C library
    is not glibc. The undo sets the thresholds glibc's own adjustment reaches with large
    arrays (module docstring).
    """
    if os.environ.get(KEEP_VAR) == "0" or not _set(_KEEP):
        return None
    return lambda: _set(_AFTER)
