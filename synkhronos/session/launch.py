"""Starting and stopping the workers, and running one command on every rank.

Workers are fresh interpreters (``python -m synkhronos.worker``), not ``os.fork`` copies,
so they inherit no threads, device contexts or imported state from the user's process.
They run in their own process session (a Ctrl-C in the terminal reaches rank 0 only) and
end with rank 0: a guardian process (:func:`synkhronos.transport.names.guard`) ends them
and sweeps the shared memory once rank 0 is gone, however it ended. While rank 0 waits on
them, a :class:`~synkhronos.session.liveness.Watchdog` declares a worker that makes no
progress for the fork's ``timeout`` hung. SIGTERM to rank 0 closes the session before the
previous handler runs; :func:`fork` removes the names, and ends the workers, that this
user's programs which died left. :meth:`Session.close` stops the workers, removes the
session's names and restores rank 0's thread limits and affinity even when a step of it
fails.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Literal, overload

import numpy as np

from synkhronos.rank.backends import get_backend, gpu
from synkhronos.rank.backends.cpu import xla_flags as cpu_xla_flags
from synkhronos.rank.backends.cpu_choice import CHOICE_VAR, faster_cpu_backend, known_choice
from synkhronos.rank.first_calls import FirstCalls
from synkhronos.rank.graphs import pack
from synkhronos.rank.heap import keep_freed_memory
from synkhronos.rank.state import RankState
from synkhronos.session.agreed import AgreedValues
from synkhronos.session.liveness import Watchdog
from synkhronos.session.worker_output import WorkerOutput, prefix_wanted
from synkhronos.transport import names, trace
from synkhronos.transport.channel import (
    Aborted,
    Channel,
    ControlBlock,
    WorkerDied,
    WorkerHung,
    failure_error,
)
from synkhronos.transport.comm import make_communicator
from synkhronos.transport.comm.xla import COORDINATOR_VAR, free_address
from synkhronos.transport.names import (
    NAME_ATTEMPTS,
    NameTaken,
    dead_prefixes,
    end_workers,
    new_session_name,
    process_prefix,
    sweep,
)
from synkhronos.transport.nodes import LAYOUT_VAR, coordinator_host, under_mpi_launcher
from synkhronos.transport.nodes import current as current_nodes
from synkhronos.transport.nodes import start as start_nodes
from synkhronos.transport.nodes import stop as stop_nodes
from synkhronos.transport.protocol import DISCARD_UPDATES, FORGET_DATA, TIMELINE, Command
from synkhronos.transport.shared_arrays import released_ids

TIMELINE_VAR = "SYNK_TIMELINE"  # a path: fork records every rank's timeline there until close
_COMMAND_NAMES = {int(c): c.name for c in Command}  # the command spans' names
STOP_GRACE_S = 5.0  # how long close() waits for workers to exit before SIGKILL
DEFAULT_TIMEOUT_S = 300.0  # seconds without progress (not per call) before a rank is hung

_session: Session | None = None
_periodic_check: Callable[[], None] | None = None  # what fork(verify_every=N) runs
logger = logging.getLogger(__name__)


@overload
def auto_backend(deciding: Literal[True] = True) -> tuple[str, str]: ...
@overload
def auto_backend(deciding: bool) -> tuple[str | None, str]: ...


def auto_backend(deciding: bool = True) -> tuple[str | None, str]:
    """The backend ``fork(backend="auto")`` takes, and why.

    "gpu" when GPUs are visible, JAX may use them and the GPU extra is installed, else
    :func:`auto_cpu_backend`'s choice. ``deciding``: as ``fork`` decides, warning when
    GPUs are visible but the extra is missing, and measuring the CPU backends if this
    machine never did; else only describing (the choice is None where ``fork`` would
    measure).
    """
    if gpu.on_cpu_devices():
        where = "JAX_PLATFORMS=cpu (GPU ranks on CPU devices only with backend='gpu')"
    elif not gpu.visible_gpus():
        where = "no GPU visible"
    elif missing := gpu.gpu_packages_missing():
        where = (
            f"GPUs are visible but {' and '.join(missing)} is missing, so CPU ranks; "
            f"{gpu.EXTRA_HINT}"
        )
        if deciding:
            logger.warning("synkhronos: %s", where)
    else:
        return "gpu", "GPUs are visible, and JAX with its CUDA plugin is installed"
    choice, why = auto_cpu_backend(deciding)
    return choice, f"{where}; on CPU ranks: {why}"


@overload
def auto_cpu_backend(deciding: Literal[True] = True) -> tuple[str, str]: ...
@overload
def auto_cpu_backend(deciding: bool) -> tuple[str | None, str]: ...


def auto_cpu_backend(deciding: bool = True) -> tuple[str | None, str]:
    """ "jax-cpu" where PyTensor's JAX mode was measured faster on this machine, else "cpu"
    (:mod:`synkhronos.rank.backends.cpu_choice`); "cpu" under an MPI launcher, where nodes
    measuring apart could choose apart. With the reason; without ``deciding``, None where
    it would measure."""
    if under_mpi_launcher() and not os.environ.get(CHOICE_VAR):
        return "cpu", "under an MPI launcher, where nodes measuring apart could choose apart"
    known = known_choice()
    if known is not None:
        return known
    if not deciding:
        return None, (
            "not measured on this machine yet: the first fork with "
            "backend='auto' times PyTensor's default and JAX modes (seconds, once)"
        )
    return faster_cpu_backend(), "measured now"


def _match_jax_precision() -> None:
    """Make rank 0's JAX precision follow floatX now, as the workers' will.

    PyTensor's JAX backend fixes ``jax_enable_x64`` from floatX when it is first imported;
    if floatX changed since, rank 0 would compute in another precision than the workers.
    """
    import pytensor

    try:
        import jax
    except ImportError:
        raise ImportError(
            "the jax-cpu and gpu backends need JAX; install the extra: "
            "pip install 'synkhronos[jax]' (or [cuda] for GPUs)"
        ) from None
    import pytensor.link.jax.dispatch  # noqa: F401 - sets x64 from floatX on first import

    jax.config.update("jax_enable_x64", pytensor.config.floatX == "float64")


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def rank_cores(n_ranks: int, available=None) -> list[list[int]] | None:
    """The cores each rank is pinned to, or None to pin none.

    Rank ``r`` gets ``cores[r * k:(r + 1) * k]`` of the sorted ``available`` cores (default:
    this process's affinity set), ``k = len(cores) // n_ranks``. None when there are fewer
    cores than ranks.

    Examples
    --------
    >>> rank_cores(2, {0, 1, 2, 3, 4})
    [[0, 1], [2, 3]]
    >>> rank_cores(3, {4, 6}) is None
    True
    """
    cores = sorted(os.sched_getaffinity(0) if available is None else available)
    if len(cores) < n_ranks:
        return None
    k = len(cores) // n_ranks
    return [cores[r * k : (r + 1) * k] for r in range(n_ranks)]


def cores_to_pin(n_ranks: int, backend_name: str) -> list[list[int]] | None:
    """:func:`rank_cores`, or None to pin none: when the environment variable
    ``SYNK_AFFINITY`` is ``0``, and for GPU ranks on GPUs, which the GPUs drive (pinning
    would only starve their threads)."""
    if os.environ.get("SYNK_AFFINITY") == "0":
        return None
    if backend_name == "gpu" and not gpu.on_cpu_devices():
        return None
    return rank_cores(n_ranks)


class _RankZeroLimits:
    """What :class:`Session` changed in rank 0's process: its math libraries' threads, its
    CPU affinity, ``XLA_FLAGS``, its heap (:mod:`synkhronos.rank.heap`);
    :meth:`restore_original_limits` (at close) undoes it."""

    def __init__(self, threads: int, cores: list[int] | None, backend: str):
        import scipy.linalg  # noqa: F401 - load the BLAS that Numba-compiled graphs call
        from threadpoolctl import threadpool_limits

        self._blas = threadpool_limits(limits=threads)
        self._affinity = os.sched_getaffinity(0)
        self._xla_flags = os.environ.get("XLA_FLAGS")
        if cores is not None:
            os.sched_setaffinity(0, cores)
        xla_flags = cpu_xla_flags(self._xla_flags or "", threads)
        if _jax_on_cpus(backend) and xla_flags:
            # Effective only if JAX has not started its CPU client yet in this process.
            os.environ["XLA_FLAGS"] = xla_flags
        self._restore_heap = keep_freed_memory()

    def restore_original_limits(self) -> None:
        """Undo each change, even when undoing another one fails."""
        _run_all(
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


def _run_all(steps) -> None:
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


def _jax_on_cpus(backend: str) -> bool:
    """Whether ranks of ``backend`` run XLA on CPU cores ("jax-cpu", and "gpu" on CPU
    devices): then each gets its share of the cores, as CPU ranks do, and XLA on one core
    no thread pool (two processes' pools spinning on the same cores made a 2-rank MLP
    step 1 s instead of tens of ms)."""
    return backend == "jax-cpu" or (backend == "gpu" and gpu.on_cpu_devices())


def _worker_env(threads: int, backend: str, gpu: str | None) -> dict:
    import pytensor

    env = dict(os.environ)
    for var in THREAD_VARS:
        env.setdefault(var, str(threads))
    flags = env.get("PYTENSOR_FLAGS", "")
    env["PYTENSOR_FLAGS"] = ",".join(f for f in (flags, f"floatX={pytensor.config.floatX}") if f)
    env["SYNK_SYS_PATH"] = json.dumps(sys.path)
    if _jax_on_cpus(backend):
        env["JAX_PLATFORMS"] = "cpu"
        xla_flags = cpu_xla_flags(env.get("XLA_FLAGS", ""), threads)
        if xla_flags:
            env["XLA_FLAGS"] = xla_flags
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


class Session:
    """Rank 0's view of a fork: the workers, the channel, and rank 0's own state."""

    verify_every: int | None = None  # fork(verify_every=N)
    calls = 0  # function calls and chains run, counted while verify_every is set

    def __init__(
        self,
        n_ranks: int,
        backend_name: str,
        gpus: list[str] | None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        rank_prefix: bool = True,
    ):
        self.n_ranks = n_ranks
        self.backend = get_backend(backend_name)
        self.broken = False
        self.processes: list[subprocess.Popen] = []
        self.thread_limits: _RankZeroLimits | None = None
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
                    env=_worker_env(self.threads, backend_name, gpu),
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
        pending = [f for f in self.functions if not f._shipped]
        if not pending:
            return
        specs = [f._spec for f in pending]
        shipped = len(self.state.registry)
        payload = np.frombuffer(pack(specs, self.state.registry), np.uint8)
        try:
            self.execute(Command.DISTRIBUTE, [payload], lambda: self.state.add_functions(specs))
        except BaseException:
            self.broken = True  # the ranks' registries may now disagree
            raise
        self.agreed.agree(self.state.registry.variables[shipped:])  # the values shipped
        for f in pending:
            f._shipped = True

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

    def check_sound(self) -> None:
        """``RuntimeError`` if the session is broken (a command must not be run)."""
        if self.broken:
            raise RuntimeError(
                "this synkhronos session is broken (a worker died or a call "
                "was interrupted); call synk.close() and fork again"
            )

    def execute(self, code: int, arrays, local):
        """Send a command to every worker, run ``local()`` as rank 0's part, and wait.

        Raises rank 0's own exception, or a :class:`RemoteError` naming the failed workers'
        ranks with their tracebacks (:class:`SharedMemoryFull
        <synkhronos.transport.shm.SharedMemoryFull>` where ``/dev/shm`` was full);
        returns ``local()``'s result otherwise. The updates a call left pending on every
        rank (:attr:`RankState.pending <synkhronos.rank.state.RankState.pending>`) are
        applied only if no rank failed: rank 0's here, the workers' before their next
        command, which otherwise tells them to drop theirs.
        """
        self.check_sound()
        with trace.span(_COMMAND_NAMES[code], "command"):
            code = self._send(code, arrays)
            result, error = self._run_local(local)
            try:
                with trace.span("wait for ranks", "wait"):
                    failures = self.channel.wait_done()
            except BaseException:
                self.broken = True
                raise
            self._settle(failures, error)
            if self.verify_every and code & (FORGET_DATA - 1) in (Command.CALL, Command.CHAIN):
                self.calls += 1
                if self.calls % self.verify_every == 0 and _periodic_check is not None:
                    _periodic_check()
            return result

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

    def _run_local(self, local) -> tuple:
        """Rank 0's part: ``(result, None)``, or ``(None, error)`` with the workers told to
        abort; a Ctrl-C is raised at once."""
        try:
            return local(), None
        except BaseException as e:  # noqa: BLE001 - re-raised by execute, after the workers
            error = _interrupt_behind(e)
            self.control.set_abort(True)
            if isinstance(error, KeyboardInterrupt):
                # Ctrl-C in rank 0's own part: the session is broken anyway, and a
                # worker that cannot answer (stopped, hung) must not keep the user
                # waiting; close() ends the workers.
                self.broken = True
                raise error from e if error is not e else None
            return None, error

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
        _run_all(
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


def current() -> Session:
    """The running session; ``RuntimeError`` if :func:`fork` was not called."""
    if _session is None:
        raise RuntimeError("synkhronos is not running: call synk.fork() first")
    return _session


def backend() -> str:
    """The backend of the running fork: "cpu", "jax-cpu" or "gpu" (what "auto" chose).

    Examples
    --------
    >>> synk.fork(backend="auto")                 # doctest: +SKIP
    >>> mode = "CVM" if synk.backend() == "cpu" else None   # doctest: +SKIP
    """
    return current().backend.name


def get_n_gpu() -> int:
    """The number of GPUs this process may use, counted without initialising CUDA
    (``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi``; 0 when neither finds any).

    Examples
    --------
    >>> import synkhronos as synk
    >>> synk.get_n_gpu() >= 0
    True
    """
    return len(gpu.visible_gpus())


def fork(
    n_parallel: int | None = None,
    use_gpu: bool = True,
    master_rank: int = 0,
    profile_workers: bool = False,
    max_n_var: int = 1000,
    max_dim: int = 16,
    backend: str = "auto",
    gpus: list[int] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    nodes: bool | None = None,
    rank_prefix: bool | None = None,
    timeline: str | os.PathLike | None = None,
    verify_every: int | None = None,
) -> int:
    """Start the worker processes; return the number of ranks (rank 0 is this process).

    Parameters
    ----------
    n_parallel : int, optional
        Number of ranks. Default: one per usable CPU core (``os.sched_getaffinity``) on
        CPU backends and on "gpu" with ``JAX_PLATFORMS=cpu`` (CPU devices), one per
        visible GPU on "gpu".
    use_gpu : bool
        False: CPU ranks (with ``backend="auto"``, "cpu" or "jax-cpu" as below).
    master_rank : int
        Which visible GPU rank 0 drives (the others follow in order); ignored on CPU
        ranks and when ``gpus`` is given.
    profile_workers, max_n_var, max_dim
        Accepted for programs written for the original Synkhronos, and ignored: there
        is no worker profiling here, and nothing has a fixed number of variables or
        dimensions.
    backend : {"auto", "cpu", "jax-cpu", "gpu"}
        "auto" picks "gpu" when GPUs are visible (counted with ``nvidia-smi``, without
        initialising CUDA here), ``JAX_PLATFORMS`` is not "cpu", and the GPU extra is
        installed. "gpu" with ``JAX_PLATFORMS=cpu`` runs GPU ranks' code on one CPU
        device per rank, collectives through gloo (as the tests do). Otherwise it picks
        "jax-cpu" where PyTensor's JAX mode was measured at least 1.1x faster than its
        default mode on this machine and floatX, else "cpu"; the measurement (a few
        seconds) runs once and is remembered (see :doc:`model`). The environment
        variable ``SYNK_CPU_BACKEND`` ("cpu" or "jax-cpu") decides instead, and under
        an MPI launcher it is "cpu" unless that variable says otherwise.
    gpus : list of int, optional
        GPU ids to use, one per rank (default: the first ``n_parallel`` visible, from
        ``master_rank`` on).
    timeout : float or None
        Seconds a worker may go without progress, while rank 0 waits on it, before
        :class:`~synkhronos.transport.channel.WorkerHung` is raised naming its rank and the session
        is broken (:func:`close` then ends the workers). A worker computing, or waiting
        for another rank, is making progress however long a call takes; one stopped or
        deadlocked is not. ``None`` waits forever. Default 300.
    nodes : bool, optional
        Several machines over MPI (see :doc:`nodes`): None (default) when started by an
        MPI launcher (``mpiexec``, ``srun``) with more than one process; True to require
        MPI (``mpi4py``); False for this machine only. Under MPI the ranks started here
        are this node's local ranks, and the count returned is theirs.
    rank_prefix : bool, optional
        Tag each line the workers print with their rank, ``[rank 1] ...``, written out
        by this process (default: yes, unless the environment variable
        ``SYNK_RANK_PREFIX`` is ``0``); False lets the workers write to this process's
        terminal directly. Either way the workers' log records reach this process's
        ``logging`` with their rank (see :doc:`logging`).
    timeline : str or path, optional
        Record every rank's timeline from the fork until :func:`close`, which writes it
        to this file (Chrome trace-event JSON; see :doc:`timeline`). Default: the
        environment variable ``SYNK_TIMELINE``, else none. :func:`timeline` records a
        part of a program instead.
    verify_every : int, optional
        Run :func:`synkhronos.verify` after every ``verify_every``-th function call or
        chain, which then raises :class:`synkhronos.RanksDisagree` when the ranks hold
        different values of a shared variable (default: never).

    Notes
    -----
    Until :func:`close`, SIGTERM to this process first closes the session, then acts as
    before (by default, ends the process), and every rank, this process included, keeps
    the memory it frees for its next steps instead of giving it back to the system
    (:mod:`synkhronos.rank.heap`; ``SYNK_KEEP_MEMORY=0`` leaves the C library's settings
    alone). ``fork`` also removes what this user's programs that died left in ``/dev/shm``,
    and ends their workers where their guardian could not; names of running programs
    (told by a lock each holds, so also across PID namespaces) and of other users are
    left alone.

    Examples
    --------
    >>> import synkhronos as synk
    >>> n = synk.fork(2, backend="cpu")
    >>> synk.close()
    """
    global _session
    if verify_every is not None and not (isinstance(verify_every, int) and verify_every > 0):
        raise ValueError(f"verify_every must be a positive int or None, got {verify_every!r}")
    if _session is not None:
        raise RuntimeError("synkhronos is already forked; call synk.close() before forking again")
    backend = _chosen_backend(use_gpu, backend)
    n_parallel, gpu_ids = _ranks_and_gpus(backend, n_parallel, gpus, master_rank)
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    sweep_dead()
    _start_guardian()
    world = start_nodes(nodes, n_parallel, close)
    if world.n_nodes > 1:
        os.environ[LAYOUT_VAR] = world.layout  # read by every rank's make_communicator
    if backend == "gpu":  # where global rank 0 runs JAX's coordination service
        os.environ[COORDINATOR_VAR] = world.from_node_0(
            free_address(coordinator_host(world.n_nodes)) if world.node == 0 else None
        )
    try:
        session = Session(n_parallel, backend, gpu_ids, timeout, prefix_wanted(rank_prefix))
    except BaseException:
        stop_nodes()
        gpu.restore_environment()
        raise
    finally:
        os.environ.pop(LAYOUT_VAR, None)
        os.environ.pop(COORDINATOR_VAR, None)
    session.verify_every = verify_every
    _session = session
    timeline = timeline or os.environ.get(TIMELINE_VAR)
    if timeline:
        session.start_timeline(timeline)
    atexit.register(close)
    _close_on_sigterm()
    return n_parallel


def _chosen_backend(use_gpu: bool, backend: str) -> str:
    """The backend that fork's ``use_gpu`` and ``backend`` name ("auto" resolved), checked
    to exist."""
    if not use_gpu:
        if backend == "gpu":
            raise ValueError("use_gpu=False asks for CPU ranks, but backend='gpu'")
        backend = auto_cpu_backend()[0] if backend == "auto" else backend
    if backend == "auto":
        backend = auto_backend()[0]
    get_backend(backend)
    return backend


def _ranks_and_gpus(
    backend: str, n_parallel: int | None, gpus: list[int] | None, master_rank: int
) -> tuple[int, list[str] | None]:
    """The number of ranks to start, and on "gpu" the devices they drive; on a backend
    that runs JAX, rank 0's JAX precision set from floatX first."""
    gpu_ids = None
    if backend == "gpu":
        gpu_ids = gpu.prepare_gpus(n_parallel, gpus, master_rank)
        n_parallel = n_parallel if gpu_ids is None else len(gpu_ids)
    if backend != "cpu":
        _match_jax_precision()
    if n_parallel is None:
        n_parallel = len(os.sched_getaffinity(0))
    if not isinstance(n_parallel, int) or n_parallel < 1:
        raise ValueError(f"n_parallel must be a positive int, got {n_parallel!r}")
    return n_parallel, gpu_ids


def set_periodic_check(check: Callable[[], None]) -> None:
    """Make ``check`` what ``fork(verify_every=N)`` runs after every N-th call or chain
    (:mod:`synkhronos.api.verification` registers ``verify``: a layer this one does not
    import)."""
    global _periodic_check
    _periodic_check = check


def sweep_dead() -> list[tuple[str, list[int], list[str]]]:
    """End the workers, and remove the names, that this user's programs which died left
    (where their guardian could not: it was ended too); return, per dead program, its
    name prefix, the pids of the workers ended and the names removed."""
    return [(prefix, end_workers(prefix), sweep(prefix)) for prefix in dead_prefixes()]


_guardian: subprocess.Popen | None = None


def _start_guardian() -> None:
    """Start, once per process, the guardian that ends this process's workers and removes
    its names when it ends (:func:`synkhronos.transport.names.guard`); it reads a pipe
    whose other end only this process holds."""
    global _guardian
    if _guardian is None:
        atexit.register(_stop_guardian)
    elif _guardian.poll() is None:
        return
    elif _guardian.stdin is not None:
        _guardian.stdin.close()  # it was ended: start another
    _guardian = subprocess.Popen(
        [sys.executable, "-I", "-S", names.__file__, process_prefix()],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )


def _stop_guardian() -> None:
    """(At exit) let the guardian go, and wait for it: it leaves no zombie behind."""
    global _guardian
    guardian, _guardian = _guardian, None
    if guardian is not None:
        if guardian.stdin is not None:
            guardian.stdin.close()
        try:
            guardian.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            guardian.kill()


def distribute() -> None:
    """Ship every function built but not yet shipped to the workers (each rank compiles a
    function at its first call).

    One pickle carries them all, so a shared variable several functions use stays one
    variable on each rank; shared variables shipped earlier are referred to, not copied.
    Calling a function that was not shipped yet distributes automatically.

    Examples
    --------
    >>> f = synk.function([x], x.sum())           # doctest: +SKIP
    >>> synk.distribute()                         # doctest: +SKIP
    """
    current().distribute()


def close() -> None:
    """Stop the workers and free their shared memory (also run at interpreter exit).

    ``Data`` objects stay valid; functions must be built again after a new :func:`fork`.
    """
    global _session
    session, _session = _session, None
    if session is not None:
        atexit.unregister(close)
        _run_all([session.stop_timeline, _restore_sigterm, stop_nodes, session.close])


@contextlib.contextmanager
def timeline(path: str | os.PathLike) -> Iterator[None]:
    """Record every rank's timeline while the block runs, and write it to ``path``.

    The file is Chrome trace-event JSON (open it in Perfetto or ``chrome://tracing``, or
    summarise it with ``python -m synkhronos timeline path``): one process per rank, a
    span for every command and each of its phases on every rank, counters of the bytes
    moved (see :doc:`timeline`). A worker that dies meanwhile keeps its spans up to the
    one it died in; :func:`close` within the block writes the file.

    Parameters
    ----------
    path : str or path
        The file to write (created, or emptied, at once: a path that cannot be written
        raises before the block runs).

    Raises
    ------
    RuntimeError
        If no session runs, or a timeline is being recorded already.

    Examples
    --------
    >>> with synk.timeline("step.json"):          # doctest: +SKIP
    ...     f(x_data, batch=256)
    """
    session = current()
    session.start_timeline(path)
    try:
        yield
    finally:
        session.stop_timeline()  # nothing left to write if close() wrote it


_previous_sigterm = None  # the SIGTERM handler _close_on_sigterm replaced


def _close_on_sigterm() -> None:
    """Make SIGTERM close the session first, then act as it did before the fork.

    Python's default for SIGTERM is to die at once, skipping ``atexit``: the workers would
    still be ended and the names swept (by rank 0's guardian), but by SIGKILL. A
    program's own handler is left alone: it may still need the session (a checkpoint on
    preemption), and ``atexit`` closes the session when that handler exits.
    """
    global _previous_sigterm
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; the guardian still ends the workers
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return  # ignored, handled by the program, or outside Python: leave it so
    _previous_sigterm = previous
    signal.signal(signal.SIGTERM, _on_sigterm)


def _restore_sigterm() -> None:
    global _previous_sigterm
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; fork() set none from elsewhere
    if _previous_sigterm is not None and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, _previous_sigterm)
    _previous_sigterm = None


def _on_sigterm(signum, frame) -> None:
    if _session is not None:
        _session.broken = True  # a call may be under way: end the workers, send nothing
    close()  # restores SIG_DFL
    # Die of the signal, as without synkhronos (atexit hooks do not run).
    sweep(process_prefix())  # the Data segments too
    os.kill(os.getpid(), signum)
