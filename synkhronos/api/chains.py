"""Chained calls: functions and collectives on shared variables, one command per call.

A training step is a gradient function, an all-reduce of the gradient and an update
function. Called one by one, each is a round trip from rank 0 through the command
channel; chained, rank 0 sends one command and every rank runs the three back to back
(:mod:`synkhronos.rank.chain_part`), and the reply brings the functions' outputs.

A chain's steps apply their updates as they run (a later step reads them), so unlike a
single call a chain is not all-or-none: after a failure on some rank, its error lists
the shared variables the ranks may now disagree on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from synkhronos.api.calls import KeptCall, reuses, run_command, stale
from synkhronos.api.collectives import check_tensor, registered
from synkhronos.api.functions import BaseFunction, Function
from synkhronos.api.planning import PLAIN, CallOptions
from synkhronos.rank.chain_part import (
    CHAINABLE,
    CollectiveStep,
    encode_table,
    fused_notes,
    held_updates,
    run_steps,
)
from synkhronos.session import launch
from synkhronos.transport.channel import MAX_ARRAYS, check_count
from synkhronos.transport.nodes import abort_nodes
from synkhronos.transport.protocol import Arg, Command
from synkhronos.transport.reduction import check_collective_op
from synkhronos.transport.shared_arrays import Data


def _split_reply(arrays: list[np.ndarray], n_functions: int) -> list[list[np.ndarray]]:
    """A worker's reply cut into ``[weight, *host]`` per function step."""
    parts, pos = [], 0
    for _ in range(n_functions):
        weight, n_host = (int(w) for w in arrays[pos])
        parts.append([np.array([weight], np.int64), *arrays[pos + 1 : pos + 1 + n_host]])
        pos += 1 + n_host
    return parts


def _collective_steps(session, entry) -> list[tuple[CollectiveStep, list]]:
    """A chain's collective ``entry`` as steps, each with its variables: one per
    :data:`~synkhronos.transport.channel.MAX_ARRAYS` variables, what one message carries,
    run one after the other as one collective would be."""
    if not isinstance(entry, tuple) or len(entry) not in (2, 3) or entry[0] not in CHAINABLE:
        raise TypeError(
            f"a chain step is a synkhronos Function or a tuple (name, shared "
            f"variables[, op]) with name in {sorted(CHAINABLE)}; got {entry!r}"
        )
    name, shared_vars, op = (*entry, "avg") if len(entry) == 2 else entry
    if name in ("all_reduce", "reduce"):
        check_collective_op(op)
    elif len(entry) == 3:
        raise TypeError(f"{name} takes no op; write ({name!r}, shared variables)")
    variables, indices, _ = registered(session, shared_vars)
    for var in variables:
        check_tensor(var, f"the chain's {name} of shared variable {var}")
    if name == "all_gather" and any(v.ndim == 0 for v in variables):
        raise ValueError("all_gather needs shared variables with a first axis")
    return [
        (CollectiveStep(CHAINABLE[name], indices[k : k + MAX_ARRAYS], op, True),
         variables[k : k + MAX_ARRAYS])
        for k in range(0, max(len(variables), 1), MAX_ARRAYS)
    ]  # fmt: skip


def _watched(functions: list, written: dict, handed: set[int]) -> tuple[list, list]:
    """What a chain of ``functions`` reads that rank 0 broadcasts first where the program
    changed it (:func:`~synkhronos.api.collectives.send_changes`), and what it leaves as
    synkhronos' own (``written``, by id), less what a training function hands between its
    phases (``handed``, by id): written anew by every call before it is read."""
    reads = {id(v): v for f in functions for v in f.reads}
    return (
        [v for k, v in reads.items() if k not in handed],
        [v for k, v in written.items() if k not in handed],
    )


def _keep(function: Function, session, args: tuple, plan, ran: tuple | None) -> tuple | None:
    """The kept call of a plain call with ``args`` planned as ``plan`` (the chain's first
    Function's) where it ran as one program (``ran``: the program and its weights,
    :attr:`RankState.last_fused <synkhronos.rank.state.RankState.last_fused>`), which
    is only where rank 0 runs alone; with its scattered inputs' count and the row count
    it passes (a training function's). None where a call like it could not skip the plan.

    A call like it has scattered inputs of the same kinds, numpy arrays of the same shapes
    and dtypes (the inputs' own) or the same ``Data`` of the same layouts, each of the
    call's row count: it passes the same checks and has the same rows. It goes straight
    to the program, its arrays passed as they are (the program's call puts them on the
    device, as a ``jax.jit`` function's does), not copied into the first function's
    scratch ``Data`` first, and without a plan; its broadcast inputs are checked as a
    call checks them (:meth:`Chain._kept_values`)."""
    if ran is None or not session.alone or function.spec.sliceable:
        return None
    state = session.state
    counts_rows = plan.bcast_kinds.size and plan.bcast_kinds[-1] == Arg.ROWS
    rows = [plan.bcast[-1]] if counts_rows else []  # a training function's row count
    n = len(plan.scatter)
    # A training function's hidden scattered input (its rows' positions) is no argument.
    if len(args) != n + len(plan.bcast) - len(rows):
        return None
    fused, weights = ran
    length = weights[0]  # one rank's rows: the whole selection
    hosts: list = []
    for a, d in zip(args[:n], plan.scatter, strict=True):
        if type(a) is np.ndarray and a.dtype == d.dtype and len(a) == length:
            hosts.append((a.shape, a.dtype))
        elif a is d and len(d) == length:
            hosts.append(None)
        else:
            return None

    def run(values: list) -> list:
        with fused_notes(state):
            return fused.run(fused.inputs(values), weights)

    return KeptCall(args[:n], hosts, len(args), None, run, True), n, rows


class Chain:
    """Functions and collectives run on every rank by one command; build it with
    :func:`chain`."""

    def __init__(
        self, session, entries: Sequence, every_rank_rows: bool = False, fuse: bool = True
    ):
        self._session = session
        self._fuse = fuse
        steps: list = []
        functions: list[Function] = []
        # The chain's synkhronos functions, each with how many Functions it runs as.
        self._members: list[tuple[BaseFunction, int]] = []
        written: dict = {}
        touched: list = []  # per step, its spec or its collective's variables
        for member in entries:
            if isinstance(member, BaseFunction):
                self._check_member(member)
                inlined = member.chain_entries()
                self._members.append((member, sum(isinstance(e, Function) for e in inlined)))
            else:
                inlined = [member]
            for entry in inlined:
                if isinstance(entry, Function):
                    steps.append(entry.spec.fid)
                    functions.append(entry)
                    touched.append(entry.spec)
                    written.update((id(v), v) for v in entry.writes)
                else:
                    for step, variables in _collective_steps(session, entry):
                        steps.append(step)
                        touched.append(variables)
                        written.update((id(v), v) for v in variables)
        if not steps:
            raise ValueError("a chain needs at least one step")
        # A worker replies, per function step, [weight, n_host] and its host outputs.
        check_count(
            sum(1 + len(f.spec.outputs) for f in functions),
            "the chain's functions' outputs (a worker's reply holds them all)",
        )
        self._steps, self._functions, self._shipped = steps, functions, not functions
        self._every_rank_rows = every_rank_rows or any(m.reads_call_plan for m, _ in self._members)
        self._kept: tuple | None = None  # (KeptCall, its scattered count, its row count)
        self._table = encode_table(steps, fuse)
        self._written = written  # by id()
        handed = {id(v) for f in functions for v in f.handover}
        self._reads, self._leaves = _watched(functions, written, handed)
        # Written as a step runs (the others apply on every rank or on none); what a
        # training function hands between its phases is written anew by the next call.
        applied = {
            v.name or str(v)
            for step, held in zip(
                touched, held_updates(touched, session.state.backend.mode), strict=True
            )
            for v in (step if isinstance(step, list) else [v for v, _ in step.updates])
            if id(v) not in held and id(v) not in handed
        }
        names = ", ".join(sorted(applied))
        self._may_differ = (
            f"a chain's steps apply as they run, so the ranks may now "
            f"disagree on: {names}; synk.broadcast them to agree again"
            if names
            else "no rank applied any update: every shared variable is as before the call"
        )

    def _check_member(self, member: BaseFunction) -> None:
        """Refuse a function of another session, or one that needs the call's arguments
        (or its plan) after the chain's first."""
        if member._session is not self._session:
            raise stale("a function in the chain")
        if self._members and member.inputs:
            raise TypeError(
                f"{member._what} takes inputs, but only the chain's first "
                f"function receives the call's arguments"
            )
        if self._members and member.reads_call_plan:
            raise TypeError(
                f"{member._what} trains (it counts the call's rows): it is a chain's first step"
            )

    def __repr__(self) -> str:
        return f"<synkhronos.Chain of {len(self._steps)} steps>"

    def __call__(self, *args, **kwargs) -> list:
        """Run every step on every rank, in order, with one command.

        Parameters
        ----------
        *args, **kwargs
            The call of the chain's first function, options included, as for a
            :class:`~synkhronos.Function` call; later functions are called without
            arguments.

        Returns
        -------
        list
            One entry per function of the chain, in order: what calling it alone would
            return.
        """
        options, kwargs = CallOptions.split(kwargs) if kwargs else (PLAIN, kwargs)
        return self._run(args, options, kwargs, "this chain")

    def _run(
        self, args: tuple, options: CallOptions, kwargs: dict, what: str, selected=None
    ) -> list:
        """A call of the chain, or of the training function ``what`` that runs as one, with
        its ``options`` and its inputs given by name (``kwargs``); ``selected``: the rows
        its givens select, computed by the caller (the first function's ``plan``'s)."""
        # abort_nodes inline, as in Function.__call__: no wrapper's frame on a tiny call.
        try:
            session = launch.current()
            if session is not self._session:
                raise stale(what)
            if not self._shipped:  # its functions, not yet known to be shipped
                session.distribute()
                self._shipped = True
            if not self._members:
                if args or kwargs:
                    raise TypeError("this chain has no function to take arguments")
                return self._planned(session, None, options)
            if kwargs:
                args = self._members[0][0].ordered_arguments(args, kwargs)
            kept = self._kept if reuses(session, options) else None
            if kept is not None and kept[0].matches(args):
                values = self._kept_values(args, *kept[1:])  # checked before the command
                return self._outputs(session, None, self._command(kept[0].run, values), None)
            return self._planned(session, args, options, selected)
        except BaseException as error:
            abort_nodes("a synkhronos chained call", error)
            raise

    def _planned(self, session, args: tuple | None, options: CallOptions, selected=None) -> list:
        """A call by the general path (``args`` None: the chain has no function to take
        any): planned, run, and kept where a call like it may reuse it."""
        plan, arrays = None, [self._table]
        if args is not None:
            first = self._members[0][0]
            plan = first.plan(session, args, options, self._every_rank_rows, selected)
            if session.n_ranks > 1:
                arrays += plan.encode()
        state = session.state

        def local() -> tuple[list, tuple | None]:
            results = run_steps(state, self._steps, plan, lambda d: d.data, self._fuse)
            return results, state.last_fused  # the program this call ran as, if it did

        results, ran = self._command(local, arrays=arrays)
        if plan is not None and args is not None and reuses(session, options):
            self._kept = _keep(self._functions[0], session, args, plan, ran)
        return self._outputs(session, plan, results, options.output_subset)

    def _kept_values(self, args: tuple, n: int, rows: list) -> list:
        """The program's arguments for a call like the kept one, with ``args`` (``n``
        scattered), its broadcast inputs checked as a call checks them (:meth:`Planner.
        broadcast <synkhronos.api.planning.Planner.broadcast>`), and the kept ``rows``."""
        values = [a if type(a) is np.ndarray else a.data for a in args[:n]]
        if len(args) == n:  # no broadcast input but the row count
            return values + rows
        bcast, _ = self._functions[0].planner.broadcast((*args[n:], *rows))
        return values + [b.data if isinstance(b, Data) else b for b in bcast]

    def _command(self, local, *values, arrays=None) -> Any:
        """The chain's command (:func:`~synkhronos.api.calls.run_command`), rank 0's part
        ``local(*values)``; ``arrays``: the message (default: the step table alone)."""
        return run_command(
            self._session, Command.CHAIN, [self._table] if arrays is None else arrays,
            local, values, self._reads, (self._leaves, self._written.keys()), self._may_differ,
        )  # fmt: skip

    def _outputs(self, session, plan, results: list, output_subset) -> list:
        """Per synkhronos function of the chain, what calling it alone would return."""
        replies = [
            _split_reply(session.channel.reply_arrays(r), len(self._functions))
            for r in range(1, session.n_ranks)
        ]
        # The plan's subset is the first Function's when it is the first member (a
        # training function's first phase computes every output of its own).
        subset_given = output_subset is not None and self._members[0][0] is self._functions[0]
        per_function = []
        for j, (f, result) in enumerate(zip(self._functions, results, strict=True)):
            subset = plan.subset if j == 0 and plan is not None else None
            given = output_subset if j == 0 and subset_given else None
            per_function.append(f.collected([r[j] for r in replies], result, subset, given))
        outputs, start = [], 0
        for k, (member, n) in enumerate(self._members):
            subset_k = output_subset if k == 0 else None
            outputs.append(member.outputs_from(per_function[start : start + n], subset_k))
            start += n
        return outputs


def chain(*steps, every_rank_rows: bool = False, fuse: bool = True) -> Chain:
    """Chain synkhronos functions and collectives into one call: one command per call.

    Parameters
    ----------
    *steps : Function, TrainingFunction or tuple
        In the order every rank runs them: synkhronos functions (a
        :class:`~synkhronos.api.training.TrainingFunction` runs its phases there, and is
        the first step; the chain then refuses a call without rows on some rank), and
        collectives on shared variables written ``(name, shared_vars)`` or
        ``(name, shared_vars, op)``, with ``name`` one of "all_reduce", "broadcast",
        "all_gather" or "reduce" (in place: rank 0's variables get the result) and
        ``op`` as for :func:`synkhronos.all_reduce` (default "avg"); a collective of
        more variables than one message carries runs as consecutive steps of at most
        :data:`~synkhronos.transport.channel.MAX_ARRAYS` each. Only the first function
        may take inputs: it receives the call's arguments.
    every_rank_rows : bool
        Refuse (``ValueError``, before any rank runs) a call that gives some rank, of
        any node, no rows of the first function's data: a rank without rows skips that
        function, so a later step would read what it wrote on an earlier call (a
        training step's gradient, say). Every node finds the same empty ranks; under
        MPI the error ends the job, as any failed call does (:doc:`nodes`).
    fuse : bool
        On GPU ranks, run the whole chain as one XLA program per rank, dispatched once
        per call, when every rank computes on equally shaped inputs and the collectives
        are "all_reduce" or "broadcast" (:mod:`synkhronos.rank.fused_chain`); other calls,
        and False, run step by step, with the same results. Other backends ignore it.

    Returns
    -------
    Chain
        ``chain(*args, batch=None, batch_s=None, num_slices=1, output_subset=None)``
        returns a list with, per function, what calling it alone would return.

    Notes
    -----
    Rank 0 sends one command; every rank runs the steps back to back without waiting
    on rank 0 in between. If a step fails on a rank, its error (re-raised in rank 0 as
    for a call) carries a note naming the step and the rank, and the ranks waiting in
    a later collective give up (nothing hangs); the steps before it have run, so unlike
    a single call's, their updates stay applied where they ran: a second note lists the
    shared variables the ranks may then disagree on.

    Examples
    --------
    >>> import numpy as np, pytensor, pytensor.tensor as pt, synkhronos as synk
    >>> n = synk.fork(2, backend="cpu")
    >>> x = pt.vector("x")
    >>> total = pytensor.shared(np.float64(0), name="total")
    >>> add = synk.function([x], x.mean(), updates=[(total, x.sum())])
    >>> double = synk.function([], updates=[(total, 2 * total)])
    >>> step = synk.chain(add, ("all_reduce", total, "sum"), double)
    >>> step(np.arange(5.0))      # rank 0 has rows 0..2, rank 1 rows 3..4
    [array(2.), []]
    >>> synk.gather(total).tolist()        # 3 + 7, doubled, on both ranks
    [20.0, 20.0]
    >>> synk.close()
    """
    return Chain(launch.current(), steps, every_rank_rows, fuse)


__all__ = ["Chain", "chain"]
