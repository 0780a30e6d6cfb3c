"""The phases' graphs, rebuilt from the analysed graph: row counts used as values become
the whole batch's, earlier phases' values become placeholders, and random draws per row
are drawn for the whole batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Apply, Variable, clone_get_equiv
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import graph_inputs, io_toposort
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.shape import Shape, Shape_i

from synkhronos.api.split.analysis import Fact, RowGraph, structural
from synkhronos.api.split.lengths import is_shape
from synkhronos.api.split.walk import owner_inputs, walk_up


def drawn_whole(graph: RowGraph, node: Apply) -> bool:
    """Whether a random draw per row can be drawn for the whole batch instead: its
    distribution's parameters do not vary by row."""
    return not any(graph.has(i, Fact.ROW) for i in node.inputs[2:])


class Substitution:
    """Rebuilds original variables with every value use of a row count replaced by the
    call's whole count (unless not ``counts``), and ``replace``'s variables by theirs;
    with ``positions``, random draws per row are drawn for the whole batch, and the
    rank's rows taken. With ``exact``, the statistics the rows read back are the whole
    batch's (summed over the ranks in rounds), and divide by the whole count too."""

    def __init__(
        self,
        graph: RowGraph,
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
        self.whole: dict = {}

    def rebuild_all(self, variables: Sequence[Variable]) -> list:
        return [self.rebuild(v) for v in variables]

    def rebuild(self, v: Variable) -> Variable:
        for top in walk_up([v], owner_inputs, self.memo.__contains__):
            if top.owner is None:
                self.memo[top] = top
            else:
                self._rebuild_node(top.owner)
        return self.memo[v]

    def _clone(self, v: Variable) -> Variable:
        return self.graph.clone_of.get(v, v)

    def _rebuild_node(self, node: Apply) -> None:
        g = self.graph
        outs = [self._clone(o) for o in node.outputs]
        if (
            self.positions is not None
            and isinstance(node.op, RandomVariable)
            and g.has(outs[1], Fact.ROW)
            and drawn_whole(g, outs[0].owner)
        ):
            self._draw_whole(node, g.lengths.row_axes(outs[1])[0])
            return
        keep = not self.counts or any(self._keeps_count(o) for o in outs)
        positions = structural(node)
        inputs = [
            self._whole(i)
            if not keep
            and k not in positions
            and g.has(self._clone(i), Fact.COUNT)
            and all(getattr(i.type, "broadcastable", (False,)))  # a count, dims added
            else self.memo[i]
            for k, i in enumerate(node.inputs)
        ]
        if all(a is b for a, b in zip(inputs, node.inputs, strict=True)):
            new = node
        else:
            new = node.clone_with_new_inputs(inputs, strict=False)
        for o, n in zip(node.outputs, new.outputs, strict=True):
            self.memo[o] = n

    def _keeps_count(self, v: Variable) -> bool:
        """Whether the analysed ``v`` keeps the rank's own count: a shape does; so does a
        statistic the rows read (not a value per row), unless it is the whole batch's."""
        g = self.graph
        if g.has(v, Fact.PURE):
            return True
        statistic = g.has(v, Fact.FEEDS_ROWS) and g.has(v, Fact.DATA) and not g.has(v, Fact.ROW)
        return not self.exact and statistic

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
        if v not in self.whole:
            leaves = {a: self._whole_leaf(a) for a in _shape_leaves(v)}
            leaves = {a: value for a, value in leaves.items() if value is not None}
            if not leaves:
                self.whole[v] = v
            elif self.exact:
                self.whole[v] = _with_leaves(v, leaves)
            else:
                self.whole[v] = graph_replace([v], leaves, strict=False)[0]
        return self.whole[v]

    def _whole_leaf(self, a: Any) -> Variable | None:
        """The whole batch's value of the shape or length ``a`` (None: ``a`` itself)."""
        original = a.owner.inputs[0]
        u = self._clone(original)
        axes = self.graph.lengths.row_axes(u)
        whole = pt.cast(self.rows, a.dtype)
        mine: Any = self.memo[original].shape if self.exact else a
        if isinstance(a.owner.op, Shape_i):
            if a.owner.op.i in axes:
                return whole
            return mine[a.owner.op.i] if self.exact else None
        if not (axes or self.exact):
            return None
        lengths = []
        for k in range(u.type.ndim):
            known = None if self.exact else self.graph.lengths.shape_expression(u, k)
            length = whole if k in axes else (mine[k] if known is None else known)
            lengths.append(pt.cast(length, a.dtype))
        return pt.stack(lengths)


def _with_leaves(v: Variable, leaves: dict) -> Variable:
    """``v`` computed from ``leaves``' values in place of theirs: only the nodes between
    them and ``v`` are new (``graph_replace`` would copy their ancestors too)."""
    equiv: dict[Any, Any] = clone_get_equiv(
        list(leaves), [v], copy_inputs=False, copy_orphans=False, memo=dict(leaves)
    )
    return equiv[v]


def _shape_leaves(v: Variable) -> list:
    """The Shape and Shape_i results ``v`` is computed from."""

    def inputs(a: Variable) -> list:
        return [] if is_shape(a) else owner_inputs(a)

    return [a for a in walk_up([v], inputs) if is_shape(a)]


def lengths_read(targets: list, sources: Sequence[Variable]) -> list:
    """The row inputs whose lengths ``targets`` read, and nothing else of them."""
    nodes = io_toposort(graph_inputs(targets), targets)
    read = [v for v in graph_inputs(targets) if v in set(sources)]
    return [
        s for s in read if all(isinstance(n.op, Shape | Shape_i) for n in nodes if s in n.inputs)
    ]


def with_lengths(targets: list, source: Variable, lengths: Any) -> list:
    """``targets`` with ``source``'s shape read from ``lengths``."""
    replace = {}
    for node in io_toposort(graph_inputs(targets), targets):
        if is_shape(node.outputs[0]) and node.inputs[0] is source:
            whole = isinstance(node.op, Shape)
            replace[node.outputs[0]] = lengths if whole else lengths[node.op.i]
    return graph_replace(targets, replace, strict=False)


__all__ = ["Substitution", "drawn_whole", "lengths_read", "with_lengths"]
