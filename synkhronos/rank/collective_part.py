"""Every rank's part of a collective on shared variables: one function per kind.

Rank 0 (:mod:`synkhronos.api.collectives`) checks the arguments and runs :func:`run` with the
kind, the variables, and the values only it has; each worker decodes the same command
(:func:`run_collective`) and runs :func:`run` with its own copies of the variables. Every
part calls the communicator (shared memory on CPU ranks, XLA programs on GPU ranks, or
with ``nccl=False``, the original Synkhronos' argument, the shared-memory methods the XLA
communicator extends) and returns rank 0's result (None elsewhere, or a result rank 0
ignores).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from synkhronos.transport import trace
from synkhronos.transport.comm.shm import ShmCommunicator
from synkhronos.transport.partition import split_bounds
from synkhronos.transport.protocol import Collective
from synkhronos.transport.reduction import COLLECTIVE_OPS, join_rows


class _HostPath:
    """A communicator that extends :class:`ShmCommunicator` (the XLA one), restricted to the
    shared-memory methods it inherits: the host path of ``nccl=False``."""

    def __init__(self, comm: ShmCommunicator):
        self._comm = comm
        self.rank, self.n_ranks = comm.rank, comm.n_ranks

    def __getattr__(self, name: str):
        method = getattr(ShmCommunicator, name)
        return lambda arrays, *args, **kwargs: method(
            self._comm, None if arrays is None else _to_host(arrays), *args, **kwargs
        )


def _to_host(arrays: list) -> list:
    return [[np.asarray(a) for a in p] if isinstance(p, list) else np.asarray(p) for p in arrays]


def communicator(state, nccl: bool):
    """The communicator a collective uses: the rank's own, or with ``nccl=False`` on GPU
    ranks its shared-memory path (CPU ranks' communicator is that path already)."""
    comm = state.comm
    if nccl or type(comm) is ShmCommunicator or not isinstance(comm, ShmCommunicator):
        return comm
    return _HostPath(comm)


def _set_all(state, variables: list, values: list, owned: bool = False) -> None:
    for var, value in zip(variables, values, strict=True):
        state.backend.set_value(var, value, owned)


def _values(state, variables: list) -> list:
    return [state.backend.value(v) for v in variables]


def _broadcast(state, comm, variables, op, rank, values):
    root = comm.rank == 0
    if root and values is not None:
        _set_all(state, variables, values)
    got = comm.broadcast(_values(state, variables) if root else None)
    if not root:
        _set_all(state, variables, got)


def _scatter(state, comm, variables, op, rank, values):
    parts = None
    if comm.rank == 0:
        bounds = [split_bounds(len(v), comm.n_ranks) for v in values]
        parts = [
            [v[b[r] : b[r + 1]] for v, b in zip(values, bounds, strict=True)]
            for r in range(comm.n_ranks)
        ]
    _set_all(state, variables, comm.scatter(parts))


def _gather(state, comm, variables, op, rank, values):
    return comm.gather(_values(state, variables))


def _get_value(state, comm, variables, op, rank, values):
    return comm.gather(_values(state, variables) if comm.rank == rank else [])


def _shapes(state, comm, variables, op, rank, values):
    return comm.gather([np.array(np.shape(v.get_value(borrow=True)), np.int64) for v in variables])


def _all_gather(state, comm, variables, op, rank, values):
    got = comm.all_gather(_values(state, variables))
    _set_all(state, variables, [join_rows([g[i] for g in got]) for i in range(len(variables))])
    return got


def _reduce(state, comm, variables, op, rank, values):
    got = _reduce_result(state, comm, variables, op, rank, values)
    if state.rank == 0:
        _set_all(state, variables, got)
    return got


def _reduce_result(state, comm, variables, op, rank, values):
    return comm.reduce(_values(state, variables), op)


def _all_reduce(state, comm, variables, op, rank, values):
    host = _values(state, variables)
    # Reduce straight into the variables' storage when the backend handed out that storage
    # and lets collectives write into it.
    in_place = state.backend.writes_in_place and all(
        isinstance(h, np.ndarray)
        and h.flags.writeable
        and h.flags.c_contiguous
        and h is v.get_value(borrow=True)
        for h, v in zip(host, variables, strict=True)
    )
    got = comm.all_reduce(host, op, out=host if in_place else None)
    if not in_place:
        _set_all(state, variables, got, owned=True)  # fresh arrays: no copy needed


def _set_value(state, comm, variables, op, rank, values):
    got = comm.broadcast(values if comm.rank == 0 else None)
    if comm.rank == rank:
        _set_all(state, variables, got)


PARTS: dict[Collective, Callable] = {
    Collective.BROADCAST: _broadcast,
    Collective.SCATTER: _scatter,
    Collective.GATHER: _gather,
    Collective.ALL_GATHER: _all_gather,
    Collective.REDUCE: _reduce,
    Collective.REDUCE_RESULT: _reduce_result,
    Collective.ALL_REDUCE: _all_reduce,
    Collective.SET_VALUE: _set_value,
    Collective.GET_VALUE: _get_value,
    Collective.SHAPES: _shapes,
}
"""This rank's part of each collective, called as ``part(state, comm, variables, op, rank,
values)``."""


def run(
    state,
    kind: Collective,
    variables: list,
    op: str | None = None,
    rank: int = 0,
    values: list | None = None,
    nccl: bool = True,
):
    """This rank's part of a collective; returns rank 0's result (None elsewhere)."""
    with trace.span(kind.name.lower(), "collective", {"op": op} if op else None):
        result = PARTS[kind](state, communicator(state, nccl), variables, op, rank, values)
    trace.count_bytes("collective", (v.get_value(borrow=True) for v in variables))
    return result


def run_collective(state, arrays: list[np.ndarray]) -> list:
    """(Worker) decode a COLLECTIVE command (``[kind, op index, rank, nccl]``, then registry
    indices) and run this rank's part; return the reply arrays (none)."""
    kind, op_code, rank, nccl = (int(x) for x in arrays[0])
    run(
        state,
        Collective(kind),
        state.shared(arrays[1]),
        COLLECTIVE_OPS[op_code],
        rank,
        nccl=bool(nccl),
    )
    return []
