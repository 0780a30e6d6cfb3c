"""Collectives over every rank of every node: the node's own communicator, then MPI.

Used when :func:`synkhronos.fork` runs under MPI on several nodes (see
:mod:`synkhronos.transport.nodes`). On CPU ranks each collective is hierarchical: the node's ranks
meet first through shared memory at local rank 0, the leaders combine over MPI, and local
rank 0 hands the result back to its node. On GPU ranks the reductions and broadcasts are
XLA programs over one mesh of every rank of every node; the exchange of layouts before
each, and every host-path reduction (host arrays, dtypes the devices do not reduce), are
this module's hierarchical host collectives (:class:`~synkhronos.transport.comm.xla.Span`),
so they too span every node; gathers and scatters take the host path. Only
the leaders call MPI; the workers know just their global rank and the global count.

``rank`` and ``n_ranks`` are global. ``root`` must be 0, and what the methods return "on
root" they return on every node's local rank 0 (each node's script sees the result).
Between nodes the arrays travel through the host: reductions with MPI ``Allreduce`` in
place where MPI defines the op for the dtype, else gathered (pickled) to every leader and
reduced there in node order, the same on every leader; the rest as mpi4py's pickled objects.
"""

from __future__ import annotations

import numpy as np

from synkhronos.transport.comm.base import Communicator
from synkhronos.transport.comm.shm import ShmCommunicator
from synkhronos.transport.comm.xla import Span, XlaCommunicator
from synkhronos.transport.reduction import empty_aligned, reduce_into

_MPI_OPS = {"sum": "SUM", "prod": "PROD", "max": "MAX", "min": "MIN"}


def _mpi_reduces(dtype: np.dtype, op: str) -> bool:
    """Whether MPI defines ``op`` for ``dtype``: not for bool (MPI has logical ops only),
    nor max and min of complex numbers (unordered to MPI; numpy orders them)."""
    return dtype.kind != "b" and not (dtype.kind == "c" and op in ("max", "min"))


def _root_0(root: int) -> None:
    if root != 0:
        raise ValueError(f"collectives over several nodes take root 0, got {root}")


def _divide(arrays: list[np.ndarray], n: int) -> None:
    """Sums into means, in place, as the shared-memory "avg" does (integers truncate)."""
    for a in arrays:
        if a.dtype.kind in "fc":
            a *= a.dtype.type(1.0 / n)
        else:
            np.copyto(a, a / n, casting="unsafe")


class NodeCommunicator(Communicator):
    """Hierarchical collectives over all nodes (see the module docstring).

    Parameters
    ----------
    local : Communicator
        The node's own communicator (local ranks).
    offset, n_global : int
        The global rank of the node's rank 0, and the number of ranks over all nodes.
    world : synkhronos.transport.nodes.World or None
        On local rank 0, the nodes' world (its MPI communicator among the leaders); None on
        the workers.
    """

    def __init__(self, local: Communicator, offset: int, n_global: int, world=None):
        self.local, self.world = local, world
        self.rank, self.n_ranks = offset + local.rank, n_global
        self.leader = local.rank == 0
        self.spread = local.n_ranks > 1  # whether the node's own step has anyone to meet
        self.xla = isinstance(local, XlaCommunicator)
        if isinstance(local, XlaCommunicator):
            local.span = Span(
                self.rank,
                n_global,
                self._host_broadcast,
                self.all_gather,
                self._host_all_reduce,
            )

    def start(self) -> None:
        self.local.start()

    def reset(self) -> None:
        """(Local rank 0, all ranks idle) forget what an aborted collective left."""
        self.local.reset()

    def close(self) -> None:
        """(Each node's rank 0, its workers gone) Leave. On GPU ranks global rank 0, whose
        process runs JAX's coordination service, leaves last: a rank still connected when
        the service ends is ended by JAX."""
        if not (self.xla and self.world is not None):
            self.local.close()
            return
        if self.rank != 0:
            self.local.close()
        self.world.mpi.Barrier()
        if self.rank == 0:
            self.local.close()

    def _allreduce_leaders(self, buffers: list[np.ndarray], op: str) -> None:
        """(Leaders) MPI Allreduce of this node's partial results, in place; "avg"
        arrives as the node's sum and leaves as the mean over every global rank."""
        from mpi4py import MPI  # only the leaders load MPI

        bare = "sum" if op == "avg" else op
        for a in buffers:
            if _mpi_reduces(a.dtype, bare):
                self.world.mpi.Allreduce(MPI.IN_PLACE, a, op=getattr(MPI, _MPI_OPS[bare]))
            else:
                parts = [np.asarray(p).reshape(-1) for p in self.world.mpi.allgather(a)]
                reduce_into(bare, parts, a.reshape(-1))
        if op == "avg":
            _divide(buffers, self.n_ranks)

    def reduce(self, arrays, op, root=0):
        _root_0(root)
        if self.xla:  # one XLA all-reduce: every node's rank 0 needs the result
            result = self.local.all_reduce(arrays, op)
            return result if self.leader else None
        if self.spread:
            reduced = self.local.reduce(arrays, "sum" if op == "avg" else op)
            if not self.leader:
                return None
            result = [np.require(np.asarray(a), requirements=["C", "W"]) for a in reduced]
        else:
            result = [np.array(a) for a in arrays]  # a copy: the caller's arrays stay as given
        self._allreduce_leaders(result, op)
        return result

    def all_reduce(self, arrays, op, out=None):
        if self.xla:
            return self.local.all_reduce(arrays, op)
        return self._host_all_reduce(arrays, op, out)

    def _host_all_reduce(self, arrays, op, out=None):
        """:meth:`all_reduce` of host arrays: the node's ranks through shared memory, the
        leaders through MPI."""
        if not self.spread:
            if out is None:
                out = [np.array(a) for a in arrays]
            else:
                for o, a in zip(out, arrays, strict=True):
                    if o is not a:
                        np.copyto(o, np.reshape(a, np.shape(o)))
            self._allreduce_leaders(out, op)
            return out
        # The node's ranks reduce in parallel into the shared result segment, the leader
        # all-reduces that segment over MPI in place, and after a barrier every rank copies
        # the result out: one copy, and no broadcast.
        if out is None:
            out = [empty_aligned(np.shape(a), np.asarray(a).dtype) for a in arrays]
        result = self.local._reduce_to_result(arrays, "sum" if op == "avg" else op)
        if self.leader:
            self._allreduce_leaders(result, op)
        self.local.barrier()
        for o, r in zip(out, result, strict=True):
            np.copyto(o.reshape(-1), r)
        return out

    def broadcast(self, arrays, root=0):
        _root_0(root)
        if self.xla:
            return self.local.broadcast(arrays, root)
        return self._host_broadcast(arrays, root)

    def _host_broadcast(self, arrays, root=0):
        """Global rank 0's host arrays on every rank: MPI among the leaders, then shared
        memory within each node."""
        _root_0(root)
        if self.leader:
            mine = [np.asarray(a) for a in arrays] if self.rank == 0 else None
            arrays = self.world.mpi.bcast(mine, root=0)
        if self.spread:
            arrays = ShmCommunicator.broadcast(self.local, arrays if self.leader else None)
        return list(arrays)

    def gather(self, arrays, root=0):
        _root_0(root)
        if self.spread:
            boxes = ShmCommunicator.gather(self.local, [np.asarray(a) for a in arrays])
            if not self.leader:
                return None
        else:
            boxes = [[np.asarray(a) for a in arrays]]
        return [box for node in self.world.mpi.allgather(boxes) for box in node]

    def all_gather(self, arrays):
        boxes = self.gather(arrays)
        if not self.spread:
            return boxes
        flat = None
        if self.leader:  # one message: the arrays per rank, then every rank's arrays
            flat = [np.array([len(b) for b in boxes], np.int64), *(a for b in boxes for a in b)]
        flat = ShmCommunicator.broadcast(self.local, flat)
        counts, rest = np.asarray(flat[0]).tolist(), flat[1:]
        bounds = np.cumsum([0, *counts]).tolist()
        return [list(rest[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def scatter(self, parts, root=0):
        _root_0(root)
        if self.leader:
            chunks = None
            if self.rank == 0:
                bounds = np.cumsum([0, *self.world.local_ranks]).tolist()
                chunks = [
                    [[np.asarray(a) for a in p] for p in parts[a:b]]
                    for a, b in zip(bounds[:-1], bounds[1:], strict=True)
                ]
            parts = self.world.mpi.scatter(chunks, root=0)
        if self.spread:
            return self.local.scatter(parts if self.leader else None)
        return list(parts[0])


__all__ = ["NodeCommunicator"]
