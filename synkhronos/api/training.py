"""``TrainingFunction``: a function whose updates train, run so that every rank holds the
one-device result.

:func:`synkhronos.function` builds one when an update depends on the rows and writes a
variable the rows' computation reads (a parameter): ``synk.function([x, y], loss,
updates=adam(loss, params))``. It runs as three steps on every rank, chained into one
command (:class:`~synkhronos.api.chains.Chain`):

1. the row phase, on each rank's rows: the values where the rows are summed away (the
   gradients, the loss's sum; :mod:`synkhronos.api.phase_split`), each written into a
   shared variable of its own, and the call's broadcast inputs kept for step 3;
2. one all-reduce ("sum") of all those variables, in one collective;
3. the reduced phase, on the same values on every rank: the updates, and the outputs
   whose reduce op was left to the default, computed from the reduced variables.

So every rank applies the same update to the same values (the ranks stay bit-identical),
and the update is the one-device update of the whole batch. Where the rows read back a
sum of theirs (batch normalization's statistics), step 1 is itself cut into rounds, each
followed by an all-reduce ("sum") of the statistics it computed
(:class:`~synkhronos.api.phase_split.Round`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import graph_inputs
from pytensor.tensor.random.type import RandomType

from synkhronos.api.chains import Chain
from synkhronos.api.functions import Function, FunctionParts
from synkhronos.api.phase_split import PhaseSplit
from synkhronos.api.stored_splits import split_phases_stored
from synkhronos.rank.graphs import GraphSpec
from synkhronos.session import launch
from synkhronos.transport.nodes import abort_on_error
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


def plan_split(parts: FunctionParts) -> tuple[PhaseSplit, list[tuple]] | None:
    """The split of ``parts``' graph, with every update it makes (``parts``' own, then the
    running averages' of :func:`running_updates`); None where no update needs a split.
    Warns (and gives None) where the updates need one that cannot be made."""
    sources = list(parts.inputs) + list(parts.sliceable)
    if not parts.updates or not sources:
        return None
    updates = list(parts.updates)
    updates += running_updates([*parts.outputs, *(u for _, u in updates)], [v for v, _ in updates])
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
    except ValueError as error:
        warnings.warn(
            f"{parts.what}: its updates depend on each rank's rows, and could not be made "
            f"exact ({error}): each rank applies its own, and the ranks' copies will "
            f"differ; build the step with synkhronos.extensions.train.make_step_function, "
            f"or pass local_updates=True to say that per-rank updates are meant",
            stacklevel=4,
        )
        return None
    return None if split is None else (split, updates)


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


class TrainingFunction(Function):
    """A :class:`~synkhronos.Function` whose updates train (see the module docstring).

    Called, inspected and referenced (``as_pytensor``) like any function; it is not a
    step of a user's :func:`~synkhronos.chain`.

    Attributes
    ----------
    row_function, reduced_function : synkhronos.Function
        The two phases (the row phase's first round, where there are rounds).
    round_functions : list of synkhronos.Function
        The row phase's later rounds (none without batch statistics).
    chain : synkhronos.Chain
        The whole call: the row phase, the all-reduces, the reduced phase.
    """

    def __init__(
        self, session, parts: FunctionParts, split: PhaseSplit, all_updates: list[tuple]
    ) -> None:
        self._session = session
        self.name = parts.name
        self.inputs = list(parts.inputs) + list(parts.bcast_inputs)
        self.output_modes = list(parts.ops)
        self.update_modes = ["avg"] * len(parts.updates)
        self._positions = {v.name: i for i, v in enumerate(self.inputs) if v.name}
        self._single = parts.single
        self._downcast = bool(parts.function_kwargs.get("allow_input_downcast"))
        self._reference = None
        self._draws = split.positions is not None
        self._positions_data: Data | None = None
        self._spec = GraphSpec(
            -1,
            parts.name,
            list(parts.inputs),
            list(parts.bcast_inputs),
            list(parts.outputs),
            list(parts.ops),
            list(parts.updates),
            list(parts.givens),
            list(parts.sliceable),
            parts.mode,
            ["avg"] * len(parts.updates),
            dict(parts.function_kwargs),
        )
        inexact = list(split.inexact)
        if split.positions is not None:
            drawn = [*split.generators, *(g for r in split.rounds for g in r.generators)]
            for generator, _ in drawn + split.last_generators:
                if session.state.registry.index(generator) is not None:
                    inexact.append(
                        f"the random generator {generator} was shipped with an earlier "
                        f"function, so each rank has its own state"
                    )
                # Every rank draws the whole batch's numbers: from rank 0's state.
                generator.tag.same_on_every_rank = True
        if inexact:
            warnings.warn(
                f"{self._what} trains every rank identically, but not as one device would: "
                + "; ".join(inexact),
                stacklevel=4,
            )
        label = parts.name or "training function"
        # Later steps read the call's broadcast values (and, after rounds, the rank's row
        # count) from where the first kept them: only a chain's first function takes
        # arguments.
        kept = {v: _kept(v) for v in [*parts.bcast_inputs, split.rows]}
        if split.rounds:
            kept[split.local_rows] = _kept(split.local_rows)
            kept[split.local_rows].tag.per_rank = True  # each rank's own count
        rounds = _round_variables(split, label)
        later = dict(kept)
        for statistics, kept_rows in rounds:
            later.update((p, v) for p, (v, _) in statistics.items())
            later.update((p, v) for p, (v, _) in kept_rows.items())
        reduced = _frontier_variables(split, label)
        if split.rounds:
            reduced = [(v, _replaced(value, later)) for v, value in reduced]
        replace = dict(zip(split.placeholders, (v for v, _ in reduced), strict=True))
        replace.update(kept)
        targets = graph_replace(split.targets, replace, strict=False)
        reduced_outputs = targets[: len(split.outputs)]
        update_values = targets[len(split.outputs) :]
        self._reduced_outputs = list(split.outputs)
        self._row_outputs = [k for k in range(len(parts.outputs)) if k not in split.outputs]
        # An explicit update overrides a default one: the running averages stay as they
        # are in the row phase (the reduced phase updates them), and the generators
        # drawn for the whole batch advance past that draw.
        running = [var for var, _ in all_updates[len(parts.updates) :]]
        # Per round of the rows: the statistics it computes (summed over the ranks after
        # it) and what it keeps of its rows for later rounds; the last round computes
        # the frontier (summed before the reduced phase).
        # A round that draws moves its generators past the draw.
        round_updates = [
            [(v, value, "sum") for v, value in statistics.values()]
            + [(v, value, "max") for v, value in kept_rows.values()]
            + [(generator, state, "avg") for generator, state in stage.generators]
            for (statistics, kept_rows), stage in zip(rounds, split.rounds, strict=True)
        ]
        round_updates.append(
            [(var, value, "sum") for var, value in reduced]
            + [(generator, state, "avg") for generator, state in split.last_generators]
        )
        row_updates = _unchanged(running, round_updates[0]) + round_updates[0]
        row_updates += [(generator, state, "avg") for generator, state in split.generators]
        row_updates += [(shared, var, "max") for var, shared in kept.items()]
        hidden = [] if split.positions is None else [split.positions]
        self.row_function = Function(
            session,
            [*parts.inputs, *hidden],
            [(o, parts.ops[k]) for k, o in zip(self._row_outputs, split.row_outputs, strict=True)],
            [*parts.bcast_inputs, split.rows],
            row_updates,
            parts.givens,
            parts.sliceable,
            f"{label} (rows)",
            parts.mode,
            parts.function_kwargs,
            counts_rows=True,
        )
        later_kwargs = {
            k: v for k, v in parts.function_kwargs.items() if k != "allow_input_downcast"
        }
        self.round_functions = []
        for k, updates in enumerate(round_updates[1:], start=1):
            updates = [(v, _replaced(value, later), op) for v, value, op in updates]
            self.round_functions.append(
                Function(
                    session,
                    [],
                    [],
                    [],
                    _unchanged(running, updates) + updates,
                    None,
                    None,
                    f"{label} (rows, round {k})",
                    self.row_function.mode,
                    later_kwargs,
                )
            )
        reduced_updates = [
            (var, value) for (var, _), value in zip(all_updates, update_values, strict=True)
        ]
        # The reduced phase applies no default update (a running average's reads the
        # rows): those of its variables without one of its updates stay as they are.
        written = {id(v) for v, _ in reduced_updates}
        reduced_updates += [
            (v, v)
            for v in graph_inputs(targets)
            if isinstance(v, SharedVariable)
            and getattr(v, "default_update", None) is not None
            and id(v) not in written
        ]
        self.reduced_function = Function(
            session,
            [],
            [(o, None) for o in reduced_outputs],
            [],
            reduced_updates,
            None,
            None,
            f"{label} (reduced)",
            self.row_function.mode,  # one compiler for every phase (a cold start waits less)
            later_kwargs,
        )
        steps: list = [self.row_function]
        for (statistics, _), function in zip(rounds, self.round_functions, strict=True):
            steps += [("all_reduce", [v for v, _ in statistics.values()], "sum"), function]
        steps += [("all_reduce", [v for v, _ in reduced], "sum"), self.reduced_function]
        self.chain = Chain(session, steps, every_rank_rows=True)
        self._all_outputs = np.arange(len(parts.outputs), dtype=np.int64)

    def _row_positions(self, first, batch) -> Data:
        """Each selected row's position in the selection (a hidden input, read by
        position): where each rank's rows start in the whole batch's draws."""
        length = len(first)
        count = length if batch is None else selection_length(resolve_rows(batch, length, "batch"))
        if self._positions_data is None or len(self._positions_data) < count:
            self._positions_data = Data(
                np.arange(max(count, 2 * length), dtype=np.int64), minibatch=True, name="positions"
            )
        return self._positions_data

    def __repr__(self) -> str:
        return f"<synkhronos.TrainingFunction {self.name or ''}>".replace(" >", ">")

    def get_shared(self) -> list:
        """The shared variables the function uses (its phases')."""
        seen: dict = {}
        for f in (self.row_function, *self.round_functions, self.reduced_function):
            for v in f.get_shared():
                seen.setdefault(id(v), v)
        return list(seen.values())

    @abort_on_error("a synkhronos training function call")
    def __call__(
        self,
        *args,
        batch=None,
        batch_s=None,
        num_slices: int = 1,
        output_subset: Sequence[int] | None = None,
        **kwargs,
    ):
        """Run the training step on every rank; return the outputs as one device would.

        Arguments as for :meth:`synkhronos.Function.__call__`. Every rank needs at least
        one row of the call (a ``ValueError`` says which rank has none).
        """
        session = launch.current()
        if session is not self._session:
            raise RuntimeError(
                f"{self._what} was built before the last synk.fork(); build it again"
            )
        if kwargs:
            args = self._by_name(args, kwargs)
        if len(args) != len(self.inputs):
            raise TypeError(f"{self._what}: expected {len(self.inputs)} arguments, got {len(args)}")
        if num_slices != 1 and self.round_functions:
            raise ValueError(
                f"{self._what} reads statistics of the whole batch (batch normalization's), "
                f"which it computes in rounds that keep each rank's rows whole: call it "
                f"with num_slices=1"
            )
        if self._draws:
            if num_slices != 1:
                raise ValueError(
                    f"{self._what} draws random numbers per row, which are one device's "
                    f"draws only with num_slices=1 (each slice would draw anew)"
                )
            n_in = len(self._spec.inputs)
            args = (*args[:n_in], self._row_positions(args[0], batch), *args[n_in:])
        # The whole row count's place (PhaseSplit.rows): the row phase's plan writes it.
        row_results, *_, reduced_results = self.chain(
            *args, _NO_ROWS, batch=batch, batch_s=batch_s, num_slices=num_slices
        )
        values: list = [None] * len(self.output_modes)
        for positions, result in (
            (self._row_outputs, row_results),
            (self._reduced_outputs, reduced_results),
        ):
            for k, value in zip(positions, _as_list(result, positions), strict=True):
                values[k] = value
        if output_subset is not None:
            values = [values[k] for k in output_subset]
            return values[0] if len(values) == 1 else values
        return values[0] if self._single else values


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


def _replaced(value, replace: dict):
    """``value`` reading ``replace``'s shared variables for its placeholders."""
    return graph_replace([value], replace, strict=False)[0]


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
        for holder, _ in pairs[1].values():
            holder.tag.per_rank = True  # each rank's rows: synk.verify and save know
        made.append((pairs[0], pairs[1]))
    return made


def _holder(like, name: str):
    """A shared variable of ``like``'s type (its lengths may change with the call)."""
    static = like.type.shape
    zeros = np.zeros(tuple(n or 0 for n in static), like.type.dtype)
    holder = pytensor.shared(zeros, name=name, shape=static)
    holder.tag.scratch = True  # written anew by each call before it is read
    return holder


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
