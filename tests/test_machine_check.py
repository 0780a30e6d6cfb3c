"""``python -m synkhronos check`` and ``sweep``: a clear non-zero exit when /dev/shm is too
small, leftovers of dead programs named with the command that removes them. (``make test``
runs the whole check, self-test included, on the test machine.)"""

from __future__ import annotations

import os

from synkhronos.api import machine_check
from synkhronos.transport import names, shm
from tests.conftest import shm_entries


def test_a_tiny_dev_shm_is_a_clear_failure(monkeypatch):
    monkeypatch.setattr(shm, "free_bytes", lambda: 2**20)
    ran = []
    monkeypatch.setattr(machine_check, "self_test", lambda backend: ran.append(backend))
    said: list[str] = []
    assert machine_check.check(say=said.append) == 1
    assert not ran  # nothing forked on a /dev/shm that cannot hold it
    assert (
        "CANNOT WORK: /dev/shm has 1 MiB free, less than the 32 MiB synkhronos needs "
        "at least; free space there, or enlarge it (e.g. docker run --shm-size=8g)" in said
    )
    assert said[-1] == "failed"
    assert any(line.startswith("fork() would start: ") for line in said)


def test_leftovers_are_named_and_swept(capsys):
    prefix = f"synk_{os.getpid()}_{'e' * 16}"  # no lock file, a live pid: not dead yet
    shm.Segment(f"{prefix}_s0_x", 64, create=True)
    lock = os.path.join(names.SHM_DIR, prefix + names.LOCK_SUFFIX)
    try:
        os.close(os.open(lock, os.O_RDWR | os.O_CREAT, 0o600))  # unlocked: its program died
        lines, any_left = machine_check._leftovers()
        assert any_left and f"  {prefix}: 2 names, 0 MiB" in lines, lines
        assert lines[-1].endswith("-m synkhronos sweep")
        assert machine_check.main(["sweep"]) == 0
        assert f"{prefix}: removed 2 names, ended 0 worker(s)" in capsys.readouterr().out
        assert shm_entries(prefix) == []
    finally:
        names.sweep(prefix)
