"""Several machines: the MPI world of node leaders.

Started as ``mpiexec -n NODES python train.py``, the same serial script runs once per node;
each node's :func:`synkhronos.fork` starts its local ranks as on one machine, and the
node's rank 0 (the user's process, the *leader*) is the only process that talks MPI. The
workers never import ``mpi4py``: they learn their global rank from the
:data:`LAYOUT_VAR` environment variable (see :mod:`synkhronos.transport.comm.node`).

Global ranks are numbered node by node: node ``k``'s local rank ``r`` is global rank
``offset[k] + r``. A call's batch goes to the nodes in data order (node ``k`` takes the
rows global ranks ``offset[k]`` onwards would take), then within each node to its ranks as
on one machine, so the split is the one a single machine with every global rank would make.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from synkhronos.transport.names import process_prefix, sweep
from synkhronos.transport.partition import Selection, split_bounds
from synkhronos.transport.reduction import combine

# Set by the MPI launchers (mpich's hydra, Open MPI's mpirun, Slurm's srun with PMI/PMIx):
# without one of them there is no MPI world, and mpi4py is not imported at all.
LAUNCHER_VARS = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")
LAYOUT_VAR = "SYNK_NODES"  # "offset,n_global" for the workers' communicators
COORDINATOR_HOST_VAR = "SYNK_COORDINATOR_HOST"
"""Node 0's address for the other nodes to reach JAX's coordination service at (GPU ranks
over several nodes), where :func:`coordinator_host`'s own choice does not suit."""
logger = logging.getLogger(__name__)


def under_mpi_launcher() -> bool:
    """Whether an MPI launcher started this process (one of :data:`LAUNCHER_VARS` is set)."""
    return any(v in os.environ for v in LAUNCHER_VARS)


def coordinator_host(n_nodes: int) -> str:
    """The address of this machine (node 0's) that the other nodes reach JAX's coordination
    service at: ``127.0.0.1`` on one machine; over several, :data:`COORDINATOR_HOST_VAR`
    where set, else an IPv4 address this machine's name resolves to other than a loopback
    one, else the address of the interface of its default route (no packet is sent). A
    name (``socket.getfqdn()``) often resolves only on the machine itself in containers.

    Raises
    ------
    RuntimeError
        If none is found; naming :data:`COORDINATOR_HOST_VAR`.
    """
    if n_nodes == 1:
        return "127.0.0.1"
    chosen = os.environ.get(COORDINATOR_HOST_VAR, "").strip()
    if chosen:
        return chosen
    try:
        named = socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        named = []
    for address in named:
        if not ipaddress.ip_address(address).is_loopback:
            return address
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # UDP: picks the route, sends nothing
            routed = probe.getsockname()[0]
    except OSError:
        routed = "0.0.0.0"
    if not ipaddress.ip_address(routed).is_loopback and routed != "0.0.0.0":
        return routed
    raise RuntimeError(
        "GPU ranks over several nodes: found no address of this machine (node 0) that other "
        f"machines could reach; set {COORDINATOR_HOST_VAR} to one"
    )


@dataclass
class World:
    """Where this node sits among the nodes.

    Attributes
    ----------
    node, n_nodes : int
        This node's index and the number of nodes.
    local_ranks : list of int
        The number of local ranks of every node.
    mpi : mpi4py communicator or None
        The leaders' communicator (None on one machine).
    on_abort : callable
        Run before :meth:`abort` ends the job (closes the session).
    """

    node: int = 0
    n_nodes: int = 1
    local_ranks: list[int] = field(default_factory=lambda: [1])
    mpi: Any = None  # an mpi4py communicator (mpi4py has no type information)
    on_abort: Callable[[], None] = lambda: None

    @property
    def offset(self) -> int:
        """The global rank of this node's rank 0."""
        return sum(self.local_ranks[: self.node])

    @property
    def n_global(self) -> int:
        """The number of ranks over all nodes."""
        return sum(self.local_ranks)

    @property
    def layout(self) -> str:
        """The value of :data:`LAYOUT_VAR` for this node's workers."""
        return f"{self.offset},{self.n_global}"

    def describe(self) -> str:
        per_node = sorted(set(self.local_ranks))
        local = per_node[0] if len(per_node) == 1 else self.local_ranks
        return (
            f"synkhronos: {self.n_nodes} nodes (MPI), {local} local ranks each, "
            f"{self.n_global} global ranks; this is node {self.node} (pid {os.getpid()}), "
            f"global ranks {self.offset}..{self.offset + self.local_ranks[self.node] - 1}"
        )

    def from_node_0(self, value):
        """Node 0's ``value``, on every node (MPI among the leaders)."""
        return value if self.mpi is None else self.mpi.bcast(value, root=0)

    @overload
    def node_share(self, sel: slice) -> slice: ...
    @overload
    def node_share(self, sel: np.ndarray) -> np.ndarray: ...

    def node_share(self, sel: Selection) -> Selection:
        """This node's rows of a call's selection: those its global ranks would take."""
        if self.n_nodes == 1:
            return sel
        n = sel.stop - sel.start if isinstance(sel, slice) else len(sel)
        bounds = split_bounds(n, self.n_global)
        lo, hi = bounds[self.offset], bounds[self.offset + self.local_ranks[self.node]]
        if isinstance(sel, slice):
            return slice(sel.start + lo, sel.start + hi)
        return sel[lo:hi]

    def combine_outputs(self, ops: list, results: list, weight: int, done: set) -> list:
        """Every node's results of a call, combined as its ranks' are within the node.

        ``ops`` are the outputs' reduce ops, ``results`` this node's combined results,
        ``weight`` its rows, ``done`` the positions already reduced over every node (by the
        communicator). Op None gives node 0's result, "per_rank" every global rank's.
        """
        mine = [None if j in done else r for j, r in enumerate(results)]
        everyone = self.mpi.allgather((weight, mine))
        weights = [w for w, _ in everyone]
        combined = []
        for j, (op, result) in enumerate(zip(ops, results, strict=True)):
            values = [theirs[j] for _, theirs in everyone]
            if j in done:
                combined.append(result)
            elif op is None:
                combined.append(values[0])
            elif op == "per_rank":
                combined.append([v for node_values in values for v in node_values])
            else:
                combined.append(combine(op, values, weights))
        return combined

    def abort(self, what: str, error: BaseException) -> None:
        """Log ``error`` (critical) naming this node, close the session, remove this
        process's shared memory, and end every node's process (``MPI_Abort``, which skips
        exit hooks): the other nodes may be waiting for this one in MPI."""
        logger.critical(
            "synkhronos: node %d of %d (global ranks %d..%d) failed in %s; aborting every node",
            self.node,
            self.n_nodes,
            self.offset,
            self.offset + self.local_ranks[self.node] - 1,
            what,
            exc_info=(type(error), error, error.__traceback__),
        )
        try:
            self.on_abort()
            sweep(process_prefix())
        finally:
            logging.shutdown()  # flushes every handler: MPI_Abort ends the process at once
            self.mpi.Abort(1)


_world = World()


def current() -> World:
    """The world of the running fork (one node when not under MPI)."""
    return _world


def _leaders_comm(nodes: bool | None):
    """MPI's world communicator, or None when this is no MPI run (or ``nodes`` is False)."""
    if nodes is False or (nodes is None and not under_mpi_launcher()):
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        if nodes:
            raise ImportError(
                "fork(nodes=True) needs mpi4py: pip install 'synkhronos[mpi]'"
            ) from None
        return None
    comm = MPI.COMM_WORLD
    return comm if nodes or comm.Get_size() > 1 else None


def start(nodes: bool | None, n_local: int, on_abort: Callable[[], None]) -> World:
    """Find the nodes (collectively, over MPI) and make their world the current one.

    Parameters
    ----------
    nodes : bool or None
        None: MPI when started by an MPI launcher with more than one process; True: MPI
        (mpi4py must be installed); False: this machine only.
    n_local : int
        This node's number of ranks.
    on_abort : callable
        Closes the session before :meth:`World.abort` ends the job.
    """
    global _world
    comm = _leaders_comm(nodes)
    if comm is None:
        _world = World(local_ranks=[n_local])
    else:
        _world = World(comm.Get_rank(), comm.Get_size(), comm.allgather(n_local), comm, on_abort)
        logger.info("%s", _world.describe())
        if _world.n_nodes > 1:
            sys.excepthook = _abort_on_uncaught
    return _world


def stop() -> None:
    """Forget the world (at :func:`synkhronos.close`)."""
    global _world
    _world = World()
    if sys.excepthook is _abort_on_uncaught:
        sys.excepthook = sys.__excepthook__


def _abort_on_uncaught(kind, error, tb) -> None:
    """``sys.excepthook`` under MPI: an exception that ends the script on one node ends
    every node, instead of leaving them waiting for it in their next call."""
    _world.abort("the script", error)


def abort_nodes(what: str, error: BaseException) -> None:
    """Under MPI, end the job for ``error``, which escapes ``what`` (see
    :meth:`World.abort`); on one machine, nothing (the caller raises it)."""
    if _world.mpi is not None and _world.n_nodes > 1:
        _world.abort(what, error)


def node_rows(n: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` of ``n`` that this node computes when a call selects
    all of them (for loading one shard per node).

    Examples
    --------
    >>> node_rows(11)  # one machine: every row
    (0, 11)
    """
    share = _world.node_share(slice(0, n))
    return share.start, share.stop


__all__ = [
    "World",
    "abort_nodes",
    "current",
    "node_rows",
    "start",
    "stop",
    "under_mpi_launcher",
]
