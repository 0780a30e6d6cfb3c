"""synkhronos.transport.names without forking: the process prefix and its lock, sweeping,
finding dead programs' names, and ending a program's workers."""

from __future__ import annotations

import fcntl
import os
import secrets
import stat
import subprocess
import sys

import pytest

from synkhronos.transport import names


def _fake_prefix() -> str:
    return f"{names.NAME_PREFIX}_{os.getpid()}_{secrets.token_hex(8)}"


def _make(entry: str) -> str:
    path = os.path.join(names.SHM_DIR, entry)
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return path


@pytest.fixture
def prefix():
    """A made-up prefix of this user; whatever is left under it is removed afterwards."""
    made = _fake_prefix()
    yield made
    names.sweep(made)


def test_session_names_hang_under_the_locked_private_prefix():
    first, second = names.new_session_name(), names.new_session_name()
    prefix = names.process_prefix()
    assert first != second and first.startswith(prefix + "_") and second.startswith(prefix + "_")
    lock = os.path.join(names.SHM_DIR, prefix + names.LOCK_SUFFIX)
    assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600
    # This process holds the lock: nobody else may take it, so it is not a dead prefix.
    fd = os.open(lock, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert prefix not in names.dead_prefixes()


def test_taken_names_the_path_the_owner_and_the_tries(prefix):
    _make(prefix + "_x")
    message = str(names.taken(prefix + "_x", tries=3))
    assert os.path.join(names.SHM_DIR, prefix + "_x") in message
    assert f"uid {os.geteuid()}" in message and "2 other name(s)" in message
    assert "gone now" in str(names.taken(prefix + "_missing"))
    assert isinstance(names.taken(prefix + "_x"), FileExistsError)


def test_sweep_removes_only_the_stems_names_lock_last(prefix):
    made = [prefix + "_a_seg", "sem." + prefix + "_a_sem", prefix + names.LOCK_SUFFIX]
    other = prefix + "x_seg"  # shares the characters, not the stem
    for entry in [*made, other]:
        _make(entry)
    try:
        assert names.entries_of(prefix, [*made, other, "unrelated"]) == made
        removed = names.sweep(prefix)
        assert sorted(removed) == sorted(made) and removed[-1] == prefix + names.LOCK_SUFFIX
        assert os.path.exists(os.path.join(names.SHM_DIR, other))
        assert names.sweep(prefix) == []
    finally:
        os.unlink(os.path.join(names.SHM_DIR, other))


def test_dead_prefixes_are_those_whose_lock_nobody_holds(prefix):
    alive = _fake_prefix()
    _make(prefix + "_seg")
    _make(prefix + names.LOCK_SUFFIX)
    _make(alive + "_seg")
    fd = os.open(_make(alive + names.LOCK_SUFFIX), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        dead = names.dead_prefixes()
        assert prefix in dead and alive not in dead
    finally:
        os.close(fd)
        names.sweep(alive)


def test_guard_ends_the_workers_and_sweeps_when_its_program_ends(prefix):
    _make(prefix + "_seg")
    # A stand-in worker: its command line names the worker module and the prefix.
    code = "import time; print('ready', flush=True); time.sleep(60)"
    worker = subprocess.Popen(
        [sys.executable, "-c", code, "synkhronos.worker", prefix], stdout=subprocess.PIPE
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline() == b"ready\n"  # its command line is in /proc now
        assert names.workers_of(prefix) == [worker.pid]
        assert names.workers_of(_fake_prefix()) == []
        guard = subprocess.Popen(
            [sys.executable, "-I", "-S", names.__file__, prefix], stdin=subprocess.PIPE
        )
        assert guard.stdin is not None
        guard.stdin.close()  # as when the program ends, however it ends
        assert guard.wait(timeout=10) == 0
        assert worker.wait(timeout=10) == -9
        assert names.entries_of(prefix, os.listdir(names.SHM_DIR)) == []
    finally:
        worker.kill()
        worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()
