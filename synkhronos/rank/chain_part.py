"""Every rank's part of a chained call: functions and collectives run back to back.

Rank 0 (:mod:`synkhronos.api.chains`) sends one CHAIN command; each rank then runs the steps
in order without returning to rank 0 in between. The command's arrays are the step
table, then the encoded :class:`~synkhronos.transport.callplan.CallPlan` of the first function
step (the only one that takes arguments). The table is one int64 vector::

    n_steps, fuse, then per step:
        FUNCTION, fid
        COLLECTIVE, kind, op index, nccl, n_vars, registry indices[n_vars]

With ``fuse`` set, GPU ranks may run the whole chain as one XLA program
(:mod:`synkhronos.rank.fused_chain`).

A worker replies, per function step, ``[weight, n_host]`` (int64) then its ``n_host``
host outputs. A step that fails on a rank names the step and the rank (an exception
note); the other ranks, waiting in a later collective, see the abort flag and give up,
as for a single collective. A step's updates apply as it runs where a later step reads
or writes the variable; the others wait, as a call's, until every rank has run the
chain (:func:`held_updates`, :attr:`RankState.pending
<synkhronos.rank.state.RankState.pending>`).

Examples
--------
>>> steps = [3, CollectiveStep(Collective.ALL_REDUCE, np.array([0, 2]), "sum", True), 4]
>>> table = encode_table(steps, fuse=True)
>>> table.tolist()
[3, 1, 0, 3, 1, 5, 1, 1, 2, 0, 2, 0, 4]
>>> decode_table(table) == (steps, True)
True
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.traversal import graph_inputs
from pytensor.tensor.random.type import RandomType

from synkhronos.rank import collective_part
from synkhronos.rank.compiled import is_jax
from synkhronos.rank.fused_chain import run_fused
from synkhronos.rank.graphs import GraphSpec
from synkhronos.rank.state import RankState, run_share, share_of, step_plans
from synkhronos.transport import trace
from synkhronos.transport.callplan import CallPlan
from synkhronos.transport.channel import Aborted
from synkhronos.transport.protocol import Collective
from synkhronos.transport.reduction import COLLECTIVE_OPS

FUNCTION, COLLECTIVE = 0, 1  # the marker opening each step of the table

CHAINABLE = {
    "all_reduce": Collective.ALL_REDUCE,
    "broadcast": Collective.BROADCAST,
    "all_gather": Collective.ALL_GATHER,
    "reduce": Collective.REDUCE,
}
"""Collectives a chain may hold, by name: those that need no values from rank 0 and
return nothing to it (they act on the variables of every rank)."""


@dataclass
class CollectiveStep:
    """A collective of a chain: its kind, the registry indices of its variables, its op."""

    kind: Collective
    indices: np.ndarray
    op: str
    nccl: bool

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, CollectiveStep)
            and self.kind == other.kind
            and np.array_equal(self.indices, other.indices)
            and self.op == other.op
            and self.nccl == other.nccl
        )

    def key(self) -> tuple:
        """The step as a hashable value, equal for equal steps (all its indices: an array's
        repr elides long ones)."""
        return (self.kind, self.indices.tobytes(), self.op, self.nccl)

    def describe(self) -> str:
        return f"{self.kind.name.lower()} of {len(self.indices)} variable(s), op {self.op!r}"


Step = int | CollectiveStep  # a function step is its fid


def encode_table(steps: list[Step], fuse: bool) -> np.ndarray:
    """The step table (module docstring) as one int64 vector."""
    words = [len(steps), int(fuse)]
    for step in steps:
        if isinstance(step, CollectiveStep):
            words += [
                COLLECTIVE,
                int(step.kind),
                COLLECTIVE_OPS.index(step.op),
                int(step.nccl),
                len(step.indices),
                *step.indices.tolist(),
            ]
        else:
            words += [FUNCTION, int(step)]
    return np.array(words, np.int64)


def decode_table(table: np.ndarray) -> tuple[list[Step], bool]:
    """The steps and the fuse flag :func:`encode_table` wrote."""
    words = table.tolist()
    steps, pos = [], 2
    for _ in range(words[0]):
        if words[pos] == FUNCTION:
            steps.append(words[pos + 1])
            pos += 2
        else:
            kind, op, nccl, n = words[pos + 1 : pos + 5]
            steps.append(
                CollectiveStep(
                    Collective(kind),
                    np.array(words[pos + 5 : pos + 5 + n], np.int64),
                    COLLECTIVE_OPS[op],
                    bool(nccl),
                )
            )
            pos += 5 + n
    return steps, bool(words[1])


def run_steps(
    state: RankState, steps: list[Step], plan: CallPlan | None, resolve, fuse: bool = True
) -> list[tuple]:
    """Run this rank's part of every step; ``plan`` is the first function step's. With
    ``fuse``, as one XLA program where :func:`~synkhronos.rank.fused_chain.run_fused` can.

    Returns :func:`~synkhronos.rank.state.run_share`'s ``(weight, host, reduced)`` per function
    step. An exception from a step gets a note naming the step and this rank.
    """
    state.last_fused = None
    if fuse:
        with fused_notes(state):
            fused = run_fused(state, steps, plan, resolve)
        if fused is not None:
            return fused
    ahead = _queue_ahead(state, steps)
    try:
        return _run_each(state, steps, plan, resolve)
    finally:
        for key in ahead:
            state.first_calls.meanwhile.pop(key, None)


@contextlib.contextmanager
def fused_notes(state: RankState) -> Iterator[None]:
    """An exception (but another rank's abort) in a chain's fused program gets a note
    naming the program and this rank."""
    try:
        yield
    except Aborted:
        raise
    except BaseException as error:
        error.add_note(f"in the fused program of a synkhronos chain, on rank {state.rank}")
        raise


def _queue_ahead(state: RankState, steps: list[Step]) -> list[tuple]:
    """(Workers) Queue the rewriting of the chain's functions after its first, called
    without arguments, for while this rank waits for another's compile of an earlier one
    (the rank that rewrites the first function of a training step would otherwise leave the
    others idle, then rewrite the second alone); the keys queued."""
    if state.rank == 0:  # rank 0 checks the workers between its tries instead
        return []
    keys = []
    held = _held_back(state, steps)
    functions = [(s, bool(h)) for s, h in zip(steps, held, strict=True) if isinstance(s, int)]
    for step, waits in functions[1:]:  # the form it runs in: its updates wait or apply
        key = ("store ahead", step)
        ahead = functools.partial(state.functions[step].store_ahead, waits)
        state.first_calls.meanwhile.setdefault(key, ahead)
        keys.append(key)
    return keys


def held_updates(steps: list[GraphSpec | list], default_mode) -> list[set[int]]:
    """Per step of a chain (a function's spec, or a collective's shared variables), the
    ids of the variables it updates that no later step reads or writes: their updates
    wait, as a call's, until every rank has run the chain (a training function's
    parameters, written by its last step, and the random generators its row phase draws
    from). The others apply as the step runs: a later step reads them. A function of JAX
    mode (``default_mode`` where its spec names none) applies its random generators'
    updates as it runs: PyTensor's JAX functions each draw from a copy of a generator,
    and give its new state as an output only in another form."""
    later: set[int] = set()
    held = []
    for step in reversed(steps):
        if isinstance(step, GraphSpec):
            jax = is_jax(step.mode if step.mode is not None else default_mode)
            written = {
                id(v) for v, _ in step.updates if not (jax and isinstance(v.type, RandomType))
            }
            held.append(written - later)
            step = [v for v in graph_inputs(step.variables()) if isinstance(v, SharedVariable)]
        else:
            held.append(set())
        later |= {id(v) for v in step}
    return held[::-1]


def _held_back(state: RankState, steps: list[Step]) -> list[set[int]]:
    """:func:`held_updates` of this rank's chain of ``steps`` (found once per chain)."""
    key = tuple(s.key() if isinstance(s, CollectiveStep) else s for s in steps)
    if key not in state.held:
        state.held[key] = held_updates(
            [
                state.shared(s.indices)
                if isinstance(s, CollectiveStep)
                else state.functions[s].spec
                for s in steps
            ],
            state.backend.mode,
        )
    return state.held[key]


def _run_each(state: RankState, steps: list[Step], plan: CallPlan | None, resolve) -> list:
    """The steps run one after the other (see :func:`run_steps`)."""
    results: list = []
    held = _held_back(state, steps)
    plans = iter(step_plans(state, steps, plan))
    for i, step in enumerate(steps):
        try:
            if isinstance(step, CollectiveStep):
                collective_part.run(
                    state, step.kind, state.shared(step.indices), step.op, 0, None, step.nccl
                )
            else:
                with trace.span("select rows", "rows"):
                    fn, share = share_of(state, next(plans), resolve)
                pending = state.pending if held[i] else None
                results.append(run_share(state, fn, share, pending, held[i]))
        except Aborted:
            raise  # another rank failed; its error names its step
        except BaseException as error:
            what = (
                step.describe()
                if isinstance(step, CollectiveStep)
                else (f"function {state.functions[step].spec.name or step}")
            )
            error.add_note(f"in step {i} ({what}) of a synkhronos chain, on rank {state.rank}")
            raise
    return results


def run_chain(state: RankState, arrays: list[np.ndarray], resolve) -> list[np.ndarray]:
    """(Worker) decode a CHAIN command, run the steps, and return the reply arrays."""
    steps, fuse = decode_table(arrays[0])
    plan = CallPlan.decode(arrays[1:]) if len(arrays) > 1 else None
    reply = []
    for weight, host, _ in run_steps(state, steps, plan, resolve, fuse):
        reply += [np.array([weight, len(host)], np.int64), *host]
    return reply
