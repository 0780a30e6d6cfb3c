"""What another local user can do to a program's names in ``/dev/shm``: read none, remove
none, break no ``fork()`` or ``close()``, and squat none for good.

The tests create a second, unprivileged user (``useradd``; this needs root, as CI runs, and
the tests are skipped otherwise) and remove it afterwards. What that user does runs in a
child of this process that has become it (``fork``, then ``setuid``): it cannot start
Python anew, since the interpreter of this suite may lie in a directory only root reads.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import time
import warnings

import numpy as np
import pytest

import synkhronos as synk
from synkhronos.session import launch
from synkhronos.session import session as session_module
from synkhronos.transport import names
from synkhronos.transport.names import SHM_DIR
from tests.conftest import shm_entries


@pytest.fixture(scope="module")
def other_user():
    """A fresh system user without a home or a shell, deleted with whatever it left."""
    if os.geteuid() != 0:
        pytest.skip("creating a second user needs root (CI runs as root)")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd and userdel are needed to create a second user")
    name = f"synk{secrets.token_hex(4)}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    user = pwd.getpwnam(name)
    try:
        yield user
    finally:
        for entry in os.listdir(SHM_DIR):
            path = os.path.join(SHM_DIR, entry)
            if os.lstat(path).st_uid == user.pw_uid:
                os.unlink(path)
        # A killed process of the user (a shell's child) may not be reaped yet, and userdel
        # refuses a user with processes: try again for a while.
        for _ in range(50):
            if subprocess.run(["userdel", name], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        else:
            subprocess.run(["userdel", name], check=True, capture_output=True)


def _as(user, action) -> None:
    """Run ``action()`` in a child process that has become ``user``; fail with what it
    raised, if anything."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        # JAX warns of any fork in a process with its threads; the child only makes system
        # calls and file operations in Python (whose own locks are reset at fork), then exits.
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        os.close(read)
        report = b""
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            action()
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            report = f"{type(error).__name__}: {error}".encode()[:4096]
        os.write(write, report)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        report = pipe.read()
    os.waitpid(pid, 0)
    assert not report, f"as {user.pw_name}: {report.decode()}"


def _plant(*entries: str) -> None:
    """Create empty files ``/dev/shm/<entry>``, as a squatter would (a segment is a file
    there, a semaphore ``sem.<name>``)."""
    for entry in entries:
        os.close(os.open(os.path.join(SHM_DIR, entry), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def _owned_by(uid: int, prefix: str) -> list[str]:
    return sorted(
        e for e in shm_entries(prefix) if os.lstat(os.path.join(SHM_DIR, e)).st_uid == uid
    )


def _dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def test_names_are_unguessable_and_private(other_user):
    synk.fork(2, backend="cpu")
    session = launch.current()
    data = synk.data(np.arange(6.0))
    try:
        prefix = names.process_prefix()
        assert re.fullmatch(rf"synk_{os.getpid()}_[0-9a-f]{{16}}", prefix)
        assert re.fullmatch(rf"{prefix}_[0-9a-f]{{8}}", session.name)
        ours = shm_entries(prefix)
        assert f"{prefix}{names.LOCK_SUFFIX}" in ours and len(ours) > 5
        for entry in ours:
            info = os.lstat(os.path.join(SHM_DIR, entry))
            assert info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o600, entry

        def read_or_write_any():
            for entry in ours:
                for flags in (os.O_RDONLY, os.O_RDWR):
                    with pytest.raises(PermissionError):
                        os.open(os.path.join(SHM_DIR, entry), flags)

        _as(other_user, read_or_write_any)
        assert float(data.data.sum()) == 15.0
    finally:
        data.free_memory()
        synk.close()


def test_another_users_names_break_neither_fork_nor_close(other_user):
    dead = _dead_pid()
    planted = [
        f"synk_{dead}_x",
        f"sem.synk_{dead}_x_go1",  # the audit's: a dead pid's names
        f"synk_{dead}_{'f' * 16}{names.LOCK_SUFFIX}",  # and an unheld lock file
        f"synk_{dead}_{'f' * 16}_s0_control",
    ]
    _as(other_user, lambda: _plant(*planted))
    synk.fork(2, backend="cpu")  # sweeps dead programs' names: only this user's
    session = launch.current()
    under_ours = [f"{session.name}_planted", f"sem.{session.name}_planted"]
    _as(other_user, lambda: _plant(*under_ours))
    synk.close()  # removes the session's names, not theirs, and does not raise
    assert sorted(shm_entries(session.name)) == sorted(under_ours)
    assert _owned_by(other_user.pw_uid, f"synk_{dead}_") == sorted(planted)
    assert _owned_by(os.geteuid(), session.name) == []


def test_squatted_names_are_skipped_or_named(other_user, monkeypatch):
    uid = f"uid {other_user.pw_uid} \\({other_user.pw_name}\\)"
    data = synk.data(np.zeros(4))
    base = data._segment.base
    try:
        # The next generations of a Data's segment, taken: the Data skips them.
        _as(other_user, lambda: _plant(f"{base}_1", f"{base}_2"))
        data.set_value(np.arange(1000.0))
        assert data._segment.generation == 3 and float(data.data.sum()) == 499500.0
        taken = [f"{base}_{g}" for g in range(4, 4 + names.NAME_ATTEMPTS)]
        _as(other_user, lambda: _plant(*taken))
        with pytest.raises(names.NameTaken, match=rf"{SHM_DIR}/{taken[-1]} .*taken, by {uid}"):
            data.set_value(np.arange(2000.0))
        assert float(data.data.sum()) == 499500.0  # the old segment is still in use
    finally:
        data.free_memory()

    # A fork's names, taken before it makes them (were they guessable): it takes others.
    squatted, fresh = names.new_session_name(), names.new_session_name()
    _as(other_user, lambda: _plant(f"{squatted}_control"))
    offered = iter([squatted, fresh])
    monkeypatch.setattr(session_module, "new_session_name", lambda: next(offered))
    synk.fork(2, backend="cpu")
    assert launch.current().name == fresh
    synk.close()
    monkeypatch.setattr(session_module, "new_session_name", lambda: squatted)
    with pytest.raises(names.NameTaken, match=rf"{SHM_DIR}/{squatted}_control: .*by {uid}"):
        synk.fork(2, backend="cpu")
    assert launch._session is None
    assert shm_entries(squatted) == [f"{squatted}_control"]  # theirs, left alone


def test_an_unprivileged_sweeper_skips_what_it_cannot_remove(other_user):
    dead, alive = _dead_pid(), os.getpid()
    # Root's, under this (live) process's pid: a sweep of root's in another test process
    # running meanwhile (make test runs several) leaves them, as it leaves any live program's.
    roots = [f"synk_{alive}_0e0e0e0e_x", f"sem.synk_{alive}_0e0e0e0e_y"]
    theirs = [f"synk_{dead}_0f0f0f0f_x", f"sem.synk_{dead}_0f0f0f0f_y"]
    _plant(*roots)

    def sweep_as_a_fork_does():
        _plant(*theirs)
        launch.sweep_dead()
        names.sweep(f"synk_{alive}_0e0e0e0e")  # as close() would, on names not its own
        assert shm_entries(f"synk_{dead}_0f0f0f0f") == []

    try:
        _as(other_user, sweep_as_a_fork_does)
        assert _owned_by(0, f"synk_{alive}_0e0e0e0e") == sorted(roots)
    finally:
        names.sweep(f"synk_{alive}_0e0e0e0e")


def test_only_this_users_orphans_are_ended(other_user):
    dead = _dead_pid()
    prefix = f"synk_{dead}_0a0a0a0a"
    _plant(f"{prefix}_s0_control")  # a dead program of this user
    # Processes whose command lines look like that program's workers: this user's, stopped,
    # and the other user's.
    look_alike = ["sh", "-c", "sleep 30; :", "synkhronos.worker", prefix]
    mine = subprocess.Popen(look_alike, start_new_session=True)
    other = subprocess.Popen(
        look_alike,
        user=other_user.pw_uid,
        group=other_user.pw_gid,
        extra_groups=[],
        start_new_session=True,
    )
    try:
        os.kill(mine.pid, signal.SIGSTOP)
        launch.sweep_dead()
        assert mine.wait(timeout=30) == -signal.SIGKILL
        assert other.poll() is None and shm_entries(prefix) == []
    finally:
        for process in (mine, other):
            os.killpg(process.pid, signal.SIGKILL)  # the shell and its sleep
            process.wait()
