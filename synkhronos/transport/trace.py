"""A per-rank timeline of a session: spans and byte counters, as Chrome trace events.

Every layer that does work marks it with :func:`span` (a context manager) and
:func:`count_bytes`. With no timeline running (the default) :func:`span` returns one
shared object whose ``__enter__`` and ``__exit__`` do nothing, and :func:`count_bytes`
returns at once: the cost is a function call.

While a timeline runs (:func:`start` in rank 0; in a worker, while rank 0's commands carry
:data:`~synkhronos.transport.protocol.TIMELINE`) each rank appends one JSON line per
finished span to its own file, ``/dev/shm/<session>_timeline<rank>`` (created by that
rank, exclusively, mode 0600), with one ``os.write``: the kernel keeps what a killed
worker wrote, so a dead worker's spans up to the one it died in are kept. Rank 0 reads
every rank's file (:func:`collect`) and writes the Chrome trace-event JSON file.

**One time base.** Every time is ``time.monotonic_ns()``: ``CLOCK_MONOTONIC``, which on
Linux is one clock for the whole machine, so the ranks' times need no exchange. (Nodes
under MPI are other machines: each node's rank 0 writes its own file, on its own clock.)

The events: ``"X"`` spans (``ts`` and ``dur`` in microseconds) with ``pid`` the rank and
``cat`` the activity (``"rank 0"``, ``"command"``, ``"rows"``, ``"compute"``,
``"collective"``, ``"wait"``, ``"reply"``, ``"outputs"``, ``"compile"``,
``"checkpoint"``), nested on one row per rank as the calls nest; ``"C"`` counters of the
bytes moved per kind (``"command"``, ``"reply"``, ``"collective"``), cumulative; ``"M"``
metadata naming each rank's process (added by :func:`collect`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

from synkhronos.transport.names import SHM_DIR

_SEPARATORS = (",", ":")


class _Off:
    """What :func:`span` returns with no timeline running: nothing happens."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


_OFF = _Off()


class Recorder:
    """One rank's writer: appends events to its file in ``/dev/shm``.

    Parameters
    ----------
    session : str
        The session's name (the file is ``<session>_timeline<rank>``).
    rank : int
        This rank (the events' ``pid``).
    """

    def __init__(self, session: str, rank: int):
        self.rank = rank
        self.path = file_of(session, rank)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        if not os.path.exists(self.path):  # a later timeline of the session appends
            flags |= os.O_EXCL
        self.fd = os.open(self.path, flags, 0o600)
        self.moved: dict[str, int] = {}

    def emit(self, event: dict) -> None:
        """Append one event, whole (one write of one line)."""
        os.write(self.fd, (json.dumps(event, separators=_SEPARATORS) + "\n").encode())

    def span(self, name: str, cat: str, start_ns: int, end_ns: int, args: dict | None) -> None:
        """Append a finished span."""
        event = {
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": start_ns / 1000,
            "dur": (end_ns - start_ns) / 1000,
            "pid": self.rank,
            "tid": 0,
        }
        if args:
            event["args"] = args
        self.emit(event)

    def count(self, kind: str, n_bytes: int) -> None:
        """Add ``n_bytes`` to the bytes moved of ``kind`` and append the counter."""
        self.moved[kind] = self.moved.get(kind, 0) + n_bytes
        self.emit(
            {
                "name": "bytes moved",
                "ph": "C",
                "ts": time.monotonic_ns() / 1000,
                "pid": self.rank,
                "args": dict(self.moved),
            }
        )

    def close(self) -> None:
        """Close the file (it stays for :func:`collect`)."""
        os.close(self.fd)


class _Span:
    __slots__ = ("recorder", "name", "cat", "args", "start")

    def __init__(self, recorder: Recorder, name: str, cat: str, args: dict | None):
        self.recorder, self.name, self.cat, self.args = recorder, name, cat, args

    def __enter__(self) -> None:
        self.start = time.monotonic_ns()

    def __exit__(self, kind, error, tb) -> None:
        args = self.args
        if kind is not None:  # the span ended by an exception: say which
            args = {**(args or {}), "error": kind.__name__}
        self.recorder.span(self.name, self.cat, self.start, time.monotonic_ns(), args)


_recorder: Recorder | None = None


def span(name: str, cat: str, args: dict | None = None):
    """A context manager marking ``name`` (of activity ``cat``, with ``args``) on this
    rank's timeline; it does nothing when no timeline runs."""
    recorder = _recorder
    if recorder is None:
        return _OFF
    return _Span(recorder, name, cat, args)


def around(manager: contextlib.AbstractContextManager, name: str, cat: str, args=None):
    """``manager``, within a :func:`span` when a timeline runs."""
    if _recorder is None:
        return manager
    return _spanning(_Span(_recorder, name, cat, args), manager)


@contextlib.contextmanager
def _spanning(span: _Span, manager: contextlib.AbstractContextManager) -> Iterator[None]:
    with span, manager:
        yield


def mark(name: str, cat: str, start_ns: int, args: dict | None = None) -> None:
    """Record a span that began at ``start_ns`` (``time.monotonic_ns()``) and ends now,
    when a timeline runs (for a wait whose span is only known to be wanted afterwards)."""
    if _recorder is not None:
        _recorder.span(name, cat, start_ns, time.monotonic_ns(), args)


def count_bytes(kind: str, arrays: Iterable) -> None:
    """Count the bytes of ``arrays`` as moved (``kind``: ``"command"``, ``"reply"``,
    ``"collective"``), when a timeline runs."""
    if _recorder is not None:
        _recorder.count(kind, sum(int(getattr(a, "nbytes", 0)) for a in arrays))


def running() -> bool:
    """Whether this rank records a timeline now."""
    return _recorder is not None


def file_of(session: str, rank: int) -> str:
    """The path of rank ``rank``'s events in session ``session``."""
    return os.path.join(SHM_DIR, f"{session}_timeline{rank}")


def start(session: str, rank: int) -> None:
    """Record this rank's spans from now on (nothing changes if it does already)."""
    global _recorder
    if _recorder is None:
        _recorder = Recorder(session, rank)


def stop() -> None:
    """Stop recording (the file stays for :func:`collect`)."""
    global _recorder
    recorder, _recorder = _recorder, None
    if recorder is not None:
        recorder.close()


def follow(on: bool, session: str, rank: int) -> None:
    """(Worker) start or stop recording as rank 0's command says."""
    if on:
        start(session, rank)
    elif _recorder is not None:
        stop()


def collect(session: str, n_ranks: int, first_rank: int = 0) -> list[dict[str, Any]]:
    """(Rank 0) Every rank's events so far, and empty the files for a later timeline.

    Ranks are renumbered from ``first_rank`` (a node's first global rank). A line cut
    short (a worker killed within its write) is skipped.
    """
    events: list[dict[str, Any]] = []
    for rank in range(n_ranks):
        path = file_of(session, rank)
        try:
            with open(path, "rb+") as file:
                lines = file.read().splitlines()
                file.truncate(0)  # the workers append (O_APPEND): they write at the new end
        except FileNotFoundError:  # a worker that never recorded
            continue
        pid = first_rank + rank
        events.append(
            {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {pid}"}}
        )
        for line in lines:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                event["pid"] = pid
                events.append(event)
    return events


def write(path: str | os.PathLike, events: list[dict[str, Any]], node: int = 0) -> None:
    """Write ``events`` as a Chrome trace-event JSON file (Perfetto, chrome://tracing)."""
    with open(path, "w") as file:
        json.dump(
            {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"node": node}},
            file,
            separators=_SEPARATORS,
        )
