"""A PyMC model's log-density cut into the terms of the rows and the terms computed once.

The rows are the leading axis of the observed data. A term of the model's log-density
(``model.logp(sum=False)``: one per free variable, observed variable and potential) is a
*row term* when it reads the rows' data (the observed values, and every constant or
``pm.Data`` container whose leading axis has the rows' length), else a *once term* (the
priors, the transforms' Jacobians, the potentials of the parameters). A row term's sum is
split: each rank sums its own rows' terms, and the ranks' sums are summed. That is exact
only where the term factors over the rows, which the analysis of the split
(:mod:`synkhronos.api.split.analysis`) checks; a term that does not is refused with
:class:`RowsNotSplittable`, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.compile.builders import SymbolicOp
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import graph_inputs, toposort
from pytensor.scalar.basic import AND
from pytensor.tensor.elemwise import CAReduce

from synkhronos.api.split.analysis import Fact, RowGraph, structural, sums_rows
from synkhronos.api.split.keeping import mixes_rows


class RowsNotSplittable(ValueError):
    """A model whose log-density does not factor over the rows of its observed data."""


@dataclass
class RowSource:
    """One array of the rows: an observed value or a data container of the model, and the
    symbolic input that stands for it in the ranks' graph."""

    original: Variable
    input: Variable

    @property
    def is_shared(self) -> bool:
        """Whether the array is a ``pm.Data`` container (``pm.set_data`` can change it)."""
        return isinstance(self.original, SharedVariable)

    def value(self) -> np.ndarray:
        """The array's current value."""
        if self.is_shared:
            return self.original.get_value(borrow=True)
        assert isinstance(self.original, Constant)
        return self.original.data


@dataclass
class ModelTerms:
    """The model's terms, cut: ``row_terms`` read the rows through ``rows`` (their inputs
    stand for the arrays), ``once_terms`` do not; ``others`` are the ``pm.Data``
    containers the row terms read that are not the rows' (every call sends their values)."""

    rows: list[RowSource]
    others: list[tuple[SharedVariable, Variable]]
    row_terms: list[Variable]
    once_terms: list[Variable]
    n_rows: int


def _label(model: Any, term: Variable, index: int) -> str:
    variables = model.free_RVs + model.observed_RVs + model.potentials
    var = variables[index]
    name = var.name or str(var)
    if var in model.potentials:
        return f"the potential {name!r}"
    op = var.owner.op if var.owner is not None else None
    kind = f" ({getattr(op, 'name', None) or type(op).__name__})" if op is not None else ""
    return f"the log-density of {name!r}{kind}"


def row_count(model: Any) -> int:
    """The rows' count: the leading length every observed value shares."""
    lengths = {}
    for rv in model.observed_RVs:
        value = model.rvs_to_values[rv]
        if value.ndim:
            lengths[rv.name] = int(value.shape[0].eval())
    if not lengths:
        raise RowsNotSplittable("the model has no observed data with rows to split")
    if len(set(lengths.values())) > 1:
        raise RowsNotSplittable(
            f"the observed values have different numbers of rows ({lengths}): the rows to "
            f"split are the leading axis that every observed value shares"
        )
    return next(iter(lengths.values()))


def _leading_length(var: Variable) -> int | None:
    if isinstance(var, Constant):
        value = np.asarray(var.data)
    elif isinstance(var, SharedVariable) and not isinstance(var.type, pt.random.type.RandomType):
        value = np.asarray(var.get_value(borrow=True))
    else:
        return None
    return value.shape[0] if value.ndim else None


def _refuse_rows_in_draws(model: Any, n_rows: int) -> None:
    """Refuse an observed variable whose rows are inside one draw (a multivariate
    distribution over the rows: a random walk, a covariance over the rows)."""
    for rv in model.observed_RVs:
        op = rv.owner.op
        batch = rv.ndim - getattr(op, "ndim_supp", 0)
        if rv.ndim and batch < 1:
            name = getattr(op, "name", None) or type(op).__name__
            raise RowsNotSplittable(
                f"the log-density of {rv.name!r} ({name}) is one term of all {n_rows} rows "
                f"(the rows are inside one draw of a multivariate distribution): it does "
                f"not factor over the rows, and cannot be split"
            )


def _why_not_rows(graph: RowGraph) -> str | None:
    """Why the analysed term does not factor over the rows, or None."""
    for node in graph.nodes:
        why = mixes_rows(graph, node)
        if why is not None:
            return why
        positions = structural(node)
        reads_rows = any(
            graph.has(i, Fact.ROW) and graph.has(i, Fact.DATA)
            for k, i in enumerate(node.inputs)
            if k not in positions
        )
        reduced = [
            o for o in node.outputs if graph.has(o, Fact.DATA) and not graph.has(o, Fact.ROW)
        ]
        if not reads_rows or not reduced:
            continue
        if isinstance(node.op, CAReduce) and isinstance(node.op.scalar_op, AND):
            # PyMC's parameter checks over the rows: a rank's check of its rows makes its
            # sum -inf whenever one device's would be.
            continue
        if sums_rows(node) and not any(graph.has(o, Fact.FEEDS_ROWS) for o in reduced):
            continue  # the term's own sum over the rows
        return (
            f"{node.op} reduces over the rows and the rows' terms read the result: each rank "
            f"would reduce its own rows"
        )
    return None


def _replaced(term: Variable, replace: dict) -> Variable:
    """``term`` with the variables of ``replace`` replaced, every node that reads a new
    input made again for its type. A symbolic op (``logsumexp``: a mixture's per-row
    log-density) is called again, which builds its graph for the new type; copying its
    node would fit the new input to the old type with a ``SpecifyShape`` of the whole
    rows' count, which no rank's share has."""
    new = dict(replace)
    for node in toposort([term]):
        inputs = [new.get(i, i) for i in node.inputs]
        if all(a is b for a, b in zip(inputs, node.inputs, strict=True)):
            continue
        if isinstance(node.op, SymbolicOp):
            outputs = node.op(*inputs, return_list=True)
        else:
            outputs = node.clone_with_new_inputs(inputs, strict=False).outputs
        new.update(zip(node.outputs, outputs, strict=True))
    return new.get(term, term)


def _value_length(model: Any, value: Variable, shapes: dict) -> int | None:
    """The leading length of a free variable's value (``shapes``: the model's evaluated
    shapes, filled the first time a length is not in the value's type)."""
    if not value.ndim:
        return None
    if value.type.shape[0] is not None:
        return value.type.shape[0]
    if not shapes:
        shapes.update(model.eval_rv_shapes())
    return int(shapes[value.name][0])


def _splits_with(split: Variable, row_inputs: list, values: list) -> bool:
    """Whether the term ``split`` factors over the rows with ``values`` split with them."""
    stand_ins = {v: v.type.clone(shape=(None, *v.type.shape[1:]))(v.name) for v in values}
    trial = _replaced(split, stand_ins)
    return _why_not_rows(RowGraph([trial.sum()], [*row_inputs, *stand_ins.values()])) is None


def _per_row_variables(model: Any, split: Variable, row_inputs: list, n_rows: int) -> list:
    """The free variables (their random variables) with one value per row that the split
    term ``split`` reads with the rows: the term would factor over the rows if their
    values were split with them, but the free variables go whole to every rank. A
    variable of the rows' length that the rows index (as many groups as rows) would mix
    the rows if split: it is not one, and stays whole. Tried: all of the rows' length
    together, then all but one (one of them indexed), then each alone."""
    shapes: dict = {}
    found = [
        v
        for v in graph_inputs([split])
        if v in model.value_vars and _value_length(model, v, shapes) == n_rows
    ]
    trials = [found] if len(found) > 1 else []
    trials += [[v for v in found if v is not left] for left in found if len(found) > 2]
    for values in trials:
        if _splits_with(split, row_inputs, values):
            return [model.values_to_rvs[v] for v in values]
    return [model.values_to_rvs[v] for v in found if _splits_with(split, row_inputs, [v])]


def split_terms(model: Any) -> ModelTerms:
    """Cut ``model``'s log-density (with the transforms' Jacobians) into row terms and
    once terms.

    Raises
    ------
    RowsNotSplittable
        If a term of the rows does not factor over them, naming the term.
    """
    from pymc.pytensorf import rewrite_pregrad

    n_rows = row_count(model)
    _refuse_rows_in_draws(model, n_rows)
    terms = model.logp(sum=False)
    rows: dict[Variable, RowSource] = {}
    others: dict[Variable, Variable] = {}
    row_terms, once_terms = [], []
    for index, term in enumerate(terms):
        # PyMC's own simplification (it runs it on the whole log-density): it drops the
        # broadcast of a term to its variable's static shape (the whole rows' count) and
        # folds what reads the data alone, so a statistic of the data stays the whole data's.
        term = rewrite_pregrad(pt.as_tensor(term))
        inputs = list(graph_inputs([term]))
        found = [v for v in inputs if _leading_length(v) == n_rows and v.ndim]
        if not found:
            once_terms.append(term)
            continue
        for v in found:
            if v not in rows:
                rows[v] = RowSource(v, v.type.clone(shape=(None, *v.type.shape[1:]))(v.name))
        for v in inputs:
            if isinstance(v, SharedVariable) and v not in rows and v not in others:
                if not isinstance(v.type, pt.random.type.RandomType):
                    others[v] = v.type(name=v.name)
        stand_ins = {v: rows[v].input for v in found} | {
            v: others[v] for v in inputs if v in others
        }
        split = _replaced(term, stand_ins)
        row_inputs = [rows[v].input for v in found]
        per_row = _per_row_variables(model, split, row_inputs, n_rows)
        if per_row:
            names = ", ".join(repr(rv.name) for rv in per_row)
            plural = ("s", "each of which has") if len(per_row) > 1 else ("", "which has")
            raise RowsNotSplittable(
                f"{_label(model, term, index)} reads the free variable{plural[0]} {names}, "
                f"{plural[1]} one value per row ({n_rows}): the free variables go whole to "
                f"every rank and the rows in shares, so a variable of the rows cannot be "
                f"split with them"
            )
        why = _why_not_rows(RowGraph([split.sum()], row_inputs))
        if why is not None:
            raise RowsNotSplittable(
                f"{_label(model, term, index)} does not factor over the rows: {why}"
            )
        row_terms.append(split)
    return ModelTerms(list(rows.values()), list(others.items()), row_terms, once_terms, n_rows)


__all__ = ["ModelTerms", "RowSource", "RowsNotSplittable", "row_count", "split_terms"]
