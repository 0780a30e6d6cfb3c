"""Collectives for CPU ranks over shared memory.

Each rank owns a mailbox segment it writes its arrays into; a semaphore barrier orders the
writes before the reads, and a second one the reads before any later write, so that
collectives may follow one another within one command (as MPI's do). Reductions run in
parallel: after the barrier, rank ``r`` reduces the ``r``-th chunk of every array into a
result segment owned by rank 0, and after a second barrier every rank copies the whole
result out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from synkhronos.transport.channel import Aborted, ControlBlock, drain, semaphore, wait
from synkhronos.transport.comm.base import Communicator
from synkhronos.transport.partition import split_bounds
from synkhronos.transport.reduction import empty_aligned, reduce_into
from synkhronos.transport.shm import GrowingSegment, Mailbox


def check_same_layouts(layouts: list) -> None:
    """Raise unless every rank's layout (each array's dtype and shape) is rank 0's, naming
    the first rank that differs. Every rank sees the same layouts, so every rank raises:
    none is left waiting in a reduction."""
    for r, layout in enumerate(layouts):
        if layout != layouts[0]:
            raise ValueError(
                f"all_reduce/reduce needs equal shapes and dtypes on every rank; rank 0 "
                f"has {layouts[0]}, rank {r} has {layout}"
            )


class ShmCommunicator(Communicator):
    """Shared-memory communicator (see the module docstring).

    Parameters
    ----------
    session : str
        Name prefix of the fork.
    rank, n_ranks : int
        This rank and the number of ranks.
    control : ControlBlock
        Shared control words (mailbox headers and the abort flag live there).
    check_alive : callable
        Raises when a peer has died; polled while blocked in a barrier.
    """

    def __init__(
        self,
        session: str,
        rank: int,
        n_ranks: int,
        control: ControlBlock,
        check_alive: Callable[[], None],
    ):
        self.rank, self.n_ranks, self.control = rank, n_ranks, control
        self.check_alive = check_alive
        create = rank == 0
        self.barrier_sems = [semaphore(f"{session}_bar{r}", create) for r in range(n_ranks)]
        self.mailboxes = [
            Mailbox(f"{session}_comm{r}", control.comm_header(r)) for r in range(n_ranks)
        ]
        self.result = GrowingSegment(f"{session}_result")
        self.result_header = control.result_header()

    # ---- synchronisation -----------------------------------------------------------------
    def _check(self) -> None:
        if self.control.aborted:
            raise Aborted("collective abandoned: another rank failed")
        self.check_alive()

    def barrier(self) -> None:
        """Block until every rank has reached this barrier."""
        # Each rank posts once to every other rank, then takes n-1 posts of its own. A post
        # for the next barrier can only be made once every rank has posted for this one,
        # so consuming it early never lets a rank through too soon.
        if self.n_ranks == 1:
            return
        for r, sem in enumerate(self.barrier_sems):
            if r != self.rank:
                sem.release()
        for _ in range(self.n_ranks - 1):
            wait(self.barrier_sems[self.rank], self._check)

    def reset(self) -> None:
        """(Rank 0, all ranks idle) forget posts left by an aborted collective."""
        for sem in self.barrier_sems:
            drain(sem)

    def close(self) -> None:
        """Nothing to release: rank 0 sweeps the session's segments and semaphores."""

    # ---- helpers -------------------------------------------------------------------------
    def _all_boxes(self) -> list[list[np.ndarray]]:
        return [box.read() for box in self.mailboxes]

    # ---- collectives ---------------------------------------------------------------------
    def broadcast(self, arrays, root=0):
        if self.rank == root:
            self.mailboxes[root].post(arrays)
        self.barrier()
        got = list(arrays) if self.rank == root else [a.copy() for a in self.mailboxes[root].read()]
        self.barrier()  # the mailbox is read: a next collective may post again
        return got

    def scatter(self, parts, root=0):
        if self.rank == root:
            per_rank = {len(p) for p in parts}
            if len(per_rank) != 1:
                raise ValueError("scatter needs the same number of arrays for every rank")
            self.mailboxes[root].post([a for p in parts for a in p])
        self.barrier()
        if self.rank == root:
            got = list(parts[root])
        else:
            flat = self.mailboxes[root].read()
            k = len(flat) // self.n_ranks
            got = [a.copy() for a in flat[self.rank * k : (self.rank + 1) * k]]
        self.barrier()
        return got

    def gather(self, arrays, root=0):
        self.mailboxes[self.rank].post(arrays)
        self.barrier()
        got = None if self.rank != root else [[a.copy() for a in box] for box in self._all_boxes()]
        self.barrier()
        return got

    def all_gather(self, arrays):
        self.mailboxes[self.rank].post(arrays)
        self.barrier()
        got = [[a.copy() for a in box] for box in self._all_boxes()]
        self.barrier()
        return got

    def reduce(self, arrays, op, root=0):
        result = self._reduce_to_result(arrays, op)
        if self.rank != root:
            return None
        return [r.reshape(np.shape(a)).copy() for r, a in zip(result, arrays, strict=True)]

    def all_reduce(self, arrays, op, out=None):
        if out is None:
            out = [empty_aligned(np.shape(a), np.asarray(a).dtype) for a in arrays]
        flat_out = [o.reshape(-1) for o in out]
        result = self._reduce_to_result(arrays, op, flat_out)
        for o, r in zip(flat_out, result, strict=True):
            bounds = split_bounds(o.size, self.n_ranks)
            for rank in range(self.n_ranks):
                if rank != self.rank:  # this rank's own chunk is in place already
                    o[bounds[rank] : bounds[rank + 1]] = r[bounds[rank] : bounds[rank + 1]]
        return out

    def _reduce_to_result(self, arrays, op, flat_out=None) -> list[np.ndarray]:
        """Every rank reduces its chunk into the result segment (and into ``flat_out``);
        returns views of the whole result."""
        # Others read only their own chunks of this rank's arrays: copy just those, and
        # reduce this rank's chunk from its own arrays.
        mine = self.mailboxes[self.rank]
        views = mine.post(arrays, oversize=1.0, copy=False)
        flat = [np.asarray(a).reshape(-1) for a in arrays]
        chunks = [split_bounds(a.size, self.n_ranks) for a in flat]
        for view, a, bounds in zip(views, flat, chunks, strict=True):
            view = view.reshape(-1)
            view[: bounds[self.rank]] = a[: bounds[self.rank]]
            view[bounds[self.rank + 1] :] = a[bounds[self.rank + 1] :]
        if self.rank == 0:
            self.result.reserve(mine.data.size)
            self.result_header[0] = self.result.generation
        self.barrier()
        boxes = self._all_boxes()
        layouts = [[(a.dtype, a.shape) for a in box] for box in boxes]
        check_same_layouts(layouts)
        layout = layouts[0]
        self.result.follow(int(self.result_header[0]))
        results = []
        for i, ((dtype, shape), offset) in enumerate(zip(layout, mine.offsets(), strict=True)):
            res = self.result.attached.array(dtype, (int(np.prod(shape)),), offset)
            lo, hi = chunks[i][self.rank : self.rank + 2]
            copies = () if flat_out is None else (flat_out[i][lo:hi],)
            inputs = [
                flat[i][lo:hi] if r == self.rank else box[i].reshape(-1)[lo:hi]
                for r, box in enumerate(boxes)
            ]
            reduce_into(op, inputs, res[lo:hi], copies)
            results.append(res)
        self.barrier()
        return results
