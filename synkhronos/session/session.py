"""Rank 0's view of a fork: starting the workers, running one command on every rank,
and stopping them.

Workers are fresh interpreters (``python -m synkhronos.worker``), not ``os.fork`` copies,
so they inherit no threads, device contexts or imported state from the user's process.
They run in their own process session (a Ctrl-C in the terminal reaches rank 0 only).
While rank 0 waits on them, a :class:`~synkhronos.session.liveness.Watchdog` declares a
worker that makes no progress for the fork's ``timeout`` hung. :meth:`Session.close`
stops the workers, removes the session's names and restores rank 0's thread limits and
affinity even when a step of it fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable

import numpy as np

from synkhronos.rank.backends import get_backend, gpu
from synkhronos.rank.backends.cpu import xla_flags as cpu_xla_flags
from synkhronos.rank.first_calls import FirstCalls
from synkhronos.rank.graphs import pack
from synkhronos.rank.heap import keep_freed_memory
from synkhronos.rank.state import RankState
from synkhronos.session.agreed import AgreedValues
from synkhronos.session.liveness import Watchdog
from synkhronos.session.placement import cores_to_pin, on_cpu_cores, rank_threads, worker_env
from synkhronos.session.worker_output import WorkerOutput
from synkhronos.transport import trace
from synkhronos.transport.channel import (
    Aborted,
    Channel,
    ControlBlock,
    WorkerDied,
    WorkerHung,
    failure_error,
)
from synkhronos.transport.comm import make_communicator
from synkhronos.transport.names import (
    NAME_ATTEMPTS,
    NameTaken,
    new_session_name,
    process_prefix,
    sweep,
)
from synkhronos.transport.nodes import current as current_nodes
from synkhronos.transport.protocol import DISCARD_UPDATES, FORGET_DATA, TIMELINE, Command
from synkhronos.transport.shared_arrays import released_ids

_COMMAND_NAMES = {int(c): c.name for c in Command}  # the command spans' names
STOP_GRACE_S = 5.0  # how long close() waits for workers to exit before SIGKILL
DEFAULT_TIMEOUT_S = 300.0  # seconds without progress (not per call) before a rank is hung

_periodic_check: Callable[[], None] | None = None  # what fork(verify_every=N) runs
logger = logging.getLogger(__name__)


class _RankZeroLimits:
    """What :class:`Session` changed in rank 0's process: its math libraries' threads, its
    CPU affinity, ``XLA_FLAGS``, its heap (:mod:`synkhronos.rank.heap`);
    :meth:`restore_original_limits` (at close) undoes it."""

    def __init__(self, threads: int, cores: list[int] | None, backend: str):
        import scipy.linalg  # noqa: F401 - load the BLAS that Numba-compiled graphs call
        from threadpoolctl import threadpool_limits

        self._blas = threadpool_limits(limits=rank_threads(threads))
        self._affinity = os.sched_getaffinity(0)
        self._xla_flags = os.environ.get("XLA_FLAGS")
        if cores is not None:
            os.sched_setaffinity(0, cores)
        xla_flags = cpu_xla_flags(self._xla_flags or "", threads)
        if on_cpu_cores(backend) and xla_flags != (self._xla_flags or ""):
            # Effective only if JAX has not started its CPU client yet in this process.
            os.environ["XLA_FLAGS"] = xla_flags
        self._restore_heap = keep_freed_memory()

    def restore_original_limits(self) -> None:
        """Undo each change, even when undoing another one fails."""
        run_all(
            [
                self._blas.restore_original_limits,
                self._restore_heap or (lambda: None),
                lambda: os.sched_setaffinity(0, self._affinity),
                self._restore_xla_flags,
            ]
        )

    def _restore_xla_flags(self) -> None:
        if self._xla_flags is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = self._xla_flags


def run_all(steps) -> None:
    """Run every one of ``steps``, even when some fail; then raise the first failure, with
    the others as notes."""
    errors = []
    for step in steps:
        try:
            step()
        except BaseException as error:  # noqa: BLE001 - raised below, after the other steps
            errors.append(error)
    if errors:
        for other in errors[1:]:
            errors[0].add_note(f"(also failed: {type(other).__name__}: {other})")
        raise errors[0]


def _limit_threads(threads: int, cores: list[int] | None, backend: str) -> _RankZeroLimits:
    """Give rank 0 its share of the cores, as the workers get theirs: pin it to ``cores``
    and limit its math libraries to ``threads`` threads.

    Oversubscribed BLAS threads spin against each other and can make a step several
    times slower; a rank that migrates between cores loses its caches. Limits numpy's and
    scipy's BLAS (the one Numba-compiled graphs call); :meth:`Session.close` restores all.
    """
    return _RankZeroLimits(threads, cores, backend)


class Session:
    """Rank 0's view of a fork: the workers, the channel, and rank 0's own state.

    Attributes
    ----------
    alone : bool
        Whether rank 0 is the only rank of the only node: :meth:`execute` then runs rank
        0's part alone (no worker to command or wait for), and a kept call may take numpy
        arrays as they are (:mod:`synkhronos.api.calls`).
    """

    def __init__(
        self,
        n_ranks: int,
        backend_name: str,
        gpus: list[str] | None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        rank_prefix: bool = True,
    ):
        self.n_ranks = n_ranks
        self.alone = current_nodes().n_global == 1
        self.backend = get_backend(backend_name)
        self.broken = False
        self.processes: list[subprocess.Popen] = []
        self.thread_limits: _RankZeroLimits | None = None
        self.verify_every: int | None = None  # fork(verify_every=N)
        self.calls = 0  # function calls and chains run, counted while verify_every is set
        self.discard_updates = False  # the next command tells the workers to drop theirs
        self.timeline_path: str | None = None  # where the running timeline goes
        self.name, self.control, self.channel, comm = self._create_names(backend_name)
        control = self.control  # not self: the session would sit in a reference cycle
        self.watchdog = Watchdog([], lambda rank: int(control.heartbeat(rank)[0]), timeout)
        # Rank 0 watches the workers while it waits for the lock.
        watch = _weak(self.check_alive)
        first_calls = FirstCalls(self.control.segment.fd, watch, share=(0, n_ranks))
        self.state = RankState(0, n_ranks, comm, self.backend, first_calls)
        self.threads = max(1, len(os.sched_getaffinity(0)) // n_ranks)  # per rank
        self.cores = cores_to_pin(n_ranks, backend_name)
        self.functions: list = []  # every synkhronos Function built in this session
        self.shipped = 0  # how many of them distribute() shipped
        self.sliceable_ids: set[int] = set()  # id() of every sliceable shared variable
        # Rows of sliceable variables per rank (see collectives.sliceable_lengths); emptied
        # by forget_lengths() whenever a call or collective may have changed them.
        self.lengths_cache: dict[tuple, list[int]] = {}
        # Rank 0's shared values as synkhronos last left them: a call first broadcasts
        # those the program changed since (collectives.send_changes).
        self.agreed = AgreedValues()
        self.output = WorkerOutput(rank_prefix, current_nodes().offset)
        try:
            self.thread_limits = _limit_threads(
                self.threads, self.cores[0] if self.cores else None, backend_name
            )
            self._start_workers(backend_name, gpus)
        except BaseException as error:
            self.broken = True
            try:
                self.close()
            except Exception as closing:  # noqa: BLE001 - the start's error is the one to see
                error.add_note(f"(closing the half-started session failed too: {closing})")
            raise

    def _create_names(self, backend_name: str) -> tuple:
        """The session's name and what rank 0 creates under it: the control block, the
        channel, the communicator. A name someone else took is skipped by starting again
        under a fresh name."""
        check_alive = _weak(self.check_alive)
        for _ in range(NAME_ATTEMPTS - 1):
            try:
                return self._names_under(new_session_name(), backend_name, check_alive)
            except NameTaken:
                continue
        return self._names_under(new_session_name(), backend_name, check_alive)

    def _names_under(self, name: str, backend_name: str, check_alive) -> tuple:
        """Create the control block, the channel and the communicator under ``name``;
        remove what was made if one fails."""
        try:
            control = ControlBlock(name, self.n_ranks, create=True)
            channel = Channel(name, 0, self.n_ranks, control, check_alive)
            comm = make_communicator(backend_name, name, 0, self.n_ranks, control, check_alive)
        except BaseException:
            sweep(name)
            raise
        return name, control, channel, comm

    def _start_workers(self, backend_name: str, gpus: list[str] | None) -> None:
        for rank in range(1, self.n_ranks):
            gpu = gpus[rank] if gpus else None
            self.processes.append(
                self.output.spawn(
                    rank,
                    [
                        sys.executable,
                        "-m",
                        "synkhronos.worker",
                        self.name,
                        process_prefix(),
                        str(rank),
                        str(self.n_ranks),
                        str(os.getpid()),
                        backend_name,
                    ],
                    env=worker_env(self.threads, backend_name, gpu),
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            if self.cores is not None:
                # Set on the fresh interpreter before it loads numpy: every thread it
                # starts later inherits the set. (One that died is reported just below.)
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(self.processes[-1].pid, self.cores[rank])
            self.watchdog.pids.append(self.processes[-1].pid)
        self.output.start()
        self.state.comm.start()
        failures = self.channel.wait_done()  # each worker reports once it is ready
        if failures:
            raise failure_error(failures)

    def start_timeline(self, path: str | os.PathLike) -> None:
        """Record every rank's timeline from now on, for :meth:`stop_timeline` to write
        to ``path``; ``RuntimeError`` if one is being recorded already."""
        if self.timeline_path is not None:
            raise RuntimeError(
                f"synkhronos records a timeline into {self.timeline_path} already; "
                "one timeline at a time"
            )
        with open(path, "w"):  # a path that cannot be written fails now, not at the end
            pass
        self.timeline_path = os.path.abspath(path)  # the file goes there, whatever the cwd then
        trace.start(self.name, 0)  # the workers start with the next command (its flag)

    def stop_timeline(self) -> None:
        """Write the running timeline's file (nothing if none runs): every rank's events
        so far, a dead worker's included. Under MPI, node ``k`` > 0 writes
        ``<path>.node<k>``, on its own machine's clock."""
        path, self.timeline_path = self.timeline_path, None
        if path is None:
            return
        trace.stop()
        world = current_nodes()
        events = trace.collect(self.name, self.n_ranks, world.offset)
        trace.write(path if world.node == 0 else f"{path}.node{world.node}", events, world.node)

    def forget_lengths(self) -> None:
        """Drop the cached rows of sliceable variables (their values may have changed)."""
        self.lengths_cache.clear()

    def distribute(self) -> None:
        """Ship every function built but not yet shipped to the workers (each rank compiles a
        function at its first call).

        One pickle carries them all, so a shared variable several functions use stays one
        variable on each rank; shared variables shipped earlier are referred to, not copied.
        """
        if self.shipped == len(self.functions):
            return
        specs = [f.spec for f in self.functions[self.shipped :]]
        shipped = len(self.state.registry)
        payload = np.frombuffer(pack(specs, self.state.registry), np.uint8)
        try:
            self.execute(Command.DISTRIBUTE, [payload], lambda: self.state.add_functions(specs))
        except BaseException:
            self.broken = True  # the ranks' registries may now disagree
            raise
        self.agreed.agree(self.state.registry.variables[shipped:])  # the values shipped
        self.shipped = len(self.functions)

    def check_alive(self) -> None:
        """Raise :class:`WorkerDied` if any worker has exited, :class:`WorkerHung` if one
        made no progress for ``timeout`` seconds (polled while rank 0 waits)."""
        for rank, process in enumerate(self.processes, start=1):
            code = process.poll()
            if code is not None:
                self.broken = True
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                raise WorkerDied(
                    f"synkhronos worker rank {rank} died ({how}); call synk.close() and fork again"
                )
        try:
            self.watchdog.check()
        except WorkerHung:
            self.broken = True
            raise

    def execute(self, code: int, arrays, local, args: tuple = ()):
        """Send a command to every worker, run ``local(*args)`` as rank 0's part, and wait.

        Raises rank 0's own exception, or a :class:`RemoteError` naming the failed workers'
        ranks with their tracebacks (:class:`SharedMemoryFull
        <synkhronos.transport.shm.SharedMemoryFull>` where ``/dev/shm`` was full);
        returns ``local``'s result otherwise. The updates a call left pending on every
        rank (:attr:`RankState.pending <synkhronos.rank.state.RankState.pending>`) are
        applied only if no rank failed: rank 0's here, the workers' before their next
        command, which otherwise tells them to drop theirs. Every command of the session
        runs through here, on one rank too (:attr:`alone`: no message, no wait).
        """
        if self.broken:
            raise RuntimeError(
                "this synkhronos session is broken (a worker died or a call "
                "was interrupted); call synk.close() and fork again"
            )
        if self.alone and self.timeline_path is None:
            # No worker to command, wait for or tell of released Data: the command is
            # rank 0's part, settled as below (inline: this is most of a tiny call's cost).
            released_ids.clear()
            try:
                result = local(*args)
            except BaseException as e:  # noqa: BLE001 - _settle raises it
                self._settle((), self._failed(e))
            if self.state.pending:
                self._settle((), None)
            if self.verify_every:
                self._count(code)
            return result
        with trace.span(_COMMAND_NAMES[code], "command"):
            code = self._send(code, arrays)
            result, error = self._run_local(local, args)
            try:
                with trace.span("wait for ranks", "wait"):
                    failures = self.channel.wait_done()
            except BaseException:
                self.broken = True
                raise
            self._settle(failures, error)
            self._count(code)
            return result

    def _count(self, code: int) -> None:
        """Count a call or chain run while ``fork(verify_every=N)`` is set, and verify the
        ranks after every N-th."""
        if self.verify_every and code & (FORGET_DATA - 1) in (Command.CALL, Command.CHAIN):
            self.calls += 1
            if self.calls % self.verify_every == 0 and _periodic_check is not None:
                _periodic_check()

    def _send(self, code: int, arrays) -> int:
        """Post the command to the workers (if any); return its code with the flags added."""
        if released_ids:
            # Tell the workers to unmap released Data along with this command.
            code, arrays = code | FORGET_DATA, [*arrays, self._released()]
        if self.processes:
            self.watchdog.arm()
            if self.discard_updates:
                code |= DISCARD_UPDATES
            with trace.span("send", "command"):
                self.channel.send(code | TIMELINE if self.timeline_path else code, arrays)
            trace.count_bytes("command", arrays)
            self.discard_updates = False
        return code

    def _run_local(self, local, args: tuple) -> tuple:
        """Rank 0's part: ``(result, None)``, or ``(None, error)`` with the workers told to
        abort; a Ctrl-C is raised at once."""
        try:
            return local(*args), None
        except BaseException as e:  # noqa: BLE001 - re-raised by execute, after the workers
            return None, self._failed(e)

    def _failed(self, e: BaseException) -> BaseException:
        """Rank 0's part raised ``e``: tell the workers to abort, and return the error to
        raise once they are done; a Ctrl-C is raised at once."""
        error = _interrupt_behind(e)
        self.control.set_abort(True)
        if isinstance(error, KeyboardInterrupt):
            # Ctrl-C in rank 0's own part: the session is broken anyway, and a worker
            # that cannot answer (stopped, hung) must not keep the user waiting; close()
            # ends the workers.
            self.broken = True
            raise error from e if error is not e else None
        return error

    def _settle(self, failures, error: BaseException | None) -> None:
        """After every rank is done: apply the pending updates if no rank failed (else drop
        them), clear an abort, and raise rank 0's error or the workers'."""
        if failures or error is not None:
            self.state.pending.clear()
            self.discard_updates = bool(self.processes)
        elif self.state.pending:
            with trace.span("apply updates", "updates"):
                self.state.apply_pending()
        if self.control.aborted:
            self.state.comm.reset()
            self.control.set_abort(False)
        if failures:
            remote = failure_error(failures)
            if error is not None and not isinstance(error, Aborted):
                raise error from remote
            raise remote
        if error is not None:
            raise error

    @staticmethod
    def _released() -> np.ndarray:
        ids = []
        while released_ids:  # pop: a finalizer may append meanwhile
            ids.append(released_ids.pop())
        return np.array(ids, np.int64)

    def close(self) -> None:
        """Stop the workers, remove every name of the session, and restore rank 0's thread
        limits and CPU affinity.

        A sound session sends STOP; a broken one (a worker died or hung, a call was
        interrupted), or one that cannot send, sends SIGTERM. Workers still running after
        :data:`STOP_GRACE_S` get SIGKILL. Each step runs even when an earlier one failed;
        the first failure is raised at the end, with the others noted on it.
        """
        # JAX's runtime, which holds GPU ranks' device arrays, goes with the communicator:
        # the backend first gives shared variables host values.
        run_all(
            [
                self._stop_workers,
                self.output.close,
                lambda: self.backend.close(self.state.registry.variables),
                self.state.comm.close,
                self.control.segment.close_fd,
                lambda: sweep(self.name),
                self._restore_limits,
                gpu.restore_environment,  # after the limits: both restore XLA_FLAGS
                self.functions.clear,
            ]
        )  # they refer to this session: no cycle to wait on

    def _stop_workers(self) -> None:
        unsent = None
        if not self.broken and all(p.poll() is None for p in self.processes):
            try:
                self.channel.send(Command.STOP)
            except Exception as error:  # noqa: BLE001 - raised once the workers are ended
                unsent = error
                self._terminate()
        else:
            self._terminate()
        # STOP carries no arrays and the workers hold open what they still use, so the
        # names can go now: should rank 0 be killed while it waits, nothing is left.
        sweep(self.name)
        deadline = time.monotonic() + STOP_GRACE_S
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                try:
                    process.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:  # e.g. stuck in a driver call
                    logger.warning(
                        "synkhronos: worker pid %d did not exit after SIGKILL; leaving it",
                        process.pid,
                    )
        if unsent is not None:
            raise unsent

    def _restore_limits(self) -> None:
        if self.thread_limits is not None:
            self.thread_limits.restore_original_limits()

    def _terminate(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
                process.send_signal(signal.SIGCONT)  # a stopped worker acts on it once resumed


def _weak(method):
    """``method``, called through a weak reference to its object.

    The channel and communicator call back into the session; with strong references the
    session would sit in a reference cycle, and its mappings (one fd each) would outlive
    it until the next garbage collection.
    """
    ref = weakref.WeakMethod(method)
    return lambda: ref()()


def _interrupt_behind(error: BaseException) -> BaseException:
    """The ``KeyboardInterrupt`` that caused ``error``, else ``error``.

    Ctrl-C while a Numba-compiled graph runs surfaces as a ``SystemError`` ("returned a
    result with an exception set") caused by the interrupt; the user pressed Ctrl-C, so
    that is what is raised.
    """
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, KeyboardInterrupt):
        cause = cause.__cause__ or cause.__context__
    return error if cause is None else cause


def set_periodic_check(check: Callable[[], None]) -> None:
    """Make ``check`` what ``fork(verify_every=N)`` runs after every N-th call or chain
    (:mod:`synkhronos.api.verification` registers ``verify``: a layer this one does not
    import)."""
    global _periodic_check
    _periodic_check = check
