"""Which ops keep the rows apart: the split's allowlist.

The row phase runs on a rank's rows only; its result is one device's only where every op
between the rows and their reductions computes each row's result from that row alone (or
reduces the rows in a way the ranks can finish: a sum, a maximum, a minimum). An op is
judged by what it is and where its inputs and outputs hold the rows (their *rows' axes*):
an elementwise op whose inputs hold the rows where its output does, a transpose that
moves them, a reduction or a softmax over other axes, a matrix product with one operand
of the rows, a convolution or pooling over the batch, a reshape that keeps them leading,
a subtensor that takes every row, a scan stepping along another axis whose step keeps
them apart. Any other op that reads the rows and keeps them is named, with what each rank
computes instead: an op outside the list draws a warning, never a silent difference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from pytensor.compile.builders import OpFromGraph
from pytensor.graph.basic import Apply, Constant
from pytensor.raise_op import CheckAndRaise
from pytensor.scalar.basic import Add, Identity, Mul, Neg, Sub
from pytensor.tensor.basic import ARange
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.subtensor import indices_from_subtensor
from pytensor.tensor.variable import TensorVariable

from synkhronos.api.split.analysis import (
    Fact,
    RowGraph,
    index_positions,
    structural,
    sums_rows,
)

#: Ops over a batch (rows on the first axis, in and out): the extensions' convolutions,
#: poolings and their gradients with respect to their inputs, by class name (no import).
_OVER_THE_BATCH = {"Conv2d", "Conv2dGradInputs", "Pool2d", "Pool2dGrad", "MaxPool2dGather"}
#: Ops whose output is their first input's value (rows where it has them); also any
#: CheckAndRaise (Assert, PyMC's parameter checks), by class.
_SAME = {"SpecifyShape", "ViewOp", "DeepCopyOp", "OutputGuard"}
#: The Lasagne port's folds of leading axes: what they fold is computed on row by row
#: between them (the lengths know where they put the rows).
_FOLDS = {"FoldLeading", "UnfoldLeading"}
#: Scalar ops linear in each of their operands (a sum over rows stays a sum through them).
_LINEAR = (Add, Sub, Neg, Identity)
#: Ops whose named axis (``axis``) the rows must not be on.
_ALONG_AXIS = {
    "Softmax": ("softmax", "normalize over its own rows"),
    "LogSoftmax": ("log_softmax", "normalize over its own rows"),
    "CumOp": ("a cumulative op", "accumulate its own rows"),
    "SortOp": ("sort", "sort its own rows"),
    "ArgSortOp": ("argsort", "sort its own rows"),
    "Argmax": ("argmax", "compare its own rows"),
}


def value_inputs(graph: RowGraph, node: Apply) -> list:
    """``node``'s inputs of the rows whose values it reads (not their shape alone)."""
    shapes = structural(node) - index_positions(node)
    return [
        i
        for k, i in enumerate(node.inputs)
        if k not in shapes
        and isinstance(i, TensorVariable)
        and graph.has(i, Fact.ROW)
        and graph.has(i, Fact.DATA)
    ]


def mixing_said(graph: RowGraph, nodes: list) -> list[str]:
    """Why ``nodes`` (the row phase's, in order) mix the rows, once per op: a node that
    reads a value already mixed is not said again (its cause is)."""
    said: dict[str, None] = {}
    mixed: set = set()
    for node in nodes:
        if any(i in mixed for i in node.inputs):
            mixed.update(node.outputs)
            continue
        why = mixes_rows(graph, node)
        if why is not None:
            said.setdefault(why)
            mixed.update(node.outputs)
    return list(said)


def mixes_rows(graph: RowGraph, node: Apply) -> str | None:
    """Why ``node`` computes a value of the rows from several rows (each rank would see
    only its own), or None where it keeps them apart or reduces them (a reduction is
    judged as a statistic or a frontier entry)."""
    row_inputs = value_inputs(graph, node)
    outs = [o for o in node.outputs if graph.has(o, Fact.ROW) and graph.has(o, Fact.DATA)]
    if not row_inputs or not outs:
        return None
    return _checker(node)(graph, node, row_inputs, outs)


def known_name(op) -> str:
    """The name ``op`` is judged by: its class's, or that of the nearest class it derives
    from that the list names (a library's subclass of PyTensor's ``GradClip``, a view,
    is judged as a ``ViewOp``)."""
    for cls in type(op).__mro__:
        if cls.__name__ in _KNOWN:
            return cls.__name__
    return type(op).__name__


def _checker(node: Apply) -> Callable[[RowGraph, Apply, list, list], str | None]:
    """How ``node``'s op is judged (see the module docstring)."""
    op, name = node.op, known_name(node.op)
    core = getattr(op, "core_op", None)
    if name in _ALONG_AXIS:
        return _along_axis
    if isinstance(op, Elemwise | CheckAndRaise) or name in _SAME:
        return _same_axes
    if name in ("Dot", "Dot22") or type(core).__name__ == "Dot":
        return _product
    by_kind = [
        (isinstance(op, DimShuffle), _transposed),
        (isinstance(op, CAReduce), _reduced_elsewhere),
        ("Subtensor" in name, _picks_rows),
        (core is not None, _batch_axes_only),
        (name in _FOLDS or isinstance(op, RandomVariable), _apart),
        (isinstance(op, OpFromGraph), _inner_graph),
    ]
    for applies, checker in by_kind:
        if applies:
            return checker
    return _BY_NAME.get(name, _not_known)


def _apart(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> None:
    """Keeps the rows apart (a fold's; draws per row are said by the phases where they
    cannot be one device's)."""
    return None


def _not_known(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str:
    return _unknown(node, "not known to keep the rows apart")


def _same_axes(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    return _aligned(graph, node, row_inputs, outs, lambda k: k)


def _transposed(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    order = list(node.op.new_order)
    return _aligned(graph, node, row_inputs, outs, lambda k: order.index(k) if k in order else -1)


def _allocated(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    """A value broadcast to a shape: its axes are the result's last."""
    offset = outs[0].ndim - getattr(node.inputs[0], "ndim", 0)
    return _aligned(graph, node, row_inputs, outs, lambda k: k + offset)


def _leading(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    """A convolution or pooling over the batch, a reshape: rows first, in and out."""
    held = {tuple(graph.lengths.row_axes(v)) for v in (*row_inputs, *outs)}
    return None if held == {(0,)} else _unknown(node, "the rows not on the first axis")


def _unknown(node: Apply, why: str) -> str:
    return f"{node.op} ({why}): each rank would compute it from its own rows only"


def _aligned(
    graph: RowGraph, node: Apply, row_inputs: list, outs: list, to_out: Callable[[int], int]
) -> str | None:
    """None where every input of the rows holds them at the output's rows' axes
    (``to_out`` maps an input's axis to the output's); else rows meet rows of another
    axis (``x[:, None] - x[None, :]``: every rank pairs its own rows only)."""
    want = set(graph.lengths.row_axes(outs[0]))
    for i in row_inputs:
        if {to_out(k) for k in graph.lengths.row_axes(i)} != want:
            return (
                f"{node.op} pairs rows with rows (rows on axes {sorted(want)} of its "
                f"result): each rank would pair its own rows only"
            )
    return None


def _along_axis(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    """An op along one axis (a softmax, a cumulative op, a sort): exact where the rows
    are on another; its result holds them where its input does."""
    op, name, first = node.op, known_name(node.op), node.inputs[0]
    if first not in row_inputs:
        return None  # the rows are not what it orders or normalizes
    axes = getattr(op, "axis", None)
    if name in ("SortOp", "ArgSortOp") and len(node.inputs) > 1:
        axis = node.inputs[1]  # PyTensor 3.0's: an input (3.3's is the op's own)
        axes = None if not isinstance(axis, Constant) or axis.data is None else axis.data
    if axes is None:  # over every axis (a cumulative op or a sort flattens first)
        along = graph.lengths.row_axes(first)
    else:
        normal = [int(k) % getattr(first, "ndim", 1) for k in np.atleast_1d(axes)]
        along = [k for k in normal if k in graph.lengths.row_axes(first)]
    if not along:
        return None
    what, instead = _ALONG_AXIS[name]
    if name == "CumOp":
        what = f"a cumulative {getattr(op, 'mode', '')}"
    where = "every axis" if axes is None else f"axis {along[0]}"
    return f"{what} over {where} (the rows): each rank would {instead}"


def _reduced_elsewhere(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    """A reduction that keeps rows reduces other axes only (else it reduces some of two
    axes of rows, which an earlier op paired and is said of)."""
    x = row_inputs[0]
    axes = node.op.axis if node.op.axis is not None else range(x.ndim)
    kept = [k for k in range(x.ndim) if k not in axes]  # a row axis reduced: -1, said
    return _aligned(graph, node, row_inputs, outs, lambda k: kept.index(k) if k in kept else -1)


def _picks_rows(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    """Why indexing the rows' axis of a value of the rows (``x[::-1]``, ``x[1:]``,
    ``x[perm]``) mixes rows, or None: a whole slice, or the rows' own positions
    (``arange(n)``, or ``arange(n)[:, None]`` beside other indices: each row paired with
    itself), do not."""
    x = node.inputs[0]
    if x not in row_inputs:
        return None  # rows of the indices (an embedding's lookup): each row its own
    indices = _indices(node)
    for k in graph.lengths.row_axes(x):
        index = indices[k] if k < len(indices) else slice(None)
        if isinstance(index, slice):
            if index == slice(None):
                continue
        elif _positions(graph, index):
            continue
        return (
            f"indexing axis {k} (the rows) by position ({node.op}): each rank would index "
            f"its own rows"
        )
    return None


class IndexedPastRows(ValueError):
    """A function indexes the rows of a value of the rows by indices that number the
    whole batch's rows (:func:`indexed_past_rows`): refused, not run per rank."""


def indexed_past_rows(graph: RowGraph, nodes: list) -> list[str]:
    """Why ``nodes`` index the rows' axis of a value of the rows by an array of indices
    that are not the rows' own positions (``x[perm]``, mixup): the indices number the
    whole batch's rows, a rank holds its own only, and would read past them (PyTensor's
    default mode checks no bounds): such a function is refused, not warned."""
    said: dict[str, None] = {}
    for node in nodes:
        if "AdvancedSubtensor" not in known_name(node.op) or node.inputs[0] not in value_inputs(
            graph, node
        ):
            continue
        indices = _indices(node)
        for k in graph.lengths.row_axes(node.inputs[0]):
            index = indices[k] if k < len(indices) else slice(None)
            named = _batch_numbers(graph, index)
            if named:
                said.setdefault(_past_rows(node, k, named))
    return list(said)


#: Ops whose result numbers a rank's own rows (an argsort of them, say).
_OWN_POSITIONS = {"ArgSortOp", "Argmax", "MaxAndArgmax", "ARange"}


def _batch_numbers(graph: RowGraph, index) -> list[str]:
    """The integer inputs of the rows whose values ``index`` (an array) is computed from,
    not through an op whose result numbers a rank's own rows (an argsort)."""
    if not isinstance(index, TensorVariable) or index.ndim == 0:
        return []
    named, stack, seen = [], [index], set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if v.owner is None:
            integer = getattr(v.type, "dtype", "").startswith(("int", "uint"))
            if integer and graph.has(v, Fact.DATA):
                named.append(graph.label(v))
        elif known_name(v.owner.op) not in _OWN_POSITIONS:
            stack.extend(v.owner.inputs)
    return named


def _indices(node: Apply) -> tuple:
    """A subtensor's (or increment's) index per axis it indexes."""
    start = 2 if "Inc" in known_name(node.op) else 1
    idx_list = getattr(node.op, "idx_list", None)  # AdvancedSubtensor1's: axis 0's only
    given = node.inputs[start:]
    return tuple(given) if idx_list is None else indices_from_subtensor(given, idx_list)


def _past_rows(node: Apply, k: int, named: list[str]) -> str:
    return (
        f"{node.op} indexes axis {k} (the rows) by the values of {', '.join(named)}, "
        f"which number the whole batch's "
        f"rows: a rank holds its own rows only and would read past them; index the rows "
        f"before the call (give x[perm] as an input)"
    )


def _positions(graph: RowGraph, index) -> bool:
    """Whether ``index`` is the rows' positions, ``arange`` of a count (its axes
    expanded, maybe): computed from shapes alone, on a rank its own rows'."""
    while index.owner is not None and isinstance(index.owner.op, DimShuffle):
        index = index.owner.inputs[0]
    owner = index.owner
    return owner is not None and isinstance(owner.op, ARange) and graph.has(index, Fact.PURE)


def _product(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    """A matrix product keeps rows apart with one operand of the rows; with two, where
    the rows are batch axes of a batched product (row i with row i); a product over the
    rows' axis of both (``x.T @ delta``) is a sum, a reduction."""
    if len(row_inputs) < 2:
        return None
    op = node.op
    core_ndim = 2 if getattr(op, "core_op", None) is not None else 0
    in_core = [
        k
        for i in row_inputs
        for k in graph.lengths.row_axes(i)
        if k >= i.ndim - core_ndim or core_ndim == 0
    ]
    if not in_core:
        return None
    core = getattr(op, "core_op", op)
    return (
        f"a matrix product ({core}) of two values of the rows, as z1 @ z2.T, pairs "
        f"rows with rows: each rank would pair its own rows only"
    )


def _batch_axes_only(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    """A batched op (Blockwise) keeps rows apart where they are batch axes only, the
    same in every input and output."""
    core_ndims = [len(s) for s in node.op.inputs_sig] + [len(s) for s in node.op.outputs_sig]
    for v, core_ndim in zip([*node.inputs, *node.outputs], core_ndims, strict=True):
        if v in row_inputs or v in outs:
            if any(k >= getattr(v, "ndim", 0) - core_ndim for k in graph.lengths.row_axes(v)):
                return _unknown(node, "the rows in its core axes")
    return _aligned(graph, node, row_inputs, outs, lambda k: k)


def _joined(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    """A concatenation (or its split) along an axis that is not the rows'."""
    if hasattr(node.op, "axis"):  # PyTensor >= 3.3: the op's own, not an input
        axis = node.op.axis
    else:
        given = node.inputs[0] if type(node.op).__name__ == "Join" else node.inputs[1]
        if not isinstance(given, Constant):
            return _unknown(node, "along an axis not known")
        axis = given.data
    k = int(axis) % outs[0].ndim
    if k in graph.lengths.row_axes(outs[0]):
        # By name: PyTensor 3.3 writes the axis into the op's name (Join{axis=0}).
        name = type(node.op).__name__
        return f"{name} along axis {k} (the rows): each rank would join or split its own rows"
    return _aligned(graph, node, row_inputs, outs, lambda a: a)


def _scan(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    """A scan keeps rows apart where no input it steps along has the rows on the axis
    stepped, and its step keeps them apart (judged as the outer graph is, on the step's
    graph whose inputs hold the rows on their first axis), with its reductions of rows
    summed and only added up after (a gradient accumulated over the steps)."""
    op = node.op
    outer_of = op.get_oinp_iinp_iout_oout_mappings()["outer_inp_from_inner_inp"]
    stepped = 1 + op.info.n_seqs + op.info.n_mit_mot + op.info.n_mit_sot + op.info.n_sit_sot
    inner_inputs, inner_outputs = _inner_io(op)
    sources = []
    for k, inner in enumerate(inner_inputs):
        outer = node.inputs[outer_of[k]]
        if not (graph.has(outer, Fact.ROW) and graph.has(outer, Fact.DATA)):
            continue
        axes = graph.lengths.row_axes(outer)
        if outer_of[k] < stepped:
            if 0 in axes:
                return f"{op} steps along axis 0 (the rows): each rank would step its own rows"
            axes = [a - 1 for a in axes]
        if axes != [0]:
            return _unknown(node, f"its step holds the rows on axes {axes}")
        sources.append(inner)
    step = RowGraph(inner_outputs, sources)
    said = mixing_said(step, step.nodes)
    if said:
        return f"{op}'s step: {said[0]}"
    return _step_sums(step)


def _inner_graph(graph: RowGraph, node: Apply, row_inputs: list, outs: list) -> str | None:
    """An op of an inner graph (OpFromGraph: ``xlogy``, a user's op) keeps rows apart
    where its inputs and outputs hold them first and its graph keeps them apart."""
    op = node.op
    held = {tuple(graph.lengths.row_axes(v)) for v in (*row_inputs, *outs)}
    if held != {(0,)}:
        return _unknown(node, "the rows not on the first axis")
    inner_inputs, inner_outputs = _inner_io(op)
    sources = [i for i, o in zip(inner_inputs, node.inputs, strict=True) if o in row_inputs]
    inner_graph = RowGraph(inner_outputs, sources)
    said = mixing_said(inner_graph, inner_graph.nodes)
    return f"{op}'s graph: {said[0]}" if said else None


def _inner_io(op: Any) -> tuple[list, list]:
    """The inputs and outputs of ``op``'s inner graph, in nodes that can be copied:
    PyTensor 3.3 keeps inner graphs frozen (a FrozenFunctionGraph's nodes have no
    ``clone_with_new_inputs``), so they are thawed first."""
    inner = op.fgraph
    if hasattr(inner, "unfreeze"):  # PyTensor >= 3.3
        inner = inner.unfreeze()
    return list(inner.inputs), list(inner.outputs)


def _step_sums(step: RowGraph) -> str | None:
    """Why a scan's step reduces its rows in a way that summing the ranks' results does
    not finish, or None: each reduction a sum that the step's rows do not read, and
    what it feeds linear in it."""
    for node in step.nodes:
        if any(step.has(i, Fact.ROW) for i in node.inputs):
            for o in node.outputs:
                if step.has(o, Fact.DATA) and not step.has(o, Fact.ROW):
                    if not sums_rows(node) or step.has(o, Fact.FEEDS_ROWS):
                        return _unknown(node, "a reduction of the rows inside a scan's step")
        elif any(step.has(i, Fact.DATA) for i in node.inputs) and not _linear(step, node):
            return _unknown(node, "a scan's step combines its sums over rows, not linearly")
    return None


def _linear(step: RowGraph, node: Apply) -> bool:
    """Whether ``node`` is linear in its values computed from sums over rows (so that
    the ranks' results add up to the whole batch's)."""
    op, name = node.op, known_name(node.op)
    scalar = getattr(op, "scalar_op", None)
    if isinstance(scalar, _LINEAR) or isinstance(op, DimShuffle) or sums_rows(node):
        return True
    if isinstance(scalar, Mul) or name in ("Dot", "Dot22"):
        return sum(step.has(i, Fact.DATA) for i in node.inputs) == 1
    passes = name in _SAME or isinstance(op, CheckAndRaise)
    return passes or name in ("Reshape", "Alloc") or "Subtensor" in name


#: The ops judged by their class name alone.
_BY_NAME: dict[str, Callable[[RowGraph, Apply, list, list], str | None]] = {
    **dict.fromkeys(_OVER_THE_BATCH, _leading),
    "Reshape": _leading,
    "Join": _joined,
    "Split": _joined,
    "Alloc": _allocated,
    "Scan": _scan,
}

#: Every class name the list judges an op by (:func:`known_name`).
_KNOWN = {*_ALONG_AXIS, *_SAME, *_FOLDS, *_BY_NAME, "Dot", "Dot22"}

__all__ = [
    "IndexedPastRows",
    "indexed_past_rows",
    "known_name",
    "mixes_rows",
    "mixing_said",
    "value_inputs",
]
