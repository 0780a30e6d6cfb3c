"""Rank 0's watch on the workers while it waits: is each one still making progress?

A worker counts as making progress while any of these holds:

- its heartbeat word in the control block changes: a worker bumps it each time a blocked
  wait polls (every :data:`~synkhronos.transport.channel.POLL_S`), so a rank waiting for another is
  alive;
- its CPU time grows, or the kernel has it runnable (state ``R``): a rank inside a long
  compute, in Python or in C, holding the GIL or not, is alive;
- it has a running child process (PyTensor compiling C code, for example).

A worker that does neither for ``timeout`` seconds (stopped by SIGSTOP or a debugger, or
asleep in a deadlock outside synkhronos' waits) is declared hung: :class:`Watchdog.check`
raises :class:`~synkhronos.transport.channel.WorkerHung` naming its rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from synkhronos.transport.channel import WorkerHung

STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "waiting for I/O",
    "T": "stopped (SIGSTOP)",
    "t": "stopped by a debugger",
    "Z": "exited (zombie)",
    "X": "exited",
}


def process_state(pid: int) -> tuple[str, int]:
    """The kernel's state letter of process ``pid`` and its CPU time, in clock ticks.

    Read from ``/proc/<pid>/stat``; ``("X", 0)`` when the process is gone.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return "X", 0
    fields = text[text.rindex(b")") + 2 :].split()  # the command name may hold spaces
    return fields[0].decode(), int(fields[11]) + int(fields[12])  # state, utime + stime


def has_children(pid: int) -> bool:
    """Whether process ``pid`` has a running child (a compiler PyTensor started, say).

    A worker waiting for its child is as alive as the child, whose CPU time is not its own.
    """
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as children:
            return bool(children.read().strip())
    except OSError:
        return False


class Watchdog:
    """Declares a worker hung after ``timeout`` seconds without progress.

    Rank 0 calls :meth:`arm` when it posts a command (one attribute store, nothing read)
    and :meth:`check` each time one of its waits polls; the first check of a command takes
    the baseline.

    Parameters
    ----------
    pids : list of int
        Process ids of ranks 1, 2, ... (the list may be filled after construction).
    heartbeat : callable
        ``heartbeat(rank)`` reads the rank's heartbeat word.
    timeout : float or None
        Seconds without progress before a rank is declared hung; ``None``: never.

    Examples
    --------
    >>> import subprocess
    >>> sleeper = subprocess.Popen(["sleep", "30"])  # alive, but neither computes nor waits
    >>> time.sleep(0.2)
    >>> dog = Watchdog([sleeper.pid], lambda rank: 0, timeout=0.2)
    >>> dog.check()
    >>> time.sleep(0.5)
    >>> dog.check()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    synkhronos.transport.channel.WorkerHung: synkhronos worker rank 1 (pid ...) made no progress ...
    >>> sleeper.kill(); _ = sleeper.wait()
    """

    def __init__(self, pids: list[int], heartbeat: Callable[[int], int], timeout: float | None):
        self.pids = pids
        self.heartbeat = heartbeat
        self.timeout = timeout
        self.armed = False
        self.beats: list[int] = []
        self.ticks: list[int] = []
        self.progress_at: list[float] = []

    def arm(self) -> None:
        """Start watching a new command: the next check takes a fresh baseline."""
        self.armed = False

    def check(self) -> None:
        """Raise :class:`~synkhronos.transport.channel.WorkerHung` for a worker that made no
        progress for ``timeout`` seconds."""
        if self.timeout is None:
            return
        now = time.monotonic()
        if not self.armed:
            n = len(self.pids)
            self.beats, self.ticks, self.progress_at = [0] * n, [0] * n, [0.0] * n
        for i, pid in enumerate(self.pids):
            beat = self.heartbeat(i + 1)
            if self.armed and beat != self.beats[i]:
                self.beats[i], self.progress_at[i] = beat, now
                continue
            state, ticks = process_state(pid)
            if not self.armed or ticks != self.ticks[i] or state == "R" or has_children(pid):
                self.beats[i], self.ticks[i], self.progress_at[i] = beat, ticks, now
            elif now - self.progress_at[i] > self.timeout:
                raise WorkerHung(
                    f"synkhronos worker rank {i + 1} (pid {pid}) made no progress for "
                    f"{self.timeout:g} s (it is {STATES.get(state, state)}); call "
                    f"synk.close() and fork again"
                )
        self.armed = True
