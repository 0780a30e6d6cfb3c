"""Tests of synkhronos.heap: large arrays come from the heap while forked, on every rank."""

import ctypes
import subprocess
import sys

import numpy as np
import pytest

import synkhronos as synk
from synkhronos import heap, routine

LARGE = 8 << 20  # float64 elements: 64 MiB, above glibc's largest automatic mmap threshold


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL("libc.so.6")
        info = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    info.restype = _MallInfo2
    return info


pytestmark = pytest.mark.skipif(_mallinfo2() is None, reason="needs glibc 2.33+ (mallinfo2)")


def mapped_while_holding_a_large_array(elements: int = LARGE) -> int:
    """Bytes glibc holds in mmap'ed blocks while a float64 array of ``elements`` is alive."""
    array = np.empty(elements)  # malloc alone decides where; nothing is touched
    mapped = _mallinfo2()().hblkhd
    del array
    return mapped


def rank_mapped(state):
    """A routine: this rank's :func:`mapped_while_holding_a_large_array`."""
    return [np.array([mapped_while_holding_a_large_array()])]


def test_keep_freed_memory_serves_large_arrays_from_the_heap_until_undone():
    # In a child: the settings are process-wide.
    script = (
        "from tests.test_heap import mapped_while_holding_a_large_array as mapped\n"
        "from synkhronos import heap\n"
        "before = mapped()\n"
        "undo = heap.keep_freed_memory()\n"
        "kept = mapped()\n"
        "undo()\n"
        f"print(before, kept, mapped({4 * LARGE}))\n")  # more than the heap kept
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": ".", "PATH": ""})
    before, kept, after = map(int, out.stdout.split())
    assert before >= LARGE * 8 and after >= 4 * LARGE * 8  # glibc's own way: mmap'ed
    assert kept < LARGE * 8  # from the heap, where freeing keeps it


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(heap.KEEP_VAR, "0")
    assert heap.keep_freed_memory() is None


@pytest.mark.parametrize("keep", ["1", "0"])
def test_fork_keeps_memory_on_every_rank(monkeypatch, keep):
    monkeypatch.setenv(heap.KEEP_VAR, keep)
    synk.fork(2, backend="cpu")
    try:
        mapped = [int(r[0][0]) for r in routine.run(rank_mapped)]
    finally:
        synk.close()
    if keep == "1":
        assert all(m < LARGE * 8 for m in mapped), mapped
    else:
        assert all(m >= LARGE * 8 for m in mapped), mapped
