"""Communicators: the collectives every rank calls together (SPMD, as in MPI).

:class:`~synkhronos.transport.comm.base.Communicator` is the interface; ``shm`` implements it over
shared memory for CPU ranks, ``xla`` as XLA programs over JAX's multi-process runtime for
GPU ranks (NCCL between GPUs, gloo between CPU devices); ``node`` spans several nodes on
top of either (MPI among the nodes' rank 0).
"""

import os

from synkhronos.transport.comm.base import Communicator
from synkhronos.transport.nodes import LAYOUT_VAR, current


def make_communicator(
    backend: str, session: str, rank: int, n_ranks: int, control, check_alive
) -> Communicator:
    """The communicator for ranks of ``backend`` (XLA for "gpu", shared memory else),
    over every node's ranks when the :data:`~synkhronos.transport.nodes.LAYOUT_VAR` environment
    variable (set by :func:`synkhronos.fork` under MPI) gives their layout."""
    comm: Communicator
    if backend == "gpu":
        from synkhronos.transport.comm.xla import XlaCommunicator

        comm = XlaCommunicator(session, rank, n_ranks, control, check_alive)
    else:
        from synkhronos.transport.comm.shm import ShmCommunicator

        comm = ShmCommunicator(session, rank, n_ranks, control, check_alive)
    layout = os.environ.get(LAYOUT_VAR)
    if not layout:
        return comm
    from synkhronos.transport.comm.node import NodeCommunicator

    offset, n_global = (int(x) for x in layout.split(","))
    return NodeCommunicator(comm, offset, n_global, current() if rank == 0 else None)


__all__ = ["Communicator", "make_communicator"]
