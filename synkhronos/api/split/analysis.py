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

import numpy as np
from pytensor.graph.basic import Apply, Constant, Variable, clone_get_equiv
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.traversal import graph_inputs
from pytensor.scalar.basic import Add, Maximum, Second
from pytensor.tensor.basic import Alloc, AllocEmpty, ARange, Eye
from pytensor.tensor.elemwise import CAReduce, Elemwise
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.rewriting.shape import ShapeFeature
from pytensor.tensor.shape import Reshape, Shape, Shape_i, SpecifyShape
from pytensor.tensor.subtensor import indices_from_subtensor
from pytensor.tensor.variable import TensorVariable

from synkhronos.api.split.lengths import Lengths, is_shape

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
    return _indices(node) | ({0} if type(op).__name__ in ("Join", "Scan") else set())


def _indices(node: Apply) -> set[int]:
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


def mixes_rows(graph: RowGraph, node: Apply) -> str | None:
    """Why ``node`` mixes the rows of its inputs into rows of its result in a way the
    split cannot make exact (each rank would see only its own rows), or None."""
    row_inputs = [
        i
        for i in node.inputs
        if isinstance(i, TensorVariable) and graph.has(i, Fact.ROW) and graph.has(i, Fact.DATA)
    ]
    if not row_inputs:
        return None
    op, first = node.op, row_inputs[0]
    name = type(op).__name__
    if name in ("Softmax", "LogSoftmax", "CumOp", "SortOp", "ArgSortOp"):
        if first is not node.inputs[0]:  # the rows are not what it orders or normalizes
            return None
        axes = getattr(op, "axis", None)
        if name in ("SortOp", "ArgSortOp") and len(node.inputs) > 1:
            axis = node.inputs[1]  # PyTensor 3.0's: an input (3.3's is the op's own)
            axes = None if not isinstance(axis, Constant) or axis.data is None else axis.data
        if axes is None:  # over every axis (a cumulative op or a sort flattens first)
            along = graph.lengths.row_axes(first)
        else:
            normal = [int(k) % first.ndim for k in np.atleast_1d(axes)]
            along = [k for k in normal if k in graph.lengths.row_axes(first)]
        if not along:
            return None
        what = {
            "Softmax": ("softmax", "normalize over its own rows"),
            "LogSoftmax": ("log_softmax", "normalize over its own rows"),
            "CumOp": (f"a cumulative {getattr(op, 'mode', '')}", "accumulate its own rows"),
            "SortOp": ("sort", "sort its own rows"),
            "ArgSortOp": ("argsort", "sort its own rows"),
        }[name]
        where = "every axis" if axes is None else f"axis {along[0]}"
        return f"{what[0]} over {where} (the rows): each rank would {what[1]}"
    if name in ("Subtensor", "AdvancedSubtensor", "AdvancedSubtensor1"):
        return _picks_rows(graph, node) if first is node.inputs[0] else None
    core = getattr(op, "core_op", op)
    if type(core).__name__ in ("Dot", "Dot22") and len(row_inputs) > 1:
        # A batched product whose rows' axes are all batch axes pairs row i with row i.
        core_ndim = 2 if core is not op else 0
        in_core = [
            k
            for i in row_inputs
            for k in graph.lengths.row_axes(i)
            if k >= i.ndim - core_ndim or core_ndim == 0
        ]
        if in_core and any(graph.has(o, Fact.ROW) for o in node.outputs):
            return (
                f"a matrix product ({core}) of two values of the rows, as z1 @ z2.T, pairs "
                f"rows with rows: each rank would pair its own rows only"
            )
    return None


def _picks_rows(graph: RowGraph, node: Apply) -> str | None:
    """Why indexing the rows' axis of a value of the rows (``x[::-1]``, ``x[1:]``,
    ``x[perm]``) mixes rows, or None: a whole slice, or the rows' own positions
    (``arange(n)``, pairing each row with itself), do not."""
    x = node.inputs[0]
    if not any(graph.has(o, Fact.ROW) for o in node.outputs):
        return None  # a row picked out of the rows: a reduction, said as one
    indices = indices_from_subtensor(node.inputs[1:], node.op.idx_list)
    for k in graph.lengths.row_axes(x):
        index = indices[k] if k < len(indices) else slice(None)
        if isinstance(index, slice):
            if index == slice(None):
                continue
        elif index.owner is not None and isinstance(index.owner.op, ARange):
            if graph.has(index, Fact.PURE):
                continue
        return (
            f"indexing axis {k} (the rows) by position ({node.op}): each rank would index "
            f"its own rows"
        )
    return None


def is_maximum(node: Apply | None) -> bool:
    """Whether ``node`` takes a maximum (over the rows, where its input is theirs): the
    ranks' maxima all-reduced with "max" are the whole batch's."""
    return (
        node is not None
        and isinstance(node.op, CAReduce)
        and isinstance(node.op.scalar_op, Maximum)
    )


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

    def has(self, v: Variable, fact: Fact) -> bool:
        """Whether the analysed variable ``v`` has ``fact`` (False for one not analysed)."""
        return fact in self.facts.get(v, Fact.NONE)

    def of_original(self, v: Variable, fact: Fact) -> bool:
        """:meth:`has` of an original variable."""
        return self.has(self.clone_of.get(v, v), fact)

    def _classify(self, node: Apply) -> None:
        # Indices are values: an embedding's rows depend on the indices' rows.
        shapes = structural(node) - _indices(node)
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


__all__ = ["Fact", "RowGraph", "is_maximum", "mixes_rows", "structural", "sums_rows"]
