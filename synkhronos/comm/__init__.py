"""Communicators: the collectives every rank calls together (SPMD, as in MPI).

:class:`~synkhronos.comm.base.Communicator` is the interface; ``shm`` implements it over
shared memory for CPU ranks, ``nccl`` over NCCL for GPU ranks.
"""

from .base import Communicator

__all__ = ["Communicator"]
