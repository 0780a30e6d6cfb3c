"""Soak: many sessions and many calls leave memory and file descriptors flat, and every
failure is detected within a bounded time and leaves nothing behind.

1. ``--cycles`` fork/close cycles of 2 ranks: rank 0's RSS and open fds, per cycle.
2. ``--calls`` calls of a small function on 2 ranks: RSS and fds of rank 0 and the worker,
   sampled every tenth of the run.
3. Failures, each in a fresh session: a stopped worker (``fork(timeout=1)``), a worker
   killed while idle and during a call, Ctrl-C during a call, an exception on one rank,
   and rank 0 (this script run with ``--rank0``) ended by SIGTERM, SIGINT and SIGKILL, by
   SIGKILL while its worker is stopped, and by SIGKILL in the middle of a 2-second call
   (rank 0's guardian ends the worker in both). For each: the error seen, the time to see
   it (for rank 0's end: until its worker has exited and its names are gone, then until
   init has reaped the orphaned worker too), and what is left (processes, zombies
   included, and names).

Run: ``.venv/bin/python bench/soak.py [--cycles 50] [--calls 10000]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.session import launch
from synkhronos.session.liveness import process_state

x = pt.matrix("x", dtype="float64")


# ---- measuring -------------------------------------------------------------------------------
def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        kib = next(line for line in status if line.startswith("VmRSS")).split()[1]
    return int(kib) / 1024


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def leftovers(prefix: str, workers: list[int]) -> str:
    """What a program or session left: workers (zombies too) and /dev/shm names under
    ``prefix``; "none" if nothing."""
    names = [e for e in os.listdir("/dev/shm") if e.startswith((prefix, f"sem.{prefix}"))]
    alive = [p for p in workers if process_state(p)[0] != "X"]
    parts = ([f"{len(alive)} worker(s)"] if alive else []) + (
        [f"{len(names)} name(s)"] if names else []
    )
    return ", ".join(parts) or "none"


def settle(prefix: str, workers: list[int], limit_s: float = 10.0) -> str:
    """Wait (up to ``limit_s``) for leftovers to go; return what stays."""
    deadline = time.monotonic() + limit_s
    while leftovers(prefix, workers) != "none" and time.monotonic() < deadline:
        time.sleep(0.01)
    return leftovers(prefix, workers)


def row(table: list, *cells) -> None:
    table.append(tuple(str(c) for c in cells))


def print_table(title: str, header: tuple, table: list) -> None:
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    print(f"\n{title}")
    for r in [header, tuple("-" * w for w in widths), *table]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


# ---- 1 and 2: growth ------------------------------------------------------------------------
def cycles(n: int) -> list:
    me, table, samples, unclean = os.getpid(), [], [], 0  # unclean: cycles that left some
    start = time.monotonic()
    for _ in range(n):
        synk.fork(2, backend="cpu")
        session = launch.current()
        synk.close()
        unclean += leftovers(session.name, [p.pid for p in session.processes]) != "none"
        samples.append((rss_mib(me), fds(me)))
    per_cycle = (time.monotonic() - start) / n
    (r0, f0), (r1, f1) = samples[0], samples[-1]
    row(
        table,
        f"{n} fork/close cycles",
        "rank 0",
        f"{r0:.1f} -> {r1:.1f} MiB (+{r1 - r0:.1f})",
        f"{f0} -> {f1}",
        f"{per_cycle:.2f} s per cycle; {unclean} cycles left something",
    )
    return table


def calls(n: int) -> list:
    synk.fork(2, backend="cpu")
    session = launch.current()
    worker = session.processes[0].pid
    f = synk.function([x], (x * x).mean())
    xv = np.random.default_rng(0).normal(size=(11, 3))
    want = (xv * xv).mean()
    f(xv)
    samples = []
    start = time.monotonic()
    for i in range(n):
        assert np.isclose(f(xv), want)
        if i % max(1, n // 10) == 0 or i == n - 1:
            samples.append([(rss_mib(p), fds(p)) for p in (os.getpid(), worker)])
    per_call = (time.monotonic() - start) / n
    synk.close()
    table = []
    for k, who in enumerate(("rank 0", "worker")):
        (r0, f0), (r1, f1) = samples[0][k], samples[-1][k]
        row(
            table,
            f"{n} calls",
            who,
            f"{r0:.1f} -> {r1:.1f} MiB (+{r1 - r0:.1f})",
            f"{f0} -> {f1}",
            f"{per_call * 1e6:.0f} us per call" if k == 0 else "",
        )
    return table


# ---- 3: failures ----------------------------------------------------------------------------
def in_session(case: str, timeout, act, call) -> tuple:
    """Fork, run ``act(worker_pid)`` then ``call(f)``; the error, seconds to it, leftovers."""
    synk.fork(2, backend="cpu", timeout=timeout)
    session = launch.current()
    f = synk.function([x], x.reshape((2, -1)).mean())
    f(np.ones((4, 3)))
    act(session.processes[0].pid)
    start = time.monotonic()
    try:
        call(f)
        error = "none"
    except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt is one of the cases
        error = type(e).__name__
    took = time.monotonic() - start
    broken = session.broken
    synk.close()
    left = leftovers(session.name, [p.pid for p in session.processes])
    return case, error, f"{took:.2f} s", "broken" if broken else "goes on", left


def after(seconds: float, pid_fn, signum) -> None:
    threading.Timer(seconds, lambda: os.kill(pid_fn(), signum)).start()


def failures() -> list:
    stop = lambda pid: os.kill(pid, signal.SIGSTOP)  # noqa: E731
    ones = lambda f: f(np.ones((4, 3)))  # noqa: E731
    table = [
        in_session("worker stopped, timeout=1", 1.0, stop, ones),
        in_session(
            "worker killed while idle",
            None,
            lambda pid: (os.kill(pid, signal.SIGKILL), time.sleep(0.5)),
            ones,
        ),
        in_session(
            "worker killed during a call (0.5 s in)",
            None,
            lambda pid: (stop(pid), after(0.5, lambda: pid, signal.SIGKILL)),
            ones,
        ),
        in_session(
            "Ctrl-C during a call (0.5 s in)",
            None,
            lambda pid: (stop(pid), after(0.5, os.getpid, signal.SIGINT)),
            ones,
        ),
        in_session(
            "exception on rank 1 only", None, lambda pid: None, lambda f: f(np.ones((7, 3)))
        ),
    ]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        table.append(rank0_killed(signum))
    table.append(rank0_killed(signal.SIGKILL, stop_worker=True))
    table.append(rank0_killed(signal.SIGKILL, long_calls=True))
    return [tuple(str(c) for c in r) for r in table]


def rank0_killed(signum, stop_worker: bool = False, long_calls: bool = False) -> tuple:
    """Rank 0 (a ``--rank0`` run) ended by ``signum`` during calls (with ``stop_worker``,
    its worker stopped first; with ``long_calls``, calls of about 2 s)."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--rank0", *(["--long"] * long_calls)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    worker = int(proc.stdout.readline())
    time.sleep(0.3)
    if stop_worker:
        os.kill(worker, signal.SIGSTOP)
    start = time.monotonic()
    proc.send_signal(signum)
    proc.wait()
    prefix = f"synk_{proc.pid}_"
    while (process_state(worker)[0] not in ("X", "Z") or leftovers(prefix, []) != "none") and (
        time.monotonic() - start < 10
    ):
        time.sleep(0.002)
    exited = time.monotonic() - start
    left = settle(prefix, [worker])
    case = (
        f"rank 0 ended by {signal.Signals(signum).name} during calls"
        + (", its worker stopped" if stop_worker else "")
        + (" of 2 s" if long_calls else "")
    )
    return (
        case,
        f"exit {proc.returncode}",
        f"{exited:.3f} s, reaped {time.monotonic() - start:.2f} s",
        "-",
        left,
    )


def rank0(long_calls: bool) -> None:
    """(``--rank0``) call a function until killed; with ``long_calls``, one whose calls
    take about 2 s (30 chained element-wise ops on 2M values per rank)."""
    synk.fork(2, backend="cpu", timeout=None)
    if long_calls:
        y = x
        for _ in range(30):
            y = pt.tanh(y) * 1.0001 + 0.5
        f, xv = synk.function([x], y.sum()), np.ones((400, 10000))
    else:
        f, xv = synk.function([x], (x * x).mean()), np.ones((300, 50))
    f(xv)
    print(launch.current().processes[0].pid, flush=True)
    while True:
        f(xv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--rank0", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--long", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank0:
        return rank0(args.long)
    print_table(
        "Growth",
        ("run", "process", "RSS first -> last", "open fds", "note"),
        cycles(args.cycles) + calls(args.calls),
    )
    print_table(
        "Failures (time: from the fault, or from the signal to rank 0, until the "
        "error / until nothing is left)",
        ("case", "error seen", "time", "session", "left after close"),
        failures(),
    )


if __name__ == "__main__":
    main()
