"""Minibatches that ``givens`` select from shared data: the Theano tutorials' idiom.

``synk.function([index], cost, updates=updates, givens={x: data_x[index * B:(index + 1)
* B], y: data_y[index * B:(index + 1) * B]})`` has no input with the rows: each given's
value selects them from a shared variable every rank holds whole, by broadcast inputs
only. :func:`select` rewrites each such given as ``data[rows]``, where ``rows`` is a
hidden input holding the selected rows' numbers: a training function scatters it, so
that each rank computes its share of the selected rows, and :meth:`GivenRows.rows`
computes it on rank 0 for each call from the call's broadcast arguments, as one device's
``Subtensor`` (or advanced index) would select them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, Variable, equal_computations
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors, graph_inputs, io_toposort
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.shape import Reshape
from pytensor.tensor.subtensor import AdvancedSubtensor, Subtensor, get_idx_list
from pytensor.tensor.variable import TensorConstant


@dataclass
class GivenRows:
    """The rows the givens select, as a hidden input of the training function.

    Attributes
    ----------
    hidden : TensorVariable
        The selected rows' numbers (int64), the function's first scattered input.
    data : list of SharedVariable
        The shared variables the givens select from (each holds every row).
    is_slice : bool
        Whether the selection is a slice (else an index vector).
    givens : list
        The givens as written, ``(variable, value)`` pairs (the selection by the
        broadcast inputs in the graph).
    """

    hidden: Variable
    data: list
    is_slice: bool
    givens: list
    _bounds: Any  # a pytensor function of the broadcast inputs
    _present: list  # per slice bound: whether it is given (start, stop, step)

    def rows(self, bcast_args) -> np.ndarray:
        """The selected rows' numbers for a call with these broadcast arguments; an
        ``IndexError`` where one device's selection would raise one, a ``ValueError``
        where the shared variables' lengths make the givens select different rows."""
        values = self._bounds(*bcast_args)
        index: Any
        if self.is_slice:
            given = iter(values)
            index = slice(*(int(next(given)) if p else None for p in self._present))
        else:
            index = np.asarray(values[0])
        lengths = sorted({v.get_value(borrow=True).shape[0] for v in self.data})
        chosen = [np.arange(length, dtype=np.int64)[index] for length in lengths]
        if any(not np.array_equal(c, chosen[0]) for c in chosen[1:]):
            raise ValueError(
                f"the givens select different rows from {', '.join(map(str, self.data))}, "
                f"whose lengths differ"
            )
        return chosen[0]


def batch_size_reshapes(variables: list, rows: GivenRows, bcast_inputs: list) -> list:
    """The reshapes of a value of the selected rows to a constant shape whose first
    entry is the minibatch's length (LeNet's ``x.reshape((batch_size, 1, 28, 28))``): no
    rank's share of the rows has that length. The length is the selection's where every
    broadcast input is zero; none are found where it cannot be had, or is 1."""
    try:
        zeros = [np.zeros((0,) * v.type.ndim, v.type.dtype) for v in bcast_inputs]
        length = len(rows.rows(zeros))
    except Exception:  # noqa: BLE001 - a selection that needs other values: none found
        return []
    if length < 2:
        return []
    found = []
    for node in io_toposort(list(graph_inputs(variables)), variables):
        shape = node.inputs[1] if isinstance(node.op, Reshape) else None
        if not isinstance(shape, TensorConstant) or shape.data.ndim != 1:
            continue
        if int(shape.data[0]) == length and rows.hidden in ancestors([node.inputs[0]]):
            found.append(node)
    return found


def _selection(value, bcast_ids: set[int]) -> tuple | None:
    """``(shared variable, key, base)`` where ``value`` selects rows of ``base``, a whole
    shared variable or elementwise ops of it (:func:`_whole_data`), on axis 0 only, by
    bounds (a slice's) or an index vector computed from broadcast inputs, constants and
    shared variables; ``key``: (is_slice, bound variables, which bounds are given)."""
    node = value.owner
    if node is None or not isinstance(node.op, Subtensor | AdvancedSubtensor):
        return None
    root = _whole_data(node.inputs[0])
    if root is None:
        return None
    index = get_idx_list(node.inputs, node.op.idx_list)
    if len(index) != 1:
        return None
    (entry,) = index
    if isinstance(node.op, Subtensor):
        if not isinstance(entry, slice):
            return None
        present = [b is not None for b in (entry.start, entry.stop, entry.step)]
        bounds = [b for b in (entry.start, entry.stop, entry.step) if b is not None]
        key = (True, bounds, present)
    elif getattr(entry.type, "ndim", 0) == 1 and "int" in entry.type.dtype:
        key = (False, [entry], [True])
    else:
        return None
    free = [v for v in graph_inputs(key[1]) if v.owner is None]
    if any(not _known(v, bcast_ids) for v in free):
        return None
    return root, key, node.inputs[0]


def _whole_data(base) -> SharedVariable | None:
    """The shared variable whose rows ``base`` is, elementwise (the tutorials' labels,
    ``T.cast(shared_y, "int32")``), or None."""
    while not isinstance(base, SharedVariable):
        node = base.owner
        if node is None or not isinstance(node.op, Elemwise):
            return None
        varying = [v for v in node.inputs if not isinstance(v, Constant)]
        if len(varying) != 1 or varying[0].type.ndim != base.type.ndim:
            return None
        base = varying[0]
    return base


def _selected(root, base, hidden):
    """``base``'s rows at ``hidden``: the rows of ``root`` selected, then ``base``'s
    elementwise ops on them alone."""
    return clone_replace(base, {root: root[hidden]}) if base is not root else root[hidden]


def _known(var, bcast_ids: set[int]) -> bool:
    """Whether ``var`` is a broadcast input, a shared variable or a constant."""
    return id(var) in bcast_ids or isinstance(var, SharedVariable | Constant)


def select(givens: list, bcast_inputs: list, sliceable: list) -> tuple[list, GivenRows] | None:
    """``givens`` with each given that selects rows of a shared variable by broadcast
    inputs rewritten to read a hidden input of the selected rows' numbers, and that
    selection; None where no given selects rows so, where two select them differently,
    or where one selects from a sliceable shared variable (each rank holds its own rows
    of it)."""
    bcast_ids = {id(v) for v in bcast_inputs}
    sliceable_ids = {id(v) for v in sliceable}
    found: dict[int, tuple] = {}
    for k, (_, value) in enumerate(givens):
        selection = _selection(value, bcast_ids)
        if selection is not None:
            found[k] = selection
    if not found or any(id(data) in sliceable_ids for data, _, _ in found.values()):
        return None
    unselected = [value for k, (_, value) in enumerate(givens) if k not in found]
    if any(id(v) in bcast_ids for v in graph_inputs(unselected)):
        return None  # another given reads the index: the selection is not all
    keys = [key for _, key, _ in found.values()]
    is_slice, bounds, present = keys[0]
    for other in keys[1:]:
        same = other[0] == is_slice and other[2] == present
        if not same or not equal_computations(other[1], bounds):
            return None
    hidden = pt.lvector("given rows")
    rewritten = [
        (var, _selected(found[k][0], found[k][2], hidden) if k in found else value)
        for k, (var, value) in enumerate(givens)
    ]
    outputs = bounds if is_slice else [pt.as_tensor_variable(bounds[0])]
    compiled = pytensor.function(
        list(bcast_inputs), outputs, mode="FAST_COMPILE", on_unused_input="ignore"
    )
    data = list({id(d): d for d, _, _ in found.values()}.values())
    return rewritten, GivenRows(hidden, data, is_slice, list(givens), compiled, present)


__all__ = ["GivenRows", "batch_size_reshapes", "select"]
