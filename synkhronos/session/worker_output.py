"""What the workers print and log, brought to rank 0 with their rank.

Each worker's stdout and stderr are pipes that rank 0 reads: every line comes out of rank
0's ``sys.stdout`` or ``sys.stderr`` behind the worker's rank, ``[rank 1] ...``, as Horovod
and torchrun tag their workers' lines (global ranks under MPI). ``fork(rank_prefix=False)``
or the environment variable ``SYNK_RANK_PREFIX=0`` turns that off: the workers then write
to rank 0's terminal (its file descriptors 1 and 2) directly, as the user's own processes
would.

A worker's log records travel on a third pipe (:mod:`synkhronos.transport.log_records`)
and are handed to rank 0's logger of the same name with the attribute ``rank`` set (and,
with the prefix on, the message tagged as above), so rank 0's logging configuration
decides what is shown of every rank, where, and how.

One thread of rank 0 reads every pipe of a session. It never waits for anything but the
pipes and rank 0's own output, so a worker that writes much waits at most until rank 0
takes the GIL back; what a worker wrote before it died stays in its pipe and is read to
the end; :meth:`WorkerOutput.close` (once the workers are stopped) reads what is left,
closes the pipes and ends the thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import selectors
import subprocess
import sys
import threading

from synkhronos.transport.log_records import LOG_FD_VAR, LOG_LEVEL_VAR, decode, lowest_level

PREFIX_VAR = "SYNK_RANK_PREFIX"
PIPE_BYTES = 1 << 20  # asked of each pipe, so that a burst of output never waits on rank 0
MAX_LINE = 1 << 20  # a longer line without a newline is passed on in pieces
JOIN_S = 5.0  # close() waits this long for the thread (blocked only if rank 0's output is)

logger = logging.getLogger(__name__)


def prefix_wanted(rank_prefix: bool | None = None) -> bool:
    """Whether workers' lines get their rank: ``rank_prefix`` if given, else not when the
    environment variable :data:`PREFIX_VAR` is ``0``.

    Examples
    --------
    >>> prefix_wanted(False), prefix_wanted(True)
    (False, True)
    """
    if rank_prefix is not None:
        return bool(rank_prefix)
    return os.environ.get(PREFIX_VAR, "1").strip() != "0"


class _Pipe:
    """Rank 0's end of one pipe of a worker: what it carries, and its unfinished line."""

    def __init__(self, fd: int, rank: int, kind: str):
        self.fd, self.rank, self.kind = fd, rank, kind
        self.partial = b""


def _pipe() -> tuple[int, int]:
    read, write = os.pipe()
    with contextlib.suppress(OSError, AttributeError):  # the system's default size then
        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    os.set_blocking(read, False)
    return read, write


class WorkerOutput:
    """The pipes of a session's workers and the thread that reads them.

    Parameters
    ----------
    prefix : bool
        Tag the workers' lines with their rank, and read their stdout and stderr at all.
    first_rank : int
        The global rank of this node's rank 0 (under MPI), added to local ranks.
    """

    def __init__(self, prefix: bool, first_rank: int = 0):
        self.prefix, self.first_rank = prefix, first_rank
        self._pipes: list[_Pipe] = []
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = os.pipe()
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._thread: threading.Thread | None = None
        self._closed = False

    def spawn(self, rank: int, argv: list[str], env: dict, **popen_args) -> subprocess.Popen:
        """Start worker ``rank`` (local) with its log-record pipe, and its stdout and
        stderr on pipes of their own when lines are tagged."""
        kinds = ["log", "stdout", "stderr"] if self.prefix else ["log"]
        ends = [_pipe() for _ in kinds]
        writes = dict(zip(kinds, (write for _, write in ends), strict=True))
        env = dict(env, **{LOG_FD_VAR: str(writes["log"]), LOG_LEVEL_VAR: str(lowest_level())})
        try:
            process = subprocess.Popen(
                argv,
                env=env,
                pass_fds=(writes["log"],),
                stdout=writes.get("stdout"),
                stderr=writes.get("stderr"),
                **popen_args,
            )
        except BaseException:
            for read, _ in ends:
                os.close(read)
            raise
        finally:
            for write in writes.values():
                os.close(write)  # the worker holds its copies: a pipe ends when it exits
        for kind, (read, _) in zip(kinds, ends, strict=True):
            pipe = _Pipe(read, self.first_rank + rank, kind)
            self._pipes.append(pipe)
            self._selector.register(read, selectors.EVENT_READ, pipe)
        return process

    def start(self) -> None:
        """Start reading (once every worker is spawned)."""
        self._thread = threading.Thread(
            target=self._run, name="synkhronos-worker-output", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Read what the workers left in their pipes, close them, and end the thread.

        Call once the workers have exited (a pipe a worker's own child still holds is not
        waited for).
        """
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            os.write(self._wake_write, b"x")
            self._thread.join(JOIN_S)
            if self._thread.is_alive():
                logger.warning(
                    "synkhronos: the thread passing on the workers' output is "
                    "blocked writing to this process's output; leaving it"
                )
                return
        else:
            self._drain()
        self._selector.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _run(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.data is None:  # woken by close()
                    self._drain()
                    return
                self._read(key.data)

    def _drain(self) -> None:
        for pipe in list(self._pipes):
            while pipe in self._pipes and self._read(pipe):
                pass
            if pipe in self._pipes:
                self._end(pipe)

    def _read(self, pipe: _Pipe) -> bool:
        """Read once from ``pipe`` and pass its whole lines on; False when nothing was
        waiting (or the pipe ended)."""
        try:
            chunk = os.read(pipe.fd, 1 << 16)
        except BlockingIOError:
            return False
        if not chunk:
            self._end(pipe)
            return False
        lines = (pipe.partial + chunk).split(b"\n")
        pipe.partial = lines.pop()
        if pipe.kind != "log" and len(pipe.partial) > MAX_LINE:
            lines.append(pipe.partial)
            pipe.partial = b""
        if lines:
            self._pass_on(pipe, lines)
        return True

    def _pass_on(self, pipe: _Pipe, lines: list[bytes]) -> None:
        """Write or log ``lines``; a failure is reported, never ends the reading (a worker
        would then wait on its full pipe)."""
        try:
            self._write(pipe, lines)
        except Exception:  # noqa: BLE001 - e.g. a logging filter that raised
            with contextlib.suppress(Exception):
                logger.exception("synkhronos: could not pass on rank %d's %s", pipe.rank, pipe.kind)

    def _end(self, pipe: _Pipe) -> None:
        if pipe.partial:
            self._pass_on(pipe, [pipe.partial])
        self._selector.unregister(pipe.fd)
        os.close(pipe.fd)
        self._pipes.remove(pipe)

    def _write(self, pipe: _Pipe, lines: list[bytes]) -> None:
        if pipe.kind == "log":
            for line in lines:
                self._log(pipe.rank, line)
            return
        tag = f"[rank {pipe.rank}] ".encode()  # stdout and stderr have pipes only when tagged
        data = b"".join(tag + line + b"\n" for line in lines)
        stream = sys.stdout if pipe.kind == "stdout" else sys.stderr
        # Into the text stream's byte buffer, which, unlike the text stream, may be written
        # from two threads at once; rank 0's own text reaches it when that stream flushes.
        binary = getattr(stream, "buffer", None)
        with contextlib.suppress(AttributeError, ValueError, OSError):  # no output, closed
            if binary is not None:
                binary.write(data)
                binary.flush()
            else:  # a text-only stream (a notebook's, say)
                stream.write(data.decode(errors="replace"))
                stream.flush()

    def _log(self, rank: int, line: bytes) -> None:
        try:
            record = decode(line)
        except ValueError:  # cut off: the worker died while writing it
            record = logging.makeLogRecord(
                {
                    "name": "synkhronos.worker",
                    "levelno": logging.WARNING,
                    "levelname": "WARNING",
                    "msg": f"(a record cut off) {line[:1000]!r}",
                }
            )
        record.rank = rank
        if self.prefix:
            record.msg = f"[rank {rank}] {record.msg}"
        target = logging.getLogger(record.name)
        if target.isEnabledFor(record.levelno):
            target.handle(record)
