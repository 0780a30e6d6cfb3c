"""How the ranks' outputs of a call come together in rank 0.

Two paths, chosen per output, the same way on every rank (outputs of op None take
neither: rank 0 returns its own result, and the workers send nothing):

- **Host** (CPU ranks, and on every backend "gather", "per_rank", the ``c_*`` ops,
  integer "avg", and outputs of at most :func:`host_reduce_bytes` bytes): each worker
  replies with its outputs as host arrays through the command channel, and rank 0
  combines them in rank order with :func:`synkhronos.transport.reduction.combine`.
  Nothing here waits on another rank, so a failed worker never blocks the others.
- **Communicator** (backends with ``device_outputs``: "gpu"; CI runs it on CPU devices):
  the other reductions go through ``comm.reduce``, which on GPU ranks is an XLA program
  (:mod:`synkhronos.transport.comm.xla`), so values stay on the devices and only rank 0's
  result is copied to the host, once.
  First the ranks exchange their row counts and output shapes through shared memory. That
  exchange is the barrier where a rank's failure aborts the others (shared-memory barriers
  abort; a collective in XLA would wait for the failed rank), and where mismatched shapes
  raise the same error on every rank. If any rank had no rows, and so no outputs, every
  rank takes the host path. Between that barrier and the XLA program only the scaling of
  "avg" values remains; a rank failing there (out of GPU memory, say) leaves the others'
  programs waiting, and after it the XLA communicator refuses further programs.

Small outputs (a loss, an accuracy) take the host path on GPU ranks too: launching an
XLA collective costs more than replying a few bytes (bench/RESULTS.md, "GPU rank
by hand"). An output whose graph fixes its size (a scalar) is known small on every rank
without the exchange; one whose size shows only in its shape is judged after it, where
every rank has the same shapes. Only rank 0 uses the reduced values (a fused chain
reduces its outputs inside its one program: :mod:`synkhronos.rank.fused_chain`).

Across several nodes (:mod:`synkhronos.transport.nodes`) the communicator spans every node, and each
node's rank 0 then combines its host-path results with the other nodes' over MPI
(:meth:`World.combine_outputs <synkhronos.transport.nodes.World.combine_outputs>`).

The communicator path sums in the outputs' own dtype, where the host path averages in
float64: float32 results may differ from a single device's in the last digits, float16
ones more.
"""

from __future__ import annotations

import math
import os
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from synkhronos.transport import trace
from synkhronos.transport.nodes import current as current_nodes
from synkhronos.transport.reduction import bare_op, combine

HOST_BYTES_VAR = "SYNK_HOST_REDUCE_BYTES"
"""Environment variable: the most bytes an output of GPU ranks may have to be reduced
through the host (read at :func:`synkhronos.fork`; "0" sends every output the device path
allows through the communicator)."""

HOST_BYTES = 65536
"""The default of :data:`HOST_BYTES_VAR` (bench/RESULTS.md, "A GPU rank against JAX by hand")."""


def host_reduce_bytes() -> int:
    """The most bytes of an output that GPU ranks reduce through the host
    (:data:`HOST_BYTES_VAR`, else :data:`HOST_BYTES`)."""
    return int(os.environ.get(HOST_BYTES_VAR, HOST_BYTES))


def _static_bytes(var) -> float:
    """The bytes of output ``var`` where its graph fixes its shape (a scalar), else inf."""
    shape = var.type.shape
    if any(d is None for d in shape):
        return math.inf
    return math.prod(shape) * np.dtype(var.dtype).itemsize


def share_outputs(state, fn, subset, weight: int, outs: list | None) -> tuple[list, dict]:
    """(Every rank) Reduce what the communicator path takes; return the rest.

    Parameters
    ----------
    state : RankState
        This rank's state (communicator, backend).
    fn : RankFunction
        This rank's compiled function (output ops, and which outputs it kept on device).
    subset : sequence of int
        The outputs this call returns, in order.
    weight : int
        Rows this rank computed on (0: it computed nothing).
    outs : list or None
        This rank's outputs in ``subset`` order (None when ``weight`` is 0).

    Returns
    -------
    host : list
        The outputs of the host path, as host arrays, in order (empty when ``weight`` is 0);
        on the workers without those of op None, which only rank 0's result gives.
    reduced : dict
        On rank 0, position in ``subset`` -> reduced value (backend array) of the outputs
        that took the communicator path; empty elsewhere.
    """
    if not weight or outs is None:
        outs = []
    limit = state.host_bytes
    outputs = fn.spec.outputs
    device = (
        []
        if state.n_ranks == 1
        else [
            j for j, i in enumerate(subset) if fn.on_device[i] and _static_bytes(outputs[i]) > limit
        ]
    )
    if not device:
        return host_outputs(state, fn, subset, outs), {}
    shapes = [np.shape(outs[j]) for j in device] if weight else []
    mine = np.array([weight, *(d for s in shapes for d in (len(s), *s))], np.int64)
    with trace.span("all_gather", "collective", {"what": "rows and shapes"}):
        everyone = [a[0] for a in state.comm.all_gather([mine])]
    weights = [int(a[0]) for a in everyone]
    if min(weights) == 0:
        return host_outputs(state, fn, subset, outs), {}
    for rank, theirs in enumerate(everyone):
        if not np.array_equal(theirs[1:], mine[1:]):
            raise ValueError(
                f"outputs {[int(subset[j]) for j in device]} have shapes {shapes} on rank "
                f"{state.rank} but not on rank {rank} ({theirs[1:].tolist()} as ndim, dims); "
                f"outputs reduced with avg/sum/prod/max/min need the same shape on every rank"
            )
    # Every rank has the same shapes here, so every rank leaves out the same small ones.
    device = [
        j
        for j, s in zip(device, shapes, strict=True)
        if math.prod(s) * np.dtype(outputs[subset[j]].dtype).itemsize > limit
    ]
    if not device:
        return host_outputs(state, fn, subset, outs), {}
    total = sum(weights)
    ops = {j: fn.spec.output_ops[subset[j]] for j in device}
    # "avg" is a sum of values scaled by their share of the rows, so it goes with "sum".
    comm_ops = {j: "sum" if op == "avg" else op for j, op in ops.items()}
    reduced: dict[int, Any] = {}
    for comm_op in dict.fromkeys(comm_ops.values()):  # one collective per op, same order
        positions = [j for j in device if comm_ops[j] == comm_op]
        values = [
            state.backend.to_comm(outs[j] * (weight / total) if ops[j] == "avg" else outs[j])
            for j in positions
        ]
        with trace.span("reduce", "collective", {"op": comm_op}):
            got = state.comm.reduce(values, comm_op)
        trace.count_bytes("collective", values)
        if got is not None:
            reduced.update(zip(positions, got, strict=True))
    return host_outputs(state, fn, subset, outs, set(ops)), reduced


def host_outputs(state, fn, subset, outs: list, reduced: AbstractSet[int] = frozenset()) -> list:
    """This rank's outputs ``outs`` (``subset`` order) that take the host path, as host
    arrays: all but the positions in ``reduced``, and on the workers all but those of op
    None, which only rank 0's result gives."""
    if not outs:  # the rank computed nothing
        return []
    if not reduced and not state.rank:  # rank 0 sends all
        return [np.asarray(o) for o in outs]
    return [
        np.asarray(o)
        for j, (o, i) in enumerate(zip(outs, subset, strict=True))
        if j not in reduced and not (state.rank and i in fn.rank_0_only)
    ]


def _check_same_shapes(output: int, op: str, values: list) -> None:
    """Refuse to reduce per-rank values of different shapes (NumPy would broadcast some).

    The call has run by then: its updates are applied on every rank."""
    if len(values) < 2 or bare_op(op) == "gather":
        return
    shapes = [None if v is None else np.shape(v) for v in values]
    if len({s for s in shapes if s is not None}) > 1:
        offset = current_nodes().offset  # this node's rank 0, as a global rank
        listed = ", ".join(f"rank {offset + r}: {s}" for r, s in enumerate(shapes) if s is not None)
        raise ValueError(
            f"output {output} has shapes {listed}; outputs reduced with "
            f"avg/sum/prod/max/min need the same shape on every rank"
        )


def _result(output: int, op, values: list, weights: list[int]):
    """Output ``output``'s result from each rank's value (None: the rank computed
    nothing): rank 0's own for op None, the list for "per_rank", else combined."""
    if op is None:
        return np.asarray(values[0])
    if op == "per_rank":
        return [None if v is None else np.array(v) for v in values]
    if len(values) > 1:
        _check_same_shapes(output, op, values)
    return combine(op, values, weights)


def own_outputs(spec, subset, outs: list, weight: int, single: bool):
    """(Rank 0, the only rank of the only node) :func:`collect_outputs`'s result from its
    own outputs ``outs`` alone (``subset`` order), computed on ``weight`` rows."""
    results = [
        _result(i, spec.output_ops[i], [o], [weight]) for i, o in zip(subset, outs, strict=True)
    ]
    return results[0] if single else results


def collect_outputs(
    replies: list[list[np.ndarray]],
    spec,
    subset,
    weight: int,
    host: list,
    reduced: dict,
    single: bool,
):
    """(Rank 0) Put together the call's results from its own share and the workers'
    ``replies`` (rank 1 onwards, each ``[weight, *host outputs]``)."""
    weights = [weight]
    per_rank: list[list | None] = [host if weight else None]
    for reply in replies:
        weights.append(int(reply[0][0]))
        per_rank.append(reply[1:] if weights[-1] else None)
    results: list = []
    mine, theirs = 0, 0  # positions in rank 0's and in the workers' replies
    for j, i in enumerate(subset):
        op = spec.output_ops[i]
        if j in reduced:
            results.append(np.array(reduced[j]))  # to the host (from a GPU), and writable
            continue
        values = [host[mine] if weight else None]
        mine += 1
        if op is not None:  # (the workers send none of op None)
            values += [None if o is None else o[theirs] for o in per_rank[1:]]
            theirs += 1
        results.append(_result(i, op, values, weights))
    world = current_nodes()
    if world.n_nodes > 1:  # the same global result on every node
        results = world.combine_outputs(
            [spec.output_ops[i] for i in subset], results, sum(weights), set(reduced)
        )
    return results[0] if single else results
