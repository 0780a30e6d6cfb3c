"""The names synkhronos makes in ``/dev/shm``: unguessable, private, and swept, with the
workers, once their program is dead.

Every name starts with this process's *prefix*, ``synk_<pid>_<random>``, made once per
process (:func:`process_prefix`); each fork adds a random part of its own
(:func:`new_session_name`), so no name can be known before it appears. Names are created
exclusively and readable by this user only (mode 0600); a name that exists already is
:class:`NameTaken`, which names its owner, and the creators try another name where they can.

A program proves that it runs by holding a lock (``flock``) on its ``<prefix>_alive`` file
from before its first name exists until it ends; the kernel drops the lock when the process
ends, however it ends. :func:`dead_prefixes` finds this user's prefixes whose lock nobody
holds, which holds across PID namespaces sharing one ``/dev/shm``, where the pid in a name
means nothing. (Names without a lock file, made by versions before it, fall back on the
pid.) :func:`sweep` removes only names this user owns and skips, with a warning, what it
cannot remove: no other user's name can make it fail.

A program's workers must not outlive it either. :func:`guard`, run by :func:`synkhronos.fork`
in a small process of its own (``python -I -S names.py PREFIX``: this module needs nothing
but the standard library), waits for the program to end however it ends, then SIGKILLs its
workers, busy, blocked or stopped (:func:`end_workers`), and removes its names.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import pwd
import re
import secrets
import signal
import sys

SHM_DIR = "/dev/shm"
NAME_PREFIX = "synk"
LOCK_SUFFIX = "_alive"
NAME_ATTEMPTS = 8  # fresh names tried when one is taken, before giving up

log = logging.getLogger(__name__)


class NameTaken(FileExistsError):
    """A name synkhronos had to create exists already, made by another program or user."""


def owner(entry: str) -> str:
    """Who owns ``/dev/shm/<entry>``, for messages: ``"uid 1001 (alice)"``."""
    try:
        uid = os.lstat(os.path.join(SHM_DIR, entry)).st_uid
    except OSError:
        return "an owner that is gone now"
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def taken(entry: str, tries: int = 1) -> NameTaken:
    """The :class:`NameTaken` for ``/dev/shm/<entry>`` (a semaphore's entry is
    ``sem.<name>``), after ``tries`` names were found taken."""
    others = f" (and {tries - 1} other name(s) tried before it)" if tries > 1 else ""
    return NameTaken(
        f"synkhronos cannot create {os.path.join(SHM_DIR, entry)}{others}: the name is taken, "
        f"by {owner(entry)}. Another program or user made it; if it is a leftover of yours, "
        f"remove it, else ask its owner (names are made with random parts, so this should "
        f"not recur)"
    )


_prefix: str | None = None
_lock_fd: int | None = None  # held open for the life of the process: the lock is its proof


def process_prefix() -> str:
    """This process's name prefix, made (with its lock) on first use; an exit hook sweeps it."""
    global _prefix, _lock_fd
    if _prefix is None:
        _prefix, _lock_fd = _claim_prefix()
        atexit.register(sweep, _prefix)
    return _prefix


def _claim_prefix() -> tuple[str, int]:
    """A fresh prefix and the open, locked descriptor of its lock file.

    The lock file is made under a hidden draft name, locked, and only then linked under its
    real name, so that no sweeper ever finds it unlocked while this process lives.
    """
    for _ in range(NAME_ATTEMPTS):
        prefix = f"{NAME_PREFIX}_{os.getpid()}_{secrets.token_hex(8)}"
        lock = os.path.join(SHM_DIR, prefix + LOCK_SUFFIX)
        draft = os.path.join(SHM_DIR, f".{prefix}{LOCK_SUFFIX}")
        try:
            fd = os.open(draft, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.link(draft, lock)
        except FileExistsError:
            os.close(fd)
            continue
        finally:
            os.unlink(draft)
        return prefix, fd
    raise taken(f"{prefix}{LOCK_SUFFIX}", NAME_ATTEMPTS)


def new_session_name() -> str:
    """A fresh name stem under this process's prefix, with a random part of its own."""
    return f"{process_prefix()}_{secrets.token_hex(4)}"


def entries_of(stem: str, entries: list[str]) -> list[str]:
    """Those of ``entries`` (names in ``/dev/shm``) under ``stem``: its segments, semaphores
    and lock."""
    head = stem + "_"
    return [e for e in entries if e.startswith(head) or e.startswith("sem." + head)]


def sweep(stem: str) -> list[str]:
    """Remove every name ``<stem>_...`` in ``/dev/shm`` (segments, semaphores, the lock) that
    this user owns; return the names removed.

    Another user's name is left, and so is anything that cannot be removed (each with a
    warning): this never raises. A prefix's lock file goes last. Safe to call from several
    processes at once.
    """
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    lock = stem + LOCK_SUFFIX
    found = sorted(entries_of(stem, entries), key=lambda e: e == lock)
    uid, removed = os.geteuid(), []
    for entry in found:
        path = os.path.join(SHM_DIR, entry)
        try:
            if os.lstat(path).st_uid != uid:
                log.warning(
                    "synkhronos left %s: it belongs to %s, not to this user", path, owner(entry)
                )
                continue
            os.unlink(path)
        except FileNotFoundError:
            continue  # removed meanwhile (by a worker, or another sweep)
        except OSError as error:
            log.warning("synkhronos could not remove %s: %s", path, error)
            continue
        removed.append(entry)
    return removed


_GROUP = re.compile(rf"^(?:sem\.)?({NAME_PREFIX}_(\d+)_[0-9a-f]+)(?:_|$)")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _alive(prefix: str, pid: int) -> bool:
    """Whether the program of ``prefix`` runs: its lock is held (or, with no lock file, a
    process ``pid`` exists)."""
    try:
        fd = os.open(os.path.join(SHM_DIR, prefix + LOCK_SUFFIX), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return _pid_alive(pid)
    except OSError:
        return True  # cannot tell: leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def dead_prefixes() -> list[str]:
    """The prefixes in ``/dev/shm`` of this user's programs that have ended.

    Names of other users, and of programs that run (in any PID namespace), are not listed.
    """
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    uid, groups = os.geteuid(), {}
    for entry in entries:
        match = _GROUP.match(entry)
        if not match or match.group(1) == _prefix or match.group(1) in groups:
            continue
        try:
            if os.lstat(os.path.join(SHM_DIR, entry)).st_uid != uid:
                continue
        except OSError:
            continue
        groups[match.group(1)] = int(match.group(2))
    return sorted(prefix for prefix, pid in groups.items() if not _alive(prefix, pid))


WORKER_MODULE = b"synkhronos.worker"  # in the command line of every worker


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _each_worker(prefix: str):
    """Yield ``(pid, pidfd or None)`` for each of this user's worker processes of the
    program whose names start with ``prefix`` (found by their command lines), each while
    its pidfd is held, so that a pid reused meanwhile is never signalled."""
    uid = os.geteuid()
    try:
        pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return
    for pid in pids:
        handle = _pidfd(pid)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
            if WORKER_MODULE not in argv or prefix.encode() not in argv:
                continue
            yield pid, handle
        except OSError:
            continue  # gone meanwhile
        finally:
            if handle is not None:
                os.close(handle)


def workers_of(prefix: str) -> list[int]:
    """The pids of this user's worker processes of the program whose names start with
    ``prefix``."""
    return [pid for pid, _ in _each_worker(prefix)]


def end_workers(prefix: str) -> list[int]:
    """SIGKILL this user's worker processes of the program whose names start with
    ``prefix``, a stopped one too; return their pids."""
    ended = []
    for pid, handle in _each_worker(prefix):
        try:
            if handle is None:
                os.kill(pid, signal.SIGKILL)
            else:
                signal.pidfd_send_signal(handle, signal.SIGKILL)
        except OSError:
            continue  # gone meanwhile
        ended.append(pid)
    return ended


def guard(prefix: str) -> None:
    """Wait until the program that started this process ends, then end its workers and
    remove its names (``prefix``).

    The program holds the other end of this process's stdin: it closes when the program
    ends, however it ends (SIGKILL included), and only then.
    """
    while os.read(0, 4096):
        pass
    end_workers(prefix)
    sweep(prefix)


if __name__ == "__main__":
    guard(sys.argv[1])
