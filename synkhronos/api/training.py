"""``TrainingFunction``: a function whose updates train, run so that every rank holds the
one-device result.

:func:`synkhronos.function` builds one when an update depends on the rows and writes a
variable the rows' computation reads (a parameter): ``synk.function([x, y], loss,
updates=adam(loss, params))``. It runs as three steps on every rank, chained into one
command (:class:`~synkhronos.api.chains.Chain`):

1. the row phase, on each rank's rows: the values where the rows are summed away (the
   gradients, the loss's sum; :mod:`synkhronos.api.split`), each written into a
   shared variable of its own, and the call's broadcast inputs kept for step 3;
2. one all-reduce ("sum") of all those variables, in one collective (a maximum or
   minimum over the rows that only step 3 reads in one "max" or "min" of its own);
3. the reduced phase, on the same values on every rank: the updates, and the outputs
   whose reduce op was left to the default, computed from the reduced variables.

So every rank applies the same update to the same values (the ranks stay bit-identical),
and the update is the one-device update of the whole batch. Where the rows read back a
sum of theirs (batch normalization's statistics), step 1 is itself cut into rounds, each
followed by an all-reduce ("sum") of the statistics it computed
(:class:`~synkhronos.api.split.phases.Round`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, clone_get_equiv
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import graph_inputs, truncated_graph_inputs
from pytensor.tensor.random.type import RandomType

from synkhronos.api import mode_choice
from synkhronos.api.calls import MISS, OneRankCall
from synkhronos.api.chains import Chain
from synkhronos.api.functions import BaseFunction, Function, FunctionParts
from synkhronos.api.plain_graph import PlainGraph, line_parts
from synkhronos.api.planning import CallOptions, check_arguments, single_result
from synkhronos.api.selected import GivenMinibatch, refuse_row_options, shipped_apart
from synkhronos.api.split.keeping import IndexedPastRows
from synkhronos.api.split.phases import PhaseSplit
from synkhronos.api.split.stored import split_phases_stored
from synkhronos.transport.callplan import CallPlan
from synkhronos.transport.channel import MAX_ARRAYS
from synkhronos.transport.nodes import current as current_nodes
from synkhronos.transport.partition import resolve_rows, selection_length
from synkhronos.transport.shared_arrays import Data

_NO_ROWS = np.zeros(0, np.int8)
"""What a call passes for the whole batch's rows (``PhaseSplit.rows``) before its plan
writes them."""


def running_updates(variables: Sequence, explicit: Sequence) -> list[tuple]:
    """The ``default_update`` pairs of the float shared variables the graph of
    ``variables`` reads (a batch normalization's running averages), less ``explicit``'s
    targets; random generators keep theirs."""
    written = {id(v) for v in explicit}
    return [
        (v, v.default_update)
        for v in graph_inputs(list(variables))
        if isinstance(v, SharedVariable)
        and not isinstance(v.type, RandomType)
        and getattr(v, "default_update", None) is not None
        and id(v) not in written
    ]


def plan_split(parts: FunctionParts) -> tuple[FunctionParts, PhaseSplit, list[tuple]] | None:
    """The split of ``parts``' graph: ``parts`` with its givens made (:func:`_givens_made`),
    the split, and every update it makes (``parts``' own, then the running averages' of
    :func:`running_updates`); None where no update needs a split. Warns (and gives None)
    where the updates need one that cannot be made."""
    sources = list(parts.inputs) + list(parts.sliceable)
    if not parts.updates or not sources:
        return None
    parts, updates = _givens_made(parts)
    movable = [not explicit for explicit in parts.explicit]

    def split_them(exact_statistics: bool) -> PhaseSplit | None:
        # No creation stack for the nodes that the analysis makes (shapes, clones'
        # replacements), as PyTensor's own rewriting keeps none: tens of thousands for
        # ResNet-50's step, each a walk up the stack.
        with pytensor.config.change_flags(traceback__limit=0):
            return split_phases_stored(
                sources,
                parts.outputs,
                movable,
                updates,
                bool(parts.inputs),
                exact_statistics,
                deciding=len(parts.updates),
            )

    try:
        try:
            split = split_them(True)
            if split is not None and split.rounds and _rounds_read_free(split, parts):
                raise ValueError("a round would read what no earlier round kept")
        except ValueError:  # not expected: then each rank's statistics (warned)
            split = split_them(False)
        if split is not None:
            free = _free(split.targets, [*split.placeholders, split.rows, *parts.bcast_inputs])
            if free:
                raise ValueError(f"the reduced phase would read {', '.join(map(str, free))}")
    except IndexedPastRows as error:
        raise IndexedPastRows(f"{parts.what}: {error}") from None  # no rank may run it
    except ValueError as error:
        warnings.warn(
            f"{parts.what}: its updates depend on each rank's rows, and could not be made "
            f"exact ({error}): each rank applies its own, and the ranks' copies will "
            f"differ; build the step with synkhronos.extensions.train.make_step_function, "
            f"or pass local_updates=True to say that per-rank updates are meant",
            stacklevel=4,
        )
        return None
    return None if split is None else (parts, split, updates)


def _givens_made(parts: FunctionParts) -> tuple[FunctionParts, list[tuple]]:
    """``parts`` with its givens made in the graphs of its outputs and updates (and kept,
    for the default updates that its phases' functions add); with every update (its own,
    then the running averages', whose default updates ``pytensor.function`` makes the
    givens in too). The split must analyse the graph the function computes: the rows may
    reach it only through a given's value (``givens={x: x_all}`` with ``x_all``
    sliceable, ``{x: x_in}`` with ``x_in`` an input)."""
    n, givens = len(parts.outputs), dict(parts.givens)
    made = [*parts.outputs, *(u for _, u in parts.updates)]
    if givens:
        made = graph_replace(made, givens, strict=False)
        parts = replace(
            parts,
            outputs=made[:n],
            updates=[(v, u) for (v, _), u in zip(parts.updates, made[n:], strict=True)],
        )  # the givens kept: the rows phase's function makes them in its default updates
    running = running_updates(made, [v for v, _ in parts.updates])
    if running and givens:
        values = graph_replace([u for _, u in running], givens, strict=False)
        running = [(v, u) for (v, _), u in zip(running, values, strict=True)]
    return parts, list(parts.updates) + running


def _rounds_read_free(split: PhaseSplit, parts: FunctionParts) -> bool:
    """Whether a round after the first reads a variable that no earlier round provides."""
    earlier = [
        *(p for r in split.rounds for p in r.statistic_placeholders + r.kept_placeholders),
        split.rows,
        *parts.bcast_inputs,
    ]
    later = [v for r in split.rounds[1:] for v in r.statistics + r.kept] + split.frontier
    drawn = [*(g for r in split.rounds[1:] for g in r.generators), *split.last_generators]
    return bool(_free(later + [state for _, state in drawn], earlier))


def _free(values: list, known: list) -> list:
    """The inputs ``values`` would need besides ``known`` (and shared variables)."""
    known_ids = {id(v) for v in known}
    return [
        v
        for v in graph_inputs(values)
        if v.owner is None
        and not isinstance(v, SharedVariable | Constant)
        and id(v) not in known_ids
    ]


class TrainingFunction(BaseFunction):
    """A synkhronos function whose updates train (see the module docstring): one
    :class:`~synkhronos.api.chains.Chain` of its phases, each a
    :class:`~synkhronos.Function`.

    Called, inspected, referenced (``as_pytensor``) and chained like any function
    (:class:`~synkhronos.api.functions.BaseFunction`); in a :func:`~synkhronos.chain` it
    is the first step (its phases run there, inlined).

    Attributes
    ----------
    row_function, reduced_function : synkhronos.Function
        The two phases (the row phase's first round, where there are rounds).
    round_functions : list of synkhronos.Function
        The row phase's later rounds (none without batch statistics).
    chain : synkhronos.Chain
        The whole call: the row phase, the all-reduces, the reduced phase.
    """

    reads_call_plan = True

    def __init__(
        self,
        session,
        parts: FunctionParts,
        split: PhaseSplit,
        all_updates: list[tuple],
        given: GivenMinibatch | None = None,
    ) -> None:
        super().__init__(session, parts, parts.spec(-1, parts.mode))
        self._given = given
        if given is not None:  # its selected rows are a hidden input, no argument
            self.inputs = self.inputs[1:]
            self._positions = {v.name: i for i, v in enumerate(self.inputs) if v.name}
        self._draws = split.positions is not None
        self._positions_dtype = getattr(split.positions, "dtype", None)
        self._positions_data: Data | None = None
        _warn_inexact(session, split, self._what)
        label = parts.name or "training function"
        holders = _Holders.make(split, parts, label)
        running = [var for var, _ in all_updates[len(parts.updates) :]]
        round_updates = holders.round_updates(split, running)
        row_parts = _row_parts(parts, split, holders, running, round_updates[0], label)
        # The phases' mode is the whole line's (a large line's rounds are small graphs).
        row_parts.mode = mode_choice.choose_for_line(parts, session.backend.mode, all_updates)
        self.row_function = Function(session, row_parts)
        mode = self.row_function.mode  # one compiler for every phase (a cold start waits less)
        kwargs = {k: v for k, v in parts.function_kwargs.items() if k != "allow_input_downcast"}
        self.round_functions = [
            Function(
                session,
                FunctionParts.parse(
                    updates=_unchanged(running, updates) + updates,
                    name=f"{label} (rows, round {k})",
                    mode=mode,
                    function_kwargs=kwargs,
                ),
            )
            for k, updates in enumerate(holders.later_updates(round_updates[1:]), start=1)
        ]
        outputs, updates = _reduced_phase(split, holders, all_updates)
        self.reduced_function = Function(
            session,
            FunctionParts.parse(
                outputs=[(o, None) for o in outputs],
                updates=updates,
                name=f"{label} (reduced)",
                mode=mode,
                function_kwargs=kwargs,
            ),
        )
        self._reduced_outputs = list(split.outputs)
        self._row_outputs = [k for k in range(len(parts.outputs)) if k not in split.outputs]
        self._entries = _steps(
            split, holders, [self.row_function, *self.round_functions, self.reduced_function]
        )
        self.chain = Chain(session, [self])
        self._plain = PlainGraph(session, line_parts(parts, given), mode)
        self._fast: OneRankCall | None = None  # the plain graph's fast path

    def __repr__(self) -> str:
        return f"<synkhronos.TrainingFunction {self.name or ''}>".replace(" >", ">")

    @property
    def mode(self):
        """The compile mode of every phase, chosen for the whole line
        (:func:`~synkhronos.api.mode_choice.choose_for_line`)."""
        return self.row_function.mode

    def get_shared(self) -> list:
        """The shared variables the function uses (its phases')."""
        seen: dict = {}
        for f in (self.row_function, *self.round_functions, self.reduced_function):
            for v in f.get_shared():
                seen.setdefault(id(v), v)
        return list(seen.values())

    def __call__(self, *args, **kwargs):
        """Run the training step on every rank; return the outputs as one device would.

        Arguments (and options) as for :meth:`synkhronos.Function.__call__`. Every rank
        needs at least one row of the call (a ``ValueError`` says which rank has none), but
        where the givens select the minibatch from shared data: a minibatch of fewer rows
        than ranks is computed whole on every rank. On one CPU rank a call without
        ``num_slices`` runs the line's plain graph (:mod:`synkhronos.api.plain_graph`).
        """
        fast = self._fast
        if fast is not None and not kwargs:
            result = fast(args)
            if result is not MISS:
                return result
        args, options = self._arguments(args, kwargs)
        session = self._check_session()
        if self._given is not None:
            refuse_row_options(self._what, options)
        if self._plain.runs(options):
            result = self._plain(args, options)
            if options.plain:  # a call like it goes straight to the kept call
                self._fast = self._plain.fast(args)
            return result
        if self._given is not None and len(args) == len(self.inputs):
            rows = self._given.rows.rows(args)
            if len(rows) < current_nodes().n_global and options.batch is None:
                self._refuse_slices(options.num_slices)
                return self._given.run_whole(session, rows, args, options)
            return self.chain._run(args, options, {}, self._what, rows)[0]  # computed once
        return self.chain._run(args, options, {}, self._what)[0]

    def chain_entries(self) -> list:
        return list(self._entries)

    def as_pytensor(self, *args):
        """Run the same graph in this process alone (see
        :meth:`~synkhronos.api.functions.BaseFunction.as_pytensor`)."""
        if self._given is not None:  # the selected rows' numbers: its first input
            args = (self._given.rows.rows(args), *args)
        return super().as_pytensor(*args)

    as_theano = as_pytensor

    def plan(
        self, session, args, options: CallOptions, every_rank_rows=True, selected=None
    ) -> CallPlan:
        """The row phase's plan (every output computed: :meth:`outputs_from` picks them)."""
        if self._given is not None:
            refuse_row_options(self._what, options)
            if len(args) != len(self.inputs):
                raise TypeError(
                    f"{self._what}: expected {len(self.inputs)} arguments, got {len(args)}"
                )
            rows = self._given.rows.rows(args) if selected is None else selected
            args = (rows, *args)
        check_arguments(self._what, self._spec, args)
        self._refuse_slices(options.num_slices)
        if self._draws:
            n_in = len(self._spec.inputs)
            args = (*args[:n_in], self._row_positions(args[0], options.batch), *args[n_in:])
        # The whole row count's place (PhaseSplit.rows): the row phase's plan writes it.
        options = replace(options, output_subset=None)
        return self.row_function.plan(session, (*args, _NO_ROWS), options, True)

    def _refuse_slices(self, num_slices) -> None:
        """Refuse ``num_slices > 1`` where slices would not give one device's answer."""
        if num_slices != 1 and self.round_functions:
            raise ValueError(
                f"{self._what} reads statistics of the whole batch (batch normalization's), "
                f"which it computes in rounds that keep each rank's rows whole: call it "
                f"with num_slices=1"
            )
        if num_slices != 1 and self._draws:
            raise ValueError(
                f"{self._what} draws random numbers per row, which are one device's "
                f"draws only with num_slices=1 (each slice would draw anew)"
            )

    def outputs_from(self, results: list, output_subset: Sequence[int] | None):
        values: list = [None] * len(self.output_modes)
        for positions, result in (
            (self._row_outputs, results[0]),
            (self._reduced_outputs, results[-1]),
        ):
            for k, value in zip(positions, _as_list(result, positions), strict=True):
                values[k] = value
        if output_subset is not None:
            values = [values[k] for k in output_subset]
        return values[0] if single_result(self._single, output_subset, values) else values

    def _row_positions(self, first, batch) -> Data:
        """Each selected row's position in the selection (a hidden input, read by
        position): where each rank's rows start in the whole batch's draws."""
        length = len(first)
        count = length if batch is None else selection_length(resolve_rows(batch, length, "batch"))
        if self._positions_data is None or len(self._positions_data) < count:
            self._positions_data = Data(
                np.arange(max(count, 2 * length), dtype=self._positions_dtype),
                minibatch=True,
                name="positions",
            )
        return self._positions_data


def _steps(split: PhaseSplit, holders: _Holders, functions: list) -> list:
    """The chain's steps of the phases' ``functions`` (the row phase, its later rounds,
    the reduced phase): the all-reduces of each round's statistics before the round
    after it, and of the frontier before the reduced phase."""
    row, *rounds, reduced = functions
    steps = [row]
    for (statistics, _), stage, function in zip(holders.rounds, split.rounds, rounds, strict=True):
        steps += [*_all_reduces(statistics.values(), stage.reductions), function]
    return [*steps, *_all_reduces(holders.reduced, split.reductions), reduced]


def _all_reduces(held, reductions: list) -> list[tuple]:
    """The chain's all-reduces of the ``(shared variable, value)`` pairs ``held``, each
    finished by its op of ``reductions``: one collective per op (the sums, then the
    maxima, then the minima), not one per variable; one per ``MAX_ARRAYS`` variables
    where there are more (a deep network's gradients and statistics: ResNet-110's 659)."""
    held = list(zip(held, reductions, strict=True))
    entries = []
    for op in ("sum", "max", "min"):
        chosen = [v for (v, _), reduction in held if reduction == op]
        entries += [
            ("all_reduce", chosen[k : k + MAX_ARRAYS], op)
            for k in range(0, len(chosen), MAX_ARRAYS)
        ]
    return entries


def _drawn_alike(split: PhaseSplit) -> list:
    """The random generators every rank draws the whole batch's numbers from, with rank
    0's state (it takes its rows' by their positions)."""
    if split.positions is None:
        return []
    drawn = [*split.generators, *(g for r in split.rounds for g in r.generators)]
    return [generator for generator, _ in drawn + split.last_generators]


def _warn_inexact(session, split: PhaseSplit, what: str) -> None:
    """Warn of what the split cannot make one device's update."""
    inexact = list(split.inexact)
    for generator in shipped_apart(session, _drawn_alike(split)):
        inexact.append(
            f"the random generator {generator} was shipped with an earlier "
            f"function, so each rank has its own state"
        )
    if inexact:
        warnings.warn(
            f"{what} trains every rank identically, but not as one device would: "
            + "; ".join(inexact),
            stacklevel=5,
        )


@dataclass
class _Holders:
    """The shared variables a training function's phases hand values over in."""

    # Later steps read the call's broadcast values (and the whole batch's rows, and
    # after rounds the rank's row count) from where the row phase kept them: only a
    # chain's first function takes arguments.
    kept: list  # (shared variable, value in the row phase) pairs
    rounds: list  # per round before the last: (statistics, kept rows), as _round_variables
    later: dict  # {placeholder: shared variable}: what later steps read for it
    reduced: list  # (shared variable, value) per frontier entry

    @classmethod
    def make(cls, split: PhaseSplit, parts: FunctionParts, label: str) -> _Holders:
        # The rows are kept whole, a vector of the batch's length (PhaseSplit.rows: JAX
        # takes a count from a shape, never from a value).
        later = {v: _kept(v) for v in [*parts.bcast_inputs, split.rows]}
        if split.rounds:
            later[split.local_rows] = _kept(split.local_rows)
        kept = [(holder, v) for v, holder in later.items()]
        rounds = _round_variables(split, label)
        reduced = _frontier_variables(split, label)
        for statistics, kept_rows in rounds:
            later.update((p, v) for p, (v, _) in statistics.items())
            later.update((p, v) for p, (v, _) in kept_rows.items())
        if split.rounds:
            values = _replaced([value for _, value in reduced], later)
            reduced = [(v, value) for (v, _), value in zip(reduced, values, strict=True)]
        return cls(kept, rounds, later, reduced)

    def every_one(self) -> list:
        """Every holder: each call writes it before a later step of the call reads it."""
        in_rounds = [v for pair in self.rounds for made in pair for v, _ in made.values()]
        return [v for v, _ in self.kept] + in_rounds + [v for v, _ in self.reduced]

    def round_updates(self, split: PhaseSplit, running: list) -> list[list[tuple]]:
        """Per round of the rows, its ``(variable, value, op)`` updates: the statistics it
        computes (summed over the ranks after it), what it keeps of its rows for later
        rounds, its generators moved past its draw; the last round's, the frontier
        (all-reduced before the reduced phase, each entry with its op)."""
        made = [
            [(v, value, "sum") for v, value in statistics.values()]
            + [(v, value, "max") for v, value in kept_rows.values()]
            + [(generator, state, "avg") for generator, state in stage.generators]
            for (statistics, kept_rows), stage in zip(self.rounds, split.rounds, strict=True)
        ]
        made.append(
            [
                (var, value, op)
                for (var, value), op in zip(self.reduced, split.reductions, strict=True)
            ]
            + [(generator, state, "avg") for generator, state in split.last_generators]
        )
        return made

    def later_updates(self, round_updates: list[list[tuple]]) -> list[list[tuple]]:
        """Later rounds' updates, reading the shared variables for their placeholders."""
        values = iter(_replaced([value for u in round_updates for _, value, _ in u], self.later))
        return [[(v, next(values), op) for v, _, op in updates] for updates in round_updates]


def _row_parts(
    parts: FunctionParts,
    split: PhaseSplit,
    holders: _Holders,
    running: list,
    first_round: list[tuple],
    label: str,
) -> FunctionParts:
    """The row phase (its first round): the call's arguments, and the whole batch's row
    count as a last broadcast input that the call's plan writes."""
    # An explicit update overrides a default one: the running averages stay as they are
    # in the row phase (the reduced phase updates them), and the generators drawn for
    # the whole batch advance past that draw.
    updates = _unchanged(running, first_round) + first_round
    updates += [(generator, state, "avg") for generator, state in split.generators]
    updates += [(shared, value, "max") for shared, value in holders.kept]
    hidden = [] if split.positions is None else [split.positions]
    row_outputs = [k for k in range(len(parts.outputs)) if k not in split.outputs]
    parsed = FunctionParts.parse(
        inputs=[*parts.inputs, *hidden],
        outputs=[(o, parts.ops[k]) for k, o in zip(row_outputs, split.row_outputs, strict=True)],
        bcast_inputs=[*parts.bcast_inputs, split.rows],
        updates=updates,
        givens=parts.givens,
        sliceable=parts.sliceable,
        name=f"{label} (rows)",
        mode=parts.mode,
        function_kwargs=parts.function_kwargs,
    )
    parsed.counts_rows = True
    # The whole chain's: shipped together, with the row phase first.
    parsed.handover = holders.every_one()  # save, load and verify skip them
    parsed.same_on_every_rank = _drawn_alike(split)
    return parsed


def _reduced_phase(
    split: PhaseSplit, holders: _Holders, all_updates: list[tuple]
) -> tuple[list, list[tuple]]:
    """The reduced phase's outputs and updates, reading the reduced variables."""
    replace = dict(zip(split.placeholders, (v for v, _ in holders.reduced), strict=True))
    replace.update(holders.later)
    targets = graph_replace(split.targets, replace, strict=False)
    updates = [
        (var, value)
        for (var, _), value in zip(all_updates, targets[len(split.outputs) :], strict=True)
    ]
    # The reduced phase applies no default update (a running average's reads the rows):
    # those of its variables without one of its updates stay as they are.
    written = {id(v) for v, _ in updates}
    updates += [
        (v, v)
        for v in graph_inputs(targets)
        if isinstance(v, SharedVariable)
        and getattr(v, "default_update", None) is not None
        and id(v) not in written
    ]
    return targets[: len(split.outputs)], updates


def _as_list(result, positions: list) -> list:
    """A phase's outputs as a list (its outputs were given as a list)."""
    return list(result) if positions else []


def _kept(var):
    """A shared variable that keeps a broadcast input's value for the later steps."""
    return _holder(var, f"kept {var}")


def _unchanged(running: list, updates: list) -> list[tuple]:
    """Updates that leave those of the ``running`` averages that ``updates`` read as they
    are (an explicit update overrides a default one: the reduced phase moves them)."""
    read = {id(v) for v in graph_inputs([value for _, value, _ in updates])}
    return [(var, var, "max") for var in running if id(var) in read]


def _replaced(values: list, replace: dict) -> list:
    """``values`` reading ``replace``'s shared variables (of the same types) for their
    placeholders: the graphs between them cloned once, in one pass. (``graph_replace``
    costs a pass over its replacements for each, and ResNet-110's rounds have ~2000
    values and ~1000 placeholders.)"""
    # A value without an owner (a shared variable a round keeps) is itself, not a clone;
    # what does not depend on a placeholder (a random draw) is kept, not cloned, as
    # graph_replace keeps it.
    memo = {**{v: v for v in values if v.owner is None}, **replace}
    frontier = truncated_graph_inputs(values, list(replace))
    equiv = clone_get_equiv(frontier, values, False, False, memo=memo)
    return [equiv[v] for v in values]


def _round_variables(split: PhaseSplit, label: str) -> list[tuple[dict, dict]]:
    """Per round before the last: ``{placeholder: (shared variable, value)}`` for its
    statistics, then for the values it keeps."""
    made = []
    for k, stage in enumerate(split.rounds):
        pairs = []
        for kind, values, placeholders in (
            ("statistic", stage.statistics, stage.statistic_placeholders),
            ("kept", stage.kept, stage.kept_placeholders),
        ):
            pairs.append(
                {
                    p: (_holder(p, f"{label} round {k} {kind} {j}"), value)
                    for j, (p, value) in enumerate(zip(placeholders, values, strict=True))
                }
            )
        made.append((pairs[0], pairs[1]))
    return made


def _holder(like, name: str):
    """A shared variable of ``like``'s type (its lengths may change with the call)."""
    static = like.type.shape
    zeros = np.zeros(tuple(n or 0 for n in static), like.type.dtype)
    return pytensor.shared(zeros, name=name, shape=static)


def _frontier_variables(split: PhaseSplit, label: str) -> list[tuple]:
    """One shared variable per frontier entry, with the value the row phase writes into
    it (a statistic weighted by the rank's share of the rows)."""
    pairs = []
    for k, (term, weighted) in enumerate(zip(split.frontier, split.weighted, strict=True)):
        dtype = term.type.dtype
        if weighted:
            weight = pt.cast(split.local_rows, dtype) / pt.cast(split.rows.shape[0], dtype)
            term = pt.cast(term * weight, dtype)
        pairs.append((_holder(term, f"{label} reduced {k}"), term))
    return pairs


__all__ = ["TrainingFunction", "plan_split", "running_updates"]
