"""Which axes of a graph's variables have the rows' length: PyTensor's shape inference,
read with the rows' count as the unknown."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.tensor.shape import Shape, Shape_i
from pytensor.tensor.subtensor import Subtensor, get_idx_list
from pytensor.tensor.type import TensorType

from synkhronos.api.split.walk import owner_inputs, walk_up

#: Two rows' counts: a length that tracks the rows differs between them.
COUNTS = (7, 11)
#: An unknown length that does not track the rows.
ANY_LENGTH = 13


class Tracks(enum.IntEnum):
    """Whether a shape expression is the rows' count; ordered, so that an expression of
    several takes the most of theirs."""

    NO = 0
    UNKNOWN = 1  # read from a value: counted as the rows'
    ROW = 2


def is_shape(v: Variable) -> bool:
    """Whether ``v`` is a variable's shape or one of its lengths."""
    return v.owner is not None and isinstance(v.owner.op, Shape | Shape_i)


def _axis_read(v: Variable) -> tuple[Variable, int] | None:
    """``(u, k)`` where ``v`` is the length of ``u``'s axis ``k``: ``Shape_i{k}(u)``, or
    ``Shape(u)[k]`` with ``k`` a constant, as PyTensor 3.3's shape inference writes it."""
    node = v.owner
    if node is None:
        return None
    if isinstance(node.op, Shape_i):
        return node.inputs[0], node.op.i
    shape_node = node.inputs[0].owner if isinstance(node.op, Subtensor) else None
    if shape_node is None or not isinstance(shape_node.op, Shape):
        return None
    (index,) = get_idx_list(node.inputs, node.op.idx_list)
    if not isinstance(index, Constant):
        return None
    u = shape_node.inputs[0]
    return u, int(index.data) % u.type.ndim


def _expression_inputs(v: Variable) -> list:
    """What a shape expression is computed from, down to the shapes it reads."""
    return [] if isinstance(v, Constant) or is_shape(v) else owner_inputs(v)


class _Shapes:
    """PyTensor 3.3's shape inference read as 3.0's ``ShapeFeature.shape_of`` dict: 3.3's
    infers a shape when asked, for any variable; 3.0's holds the graph's own only."""

    def __init__(self, fg: FunctionGraph):
        self._variables = fg.variables
        self._infer = fg.shape_feature.shape_tuple

    def get(self, v: Variable) -> tuple | None:
        return self._infer(v) if v in self._variables else None

    def __contains__(self, v: Variable) -> bool:
        return v in self._variables


class Lengths:
    """The rows' axes of a graph's variables (the graph ``fg``, a copy with shape
    inference; ``copy`` maps the original's variables to the copy's)."""

    def __init__(self, fg: FunctionGraph, copy: dict, sources: set, roots: set):
        self.sources = sources
        self.roots = roots
        held = vars(fg.shape_feature).get("shape_of")  # 3.0's dict (3.3's is a property)
        self._shape_of = held if held is not None else _Shapes(fg)
        self._clients = fg.clients
        # Shape inference can reach the original graph's variables (an op's own shape
        # expressions): read them as their copies.
        self._copy = copy
        self._no_twin: set = set()
        self._tracks: dict = {}
        self.axes: dict = {}  # each variable's axes of the rows' length, once computed
        self._values: dict = {}  # shape expressions' values, by rows' count

    def tracks(self, e: Variable) -> Tracks:
        """Whether the shape expression ``e`` is the rows' count."""
        for v in walk_up([e], _expression_inputs, self._tracks.__contains__):
            if isinstance(v, Constant):
                self._tracks[v] = Tracks.NO
            elif v.owner is None:
                self._tracks[v] = Tracks.UNKNOWN if v in self.sources else Tracks.NO
            elif (axis := _axis_read(v)) is not None:
                self._tracks[v] = self._length_tracks(*axis)
            elif is_shape(v):
                self._tracks[v] = self._length_tracks(v.owner.inputs[0], None)
            else:
                self._tracks[v] = max((self._tracks[i] for i in v.owner.inputs), default=Tracks.NO)
        return self._tracks[e]

    def _length_tracks(self, u: Variable, k: int | None) -> Tracks:
        """Whether the length of ``u``'s axis ``k`` (its whole shape for None) is (or
        holds) the rows' count."""
        u = self._copy.get(u, u)
        if u in self.sources:
            return Tracks.ROW if k is None or k == 0 else Tracks.NO
        if u in self.roots:
            return Tracks.NO
        if u not in self.axes:  # an axis of a variable not met yet
            return Tracks.UNKNOWN
        row = bool(self.axes[u]) if k is None else k in self.axes[u]
        return Tracks.ROW if row else Tracks.NO

    def shape_expression(self, v: Variable, k: int) -> Variable | None:
        """Axis ``k``'s length of ``v`` from the graph's roots, if it reads no value."""
        shape = self._shape_of.get(v)
        if shape is None or self.tracks(shape[k]) == Tracks.UNKNOWN:
            return None
        return shape[k]

    def has_row_axis(self, v: Variable) -> bool:
        return isinstance(v.type, TensorType) and bool(self.row_axes(v))

    def row_axes(self, v: Variable) -> list[int]:
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
                # Shape inference knows nothing of this op.
                if k in self._unknown_op_axes(v):
                    axes.append(k)
            elif self._tracks_rows(length):
                axes.append(k)
        self.axes[v] = axes
        return axes

    def _unknown_op_axes(self, v: Variable) -> list[int]:
        """The rows' axes of the output ``v`` of an op shape inference knows nothing of:
        a fold of leading axes (the Lasagne port's, by class name) holds the rows where
        the axes it folds or splits do; another op, the axes its inputs of as many
        dimensions have at the same places (a pooling keeps the rows' axis)."""
        node = v.owner
        name = type(node.op).__name__ if node is not None else None
        if name == "FoldLeading":
            k, within = node.op.k, self.row_axes(node.inputs[0])
            return [0] * any(a < k for a in within) + [a - k + 1 for a in within if a >= k]
        if name == "UnfoldLeading":
            k, (x, like) = node.op.k, node.inputs
            kept = [a + k - 1 for a in self.row_axes(x) if a >= 1]
            return [a for a in self.row_axes(like) if a < k] + kept
        ndim = getattr(v, "ndim", 0)
        inputs = [i for i in owner_inputs(v) if getattr(i, "ndim", -1) == ndim]
        return [k for k in range(ndim) if any(k in self.row_axes(i) for i in inputs)]

    def _tracks_rows(self, length: Variable) -> bool:
        """Whether the length ``length`` changes with the rows' count: computed for two
        counts (a length the symbols only involve, as a flattening's ``n * m / n``, does
        not); where it cannot be computed, whether it involves the count."""
        try:
            return self._evaluate(length, COUNTS[0]) != self._evaluate(length, COUNTS[1])
        except Exception:  # noqa: BLE001 - an op that cannot compute here: judge by symbols
            return self.tracks(length) != Tracks.NO

    def _evaluate(self, e: Variable, rows: int) -> Any:
        """The value of the shape expression ``e`` with ``rows`` rows (other unknown
        lengths at an arbitrary value)."""
        memo = self._values.setdefault(rows, {})
        for v in walk_up([e], _expression_inputs, memo.__contains__):
            if isinstance(v, Constant):
                memo[v] = v.data
            elif v.owner is None:
                raise ValueError(f"{v} is not a shape")
            elif is_shape(v):
                memo[v] = self._shape_value(v.owner, rows)
            else:
                node = v.owner
                storage: list = [[None] for _ in node.outputs]
                node.op.perform(node, [memo[i] for i in node.inputs], storage)
                memo.update((o, out) for o, (out,) in zip(node.outputs, storage, strict=True))
        return np.asarray(memo[e]).tolist()

    def _shape_value(self, node: Apply, rows: int) -> Any:
        u = node.inputs[0]
        if isinstance(node.op, Shape_i):
            return np.int64(self._root_length(u, node.op.i, rows))
        return np.array([self._root_length(u, k, rows) for k in range(u.type.ndim)], np.int64)

    def _root_length(self, u: Variable, k: int, rows: int) -> int:
        u = self._copy.get(u, u)
        if u in self.sources:
            return rows if k == 0 else (u.type.shape[k] or ANY_LENGTH)
        if isinstance(u, SharedVariable):
            return int(np.shape(u.get_value(borrow=True))[k])
        if u in self.roots:
            return u.type.shape[k] or ANY_LENGTH
        shape = self._shape_of.get(u)
        if shape is None:  # a variable outside the graph: its twin in the graph, if any
            twin = self._twin(u)
            if twin is not None:
                return self._root_length(twin, k, rows)
            return rows if k in self._aligned_axes(u) else ANY_LENGTH
        own = shape[k].owner
        if own is None:
            return int(shape[k].data)
        if isinstance(own.op, Shape_i) and own.inputs[0] is u:
            return rows if k in self.row_axes(u) else ANY_LENGTH
        return int(self._evaluate(shape[k], rows))

    def _twin(self, v: Variable) -> Variable | None:
        """The graph's variable computed as ``v`` is (same ops on the same inputs), or None:
        shape expressions can hold copies of the graph's computations."""

        def known(t: Variable) -> bool:
            return t in self._copy or t in self._shape_of or t in self._no_twin

        def inputs(t: Variable) -> list:
            return [i for i in owner_inputs(t) if not isinstance(i, Constant)]

        for t in walk_up([v], inputs, known):
            mapped = [self._copy.get(i, i) for i in owner_inputs(t)]
            found = None
            if t.owner is not None and not any(i in self._no_twin for i in mapped):
                found = self._computed_alike(t, mapped)
            if found is None:
                self._no_twin.add(t)
            else:
                self._copy[t] = found
        return self._copy.get(v)

    def _computed_alike(self, t: Variable, mapped: list) -> Variable | None:
        """The graph's output of a node with ``t``'s op on the ``mapped`` inputs."""
        anchor = next((i for i in mapped if not isinstance(i, Constant)), None)
        for client, _ in self._clients.get(anchor, []) if anchor is not None else []:
            if (
                isinstance(client, Apply)
                and client.op == t.owner.op
                and len(client.inputs) == len(mapped)
                and all(
                    a is b or (isinstance(a, Constant) and a.equals(b))
                    for a, b in zip(client.inputs, mapped, strict=True)
                )
            ):
                return client.outputs[t.owner.outputs.index(t)]
        return None

    def _aligned_axes(self, v: Any) -> list[int]:
        """The rows' axes of a variable shape inference does not know, from its inputs of
        as many dimensions (at the same places)."""

        def inputs(t: Any) -> list:
            if t in self.sources:
                return []
            return [i for i in owner_inputs(t) if getattr(i, "ndim", -1) == t.ndim]

        for t in walk_up([v], inputs, self.axes.__contains__):
            if t in self.sources:
                self.axes[t] = [0]
            else:
                found = inputs(t)
                self.axes[t] = [k for k in range(t.ndim) if any(k in self.axes[i] for i in found)]
        return self.axes[v]


__all__ = ["ANY_LENGTH", "COUNTS", "Lengths", "Tracks", "is_shape"]
