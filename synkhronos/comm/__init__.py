"""Communicators: the collectives every rank calls together (SPMD, as in MPI).

:class:`~synkhronos.comm.base.Communicator` is the interface; ``shm`` implements it over
shared memory for CPU ranks, ``nccl`` over NCCL for GPU ranks.
"""

from .base import Communicator


def make_communicator(backend: str, session: str, rank: int, n_ranks: int, control,
                      check_alive) -> Communicator:
    """The communicator for ranks of ``backend`` (NCCL for "gpu", shared memory else)."""
    if backend == "gpu":
        from .nccl import NcclCommunicator

        return NcclCommunicator(session, rank, n_ranks, control, check_alive)
    from .shm import ShmCommunicator

    return ShmCommunicator(session, rank, n_ranks, control, check_alive)


__all__ = ["Communicator", "make_communicator"]
