"""Tests of synkhronos.rank.heap: large arrays come from the heap while forked, on every rank."""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import synkhronos as synk
from synkhronos.api import routines
from synkhronos.rank import heap

ROOT = Path(__file__).resolve().parents[1]
LARGE = 8 << 20  # float64 elements: 64 MiB, above glibc's largest automatic mmap threshold


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc_version() -> tuple[int, ...]:
    try:
        version = ctypes.CDLL(None).gnu_get_libc_version
    except (OSError, AttributeError):
        return (0,)
    version.restype = ctypes.c_char_p
    return tuple(int(p) for p in version().decode().split(".")[:2])


# mallinfo2 (2.33) reports the mmap'ed bytes; 2.35 accepts an mmap threshold above 32 MiB.
pytestmark = pytest.mark.skipif(_glibc_version() < (2, 35), reason="needs glibc 2.35+")


def _mapped_bytes() -> int:
    info = ctypes.CDLL(None).mallinfo2
    info.restype = _MallInfo2
    return info().hblkhd


def mapped_for_a_large_array(elements: int = LARGE) -> int:
    """Bytes glibc mmap'ed for a float64 array of ``elements`` (0: it came from the heap)."""
    before = _mapped_bytes()
    array = np.empty(elements)  # malloc alone decides where; nothing is touched
    mapped = _mapped_bytes() - before
    del array
    return mapped


def rank_mapped(state):
    """A routine: this rank's :func:`mapped_for_a_large_array`."""
    return [np.array([mapped_for_a_large_array()])]


def _clean_env() -> dict:
    """This environment without the user's malloc settings, which keep_freed_memory obeys."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("MALLOC_") or k == "GLIBC_TUNABLES" or k == heap.KEEP_VAR)
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def test_keep_freed_memory_serves_large_arrays_from_the_heap_until_undone():
    # In a child: the settings are process-wide.
    script = (
        "from tests.test_heap import mapped_for_a_large_array as mapped\n"
        "from synkhronos.rank import heap\n"
        "before = mapped()\n"
        "undo = heap.keep_freed_memory()\n"
        "kept = mapped()\n"
        "undo()\n"
        "print(before, kept, mapped())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=_clean_env()
    )
    assert out.returncode == 0, out.stderr
    before, kept, after = map(int, out.stdout.split())
    assert before >= LARGE * 8 and after >= LARGE * 8  # glibc's own way: mmap'ed
    assert kept == 0  # from the heap, where freeing keeps it


@pytest.mark.parametrize(
    "setting",
    [
        {heap.KEEP_VAR: "0"},
        {"MALLOC_TRIM_THRESHOLD_": "1000000"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"},
    ],
)
def test_switched_off_by_the_environment(monkeypatch, setting):
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    assert heap.keep_freed_memory() is None


@pytest.mark.parametrize("keep", ["1", "0"])
def test_fork_keeps_memory_on_every_rank_until_close(monkeypatch, keep):
    for name in [k for k in os.environ if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES"]:
        monkeypatch.delenv(name)
    monkeypatch.setenv(heap.KEEP_VAR, keep)
    synk.fork(2, backend="cpu")
    try:
        mapped = [int(r[0][0]) for r in routines.run(rank_mapped)]
    finally:
        synk.close()
    if keep == "1":
        assert mapped == [0, 0]
    else:
        assert all(m >= LARGE * 8 for m in mapped), mapped
    assert mapped_for_a_large_array() >= LARGE * 8  # rank 0 after close: glibc's way again
