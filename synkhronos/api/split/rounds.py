"""The rounds of a row phase whose rows read back a sum of theirs (batch normalization's
statistics): which statistics each round computes, and what it keeps for later rounds."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.scalar.basic import Mul, Neg, Second
from pytensor.tensor.elemwise import CAReduce, Elemwise
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.type import TensorType

from synkhronos.api.split.analysis import Fact, RowGraph, extremum, sums_rows
from synkhronos.api.split.walk import owner_inputs, walk_up


@dataclass
class RoundsPlan:
    """The rounds' plan, on the analysed graph: per round before the last (``final``),
    the statistics it computes and the values it keeps for later rounds."""

    final: int
    statistics: list
    kept: list
    not_sums: list = field(default_factory=list)


def plan_rounds(
    graph: RowGraph, row_nodes: list, frontier: list, kept_outputs: list
) -> tuple[RoundsPlan | None, str]:
    """The rounds that make the rows' statistics exact, or None where the row phase needs
    no more than one (no statistic), or cannot be cut: then, why (an output left to the
    ranks reads a statistic; a draw that is no tensor would be kept). The variables are
    the analysed graph's."""
    sums, not_sums = statistics_read(graph, row_nodes)
    if not sums:
        return None, ""
    depth, drawn = _depths(graph, sums)
    if any(depth.get(o, 0) for o in kept_outputs):
        return None, "an output the ranks compute on their own rows reads them"
    try:
        plan = _assign(graph, sums, depth, drawn, frontier)
    except ValueError as error:
        return None, str(error)
    plan.not_sums = not_sums
    return (plan, "") if plan.final else (None, "")


def statistics_read(graph: RowGraph, row_nodes: list) -> tuple[set, list]:
    """The reductions of rows that the rows' computation reads back: the sums (batch
    normalization's), maxima (a softmax's over the rows) and minima, which a round makes exact,
    and the others (which no round can)."""
    sums, others = set(), []
    for node in row_nodes:
        if not any(graph.has(i, Fact.ROW) for i in node.inputs):
            continue
        for o in node.outputs:
            if (
                graph.has(o, Fact.DATA)
                and not graph.has(o, Fact.ROW)
                and graph.has(o, Fact.FEEDS_ROWS)
            ):
                if sums_rows(node) or extremum(node):
                    sums.add(o)
                else:
                    others.append(o)
    return sums, others


def _depths(graph: RowGraph, sums: set) -> tuple[dict, set]:
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


def _assign(graph: RowGraph, sums: set, depth: dict, drawn: set, frontier: list) -> RoundsPlan:
    """What each round computes, from the last back: a round reads an earlier round's
    statistic summed over the ranks, and an earlier round's value of the rows (or a
    draw) from where that round kept it; what depends on neither, it computes."""
    final = max((depth.get(v, 0) for v in frontier), default=0)
    plan = RoundsPlan(final, [[] for _ in range(final)], [[] for _ in range(final)])
    for k in range(final, -1, -1):
        targets = frontier if k == final else plan.statistics[k] + plan.kept[k]

        def read(u: Variable, k: int = k) -> str:
            """Where round ``k`` reads ``u``: an earlier round's statistics or kept
            values, or its own computation ("")."""
            if depth.get(u, 0) >= k:
                return ""
            if u in sums:
                return "statistic"
            return "kept" if graph.has(u, Fact.DATA) or u in drawn else ""

        def inputs(u: Variable, read=read) -> list:
            return [] if read(u) else owner_inputs(u)

        for u in walk_up(targets, inputs):
            where = read(u)
            if where == "kept" and not isinstance(u.type, TensorType):
                raise ValueError(
                    f"a round would have to keep {_described(graph, u)} for a later one, "
                    f"and only arrays are kept between rounds"
                )
            found = {"statistic": plan.statistics, "kept": plan.kept}.get(where)
            if found is not None and u not in found[depth.get(u, 0)]:
                found[depth.get(u, 0)].append(u)
    return plan


def factored_sums(graph: RowGraph) -> list | None:
    """The analysed graph's targets, with the statistics that a factor constant over the
    rows multiplies (an earlier statistic, as a variance's gradient) rewritten as that
    factor times the sum of the rest: ``sum(g * (x - mean))`` as ``g * sum(x - mean)``,
    the same sum in another order of its terms; None where none is. The sum of the rest
    no longer waits for the factor, so it joins an earlier round: batch normalization's
    gradient takes one round per layer, not two. ``graph`` is rewritten in place
    (:meth:`~synkhronos.api.split.analysis.RowGraph.rewrite`)."""
    factored = []
    for node in graph.nodes:
        op, out = node.op, node.outputs[0]
        if (
            isinstance(op, CAReduce)
            and sums_rows(node)
            and graph.has(out, Fact.FEEDS_ROWS)
            and graph.has(node.inputs[0], Fact.ROW)
        ):
            axes = tuple(range(node.inputs[0].type.ndim)) if op.axis is None else tuple(op.axis)
            made = _factored(graph, node.inputs[0], axes, out)
            if made is not None:
                factored.append((out, made))
    if not factored:
        return None
    # The last first: a rewritten sum's factors may hold an earlier one, rewritten after.
    graph.rewrite(factored[::-1])
    return list(graph.fgraph.outputs)


def _factored(graph: RowGraph, term: Variable, axes: tuple, out: Variable):
    """``sum(term, axes)`` as the product of ``term``'s factors constant over the rows
    (computed from them, broadcast along ``axes``), times the sum of its other factors;
    None where it has no such factor, or the other factors do not have ``term``'s shape,
    or the result not the type of the sum ``out``."""
    factors, negated = _factors(term)
    constant = [
        f
        for f in factors
        if graph.has(f, Fact.DATA)
        and not graph.has(f, Fact.ROW)
        and all(f.type.broadcastable[a] for a in axes)
    ]
    rest = [f for f in factors if f not in constant]
    if not constant or not rest:
        return None
    inner = pt.mul(*rest) if len(rest) > 1 else rest[0]
    if inner.type.broadcastable != term.type.broadcastable:
        return None  # the factors left would sum fewer terms than the rows'
    summed = pt.sum(-inner if negated else inner, axis=axes)
    outside = [pt.squeeze(f, axis=axes) for f in constant]
    made = pt.cast(pt.mul(summed, *outside), out.type.dtype)
    try:  # the sum's own type (its static lengths), or no rewrite
        return out.type.filter_variable(made)
    except TypeError:
        return None


def _factors(term: Variable) -> tuple[list, bool]:
    """The factors of a product (through negations, and values broadcast to another's
    shape: ``second(a, b)``'s factor is ``b``), and whether it is negated."""
    factors, negated, stack = [], False, [term]
    while stack:
        v = stack.pop()
        op = v.owner.op if v.owner is not None else None
        scalar = op.scalar_op if isinstance(op, Elemwise) else None
        if isinstance(scalar, Mul):
            stack.extend(v.owner.inputs)
        elif isinstance(scalar, Neg):
            negated = not negated
            stack.append(v.owner.inputs[0])
        elif isinstance(scalar, Second):
            stack.append(v.owner.inputs[1])
        else:
            factors.append(v)
    return factors, negated


def read_with(graph: RowGraph, v: Variable) -> str:
    """The named shared variable nearest to where the analysed ``v`` is read (a
    statistic's layer, by its parameter or running average: ``'bn1.gamma'``), or ""."""
    clients = graph.fgraph.clients
    queue, seen = [v], {v}
    while queue:
        u = queue.pop(0)
        for node, _ in clients.get(u, []):
            if node == "output":
                continue
            for i in node.inputs:
                if isinstance(i, SharedVariable) and i.name:
                    return i.name
            fresh = [o for o in node.outputs if o not in seen]
            seen.update(fresh)
            queue.extend(fresh)
    return ""


def _described(graph: RowGraph, u: Variable) -> str:
    """``u`` as a message names it: by its name, or, for a value PyTensor made (a scalar
    taken from an array), with the nearest named variable it is computed from (the
    user's layer's parameter or input)."""
    label = graph.label(u)
    if graph.original.get(u, u).name:
        return label
    stack, seen = list(owner_inputs(u)), set()
    while stack:
        v = stack.pop(0)
        if id(v) in seen:
            continue
        seen.add(id(v))
        name = graph.original.get(v, v).name
        if name:
            return f"{label} (a {u.type}, computed from {name!r})"
        stack.extend(owner_inputs(v))
    return f"{label} (a {u.type})"


__all__ = ["RoundsPlan", "factored_sums", "plan_rounds", "read_with", "statistics_read"]
