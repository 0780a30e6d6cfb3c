"""A chain run as one XLA program per rank, on GPU ranks (JAX mode, the XLA communicator).

A training step chained as ``synk.chain(f_grad, ("all_reduce", flat, "sum"), f_update)``
runs, step by step, as a call of one jitted function, an XLA all-reduce and a call of
another: three programs, each waited for. Fused, each rank composes the functions' JAX
callables (PyTensor's JAX mode compiles each graph into one) with the collectives
(:func:`~synkhronos.transport.comm.traced.reduce_traced` and its kin) into one program over
the mesh, and dispatches it once per call. What fusion saves is the dispatches, waits and
host round trips between the steps; and the all-reduce of a flat gradient larger than a
bucket (:data:`~synkhronos.transport.comm.xla_settings.BUCKET_VAR`) runs as one all-reduce per
bucket, each waiting only for the gradients it holds, which XLA can overlap with the rest
of the backward pass (the schedule: ``tests/test_gpu_step.py``). Shared variables
pass through the program as its inputs and outputs, updated as each step would update
them (their old buffers donated to the new values, updated in place and deleted, on
GPUs; on CPU devices where no update reads another's old value:
:data:`~synkhronos.transport.comm.xla_settings.DONATE_VAR`), and outputs that the
communicator reduces (:mod:`synkhronos.rank.outputs`) are reduced inside it. What a
training function hands between its phases (the spec's ``handover``: its gradients,
say), which the program writes before it reads it, stays inside the program: neither an
input nor an output, no buffer held between calls, and no copy written out (on one CPU
device the MLP step of ``bench/bench_gpu_overhead.py`` took 1.3x a ``jax.jit`` step with
it as an output). On one rank a broadcast is the identity, and an all-reduce still
computes its arrays whole, as on several ranks.

Fusion needs the same program on every rank (XLA's collectives pair up operations of one
program), so the chain runs fused only when every rank's inputs to it (its rows, the
broadcast values, the shared variables' values) have the same shapes and dtypes: before
each call the ranks exchange them through shared memory, the barrier where a rank's
earlier failure stops the others, as before every XLA collective, and every rank takes
the same path. A call whose rows split unevenly, that slices (``num_slices > 1``), or
whose functions cannot be traced into one program (PyTensor's JAX function takes some
scalar inputs as static Python numbers, or a shared random generator) runs step by step
instead, with the same results. Across several nodes chains run step by step.
"""

from __future__ import annotations

import weakref

import numpy as np
from pytensor.tensor.shape import Shape, Shape_i

from synkhronos.rank.outputs import host_outputs
from synkhronos.rank.state import RankState, share_of, step_plans
from synkhronos.transport.callplan import CallPlan
from synkhronos.transport.comm.traced import (
    AXIS,
    broadcast_traced,
    reduce_buckets_traced,
    reduce_traced,
)
from synkhronos.transport.comm.xla import XlaCommunicator
from synkhronos.transport.protocol import Collective
from synkhronos.transport.reduction import IN_PLACE_DTYPES

_TRACED = {
    Collective.ALL_REDUCE: lambda x, op, n, bucket: (
        reduce_buckets_traced(x, op, n, bucket) if n > 1 else _one_rank_all_reduce(x)
    ),
    Collective.BROADCAST: lambda x, op, n, bucket: x if n == 1 else broadcast_traced(x, 0),
}
"""The collectives a fused chain runs inside its program: ``(value, op, ranks, bucket
bytes) -> value``. "reduce" (into rank 0 only) and "all_gather" (the shape changes) run
step by step."""


class _Call:
    """One function step of a fused chain: its compiled PyTensor function (JAX mode) and
    where its inputs and outputs go."""

    def __init__(self, fn, compiled, subset: list[int], n_args: int):
        self.fn, self.subset, self.n_args, self.compiled = fn, subset, n_args, compiled
        self.jax_fn = compiled.vm.jit_fn
        # Input storage cells: the call's arguments first, then the shared variables (a
        # shared variable's cell is its container's, the same for every function).
        self.cells = [c.storage for c in compiled.input_storage[n_args:]]
        # The outputs after the returned ones update these cells, in this order.
        self.updates = [
            c.storage
            for i, c in zip(compiled.maker.expanded_inputs, compiled.input_storage, strict=True)
            if i.update is not None
        ]
        self.n_out = len(compiled.maker.fgraph.outputs) - len(self.updates)
        # Whether the graph reads each cell (an update's target only is not read).
        fgraph = compiled.maker.fgraph
        self.reads = [bool(fgraph.clients[v]) for v in fgraph.inputs[n_args:]]
        # Positions in ``subset`` reduced by the communicator inside the program.
        self.reduced = [j for j, i in enumerate(subset) if fn.on_device[i]]


def _fusable(state: RankState, steps) -> bool:
    """Whether the chain's collectives allow one program (the same answer on every rank;
    the communicator is an XLA one)."""
    return all(
        isinstance(s, int)
        or (
            s.kind in _TRACED
            and all(str(v.dtype) in IN_PLACE_DTYPES for v in state.shared(s.indices))
        )
        for s in steps
    )


def _calls(state: RankState, steps, plan: CallPlan | None, resolve):
    """The function steps as :class:`_Call` objects, their weights (rows) in this call and
    the first one's arguments, or None when this rank cannot run them as one program (see
    the module docstring)."""
    import jax

    calls: list[_Call] = []
    weights: list[int] = []
    first_args: list = []
    for this in step_plans(state, steps, plan):
        fn, share = share_of(state, this, resolve)
        if share.pop("num_slices") != 1:
            return None
        subset = share.pop("subset")
        weight, compiled, args = fn.prepare(**share)
        if not weight or getattr(compiled.maker.linker, "scalar_shape_inputs", None):
            return None
        if not hasattr(compiled.vm, "jit_fn"):  # compiled in another mode than JAX's
            return None
        if calls and args:  # later functions' own arguments (sliceable rows): step by step
            return None
        key = (id(compiled), tuple(subset), len(args))  # each call's the same, built once
        call = fn.fused_steps.get(key)
        if call is None or call.compiled is not compiled:
            call = fn.fused_steps[key] = _Call(fn, compiled, subset, len(args))
        if not all(isinstance(c[0], (np.ndarray, np.generic, jax.Array)) for c in call.cells):
            return None  # a random generator's state, say
        calls.append(call)
        weights.append(weight)
        first_args = first_args or args
    return calls, weights, first_args


class FusedChain:
    """The program of one chain on one rank (see the module docstring), built on first use.

    Attributes
    ----------
    calls : int
        How many times this rank ran the program (counted for the tests).
    """

    _distinct = False  # whether the cells' values as run() left them are distinct arrays

    def __init__(self, state: RankState, comm: XlaCommunicator, steps, calls: list[_Call]):
        self.state, self.comm, self.steps, self.function_calls = state, comm, steps, calls
        self.calls = 0
        cells: dict[int, list] = {}  # every storage cell the program reads, by id
        for call in calls:
            cells.update((id(c), c) for c in call.cells)
        for step in steps:
            if not isinstance(step, int):
                cells.update(
                    (id(v.container.storage), v.container.storage)
                    for v in state.shared(step.indices)
                )
        self._written: list = []  # (weak references to) the cells' values as run() left them
        self._held: dict = {}  # the cells' values as the mesh's arrays (XlaCommunicator.run)
        self.transient = _transient(state, steps, calls)
        self.cells = [c for k, c in cells.items() if k not in self.transient]
        self.bucket_bytes = comm.bucket_bytes  # this program's, whatever comes later
        bucketed = any(
            step.kind == Collective.ALL_REDUCE
            and np.ndim(v.container.storage[0]) == 1
            and v.container.storage[0].nbytes > self.bucket_bytes
            for step in steps
            if not isinstance(step, int)
            for v in state.shared(step.indices)
        )
        # This program's, whatever comes later. Donated, XLA writes the new values over
        # the old ones (the old arrays are deleted): parameters and optimizer state are
        # not held twice.
        self.donate = not reads_overwritten(calls) if comm.donate is None else comm.donate
        self.program = comm.program(self._body, donate=self.donate, buckets=bucketed)

    def _body(self, xs: list) -> list:
        """(Traced) every step on this rank's values: the functions' outputs (reduced
        inside where the communicator reduces them), then every cell's new value."""
        n_args = self.function_calls[0].n_args
        env = {id(c): x for c, x in zip(self.cells, xs[n_args:], strict=True)}
        calls, outputs, n = iter(self.function_calls), [], self.state.n_ranks
        for step in self.steps:
            if isinstance(step, int):
                call = next(calls)
                if self.donate and call is not self.function_calls[0]:
                    env = _after_all(env)
                args = list(xs[:n_args]) if call is self.function_calls[0] else []
                # A transient cell not written yet is not read here: an empty stand-in.
                cells = (env[id(c)] if id(c) in env else _unread(c[0]) for c in call.cells)
                got = call.jax_fn(*args, *cells) or ()
                for cell, value in zip(call.updates, got[call.n_out :], strict=True):
                    env[id(cell)] = value
                ops = call.fn.spec.output_ops
                outputs += [
                    reduce_traced(got[i], ops[i], n) if j in call.reduced else got[i]
                    for j, i in enumerate(call.subset)
                ]
            else:
                traced = _TRACED[step.kind]
                for var in self.state.shared(step.indices):
                    key = id(var.container.storage)
                    env[key] = traced(env[key], step.op, n, self.bucket_bytes)
        # The cells first, in the order of the inputs donated: JAX gives each donated
        # buffer to the first result of its shape and dtype, so each new value takes its
        # old value's buffer (an output of the same shape first would take it, and XLA
        # would copy every cell around it).
        return [*(env[id(c)] for c in self.cells), *outputs]

    def inputs(self, args: list) -> list:
        """The program's inputs on this device: the first function's arguments, then the
        cells' current values (the cells keep them on the device from now on). On one
        rank host arguments stay as they are: the program's call puts them, as a
        ``jax.jit`` function's does."""
        import jax
        import jax.numpy as jnp

        alone = self.comm.alone  # host arguments taken as they are
        cells = [c[0] for c in self.cells]
        written = self._written
        if len(written) != len(cells) or any(
            c is not w() for c, w in zip(cells, written, strict=True)
        ):
            cells = self.comm.to_device(cells)  # not all as the last run left them
        elif self._distinct and alone and not any(isinstance(a, jax.Array) for a in args):
            return [*args, *cells]  # as the last run left them: none read twice
        values = [*(args if alone else self.comm.to_device(args)), *cells]
        seen = {id(v) for v in values[: len(args)]}
        for i in range(len(args), len(values)):
            if id(values[i]) in seen:  # one buffer cannot be donated twice, nor also be read
                values[i] = jnp.array(values[i], copy=True)
            seen.add(id(values[i]))
        for cell, value in zip(self.cells, values[len(args) :], strict=True):
            cell[0] = value
        return values

    def run(self, inputs: list, weights: list[int]) -> list[tuple]:
        """Run the program on ``inputs`` and store the cells' new values; returns, per
        function step, :func:`~synkhronos.rank.state.run_share`'s ``(weight, host,
        reduced)``, with this call's ``weights`` (rows per function step)."""
        n_args = self.function_calls[0].n_args
        got = self.comm.run(self.program, inputs[:n_args], inputs[n_args:], self._held)
        self.calls += 1
        for cell, value in zip(self.cells, got[: len(self.cells)], strict=True):
            cell[0] = value
        # On this device; weakly: a value set since is not held.
        values = [c[0] for c in self.cells]
        self._written = [weakref.ref(v) for v in values]
        self._distinct = len({id(v) for v in values}) == len(values)  # each its own buffer
        results, pos = [], len(self.cells)
        for call, weight in zip(self.function_calls, weights, strict=True):
            outs = got[pos : pos + len(call.subset)]
            pos += len(call.subset)
            reduced = {j: outs[j] for j in call.reduced} if self.state.rank == 0 else {}
            host = host_outputs(self.state, call.fn, call.subset, outs, set(call.reduced))
            results.append((weight, host, reduced))
        return results


def reads_overwritten(calls: list[_Call]) -> bool:
    """Whether an update of a function step of ``calls`` reads the old value of another
    shared variable the step updates (not only its shape, nor through its new value), as
    Lasagne's momentum computes the new parameter from the old velocity: donated, XLA
    keeps a copy of that variable (Adam's new parameter reads its moments' new values)."""
    for call in calls:
        fgraph = call.compiled.maker.fgraph
        updates = fgraph.outputs[call.n_out :]
        new = set(updates)
        # Per variable of the graph, the cells whose old values it reads, as bits; a new
        # value passes none on.
        reads = {v: 1 << k for k, v in enumerate(fgraph.inputs[call.n_args :])}
        own = {}
        for node in fgraph.toposort():
            bits = 0
            if not isinstance(node.op, Shape | Shape_i):  # a shape reads no values
                for i in node.inputs:
                    bits |= reads.get(i, 0)
            for o in node.outputs:
                own[o], reads[o] = bits, 0 if o in new else bits
        cell = {id(c): k for k, c in enumerate(call.cells)}
        written = {cell[id(c)] for c in call.updates}
        for c, out in zip(call.updates, updates, strict=True):
            others = written - {cell[id(c)]}
            if any(own.get(out, 0) >> k & 1 for k in others):
                return True
    return False


def _transient(state: RankState, steps, calls: list[_Call]) -> set[int]:
    """The cells (by id) of the functions' ``handover`` that the program writes before
    any step reads them: they live inside the program only."""
    handed = {id(v.container.storage) for c in calls for v in c.fn.spec.handover}
    written: set[int] = set()
    read_first: set[int] = set()
    functions = iter(calls)
    for step in steps:
        if isinstance(step, int):
            call = next(functions)
            read = {id(c) for c, r in zip(call.cells, call.reads, strict=True) if r}
            read_first |= read - written
            written |= {id(c) for c in call.updates}
        else:
            read_first |= {id(v.container.storage) for v in state.shared(step.indices)} - written
    return (handed & written) - read_first


def _after_all(env: dict) -> dict:
    """(Traced) ``env``'s values, once every one of them is computed: a later step reads
    them after all that the steps before it read (where the cells are donated). Without
    this, XLA sees that a parameter's update needs only its own gradient (the slice of
    the flat vector), not the whole backward pass that still reads the old parameter, and
    copies each donated parameter and optimizer state before the program starts
    (``tests/test_gpu_one_rank.py``). Without donation the update phase may overlap the
    backward pass instead."""
    import jax

    keys = list(env)
    return dict(zip(keys, jax.lax.optimization_barrier([env[k] for k in keys]), strict=True))


def _one_rank_all_reduce(x):
    """(Traced) An all-reduce of ``x`` on one rank: ``x``, computed whole into a buffer of
    its own, as on several ranks. As the identity, XLA fused each convolution filter's
    gradient's last layout change (a transpose) into every update that reads it, each
    then reading it in strides (Lasagne's momentum: twice), and computed a flat gradient
    twice, once into the vector and once into the update that reads its slice
    (bench/RESULTS.md). A vector or matrix is kept as computed (an optimization barrier);
    an array of more dimensions goes through XLA's all-reduce over the mesh of one
    device, which writes it in its own layout (a barrier keeps the transposed one; for a
    matrix the all-reduce was a copy the MLP step paid for)."""
    from jax import lax

    return lax.psum(x, AXIS) if x.ndim > 2 else lax.optimization_barrier(x)


def _unread(value):
    """An empty array of ``value``'s dtype and dimensions: what a step is given for a
    transient cell that it writes without reading."""
    return np.empty((0,) * np.ndim(value), value.dtype)


def run_fused(state: RankState, steps, plan: CallPlan | None, resolve) -> list[tuple] | None:
    """Run ``steps`` as one program on every rank, or return None (on every rank alike) to
    have them run step by step."""
    comm = state.comm
    if (
        not isinstance(comm, XlaCommunicator)
        or not _fusable(state, steps)
        or not any(isinstance(s, int) for s in steps)
    ):
        return None
    found = _calls(state, steps, plan, resolve)
    fused: FusedChain | None = None
    inputs: list | None = None
    weights: list[int] = []
    if found is not None:
        calls, weights, args = found
        key = (
            tuple(
                s if isinstance(s, int) else (s.kind, s.op, s.nccl, s.indices.tobytes())
                for s in steps
            ),
            tuple(tuple(c.subset) for c in calls),
            tuple(id(c.jax_fn) for c in calls),
        )
        fused = state.fused.get(key)
        if fused is None:
            fused = state.fused[key] = FusedChain(state, comm, steps, calls)
        inputs = fused.inputs(args)
        if comm.alone:  # no peer to agree with
            results = fused.run(inputs, weights)
            state.last_fused = (fused, weights)
            return results
    # Every rank's inputs, through the host: one program only if they all agree.
    layouts, on_device = comm.agree(inputs)
    # on_device only where every rank has its program's inputs on its device: every rank
    # takes the same path.
    if fused is None or inputs is None or not on_device:
        return None
    if any(lay != layouts[0] for lay in layouts):
        return None
    # This call's weights: the program, built at the first call, keeps that call's steps.
    return fused.run(inputs, weights)


__all__ = ["FusedChain", "reads_overwritten", "run_fused"]
