"""The split itself: a training function's graph cut into a row phase (in rounds, where
the rows read back a sum of theirs) and a reduced phase (see :mod:`synkhronos.api.split`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import graph_inputs
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.variable import TensorVariable

from synkhronos.api.split.analysis import Fact, RowGraph, extremum, sums_rows
from synkhronos.api.split.keeping import (
    IndexedPastRows,
    indexed_past_rows,
    known_name,
    mixes_rows,
    mixing_said,
)
from synkhronos.api.split.rebuild import Substitution, drawn_whole, lengths_read, with_lengths
from synkhronos.api.split.rounds import (
    RoundsPlan,
    factored_sums,
    plan_rounds,
    read_with,
    statistics_read,
)

#: The most rounds a row phase is cut into (an all-reduce and a compiled function each);
#: beyond it, every rank's statistics are its own rows', as a warning says. Batch
#: normalization takes 3 a layer: ResNet-50's 53 take 159, ResNet-110's 109 take 327.
MAX_ROUNDS = 400


@dataclass
class Round:
    """One round of a row phase cut by statistics (see :mod:`synkhronos.api.split`): it
    runs on each rank's rows, before the statistics it computes are summed over the ranks.

    Attributes
    ----------
    statistics : list of Variable
        The sums over the rank's rows that later rounds read, summed over the ranks.
    statistic_placeholders : list of Variable
        Where later rounds' graphs read those sums (one free variable each).
    kept : list of Variable
        The values later rounds read of this round (rows of a layer, the inputs), kept
        on the rank.
    kept_placeholders : list of Variable
        Where later rounds' graphs read them.
    generators : list of (SharedVariable, Variable)
        The random generators this round draws from for the whole batch (as
        :attr:`PhaseSplit.generators`), and their states after the draw.
    reductions : list of str
        Per statistic, the all-reduce that finishes it: "sum", or "max" or "min" (a
        maximum or minimum over the rows).
    """

    statistics: list
    statistic_placeholders: list
    kept: list
    kept_placeholders: list
    generators: list = field(default_factory=list)
    reductions: list = field(default_factory=list)


@dataclass
class PhaseSplit:
    """A function's graph cut where its rows meet (see :mod:`synkhronos.api.split`).

    Attributes
    ----------
    frontier : list of Variable
        The row phase's results, as its last round computes them (row counts replaced
        by ``rows``; earlier rounds' values by their placeholders): one term per rank,
        to sum over the ranks.
    row_outputs : list of Variable
        The outputs left to the row phase, as its first round computes them (drawing as
        the frontier does).
    outputs : list of int
        The outputs that go to the reduced phase (by position).
    targets : list of Variable
        The reduced phase's results (those outputs, then the update values), computed
        from ``placeholders``.
    placeholders : list of Variable
        One free variable per frontier entry, in ``targets``' graphs where the reduced
        frontier goes.
    rows : Variable
        The hidden broadcast input: a vector as long as the call's whole batch, whose
        length is the whole row count (a length, not a value: JAX traces values, and
        the draws sized by it need a static size).
    local_rows : Variable
        The rank's own row count (weights a batch statistic).
    weighted : list of bool
        Per frontier entry: a batch statistic, averaged over the ranks with their rows
        as weights (True), or a reduction over the rows (False).
    positions : Variable or None
        A hidden scattered input, each row's position in the call's selection, where
        the row phase draws random numbers per row: every rank draws for the whole
        batch, from the same generator state, and takes its own rows' draws (so the
        draws are one device's, and the generators stay equal on every rank).
    generators : list of (SharedVariable, Variable)
        The random generators drawn for the whole batch, and their states after the
        draw (the row phase's updates of them, in place of their default updates).
    inexact : list of str
        Why the result is not one device's, if it is not.
    rounds : list of Round
        The row phase's rounds before the one that computes the frontier (none when
        the rows read back no sum of theirs); the first round's draws are in
        ``generators``.
    last_generators : list of (SharedVariable, Variable)
        The generators the last of several rounds draws from, and their states after.
    reductions : list of str
        Per frontier entry, the all-reduce that finishes it: "sum", or "max" or "min"
        (a maximum or minimum over the rows that only the reduced phase reads).
    row_axes : list of list of int
        Per output, its axes of the rows' length (none for one computed from shapes
        only): which outputs ``synk.function`` gathers, without analysing them again.
    """

    frontier: list
    row_outputs: list
    outputs: list
    targets: list
    placeholders: list
    rows: TensorVariable
    local_rows: Variable
    weighted: list
    positions: Variable | None = None
    generators: list = field(default_factory=list)
    inexact: list = field(default_factory=list)
    rounds: list = field(default_factory=list)
    last_generators: list = field(default_factory=list)
    reductions: list = field(default_factory=list)
    row_axes: list = field(default_factory=list)


def split_phases(
    sources: Sequence[Variable],
    outputs: Sequence[Variable],
    movable: Sequence[bool],
    updates: Sequence[tuple],
    by_position: bool = True,
    exact_statistics: bool = True,
    deciding: int | None = None,
) -> PhaseSplit | None:
    """Cut a function's graph where its rows meet, or None if no update needs it.

    Parameters
    ----------
    sources : list of Variable
        The variables holding rows: the scattered inputs and sliceable shared variables.
    outputs : list of Variable
        The function's outputs.
    movable : list of bool
        Per output: it may go to the reduced phase (it goes if it has no axis of the
        rows' length).
    updates : list of (SharedVariable, Variable)
        Every update of the function.
    by_position : bool
        Whether a hidden input can give each row's position (the call scatters inputs),
        so that random draws per row can be one device's.
    exact_statistics : bool
        Cut the row phase into rounds where the rows read back a sum of theirs (else
        each rank's statistics are its own rows', said in ``inexact``).
    deciding : int or None
        How many of ``updates`` (the first) decide whether the function trains; the
        others (running averages, which Lasagne's batch normalization makes the rows
        read) follow. None: all.

    Returns
    -------
    PhaseSplit or None
        None when no update both depends on the rows and writes a variable the rows'
        computation reads: such updates (a gradient written for an explicit
        all-reduce, a per-rank accumulator) keep their per-rank meaning.
    """
    graph, outputs, updates = _analysed(sources, outputs, updates)
    values = [u for _, u in updates]
    row_nodes = [node for node in graph.nodes if graph.row_phase(node)]
    if not _trains(graph, row_nodes, updates[:deciding]):
        return None
    for var, u in updates:
        if graph.of_original(u, Fact.ROW):
            raise ValueError(f"the update of {graph.label(var)} has an axis of the rows' length")
    refused = indexed_past_rows(graph, row_nodes)
    if refused:
        raise IndexedPastRows("; ".join(refused))
    moved = [k for k, o in enumerate(outputs) if movable[k] and not graph.of_original(o, Fact.ROW)]
    targets = [outputs[k] for k in moved] + values
    frontier = _frontier(graph, row_nodes, targets)
    kept_outputs = [o for k, o in enumerate(outputs) if k not in moved]
    plan, why = None, "no rounds could be cut for them"
    if exact_statistics:
        plan, why = plan_rounds(
            graph, row_nodes, frontier, [graph.clone_of.get(o, o) for o in kept_outputs]
        )
    inexact, weighted = _statistics_said(graph, frontier, plan, row_nodes, why)
    inexact += mixing_said(graph, row_nodes)
    if plan is not None and plan.final > MAX_ROUNDS:
        plan = None
    positions = _positions(graph, row_nodes, by_position, inexact)
    whole_batch = pt.vector("synk_batch_rows", dtype="int8")
    rows = whole_batch.shape[0]
    row_phase = _RowPhase(graph, rows, plan, positions, frontier, kept_outputs)
    originals = [graph.original.get(v, v) for v in frontier]
    placeholders = [v.type() for v in originals]
    reduced = Substitution(graph, rows, dict(zip(originals, placeholders, strict=True)))
    split = PhaseSplit(
        row_phase.frontier,
        row_phase.row_outputs,
        moved,
        reduced.rebuild_all(targets),
        placeholders,
        whole_batch,
        pt.cast(pt.as_tensor_variable(list(sources)[0]).shape[0], _counts_dtype()),
        weighted,
        positions,
        row_phase.generators,
        inexact,
        row_phase.rounds,
        row_phase.last_generators,
        _crossing_ops(frontier, weighted),
        [graph.row_axes_of(o) for o in outputs],
    )
    for source in lengths_read(split.targets, sources):
        _read_lengths_reduced(split, source)
    return split


def _crossing_ops(frontier: list, weighted: list) -> list[str]:
    """Each frontier value's all-reduce: a statistic's weighted terms are summed; a
    maximum or minimum over the rows is finished by its own op."""
    return [
        "sum" if w else extremum(v.owner) or "sum" for v, w in zip(frontier, weighted, strict=True)
    ]


def _analysed(
    sources: Sequence[Variable], outputs: Sequence[Variable], updates: Sequence[tuple]
) -> tuple[RowGraph, list, list]:
    """The graph of the outputs and update values, with the outputs and updates it holds
    (softmax over the rows expanded, statistics' factors constant over the rows taken
    out of their sums: :func:`~synkhronos.api.split.rounds.factored_sums`)."""
    values = [u for _, u in updates]
    graph = RowGraph(list(outputs) + values, list(sources))
    expanded = _softmax_expanded(graph)
    if expanded:  # analysed again: the maxima and sums over rows are in the graph now
        values = graph_replace(list(outputs) + values, expanded, strict=False)
        outputs, values = values[: len(outputs)], values[len(outputs) :]
        graph = RowGraph(list(outputs) + values, list(sources))
    factored = factored_sums(graph)
    if factored is not None:
        outputs, values = factored[: len(outputs)], factored[len(outputs) :]
    updates = [(var, u) for (var, _), u in zip(updates, values, strict=True)]
    return graph, list(outputs), updates


def _softmax_expanded(graph: RowGraph) -> dict:
    """Softmax and log-softmax over the rows, as their graphs of a maximum and a sum over
    the rows (which rounds make the whole batch's), by their original outputs."""
    expanded = {}
    for node in graph.nodes:
        if known_name(node.op) in ("Softmax", "LogSoftmax") and mixes_rows(graph, node):
            x = graph.original.get(node.inputs[0], node.inputs[0])
            expanded[graph.original.get(node.outputs[0])] = node.op.build_inner_graph(x)[0]
    return expanded


def _trains(graph: RowGraph, row_nodes: list, deciding: Sequence[tuple]) -> bool:
    """Whether an update depends on the rows and writes a variable that the rows'
    computation reads (directly or transformed)."""
    params = [i for node in row_nodes for i in node.inputs if not graph.has(i, Fact.DATA)]
    read = {v for v in graph_inputs(params) if isinstance(v, SharedVariable)}
    return any(var in read and graph.of_original(u, Fact.DATA) for var, u in deciding)


def _frontier(graph: RowGraph, row_nodes: list, targets: list) -> list:
    """The values of the row phase that the reduced phase reads (analysed variables)."""
    in_row_phase = set(row_nodes)
    frontier: list = []
    for node in graph.nodes:
        if node in in_row_phase:
            continue
        for i in node.inputs:
            if i.owner in in_row_phase and graph.has(i, Fact.DATA) and i not in frontier:
                frontier.append(i)
    for t in targets:
        t_c = graph.clone_of.get(t, t)
        if t_c.owner in in_row_phase and t_c not in frontier:
            frontier.append(t_c)
    return frontier


def _statistics_said(
    graph: RowGraph, frontier: list, plan: RoundsPlan | None, row_nodes: list, why: str
) -> tuple[list[str], list[bool]]:
    """Why the statistics are not one device's, if they are not (``why``: why there are
    no rounds); and per frontier entry, whether it is a batch statistic (averaged over
    the ranks by their rows)."""
    if plan is not None and plan.final > MAX_ROUNDS:
        why = (
            f"the whole batch's would take {plan.final} rounds, over MAX_ROUNDS "
            f"({MAX_ROUNDS}; synkhronos.api.split.phases)"
        )
    sums, others = statistics_read(graph, row_nodes)
    inexact = [
        f"{_named(graph, v)} reduces the rows with {v.owner.op}, which is not a sum (nor a "
        f"maximum or minimum), and their computation reads it: each rank computes it from "
        f"its own rows"
        for v in others
    ]
    weighted = [graph.has(v, Fact.FEEDS_ROWS) for v in frontier]
    inexact += [
        f"{_named(graph, v)} reduces the rows with {v.owner.op}, which is not a sum (nor a "
        f"maximum or minimum): each rank's result is added to the others'"
        for v, w in zip(frontier, weighted, strict=True)
        if not w and not sums_rows(v.owner) and not extremum(v.owner)
    ]
    # The frontier's statistics, and those the rows read that no entry of it is.
    statistics = [v for v, w in zip(frontier, weighted, strict=True) if w and v not in others]
    statistics += [v for v in graph.nodes_outputs() if v in sums and v not in statistics]
    if statistics and (plan is None or plan.final > MAX_ROUNDS):  # one line for all
        inexact.insert(0, _statistics_sentence(graph, statistics, why))
    return inexact, weighted


def _named(graph: RowGraph, v) -> str:
    """The analysed ``v`` as a message names it, with the named shared variable it is
    read with (its layer's parameter), where there is one."""
    layer = read_with(graph, v)
    return f"{graph.label(v)} (read with {layer!r})" if layer else graph.label(v)


def _statistics_sentence(graph: RowGraph, statistics: list, why: str) -> str:
    """The sentence that says each rank computes ``statistics`` from its rows, naming the
    layers they are read in (by the nearest named shared variable: a layer's parameter or
    running average)."""
    layers = list(dict.fromkeys(filter(None, (read_with(graph, v) for v in statistics))))
    named = ", ".join(repr(n) for n in layers[:3]) + (", ..." if len(layers) > 3 else "")
    where = f", read with {named}" if named else ""
    first = ", ".join(graph.label(v) for v in statistics[:3]) + ", ..." * (len(statistics) > 3)
    return (
        f"{len(statistics)} statistic(s) of the rows that their computation reads "
        f"({first}{where}): each rank computes them from its own rows, since {why}"
    )


def _positions(
    graph: RowGraph, row_nodes: list, by_position: bool, inexact: list
) -> Variable | None:
    """The hidden input of the rows' positions, where the rows draw random numbers per
    row; the draws that cannot be one device's are said in ``inexact``."""
    draws = [
        node
        for node in row_nodes
        if isinstance(node.op, RandomVariable) and any(graph.has(o, Fact.ROW) for o in node.outputs)
    ]
    positions = (
        pt.vector("synk_positions", dtype=_counts_dtype()) if draws and by_position else None
    )
    for node in draws:
        if positions is None or not drawn_whole(graph, node):
            inexact.append(f"{node.op} draws per row: each rank draws for its own rows")
    return positions


class _RowPhase:
    """The row phase's graphs: its rounds, the frontier, the outputs left to it, and the
    generators each part draws from for the whole batch."""

    def __init__(
        self,
        graph: RowGraph,
        rows: Variable,
        plan: RoundsPlan | None,
        positions: Variable | None,
        frontier: list,
        kept_outputs: list,
    ):
        self.graph, self.rows, self.exact = graph, rows, plan is not None
        # Each round reads the statistics and kept values of the rounds before it; a
        # later round draws with the rows' positions the first kept.
        self.earlier: dict = {}  # original variable -> its placeholder, so far
        self.rounds: list[Round] = []
        drawing = positions
        for k, (sums, kept) in enumerate(
            zip(plan.statistics, plan.kept, strict=True) if plan else []
        ):
            self._add_round(sums, kept, drawing)
            if k == 0 and positions is not None:
                drawing = positions.type()
                self.rounds[0].kept.append(positions)
                self.rounds[0].kept_placeholders.append(drawing)
        to_frontier = Substitution(graph, rows, self.earlier, positions=drawing, exact=self.exact)
        self.frontier = to_frontier.rebuild_all([graph.original.get(v, v) for v in frontier])
        # The outputs left to the row phase keep their rank's counts, but draw as the
        # frontier does; the first round computes them (they read no statistic).
        to_outputs = Substitution(graph, rows, positions=positions, counts=False)
        self.row_outputs = to_outputs.rebuild_all(kept_outputs)
        # The first round's draws: the outputs', then its own (the frontier's where there
        # are no rounds); each later round's stay with it, the last's in last_generators.
        generators = dict(to_outputs.generators)
        self.last_generators = list(to_frontier.generators.items())
        if self.rounds:
            generators.update(self.rounds[0].generators)
            self.rounds[0].generators = []
        else:
            generators.update(self.last_generators)
            self.last_generators = []
        self.generators = list(generators.items())

    def _add_round(self, sums: list, kept: list, positions: Variable | None) -> None:
        build = Substitution(self.graph, self.rows, self.earlier, positions, exact=self.exact)
        sums = [self.graph.original.get(c, c) for c in sums]
        kept = [self.graph.original.get(c, c) for c in kept]
        made = Round(
            build.rebuild_all(sums),
            [v.type() for v in sums],
            build.rebuild_all(kept),
            [v.type() for v in kept],
            list(build.generators.items()),
            [extremum(v.owner) or "sum" for v in sums],
        )
        self.earlier.update(zip(sums, made.statistic_placeholders, strict=True))
        self.earlier.update(zip(kept, made.kept_placeholders, strict=True))
        self.rounds.append(made)


def _counts_dtype() -> str:
    """The dtype of the counts a phase keeps or sums and of the rows' positions: 32 bits
    where floatX is (JAX mode then computes in 32 bits, and says so of a 64-bit value)."""
    return "int64" if pytensor.config.floatX == "float64" else "int32"


def _read_lengths_reduced(split: PhaseSplit, source: Variable) -> None:
    """Let the reduced phase read a row input's lengths (a mean's count, of axes that
    only the input knows) from the frontier: the same on every rank, they cross the
    all-reduce as each rank's lengths times its row count, and come back divided by
    the whole count."""
    dtype = _counts_dtype()  # lengths times rows stay far below 2**31
    lengths = pt.cast(pt.as_tensor_variable(source).shape, dtype)
    if split.rounds:  # the last round reads the lengths the first kept
        split.rounds[0].kept.append(lengths)
        split.rounds[0].kept_placeholders.append(lengths.type())
        lengths = split.rounds[0].kept_placeholders[-1]
    split.frontier.append(lengths * lengths[0])
    split.weighted.append(False)
    split.reductions.append("sum")
    split.placeholders.append(split.frontier[-1].type())
    rows = pt.cast(split.rows.shape[0], dtype)
    whole = pt.cast(pt.concatenate([rows[None], (split.placeholders[-1] // rows)[1:]]), "int64")
    split.targets = with_lengths(split.targets, source, whole)


__all__ = ["MAX_ROUNDS", "PhaseSplit", "Round", "split_phases"]
