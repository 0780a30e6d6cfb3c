"""Collectives for GPU ranks on JAX's own multi-process runtime: jitted XLA programs over a
mesh of one device per rank. Between GPUs XLA runs them with NCCL; between CPU devices
(``JAX_PLATFORMS=cpu``, as in CI) with gloo, the same programs.

**Joining.** Every rank calls :meth:`XlaCommunicator.start` once its workers run: a
barrier through shared memory (a worker that died while starting gives rank 0
``WorkerDied`` there, before anything can block), then ``jax.distributed.initialize``
with rank 0's coordinator address (:data:`COORDINATOR_VAR`; rank 0 runs JAX's
coordination service). Rank 0 joins with JAX's ``jax_enable_recoverability`` on, so that
the service outlives a worker that dies: without it the service ends every process,
rank 0 included, once a dead peer misses its heartbeats or at shutdown. Every rank joins
with JAX's preemption service off: its SIGTERM handler would replace the worker's own,
and a SIGTERM (``close()`` sends one to a broken session's surviving workers) makes every
rank wait at a barrier that a dead rank never reaches, and leaving the runtime with it,
until JAX's barrier times out and then ends rank 0's process. Rank 0 first
drops JAX's backends (``jax.extend.backend.clear_backends``), since the process may have
run JAX before the fork, and :meth:`~XlaCommunicator.close` shuts the runtime down and
drops its backends again, so that a later fork (of any backend and size) starts afresh.
The barrier leaves one window: a worker that dies between it and joining (the next
statement) leaves rank 0 in ``jax.distributed.initialize`` until its timeout (120 s),
after which JAX ends rank 0's process; JAX's public API gives no way to make a failed
join an exception. The workers leave the runtime before rank 0 (a client still
connected when the service goes is ended by JAX too).

**Arrays.** Each rank's own value travels as a "replicated" global array of its own
shape; inside the program every rank sees its own value, and each rank reads back its own
result (nothing checks that replicated values agree, so nothing is moved to make them).
A communicator of one rank (of one node) compiles its programs to take and give its
device's own arrays (:attr:`XlaCommunicator.sharding`): no global array is made or taken
apart per call, and a program's call takes JAX's C++ path as a ``jax.jit`` function's
(host arrays are put by it), so a one-rank step is dispatched as a hand-written one.
Device (JAX) arrays go through XLA; host (numpy) arrays through the shared-memory
collectives this class extends; every rank passes the same kind. Before each XLA program
the ranks exchange the arrays' shapes and dtypes through shared memory: a rank that failed
before the collective makes the others give up there (as on CPU ranks), reductions of
differently shaped arrays raise on every rank, and gathers and scatters whose pieces
differ in shape between ranks take the host path. Dtypes outside
:data:`~synkhronos.transport.reduction.IN_PLACE_DTYPES` take the host path too.

**Waiting.** No rank blocks inside XLA: a program is dispatched, and the rank polls its
results while checking its peers (rank 0: that the workers live and make progress;
workers: that rank 0 lives), so rank 0 raises ``WorkerDied`` when a rank dies mid-program.
A communicator of one rank has no peer to watch and blocks (polling's pauses cost a step
~0.5 ms).
On CPU devices gloo ends a collective whose peer died with an error at once; a program
abandoned while a peer still waits in it would leave the ranks out of step, so after one
this communicator refuses further programs (close and fork again).

Across several nodes (:mod:`synkhronos.transport.comm.node`) the mesh spans every rank of
every node (:attr:`XlaCommunicator.span`), the coordinator address travels by MPI, and
gathers and scatters go through the host.

The programs' bodies are the collectives of :mod:`synkhronos.transport.comm.traced`; a
fused step's buckets and buffer donation are set by
:mod:`synkhronos.transport.comm.xla_settings`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from synkhronos.transport.channel import POLL_S
from synkhronos.transport.comm.shm import ShmCommunicator, check_same_layouts
from synkhronos.transport.comm.traced import AXIS, broadcast_traced, reduce_traced, sender
from synkhronos.transport.comm.xla_settings import bucket_bytes_from_env, donate_from_env
from synkhronos.transport.reduction import IN_PLACE_DTYPES
from synkhronos.transport.shm import DTYPES, dtype_code

COORDINATOR_VAR = "SYNK_COORDINATOR"
"""``host:port`` of JAX's coordination service, which global rank 0 runs; set by
:func:`synkhronos.fork` for every rank."""


FIRST_PAUSE_S, LONGEST_PAUSE_S = 20e-6, 500e-6  # the polling of a program's results
# A longer wait pauses up to this share of the time waited (at most POLL_S): a compiled
# NUTS runs for minutes, on a rank's one core its every poll a wake-up beside XLA's thread.
WAITED_SHARE = 1 / 64
ERROR_GRACE_S = 1.0  # how long a failed program waits for a dead peer to show as dead
LEAVE_BOUND_S = 10.0  # how long close() waits to leave JAX's runtime after an abandoned program
_leaving: list[threading.Thread] = []  # leaving JAX's runtime past LEAVE_BOUND_S
logger = logging.getLogger(__name__)


def check_not_leaving() -> None:
    """Refuse to start GPU ranks while this process still leaves JAX's runtime (see
    :meth:`XlaCommunicator.close`).

    Raises
    ------
    RuntimeError
        If a thread of an earlier close still waits to leave.
    """
    if any(t.is_alive() for t in _leaving):
        raise RuntimeError(
            "JAX's runtime in this process is still leaving an earlier session, whose XLA "
            "collective a dead rank abandoned (NCCL may wait for it forever); GPU ranks "
            "need a new process"
        )


def free_address(host: str = "127.0.0.1") -> str:
    """``host:port`` with a port that was free on ``host`` a moment ago (the OS picks it).

    Examples
    --------
    >>> free_address().startswith("127.0.0.1:")
    True
    """
    with socket.socket() as probe:
        probe.bind((host, 0))
        return f"{host}:{probe.getsockname()[1]}"


def signature(arrays) -> np.ndarray:
    """One int64 vector naming the arrays' dtypes and shapes, to compare between ranks;
    ``[-1]`` when some dtype has no code (:data:`~synkhronos.transport.shm.DTYPES`)."""
    words = [len(arrays)]
    try:
        for a in arrays:
            shape = np.shape(a)
            words += [dtype_code(a.dtype), len(shape), *shape]
    except TypeError:
        words = [-1]
    return np.array(words, np.int64)


def _layout(words) -> list[tuple[np.dtype, tuple[int, ...]]] | None:
    """The (dtype, shape) pairs :func:`signature` wrote (None for ``[-1]``)."""
    words, layout, pos = [int(w) for w in words], [], 1
    if words[0] < 0:
        return None
    for _ in range(words[0]):
        code, ndim = words[pos], words[pos + 1]
        layout.append((DTYPES[code], tuple(words[pos + 2 : pos + 2 + ndim])))
        pos += 2 + ndim
    return layout


def _supported(layout) -> bool:
    return layout is not None and all(dtype.name in IN_PLACE_DTYPES for dtype, _ in layout)


class Span(NamedTuple):
    """The ranks a communicator's collectives run over, and its host path over them.

    ``rank`` and ``n_ranks`` are this rank's global rank and the number of ranks; the three
    functions are the host-array collectives over those same ranks, with the signatures of
    :class:`~synkhronos.transport.comm.base.Communicator`'s methods of the same names.
    """

    rank: int
    n_ranks: int
    broadcast: Callable
    all_gather: Callable
    all_reduce: Callable


class XlaCommunicator(ShmCommunicator):
    """Collectives as XLA programs over one device per rank (see the module docstring).

    Arguments as for :class:`~synkhronos.transport.comm.shm.ShmCommunicator`.

    Attributes
    ----------
    span : Span or None
        Set before :meth:`start` to span several nodes: this rank's global rank, the number
        of ranks over every node, and the host-array collectives over all of them (every
        exchange of layouts, and every host-path reduction, goes through those: none stays
        inside one node). None (default): this node's ranks, and the shared-memory
        collectives this class extends.
    dispatches : int
        XLA programs this rank has run (counted for the tests).
    alone : bool
        Whether this is the only rank of every node (set by :meth:`start`): its programs
        take and give its device's own arrays, and host arrays (see the module docstring).
    sharding : jax.sharding.Sharding or None
        The sharding of the arrays the programs take and give (set by :meth:`start`):
        replicated over the mesh, or on one rank this device's own.
    bucket_bytes : int
        The size of a fused step's all-reduce buckets (see
        :mod:`~synkhronos.transport.comm.xla_settings`), from its ``BUCKET_VAR`` as this
        rank joined (its ``bucket_bytes_from_env``); 0: none.
    donate : bool or None
        Whether fused chains built from now on donate their cells' buffers (None: each
        decides), from ``DONATE_VAR`` of :mod:`~synkhronos.transport.comm.xla_settings`
        as this rank joined (its ``donate_from_env``).
    """

    span: Span | None = None
    bucket_bytes = 0
    donate: bool | None = False
    mesh = None
    sharding: Any = None  # a jax.sharding.Sharding once started
    _config = None  # JAX's settings before start() changed them
    device = None
    dispatches = 0
    _abandoned = False
    alone = False

    def _span(self) -> Span:
        """The ranks and host path, as :attr:`span` says."""
        if self.span is not None:
            return self.span
        return Span(
            self.rank, self.n_ranks, super().broadcast, super().all_gather, super().all_reduce
        )

    # ---- joining and leaving JAX's runtime -------------------------------------------------
    def start(self) -> None:
        """Join JAX's distributed runtime (every rank of every node calls this).

        Raises
        ------
        RuntimeError
            If JAX gives this process other than one device of its own.
        """
        import jax
        from jax.extend.backend import clear_backends
        from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

        span = self._span()
        rank, n_ranks = span.rank, span.n_ranks
        self.barrier()  # every rank of this node started: none can leave rank 0 waiting below
        address = os.environ[COORDINATOR_VAR]
        local = address.startswith("127.0.0.1:")
        self._config = {
            name: getattr(jax.config, name)
            for name in (
                "jax_cpu_collectives_implementation",
                "jax_enable_recoverability",
                "jax_enable_preemption_service",
            )
        }
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.config.update("jax_enable_recoverability", True)
        jax.config.update("jax_enable_preemption_service", False)
        clear_backends()  # JAX may have run in this process before the fork
        try:
            # No cluster detection: the workers inherit an MPI launcher's variables from
            # their node's rank 0, which would name other ranks and devices.
            jax.distributed.initialize(
                address,
                n_ranks,
                rank,
                coordinator_bind_address=address if local else None,
                cluster_detection_method="deactivate",
                initialization_timeout=120,
            )
        finally:  # read only while joining
            for name in ("jax_enable_recoverability", "jax_enable_preemption_service"):
                jax.config.update(name, self._config[name])
        devices = sorted(jax.devices(), key=lambda d: d.process_index)
        if len(devices) != n_ranks or len(jax.local_devices()) != 1:
            raise RuntimeError(
                f"every rank needs one device of its own; JAX gives "
                f"{len(devices)} devices to {n_ranks} ranks, "
                f"{len(jax.local_devices())} of them to this one"
            )
        self.mesh = Mesh(np.array(devices), (AXIS,))
        self.device = jax.local_devices()[0]
        # Every rank joins with the environment fork gave it: the same buckets everywhere.
        self.bucket_bytes = bucket_bytes_from_env(self.device.platform)
        self.donate = donate_from_env(self.device.platform)
        # One rank: its device's own arrays, which a program of one device may take as
        # the mesh's (JAX's C++ dispatch takes an argument only of the sharding compiled).
        self.alone = n_ranks == 1
        self.sharding = (
            SingleDeviceSharding(self.device)
            if self.alone
            else NamedSharding(self.mesh, PartitionSpec())
        )
        self._programs: dict = {}

    def close(self) -> None:
        """Leave JAX's runtime and drop its backends (a later fork starts afresh).

        After an abandoned program (a peer died in it) leaving may wait for that program,
        which NCCL may never end; it then waits in a thread, at most
        :data:`LEAVE_BOUND_S`, after which an error is logged and later forks of GPU
        ranks in this process are refused.
        """
        if self._config is None:  # never joined
            return
        import jax
        from jax.extend.backend import clear_backends

        self.mesh = None
        self._programs = {}
        failed: list[BaseException] = []

        def leave() -> None:
            try:
                jax.distributed.shutdown()  # also after a failed start: JAX may hold half
                clear_backends()
            except BaseException as error:  # noqa: BLE001 - raised by close() below
                failed.append(error)

        if self._abandoned:
            leaving = threading.Thread(target=leave, name="synk-leave-jax", daemon=True)
            leaving.start()
            leaving.join(LEAVE_BOUND_S)
            if leaving.is_alive():
                _leaving.append(leaving)
                logger.error(
                    "synkhronos rank %d: leaving JAX's runtime still waits after %g s, "
                    "likely on a collective a dead rank abandoned; left waiting",
                    self.rank,
                    LEAVE_BOUND_S,
                )
        else:
            leave()
        jax.config.update(
            "jax_cpu_collectives_implementation", self._config["jax_cpu_collectives_implementation"]
        )
        self._config = None
        if failed:
            raise failed[0]

    # ---- programs ---------------------------------------------------------------------------
    def program(self, body, donate: bool = False, buckets: bool = False):
        """``body(list of arrays) -> list of arrays`` as a jitted program over the mesh, in
        which each rank's body sees its own arrays (collectives over the axis
        :data:`~synkhronos.transport.comm.traced.AXIS`). With ``donate``, the arrays
        :meth:`run` passes as ``donated`` give their buffers to the results (XLA updates
        them in place) and are deleted. With ``buckets`` (where :attr:`bucket_bytes` is not
        0), compiled so that XLA keeps the separate all-reduces of
        :func:`~synkhronos.transport.comm.traced.reduce_buckets_traced` apart: XLA's
        all-reduce combiner would merge them back into one (on CPU devices whatever their
        size, on GPUs up to its threshold), which would wait for the whole backward pass
        again."""
        import jax
        from jax.sharding import PartitionSpec

        options: dict[str, str | int | bool] = {}
        if buckets and self.bucket_bytes:
            if getattr(self.device, "platform", "cpu") == "cpu":
                options = {"xla_disable_hlo_passes": "cpu-all-reduce-combiner"}
            else:
                options = {
                    "xla_gpu_all_reduce_combine_threshold_bytes": self.bucket_bytes,
                    "xla_gpu_enable_latency_hiding_scheduler": True,
                }
        return jax.jit(
            jax.shard_map(
                lambda kept, donated: body([*kept, *donated]),
                mesh=self.mesh,
                in_specs=PartitionSpec(),
                out_specs=PartitionSpec(),
                check_vma=False,
            ),
            donate_argnums=(1,) if donate else (),
            # An unused donated array kept: pruned, the buffers after it would go to
            # results of another variable's (see rank.fused_chain's body).
            keep_unused=donate,
            compiler_options=options or None,
            in_shardings=self.sharding,
            out_shardings=self.sharding,
        )

    def to_device(self, arrays) -> list:
        """``arrays`` on this rank's device (JAX arrays elsewhere are moved, host ones put)."""
        import jax

        return [
            a
            if isinstance(a, jax.Array) and a.devices() == {self.device}
            else jax.device_put(a, self.device)
            for a in arrays
        ]

    def run(
        self, program, arrays: list, donated: list | None = None, held: dict | None = None
    ) -> list:
        """Run ``program`` (from :meth:`program`) on this rank's device ``arrays`` followed
        by ``donated`` (deleted if the program donates), wait for it while watching the
        peers, and return this rank's results.

        ``held`` (the caller's; over several ranks) keeps, by ``id``, the first results,
        as many as ``donated`` (those that take its buffers), each with the mesh's array
        it came from: an argument found there is passed as that array, not made again
        (a fused step's parameters and optimizer state, ~13 us each)."""
        if self._abandoned:
            raise RuntimeError(
                "an XLA collective was abandoned on this rank; call synk.close() and fork again"
            )
        self.dispatches += 1
        if self.alone:  # this device's own arrays, as they are
            results = program(arrays, donated or [])
        else:
            donated = donated or []
            wholes = program(self._whole(arrays, held), self._whole(donated, held))
            results = [r.addressable_data(0) for r in wholes]
            if held is not None:
                held.clear()  # the arrays donated are gone
                n = len(donated)
                held.update((id(r), (r, w)) for r, w in zip(results[:n], wholes[:n], strict=True))
        self.wait(results)
        return results

    def _whole(self, arrays: list, held: dict | None) -> list:
        """This rank's device ``arrays`` as the mesh's replicated arrays (see :meth:`run`)."""
        import jax

        wholes = []
        for a in arrays:
            found = held.get(id(a)) if held else None
            wholes.append(
                found[1]
                if found is not None and found[0] is a
                else jax.make_array_from_single_device_arrays(np.shape(a), self.sharding, [a])
            )
        return wholes

    def wait(self, arrays: list) -> None:
        """Wait until ``arrays`` are computed, polling: peers are checked every
        :data:`~synkhronos.transport.channel.POLL_S`, and a peer that died (or another
        rank's failure) ends the wait with its error.

        Raises
        ------
        Exception
            JAX's error for a failed program, unless a dead peer explains it.
        """
        import jax

        if self.n_ranks == 1:  # no peer in the program to watch
            jax.block_until_ready(arrays)
            return
        start = time.monotonic()
        pause, check_at = FIRST_PAUSE_S, start + POLL_S
        try:
            while not all(a.is_ready() for a in arrays):
                time.sleep(pause)
                longest = max(LONGEST_PAUSE_S, (time.monotonic() - start) * WAITED_SHARE)
                pause = min(2 * pause, longest, POLL_S)
                if time.monotonic() >= check_at:
                    self._check()
                    check_at = time.monotonic() + POLL_S
        except BaseException:
            self._abandoned = True  # the peers may still wait in this program
            raise
        try:
            jax.block_until_ready(arrays)  # ready: raises the program's error, if any
        except Exception:
            self._abandoned = True
            deadline = time.monotonic() + ERROR_GRACE_S
            while time.monotonic() < deadline:  # a peer killed mid-program shows as dead
                self._check()
                time.sleep(POLL_S / 5)
            raise

    def _program(self, key, make):
        found = self._programs.get(key)
        if found is None:
            found = self._programs[key] = self.program(make())
        return found

    def agree(self, arrays: list | None) -> tuple[list, bool]:
        """Every rank's (dtype, shape) pairs of its ``arrays`` (None where a rank has none
        to give), and whether they are device arrays on every rank, exchanged through the
        host over every rank of the span (every node): the barrier where a rank's earlier
        failure stops the others, and the one answer every rank takes its path by."""
        if arrays is None:
            words = np.array([0, -1], np.int64)
        else:
            words = np.concatenate([[int(self._device_kind(arrays))], signature(arrays)])
        boxes = self._span().all_gather([words])
        return [_layout(box[0][1:]) for box in boxes], all(box[0][0] for box in boxes)

    @staticmethod
    def _device_kind(arrays) -> bool:
        import jax

        return bool(arrays) and all(isinstance(a, jax.Array) for a in arrays)

    def _zeros(self, layout, leading: tuple = ()) -> list:
        import jax.numpy as jnp

        return [jnp.zeros((*leading, *shape), dtype, device=self.device) for dtype, shape in layout]

    # ---- collectives ----------------------------------------------------------------------
    def all_reduce(self, arrays, op, out=None):
        layouts, on_device = self.agree(arrays)
        check_same_layouts(layouts)
        span = self._span()
        if not on_device or not _supported(layouts[0]):
            # Host arrays, or a dtype the devices do not reduce (one is enough: the call's
            # arrays take one path), over every rank of the span.
            return span.all_reduce([np.asarray(a) for a in arrays], op, out)
        n = span.n_ranks
        program = self._program(
            ("reduce", op), lambda: lambda xs: [reduce_traced(x, op, n) for x in xs]
        )
        return self.run(program, self.to_device(arrays))

    def reduce(self, arrays, op, root=0):
        result = self.all_reduce(arrays, op)
        return result if self._span().rank == root else None

    def broadcast(self, arrays, root=0):
        span = self._span()
        mine, host_broadcast = span.rank == root, span.broadcast
        # The root's layout, and whether its arrays are on its device, through the host.
        words = [signature(arrays), np.array([self._device_kind(arrays)])] if mine else None
        described, on_device = host_broadcast(words, root)
        layout = _layout(described)
        if not on_device[0] or not _supported(layout):
            return host_broadcast([np.asarray(a) for a in arrays] if mine else None, root)
        program = self._program(
            ("broadcast", root), lambda: lambda xs: [broadcast_traced(x, root) for x in xs]
        )
        return self.run(program, self.to_device(arrays) if mine else self._zeros(layout))

    def all_gather(self, arrays):
        if self.span is not None:  # across nodes: by the host
            return super().all_gather([np.asarray(a) for a in arrays])
        layouts, on_device = self.agree(arrays)
        if not on_device or any(layout != layouts[0] for layout in layouts):
            return super().all_gather([np.asarray(a) for a in arrays])  # pieces differ
        from jax import lax

        n, k = self.n_ranks, len(arrays)
        program = self._program(
            ("all_gather", n),
            lambda: (
                lambda xs: [g[r] for g in (lax.all_gather(x, AXIS) for x in xs) for r in range(n)]
            ),
        )
        flat = self.run(program, self.to_device(arrays))
        return [[flat[i * n + r] for i in range(k)] for r in range(n)]

    def gather(self, arrays, root=0):
        got = self.all_gather(arrays)
        return got if self.rank == root else None

    def scatter(self, parts, root=0):
        """Rank ``k`` gets ``parts[k]`` of ``root``. Device arrays go by one program per
        other rank, in which the root sends that rank its part: no rank holds more than
        its own part and one part in flight (the root: the parts it was given)."""
        mine = self.rank == root
        words = None
        if mine:
            if len({len(p) for p in parts}) != 1:
                raise ValueError("scatter needs the same number of arrays for every rank")
            layouts = [_layout(signature(p)) for p in parts]
            on_device = (
                self.span is None
                and self._device_kind([a for p in parts for a in p])
                and all(lay == layouts[0] for lay in layouts)
                and _supported(layouts[0])
            )
            words = [np.array([on_device]), signature(parts[0])]
        on_device, described = super().broadcast(words, root)
        if not on_device[0]:
            return super().scatter(
                [[np.asarray(a) for a in p] for p in parts] if mine else None, root
            )
        blank = None if mine else self._zeros(_layout(described))
        got = self.to_device(parts[root]) if mine else []
        for k in range(self.n_ranks):
            if k == root:
                continue
            program = self._program(("send", root, k), lambda k=k: sender(root, k))
            sent = self.run(program, self.to_device(parts[k]) if mine else blank)
            got = sent if self.rank == k else got
        return got


__all__ = [
    "COORDINATOR_VAR",
    "Span",
    "XlaCommunicator",
    "check_not_leaving",
    "free_address",
    "signature",
]
