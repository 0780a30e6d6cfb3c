"""Which values of a graph depend on the rows: the analysis the split is cut by.

A variable is *data* when its value is computed from a row input's values (indices
included: an embedding's ``W[idx]`` depends on the rows of ``idx``); *row* when it is
data with an axis of the rows' length; *pure* when it is computed from shapes alone; a
*count* when it is pure and holds the rows' count; it *feeds rows* when the rows'
computation reads its value.
"""

from __future__ import annotations

import enum
from typing import Any

from pytensor.graph.basic import Apply, Constant, Variable, clone_get_equiv
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.traversal import graph_inputs
from pytensor.scalar.basic import Add, Maximum, Minimum, Second
from pytensor.tensor.basic import Alloc, AllocEmpty, ARange, Eye
from pytensor.tensor.elemwise import CAReduce, Elemwise
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.rewriting.shape import ShapeFeature
from pytensor.tensor.shape import Reshape, Shape, Shape_i, SpecifyShape

from synkhronos.api.split.lengths import Lengths, is_shape

# Ops whose result, reduced over the rows, is a sum of one term per row (so summing the
# ranks' results gives the whole batch's); by class name, so that the convolutions' Ops
# (synkhronos.ops.conv: conv3d's filter gradient is Conv2dGradWeights too) and their JAX
# kernels need not be imported here.
_ROW_SUMS = {
    "Dot",
    "Dot22",
    "Scan",
    "IncSubtensor",
    "AdvancedIncSubtensor",
    "AdvancedIncSubtensor1",
    "Conv2dGradWeights",
}


class Fact(enum.Flag):
    """What the analysis knows of a variable (see the module docstring)."""

    NONE = 0
    ROW = enum.auto()
    DATA = enum.auto()
    PURE = enum.auto()
    COUNT = enum.auto()
    FEEDS_ROWS = enum.auto()


def structural(node: Apply) -> set[int]:
    """Positions of ``node``'s inputs read for their shape or as sizes or indices, not as
    values to compute with (a row count there stays the rank's own)."""
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
    # A Join's axis is its input 0 before PyTensor 3.3, which keeps it in the op (op.axis).
    axis = name == "Join" and not hasattr(op, "axis")
    return index_positions(node) | ({0} if axis or name == "Scan" else set())


def index_positions(node: Apply) -> set[int]:
    """Positions of a subtensor's indices (an increment's value is input 1)."""
    name = type(node.op).__name__
    if "Subtensor" not in name:
        return set()
    return set(range(2 if "Inc" in name else 1, len(node.inputs)))


def sums_rows(node: Apply) -> bool:
    """Whether ``node``'s result, reduced over rows, is a sum of one term per row."""
    op = node.op
    if isinstance(op, CAReduce):
        return isinstance(op.scalar_op, Add)
    core = getattr(op, "core_op", op)  # Blockwise(Dot) is a matmul
    return type(core).__name__ in _ROW_SUMS


#: The reductions whose ranks' results, all-reduced with an op of the same name, are the
#: whole batch's (a sum's too, but a sum is a term per row: :func:`sums_rows`).
_EXTREMA = {Maximum: "max", Minimum: "min"}


def extremum(node: Apply | None) -> str | None:
    """The all-reduce op ("max" or "min") that finishes ``node``'s maximum or minimum
    (over the rows, where its input is theirs), or None for another op."""
    if node is None or not isinstance(node.op, CAReduce):
        return None
    return _EXTREMA.get(type(node.op.scalar_op))


class RowGraph:
    """A graph's variables' facts (:class:`Fact`) and rows' axes; the graph analysed is a
    copy (``original`` maps its variables back, ``clone_of`` the other way)."""

    def __init__(self, targets: list, sources: list):
        roots = [v for v in graph_inputs(targets) if not isinstance(v, Constant)]
        memo: dict[Any, Any] = clone_get_equiv(
            roots, targets, copy_inputs=False, copy_orphans=False
        )
        fg = FunctionGraph(
            roots, [memo[t] for t in targets], features=[ShapeFeature()], clone=False
        )
        self.fgraph = fg
        self.nodes = fg.toposort()
        self.original = {c: o for o, c in memo.items()}
        self.clone_of: dict[Any, Any] = {o: c for c, o in self.original.items()}
        self.lengths = Lengths(fg, memo, set(sources), set(roots))
        self.facts: dict = {}
        for v in roots:
            source = v in self.lengths.sources
            row = source or self.lengths.has_row_axis(v)
            self.facts[v] = (Fact.ROW if row else Fact.NONE) | (Fact.DATA if source else Fact.NONE)
        for node in self.nodes:
            self._classify(node)
        self._mark_feeds_rows()

    def rewrite(self, pairs: list[tuple]) -> None:
        """Replace the analysed variables of ``pairs`` by their values (built from the
        analysed graph's variables), and analyse what is new. The analysed graph then
        stands for itself: ``original`` maps its variables to themselves."""
        self.fgraph.replace_all(pairs, import_missing=True)
        self.nodes = self.fgraph.toposort()
        self.original = {}
        for node in self.nodes:
            if any(o not in self.facts for o in node.outputs):
                self._classify(node)
        for v in self.facts:
            self.facts[v] &= ~Fact.FEEDS_ROWS
        self._mark_feeds_rows()

    def has(self, v: Variable, fact: Fact) -> bool:
        """Whether the analysed variable ``v`` has ``fact`` (False for one not analysed)."""
        return fact in self.facts.get(v, Fact.NONE)

    def of_original(self, v: Variable, fact: Fact) -> bool:
        """:meth:`has` of an original variable."""
        return self.has(self.clone_of.get(v, v), fact)

    def row_axes_of(self, v: Variable) -> list[int]:
        """The axes of the rows' length of an original variable; none for one computed
        from shapes only (no rank's rows in it)."""
        analysed = self.clone_of.get(v, v)
        return [] if self.has(analysed, Fact.PURE) else self.lengths.row_axes(analysed)

    def _classify(self, node: Apply) -> None:
        # Indices are values: an embedding's rows depend on the indices' rows.
        shapes = structural(node) - index_positions(node)
        pure = is_shape(node.outputs[0]) or all(
            isinstance(i, Constant) or self.has(i, Fact.PURE) for i in node.inputs
        )
        data = not pure and any(
            self.has(i, Fact.DATA) for k, i in enumerate(node.inputs) if k not in shapes
        )
        if isinstance(node.op, Shape | Shape_i):
            axes = self.lengths.row_axes(node.inputs[0])
            count = bool(axes) if isinstance(node.op, Shape) else node.op.i in axes
        else:
            count = pure and any(self.has(i, Fact.COUNT) for i in node.inputs)
        for out in node.outputs:
            fact = Fact.PURE if pure else Fact.NONE
            fact |= Fact.DATA if data else Fact.NONE
            fact |= Fact.COUNT if count else Fact.NONE
            if not pure and self.lengths.has_row_axis(out):
                fact |= Fact.ROW
            self.facts[out] = fact

    def _mark_feeds_rows(self) -> None:
        """Mark the variables whose value the rows' computation reads (the row region)."""
        for v, fact in self.facts.items():
            if Fact.ROW in fact:
                self.facts[v] |= Fact.FEEDS_ROWS
        for node in reversed(self.nodes):
            if not any(self.has(o, Fact.FEEDS_ROWS) for o in node.outputs):
                continue
            positions = structural(node)
            for k, i in enumerate(node.inputs):
                if k not in positions and self.has(i, Fact.DATA):
                    self.facts[i] |= Fact.FEEDS_ROWS

    def row_phase(self, node: Apply) -> bool:
        """Whether ``node`` runs on a rank's rows: it reduces them, or the rows read it."""
        return any(self.has(o, Fact.FEEDS_ROWS) for o in node.outputs) or any(
            self.has(i, Fact.ROW) for i in node.inputs
        )

    def nodes_outputs(self) -> list:
        """The analysed graph's computed variables, inputs before users."""
        return [o for node in self.nodes for o in node.outputs]

    def label(self, v: Variable) -> str:
        """How a message names the analysed variable ``v``."""
        v = self.original.get(v, v)
        return repr(v.name) if v.name else str(v)


__all__ = ["Fact", "RowGraph", "extremum", "index_positions", "structural", "sums_rows"]
