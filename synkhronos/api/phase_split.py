"""A training function split where its rows meet: the one-device answer on every rank.

``synk.function([x, y], loss, updates=adam(loss, params))`` computes, on one device, the
gradient of the whole batch's loss. Run as it is on N ranks, each rank would apply Adam to
its own copy with its own rows' gradient, and the copies would drift apart. This module
cuts such a function's graph in two, at the variables where the rows are summed away:

- the **row phase** (every rank, on its rows) computes those variables — the *frontier*:
  the gradients ``x.T @ delta``, the loss's ``sum(ce)``, a batch's statistics;
- one all-reduce (op "sum") of all of them, in one collective;
- the **reduced phase** (every rank, the same values) computes the updates and the
  outputs from the reduced frontier: every rank applies the same update to the same
  values, so the ranks stay bit-identical, and equal one device's.

A sum over rows is exact when summed again over the ranks. A *mean* over rows divides by
the row count, which on a rank is its own count: wherever the graph uses a row count as
a value (``mean``'s division, the gradient's ``1 / n``), the row phase uses the call's
whole count instead (a hidden broadcast input), so that every rank's term is its share of
the whole batch's mean. A mean loss, a sum loss, a loss plus a penalty on the parameters
(the penalty is added once, in the reduced phase) are all exact.

A sum over rows that the rows' computation reads back (batch normalization's mean and
variance, and their gradients' sums) needs the whole batch before the rows can go on:
the row phase is then itself cut into *rounds* (:attr:`PhaseSplit.rounds`). Each round
computes the statistics whose inputs are ready, and the ranks sum them (one all-reduce
per round); the next round reads the sums, divided by the whole count where the graph
divides. What a later round reads of an earlier one's rows (a layer's output, the
inputs, a dropout mask) the earlier one keeps, on its rank, so nothing is computed twice.

What cannot be exact this way is said (:attr:`PhaseSplit.inexact`): a reduction over
rows that is not a sum (``max``), a statistic read by an output the ranks compute on
their own rows (then every statistic is each rank's own, and the frontier averages
them, weighted by rows), and random draws per row where no row's position can be known
(no scattered input) or the draw's parameters vary by row (elsewhere every rank draws
the whole batch's numbers and keeps its rows').

The analysis runs on rank 0 when the function is built: PyTensor's shape inference tells
which axes of every variable have the rows' length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Apply, Constant, Variable, clone_get_equiv
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import graph_inputs, io_toposort
from pytensor.scalar.basic import Add, Second
from pytensor.tensor.basic import Alloc, AllocEmpty, ARange, Eye
from pytensor.tensor.elemwise import CAReduce, Elemwise
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.rewriting.shape import ShapeFeature
from pytensor.tensor.shape import Reshape, Shape, Shape_i, SpecifyShape
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorVariable

ROW, NO, UNKNOWN = 2, 0, 1  # does a shape depend on the rows' count
_COUNTS = (7, 11)  # two rows' counts: a length that tracks the rows differs between them
_ANY_LENGTH = 13  # an unknown length that does not track the rows
#: The most rounds a row phase is cut into (an all-reduce and a compiled function each);
#: beyond it, every rank's statistics are its own rows', as a warning says. ResNet-50's
#: would take 196, and its training function several times as long to build
#: (bench/RESULTS.md, "Time to first step").
MAX_ROUNDS = 64

# Ops whose result, reduced over the rows, is a sum of one term per row (so summing the
# ranks' results gives the whole batch's); by class name, so that the convolution
# gradients of the extensions need no import here.
_ROW_SUMS = {
    "Dot",
    "Dot22",
    "Scan",
    "IncSubtensor",
    "AdvancedIncSubtensor",
    "AdvancedIncSubtensor1",
    "AbstractConv2d_gradWeights",
    "AbstractConv3d_gradWeights",
    "Conv2dGradWeights",
}


def _structural(node: Apply) -> set[int]:
    """Positions of ``node``'s inputs read for their shape or as sizes, not as values."""
    op = node.op
    if isinstance(op, Elemwise) and isinstance(op.scalar_op, Second):
        return {0}  # second(a, b): b's value in a's shape
    if isinstance(op, Alloc | Reshape | SpecifyShape):
        return set(range(1, len(node.inputs)))
    if isinstance(op, AllocEmpty | ARange | Eye):
        return set(range(len(node.inputs)))
    if isinstance(op, RandomVariable):
        return {0, 1}  # the generator and the size
    name = type(op).__name__
    if "Subtensor" in name:  # indices; an increment's value is input 1
        return set(range(2 if "Inc" in name else 1, len(node.inputs)))
    if name in ("Join", "Scan"):
        return {0}  # the axis; the number of steps
    return set()


def _sums_rows(node: Apply) -> bool:
    op = node.op
    if isinstance(op, CAReduce):
        return isinstance(op.scalar_op, Add)
    core = getattr(op, "core_op", op)  # Blockwise(Dot) is a matmul
    return type(core).__name__ in _ROW_SUMS


@dataclass
class Round:
    """One round of a row phase cut by statistics (see the module docstring): it runs on
    each rank's rows, before the statistics it computes are summed over the ranks.

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
    """

    statistics: list
    statistic_placeholders: list
    kept: list
    kept_placeholders: list
    generators: list = field(default_factory=list)


@dataclass
class PhaseSplit:
    """A function's graph cut where its rows meet (see the module docstring).

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
        as weights (True), or a sum (False).
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


class _Graph:
    """Facts about every variable of a graph: its axes of the rows' length, whether its
    value depends on the rows (data), whether it is computed from shapes alone."""

    def __init__(self, targets: list, sources: list):
        roots = [v for v in graph_inputs(targets) if not isinstance(v, Constant)]
        memo: dict[Any, Any] = clone_get_equiv(
            roots, targets, copy_inputs=False, copy_orphans=False
        )
        fg = FunctionGraph(
            roots, [memo[t] for t in targets], features=[ShapeFeature()], clone=False
        )
        self.nodes = fg.toposort()
        self.clients = fg.clients
        self.original = {c: o for o, c in memo.items()}
        # Shape inference can reach the original graph's variables (an op's own shape
        # expressions): read them as their copies.
        self._copy = memo
        self._no_twin: set = set()
        self.sources = set(sources)
        self.roots = set(roots)
        self._shape_of = fg.shape_feature.shape_of
        self._dep: dict = {}
        self.axes: dict = {}  # each variable's axes of the rows' length, once computed
        self._values: dict = {}  # shape expressions' values, by rows' count
        self.row: dict = {}
        self.data: dict = {}
        self.pure: dict = {}
        self.count: dict = {}
        for v in roots:
            self.row[v] = v in self.sources or self._has_row_axis(v)
            self.data[v] = v in self.sources
            self.pure[v] = False
            self.count[v] = False
        for node in self.nodes:
            self._classify(node)
        self.feeds_rows = self._feeds_rows()

    def _shape_dep(self, e) -> int:
        """Whether the shape expression ``e`` is the rows' count (ROW), free of it (NO), or
        read from a value (UNKNOWN: counted as the rows')."""
        stack = [e]
        while stack:
            top = stack[-1]
            if top in self._dep:
                stack.pop()
                continue
            owner = top.owner
            if isinstance(top, Constant):
                dep = NO
            elif owner is None:
                dep = UNKNOWN if top in self.sources else NO
            elif isinstance(owner.op, Shape_i | Shape):
                u = self._copy.get(owner.inputs[0], owner.inputs[0])
                if u in self.sources:
                    dep = ROW if isinstance(owner.op, Shape) or owner.op.i == 0 else NO
                elif u in self.roots:
                    dep = NO
                elif u in self.axes:  # an axis of a variable met before
                    row = (
                        bool(self.axes[u])
                        if isinstance(owner.op, Shape)
                        else (owner.op.i in self.axes[u])
                    )
                    dep = ROW if row else NO
                else:
                    dep = UNKNOWN
            else:
                missing = [i for i in owner.inputs if i not in self._dep]
                if missing:
                    stack.extend(missing)
                    continue
                dep = max((self._dep[i] for i in owner.inputs), default=NO)
            self._dep[top] = dep
            stack.pop()
        return self._dep[e]

    def shape_expression(self, v, k: int) -> Variable | None:
        """Axis ``k``'s length of ``v`` from the graph's roots, if it reads no value."""
        shape = self._shape_of.get(v)
        if shape is None or self._shape_dep(shape[k]) == UNKNOWN:
            return None
        return shape[k]

    def row_axes(self, v) -> list[int]:
        """The axes of ``v`` whose length is the rows' count (unknown ones counted in)."""
        if v in self.sources:
            return [0]
        if v in self.axes:
            return self.axes[v]
        shape = self._shape_of.get(v)
        if shape is None:
            return []
        axes = []
        for k, length in enumerate(shape):
            own = length.owner
            if own is not None and isinstance(own.op, Shape_i) and own.inputs[0] is v:
                # Shape inference knows nothing of this op: the axes its inputs of as
                # many dimensions have at this place (a pooling keeps the rows' axis).
                inputs = v.owner.inputs if v.owner is not None else []
                if any(k in self.row_axes(i) for i in inputs if getattr(i, "ndim", -1) == v.ndim):
                    axes.append(k)
            elif self._tracks_rows(length):
                axes.append(k)
        self.axes[v] = axes
        return axes

    def _tracks_rows(self, length) -> bool:
        """Whether the length ``length`` changes with the rows' count: computed for two
        counts (a length the symbols only involve, as a flattening's ``n * m / n``, does
        not); where it cannot be computed, whether it involves the count."""
        try:
            return self._evaluate(length, _COUNTS[0]) != self._evaluate(length, _COUNTS[1])
        except Exception:  # noqa: BLE001 - an op that cannot compute here: judge by symbols
            return self._shape_dep(length) != NO

    def _evaluate(self, e, rows: int):
        """The value of the shape expression ``e`` with ``rows`` rows (other unknown
        lengths at an arbitrary value)."""
        memo = self._values.setdefault(rows, {})
        stack = [e]
        while stack:
            top = stack[-1]
            if top in memo:
                stack.pop()
                continue
            owner = top.owner
            if isinstance(top, Constant):
                value = top.data
            elif owner is None:
                raise ValueError(f"{top} is not a shape")
            elif isinstance(owner.op, Shape_i | Shape):
                u = owner.inputs[0]
                axes = [owner.op.i] if isinstance(owner.op, Shape_i) else range(u.type.ndim)
                lengths = [self._root_length(u, k, rows) for k in axes]
                value = (
                    np.int64(lengths[0])
                    if isinstance(owner.op, Shape_i)
                    else np.array(lengths, np.int64)
                )
            else:
                missing = [i for i in owner.inputs if i not in memo]
                if missing:
                    stack.extend(missing)
                    continue
                storage: list = [[None] for _ in owner.outputs]
                owner.op.perform(owner, [memo[i] for i in owner.inputs], storage)
                for o, (out,) in zip(owner.outputs, storage, strict=True):
                    memo[o] = out
                stack.pop()
                continue
            memo[top] = value
            stack.pop()
        return np.asarray(memo[e]).tolist()

    def _root_length(self, u, k: int, rows: int) -> int:
        u = self._copy.get(u, u)
        if u in self.sources:
            return rows if k == 0 else (u.type.shape[k] or _ANY_LENGTH)
        if isinstance(u, SharedVariable):
            return int(np.shape(u.get_value(borrow=True))[k])
        if u in self.roots:
            return u.type.shape[k] or _ANY_LENGTH
        shape = self._shape_of.get(u)
        if shape is None:  # a variable outside the graph: its twin in the graph, if any
            twin = self._twin(u)
            if twin is not None:
                return self._root_length(twin, k, rows)
            return rows if k in self._aligned_axes(u) else _ANY_LENGTH
        own = shape[k].owner
        if own is None:
            return int(shape[k].data)
        if isinstance(own.op, Shape_i) and own.inputs[0] is u:
            return rows if k in self.row_axes(u) else _ANY_LENGTH
        return int(self._evaluate(shape[k], rows))

    def _twin(self, v):
        """The graph's variable computed as ``v`` is (same ops on the same inputs), or None:
        shape expressions can hold copies of the graph's computations."""
        stack = [v]
        while stack:
            top = stack[-1]
            if top in self._copy or top in self._shape_of or top in self._no_twin:
                stack.pop()
                continue
            if top.owner is None:
                self._no_twin.add(top)
                stack.pop()
                continue
            inputs = top.owner.inputs
            missing = [
                i for i in inputs
                if i not in self._copy and i not in self._shape_of and i not in self._no_twin
                and not isinstance(i, Constant)
            ]  # fmt: skip
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            mapped = [self._copy.get(i, i) for i in inputs]
            if any(i in self._no_twin for i in mapped):
                self._no_twin.add(top)
                continue
            found = None
            anchor = next((i for i in mapped if not isinstance(i, Constant)), None)
            for client, _ in self.clients.get(anchor, []) if anchor is not None else []:
                if (
                    isinstance(client, Apply)
                    and client.op == top.owner.op
                    and len(client.inputs) == len(mapped)
                    and all(
                        a is b or (isinstance(a, Constant) and a.equals(b))
                        for a, b in zip(client.inputs, mapped, strict=True)
                    )
                ):
                    found = client.outputs[top.owner.outputs.index(top)]
                    break
            if found is None:
                self._no_twin.add(top)
            else:
                self._copy[top] = found
        return self._copy.get(v)

    def _aligned_axes(self, v) -> list[int]:
        """The rows' axes of a variable shape inference does not know, from its inputs of
        as many dimensions (at the same places)."""
        stack = [v]
        while stack:
            top = stack[-1]
            if top in self.axes or top in self.sources or top.owner is None:
                if top not in self.axes:
                    self.axes[top] = [0] if top in self.sources else []
                stack.pop()
                continue
            inputs = [i for i in top.owner.inputs if getattr(i, "ndim", -1) == top.ndim]
            missing = [i for i in inputs if i not in self.axes]
            if missing:
                stack.extend(missing)
                continue
            self.axes[top] = [k for k in range(top.ndim) if any(k in self.axes[i] for i in inputs)]
            stack.pop()
        return self.axes[v]

    def _has_row_axis(self, v) -> bool:
        return isinstance(v.type, TensorType) and bool(self.row_axes(v))

    def _classify(self, node: Apply) -> None:
        structural = _structural(node)
        is_shape = isinstance(node.op, Shape | Shape_i)
        pure = is_shape or all(isinstance(i, Constant) or self.pure[i] for i in node.inputs)
        data = not pure and any(
            self.data.get(i, False) for k, i in enumerate(node.inputs) if k not in structural
        )
        if is_shape:
            u = node.inputs[0]
            axes = self.row_axes(u)
            count = bool(axes) if isinstance(node.op, Shape) else node.op.i in axes
        else:
            count = pure and any(self.count.get(i, False) for i in node.inputs)
        for out in node.outputs:
            self.pure[out] = pure
            self.data[out] = data
            self.count[out] = count
            self.row[out] = not pure and self._has_row_axis(out)

    def _feeds_rows(self) -> dict:
        """Variables whose value the rows' computation reads (the row region)."""
        feeds = {v: self.row[v] for v in self.row}
        for node in reversed(self.nodes):
            if not any(feeds[o] for o in node.outputs):
                continue
            structural = _structural(node)
            for k, i in enumerate(node.inputs):
                if k not in structural and self.data.get(i, False):
                    feeds[i] = True
        return feeds

    def row_phase(self, node: Apply) -> bool:
        """Whether ``node`` runs on a rank's rows: it reduces them, or the rows read it."""
        return any(self.feeds_rows[o] for o in node.outputs) or any(
            self.row.get(i, False) for i in node.inputs
        )


def _label(var: Variable) -> str:
    return repr(var.name) if var.name else str(var)


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
    values = [u for _, u in updates]
    graph = _Graph(list(outputs) + values, list(sources))
    clone_of: dict[Any, Any] = {o: c for c, o in graph.original.items()}

    def fact(table: dict, v: Variable) -> bool:
        return table.get(clone_of.get(v, v), False)

    row_nodes = [node for node in graph.nodes if graph.row_phase(node)]
    # The shared variables the rows' computation reads (directly or transformed).
    params = [i for node in row_nodes for i in node.inputs if not graph.data.get(i, False)]
    read = {v for v in graph_inputs(params) if isinstance(v, SharedVariable)}
    if not any(var in read and fact(graph.data, u) for var, u in updates[:deciding]):
        return None
    for var, u in updates:
        if fact(graph.row, u):
            raise ValueError(f"the update of {_label(var)} has an axis of the rows' length")
    moved = [k for k, o in enumerate(outputs) if movable[k] and not fact(graph.row, o)]
    targets = [outputs[k] for k in moved] + values
    # The frontier: values of the row phase that the reduced phase reads.
    in_row_phase = set(row_nodes)
    frontier_c: list = []
    for node in graph.nodes:
        if node in in_row_phase:
            continue
        for i in node.inputs:
            if i.owner in in_row_phase and graph.data[i] and i not in frontier_c:
                frontier_c.append(i)
    for t in targets:
        t_c: Any = clone_of.get(t, t)
        if t_c.owner in in_row_phase and t_c not in frontier_c:
            frontier_c.append(t_c)
    kept_outputs = [o for k, o in enumerate(outputs) if k not in moved]
    inexact: list[str] = []
    rounds = (
        _rounds(graph, row_nodes, frontier_c, [clone_of.get(o, o) for o in kept_outputs])
        if exact_statistics
        else None
    )
    too_many = ""
    if rounds is not None and rounds.final > MAX_ROUNDS:
        too_many = f" (the whole batch's would take {rounds.final} rounds, over {MAX_ROUNDS})"
        rounds = None
    if rounds is not None:
        inexact += [
            f"{_label(graph.original.get(v, v))} reduces the rows with {v.owner.op}, which "
            f"is not a sum, and their computation reads it: each rank computes it from its "
            f"own rows"
            for v in rounds.not_sums
        ]
    weighted, statistics = [], []
    for v in frontier_c:
        statistic = graph.feeds_rows[v]
        weighted.append(statistic)
        name = _label(graph.original.get(v, v))
        if statistic:
            statistics.append(name)
        elif not _sums_rows(v.owner):
            inexact.append(f"{name} reduces the rows with {v.owner.op}, which is not a sum")
    if statistics and rounds is None:  # one line for all (ResNet-50 has hundreds)
        named = ", ".join(statistics[:3]) + (", ..." if len(statistics) > 3 else "")
        inexact.insert(
            0,
            f"{len(statistics)} statistic(s) of the rows that their computation reads "
            f"(batch normalization's, say; {named}): each rank computes them from its own "
            f"rows{too_many}",
        )
    draws = [
        node
        for node in row_nodes
        if isinstance(node.op, RandomVariable) and any(graph.row[o] for o in node.outputs)
    ]
    positions = pt.vector("synk_positions", dtype="int64") if draws and by_position else None
    for node in draws:
        if positions is None or not _drawn_whole(graph, node):
            inexact.append(f"{node.op} draws per row: each rank draws for its own rows")
    whole_batch = pt.vector("synk_batch_rows", dtype="int8")
    rows = whole_batch.shape[0]
    exact = rounds is not None

    def original(c):
        return graph.original.get(c, c)

    # Each round reads the statistics and kept values of the rounds before it; a later
    # round draws with the rows' positions the first kept.
    earlier: dict = {}  # original variable -> its placeholder, of the rounds so far
    split_rounds: list[Round] = []
    drawing = positions
    for k, (sums_c, kept_c) in enumerate(
        zip(rounds.statistics, rounds.kept, strict=True) if rounds is not None else []
    ):
        build = _Substitution(graph, rows, earlier, drawing, exact=exact)
        sums_k = [original(c) for c in sums_c]
        kept_k = [original(c) for c in kept_c]
        split_rounds.append(
            Round(
                build.rebuild_all(sums_k),
                [v.type() for v in sums_k],
                build.rebuild_all(kept_k),
                [v.type() for v in kept_k],
                list(build.generators.items()),
            )
        )
        earlier.update(zip(sums_k, split_rounds[-1].statistic_placeholders, strict=True))
        earlier.update(zip(kept_k, split_rounds[-1].kept_placeholders, strict=True))
        if k == 0 and positions is not None:
            drawing = positions.type()
            split_rounds[0].kept.append(positions)
            split_rounds[0].kept_placeholders.append(drawing)
    originals = [original(v) for v in frontier_c]
    to_frontier = _Substitution(graph, rows, earlier, positions=drawing, exact=exact)
    frontier = to_frontier.rebuild_all(originals)
    # The outputs left to the row phase keep their rank's counts, but draw as the
    # frontier does; the first round computes them (they read no statistic).
    to_outputs = _Substitution(graph, rows, positions=positions, counts=False)
    row_outputs = to_outputs.rebuild_all(kept_outputs)
    # The first round's draws: the outputs', then its own (the frontier's where there
    # are no rounds); each later round's stay with it, the last's in last_generators.
    generators = dict(to_outputs.generators)
    last_generators = list(to_frontier.generators.items())
    if split_rounds:
        generators.update(split_rounds[0].generators)
        split_rounds[0].generators = []
    else:
        generators.update(last_generators)
        last_generators = []
    placeholders = [v.type() for v in originals]
    reduced = _Substitution(graph, rows, dict(zip(originals, placeholders, strict=True)))
    reduced_targets = reduced.rebuild_all(targets)
    for source in _lengths_read(reduced_targets, sources):
        # The reduced phase reads lengths of a row input (a mean's count, of axes that
        # only the input knows): the same on every rank, they cross the all-reduce as
        # each rank's lengths times its row count, and come back divided by the whole.
        lengths = pt.cast(pt.as_tensor_variable(source).shape, "int64")
        if split_rounds:  # the last round reads the rows' lengths that the first kept
            split_rounds[0].kept.append(lengths)
            split_rounds[0].kept_placeholders.append(lengths.type())
            lengths = split_rounds[0].kept_placeholders[-1]
        frontier.append(lengths * lengths[0])
        weighted.append(False)
        placeholders.append(frontier[-1].type())
        whole_lengths = pt.concatenate(
            [pt.cast(rows, "int64")[None], (placeholders[-1] // rows)[1:]]
        )
        reduced_targets = _with_lengths(reduced_targets, source, whole_lengths)
    return PhaseSplit(
        frontier,
        row_outputs,
        moved,
        reduced_targets,
        placeholders,
        whole_batch,
        pt.as_tensor_variable(list(sources)[0]).shape[0],
        weighted,
        positions,
        list(generators.items()),
        inexact,
        split_rounds,
        last_generators,
    )


def _rounds(graph: _Graph, row_nodes: list, frontier: list, kept_outputs: list):
    """The rounds that make the rows' statistics exact (:class:`_Rounds`), or None where
    the row phase needs no more than one (no statistic), or cannot be cut (an output
    left to the ranks reads a statistic; a draw that is no tensor would be kept). The
    variables are the analysed graph's."""
    sums, not_sums = _statistics(graph, row_nodes)
    if not sums:
        return None
    depth, drawn = _depths(graph, sums)
    if any(depth.get(o, 0) for o in kept_outputs):
        return None
    try:
        plan = _plan_rounds(graph, sums, depth, drawn, frontier)
    except ValueError:
        return None
    plan.not_sums = not_sums
    return plan if plan.final else None


def _statistics(graph: _Graph, row_nodes: list) -> tuple[set, list]:
    """The reductions of rows that the rows' computation reads back: the sums (batch
    normalization's), and the others (which no round can make exact)."""
    sums, others = set(), []
    for node in row_nodes:
        if not any(graph.row.get(i, False) for i in node.inputs):
            continue
        for o in node.outputs:
            if graph.data[o] and not graph.row[o] and graph.feeds_rows[o]:
                if _sums_rows(node):
                    sums.add(o)
                else:
                    others.append(o)
    return sums, others


def _depths(graph: _Graph, sums: set) -> tuple[dict, set]:
    """Per variable, the round that can compute it (how many statistics it waits for, one
    after another); and the variables drawn at random (kept, never drawn again)."""
    depth: dict = {}
    drawn: set = set()
    for node in graph.nodes:
        d = max((depth.get(i, 0) + (i in sums) for i in node.inputs), default=0)
        draws = isinstance(node.op, RandomVariable) or any(i in drawn for i in node.inputs)
        for o in node.outputs:
            depth[o] = d
            if draws:
                drawn.add(o)
    return depth, drawn


@dataclass
class _Rounds:
    """The rounds' plan, on the analysed graph: per round before the last (``final``),
    the statistics it computes and the values it keeps for later rounds."""

    final: int
    statistics: list
    kept: list
    not_sums: list = field(default_factory=list)


def _plan_rounds(graph: _Graph, sums: set, depth: dict, drawn: set, frontier: list) -> _Rounds:
    """What each round computes, from the last back: a round reads an earlier round's
    statistic summed over the ranks, and an earlier round's value of the rows (or a
    draw) from where that round kept it; what depends on neither, it computes."""
    final = max((depth.get(v, 0) for v in frontier), default=0)
    plan = _Rounds(final, [[] for _ in range(final)], [[] for _ in range(final)])
    for k in range(final, -1, -1):
        targets = frontier if k == final else plan.statistics[k] + plan.kept[k]
        seen: set = set()
        stack = list(targets)
        while stack:
            u = stack.pop()
            if u in seen:
                continue
            seen.add(u)
            d = depth.get(u, 0)
            if d < k and u in sums:
                _append_new(plan.statistics[d], u)
            elif d < k and (graph.data.get(u, False) or u in drawn):
                if not isinstance(u.type, TensorType):
                    raise ValueError(f"{_label(graph.original.get(u, u))} cannot be kept")
                _append_new(plan.kept[d], u)
            elif u.owner is not None:
                stack.extend(u.owner.inputs)
    return plan


def _append_new(found: list, v) -> None:
    if v not in found:
        found.append(v)


def _drawn_whole(graph: _Graph, node: Apply) -> bool:
    """Whether a random draw per row can be drawn for the whole batch instead: its
    distribution's parameters do not vary by row."""
    return not any(graph.row.get(i, False) for i in node.inputs[2:])


class _Substitution:
    """Rebuilds original variables with every value use of a row count replaced by the
    call's whole count (unless not ``counts``), and ``replace``'s variables by theirs;
    with ``positions``, random draws per row are drawn for the whole batch, and the
    rank's rows taken. With ``exact``, the statistics the rows read back are the whole
    batch's (summed over the ranks in rounds), and divide by the whole count too."""

    def __init__(
        self,
        graph: _Graph,
        rows: Variable,
        replace: dict | None = None,
        positions: Variable | None = None,
        counts: bool = True,
        exact: bool = False,
    ):
        self.graph = graph
        self.rows = rows
        self.counts = counts
        self.exact = exact
        self.generators: dict = {}  # a generator drawn whole: its state after the draw
        self.positions = positions
        self.memo: dict = dict(replace or {})
        self.clone_of: dict[Any, Any] = {o: c for c, o in graph.original.items()}
        self.whole: dict = {}

    def rebuild_all(self, variables: Sequence[Variable]) -> list:
        return [self.rebuild(v) for v in variables]

    def rebuild(self, v: Variable) -> Variable:
        stack = [v]
        while stack:
            top = stack[-1]
            if top in self.memo:
                stack.pop()
                continue
            if top.owner is None:
                self.memo[top] = top
                stack.pop()
                continue
            missing = [i for i in top.owner.inputs if i not in self.memo]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            self._rebuild_node(top.owner)
        return self.memo[v]

    def _rebuild_node(self, node: Apply) -> None:
        g = self.graph
        outs = [self.clone_of.get(o, o) for o in node.outputs]
        if (
            self.positions is not None
            and isinstance(node.op, RandomVariable)
            and g.row.get(outs[1], False)
            and _drawn_whole(g, self.clone_of.get(node.outputs[0], node.outputs[0]).owner)
        ):
            self._draw_whole(node, g.row_axes(outs[1])[0])
            return
        # A shape keeps the rank's own count; so does a statistic the rows read, unless
        # it is the whole batch's.
        keep = not self.counts or any(
            g.pure.get(o, False) or (not self.exact and g.feeds_rows.get(o) and g.data.get(o))
            for o in outs
        )
        structural = _structural(node)
        inputs = []
        for k, i in enumerate(node.inputs):
            if (
                not keep
                and k not in structural
                and g.count.get(self.clone_of.get(i, i), False)
                and all(getattr(i.type, "broadcastable", (False,)))  # a count, dims added
            ):
                inputs.append(self._whole(i))
            else:
                inputs.append(self.memo[i])
        if all(a is b for a, b in zip(inputs, node.inputs, strict=True)):
            new = node
        else:
            new = node.clone_with_new_inputs(inputs, strict=False)
        for o, n in zip(node.outputs, new.outputs, strict=True):
            self.memo[o] = n

    def _draw_whole(self, node: Apply, axis: int) -> None:
        """Draw for the whole batch, and keep this rank's rows (along ``axis``)."""
        rng, size, *params = node.inputs
        new = node.clone_with_new_inputs(
            [self.memo[rng], self._whole(size), *(self.memo[p] for p in params)],
            strict=False,
        )
        draws: Any = new.outputs[1]
        index: list = [slice(None)] * draws.type.ndim
        # The rank's rows' positions, taken as indices: a slice from the first would need
        # bounds known when JAX traces the function, and they are values of the call.
        index[axis] = self.positions
        self.memo[node.outputs[0]] = new.outputs[0]
        self.memo[node.outputs[1]] = draws[tuple(index)]
        if isinstance(rng, SharedVariable):
            self.generators[rng] = new.outputs[0]

    def _whole(self, v: Variable) -> Variable:
        """``v`` (computed from shapes) with the rows' axes at the whole count, and the
        other axes from the graph's roots where shape inference knows them; with
        ``exact``, from this rebuild's own variables (a round has only what it computes
        and what earlier rounds kept, and a shape expression from the roots would be
        computed again by every round: ResNet-50 has ~200)."""
        if v in self.whole:
            return self.whole[v]
        g = self.graph
        leaves = {}
        for a in _shape_leaves(v):
            original = a.owner.inputs[0]
            u = self.clone_of.get(original, original)
            axes = g.row_axes(u)
            whole = pt.cast(self.rows, a.dtype)
            mine = self.memo[original].shape if self.exact else a
            if isinstance(a.owner.op, Shape_i):
                if a.owner.op.i in axes:
                    leaves[a] = whole
                elif self.exact:
                    leaves[a] = mine[a.owner.op.i]
            elif axes or self.exact:
                lengths = []
                for k in range(u.type.ndim):
                    known = None if self.exact else g.shape_expression(u, k)
                    length = whole if k in axes else (mine[k] if known is None else known)
                    lengths.append(pt.cast(length, a.dtype))
                leaves[a] = pt.stack(lengths)
        if not leaves:
            result = v
        elif self.exact:
            result = _with_leaves(v, leaves)
        else:
            result = graph_replace([v], leaves, strict=False)[0]
        self.whole[v] = result
        return result


def _lengths_read(targets: list, sources: Sequence[Variable]) -> list:
    """The row inputs whose lengths ``targets`` read (and nothing else of them)."""
    free = [v for v in graph_inputs(targets) if v in set(sources)]
    return [s for s in free if _only_lengths_of(targets, s)]


def _only_lengths_of(targets: list, source: Variable) -> bool:
    """Whether ``targets`` read ``source`` through its shape alone."""
    for node in io_toposort(graph_inputs(targets), targets):
        if source in node.inputs and not isinstance(node.op, Shape | Shape_i):
            return False
    return True


def _with_lengths(targets: list, source: Variable, lengths: Variable) -> list:
    """``targets`` with ``source``'s shape read from ``lengths``."""
    replace = {}
    for node in io_toposort(graph_inputs(targets), targets):
        if isinstance(node.op, Shape) and node.inputs[0] is source:
            replace[node.outputs[0]] = lengths
        elif isinstance(node.op, Shape_i) and node.inputs[0] is source:
            replace[node.outputs[0]] = lengths[node.op.i]
    return graph_replace(targets, replace, strict=False)


def _with_leaves(v: Variable, leaves: dict) -> Variable:
    """``v`` computed from ``leaves``' values in place of theirs: only the nodes between
    them and ``v`` are new (``graph_replace`` would copy their ancestors too)."""
    equiv: dict[Any, Any] = clone_get_equiv(
        list(leaves), [v], copy_inputs=False, copy_orphans=False, memo=dict(leaves)
    )
    return equiv[v]


def _shape_leaves(v: Variable) -> list:
    """The Shape and Shape_i results ``v`` is computed from."""
    found, seen, stack = [], set(), [v]
    while stack:
        a = stack.pop()
        if a in seen or a.owner is None:
            continue
        seen.add(a)
        if isinstance(a.owner.op, Shape | Shape_i):
            found.append(a)
        else:
            stack.extend(a.owner.inputs)
    return found


__all__ = ["MAX_ROUNDS", "PhaseSplit", "Round", "split_phases"]
