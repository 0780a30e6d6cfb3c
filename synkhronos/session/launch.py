"""``fork`` and ``close``: starting and stopping a session, rank 0's guardian, SIGTERM.

The workers end with rank 0: a guardian process
(:func:`synkhronos.transport.names.guard`) ends them and sweeps the shared memory once
rank 0 is gone, however it ended. SIGTERM to rank 0 closes the session before the
previous handler runs; :func:`fork` removes the names, and ends the workers, that this
user's programs which died left. The session itself (the workers, one command on every
rank) is :class:`~synkhronos.session.session.Session`; the backend ``"auto"`` takes is
:mod:`synkhronos.session.backend_choice`'s, the cores each rank gets
:mod:`synkhronos.session.placement`'s.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

from synkhronos.rank.backends import gpu
from synkhronos.session.backend_choice import chosen_backend, ranks_and_gpus
from synkhronos.session.session import DEFAULT_TIMEOUT_S, STOP_GRACE_S, Session, run_all
from synkhronos.session.worker_output import prefix_wanted
from synkhronos.transport import names
from synkhronos.transport.comm.xla import COORDINATOR_VAR, free_address
from synkhronos.transport.names import dead_prefixes, end_workers, process_prefix, sweep
from synkhronos.transport.nodes import LAYOUT_VAR, coordinator_host
from synkhronos.transport.nodes import start as start_nodes
from synkhronos.transport.nodes import stop as stop_nodes

TIMELINE_VAR = "SYNK_TIMELINE"  # a path: fork records every rank's timeline there until close

_session: Session | None = None


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
    backend = chosen_backend(use_gpu, backend)
    n_parallel, gpu_ids = ranks_and_gpus(backend, n_parallel, gpus, master_rank)
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
        run_all([session.stop_timeline, _restore_sigterm, stop_nodes, session.close])


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
