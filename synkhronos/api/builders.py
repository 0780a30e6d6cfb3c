"""``synk.function``: which kind of :class:`~synkhronos.Function` a call builds.

A function whose updates train becomes a
:class:`~synkhronos.api.training.TrainingFunction` (every rank gets one device's update);
any other, a plain :class:`~synkhronos.Function`.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace

import pytensor
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import ancestors
from pytensor.link.basic import Container
from pytensor.tensor.random.type import RandomType

from synkhronos.api import given_rows
from synkhronos.api.functions import BaseFunction, Function, FunctionParts
from synkhronos.api.planning import in_order, label
from synkhronos.api.selected import (
    GivenMinibatch,
    SelectedWhole,
    random_generators,
    shipped_apart,
)
from synkhronos.api.split.analysis import RowGraph
from synkhronos.api.split.keeping import IndexedPastRows, indexed_past_rows, mixing_said
from synkhronos.api.split.phases import PhaseSplit
from synkhronos.api.training import TrainingFunction, plan_split
from synkhronos.session import launch

_log = logging.getLogger(__name__)

# The original Synkhronos' names of its reduce ops.
_ORIGINAL_OPS = {
    "+": "sum",
    "add": "sum",
    "*": "prod",
    "product": "prod",
    "maximum": "max",
    "minimum": "min",
    "average": "avg",
    "mean": "avg",
}


#: The ops that return each rank's own result (the ranks' values are not joined).
_OWN = (None, "per_rank")


def _with_collect_modes(outputs, collect_modes, reduce_ops):
    """``outputs`` as ``(variable, op)`` pairs from the original's ``collect_modes`` and
    ``reduce_ops`` keywords (a single output stays single)."""
    single = isinstance(outputs, Variable)
    variables = [outputs] if single else list(outputs or ())
    if not all(isinstance(v, Variable) for v in variables):
        raise TypeError("collect_modes/reduce_ops name the ops of plain-variable outputs only")

    def per_output(value, keyword):
        values = list(value) if isinstance(value, list | tuple) else [value] * len(variables)
        if len(values) != len(variables):
            raise ValueError(f"{keyword} has {len(values)} entries for {len(variables)} outputs")
        return values

    modes = per_output("reduce" if collect_modes is None else collect_modes, "collect_modes")
    ops = per_output("avg" if reduce_ops is None else reduce_ops, "reduce_ops")
    pairs = [
        (var, _ORIGINAL_OPS.get(op, op) if mode == "reduce" else mode)
        for var, mode, op in zip(variables, modes, ops, strict=True)
    ]
    return pairs[0] if single else pairs


def _rows_gathered(parts: FunctionParts, split: PhaseSplit | None) -> None:
    """Give each output whose op is left to the default and whose leading axis is the rows
    op "gather" (``parts.ops``): the call then returns every rank's rows, in order, as one
    device's function returns them; averaging the ranks' rows would not. A training
    function's ``split`` knows its outputs' rows already (it analysed the graph with
    the givens made).

    ``ValueError`` for such an output whose rows are on another axis only: neither op
    gives one device's value, so the caller names one (or moves the rows first).
    """
    sources = [*parts.inputs, *parts.sliceable]
    asked = [
        k
        for k, (var, explicit) in enumerate(zip(parts.outputs, parts.explicit, strict=True))
        if not explicit and getattr(var.type, "ndim", 0) >= 1
    ]
    if split is None and sources and parts.outputs and not asked:
        _plain_rows_judged(parts, sources)  # judged, though no output's rows are asked
    if not sources or not asked:
        return
    if split is not None:
        row_axes = [split.row_axes[k] for k in asked]
    else:
        graph, outputs = _plain_rows_judged(parts, sources)
        row_axes = [graph.row_axes_of(outputs[k]) for k in asked]
    for k, axes in zip(asked, row_axes, strict=True):
        if 0 in axes:
            parts.ops[k] = "gather"
        elif axes:
            raise ValueError(
                f"{parts.what}: {label(parts.outputs[k], k, 'output')} has the rows on axis "
                f"{axes[0]}, not 0: no reduce op gives one device's value; put the rows "
                f'first (dimshuffle) for "gather", or name the op'
            )


def _given(outputs: list, givens: list) -> list:
    """``outputs`` with the givens made: the rows reach the graph through their values."""
    return graph_replace(outputs, dict(givens), strict=False) if givens else list(outputs)


def _plain_rows_judged(parts: FunctionParts, sources: list) -> tuple[RowGraph, list]:
    """The analysis of a plain function's outputs (:mod:`synkhronos.api.split`), and the
    outputs it analysed (the givens made), judged as a training function's: refused
    (:class:`IndexedPastRows`) where a rank would index its rows by indices of the whole
    batch's, warned where an output that the ranks reduce or gather mixes rows (each
    rank's value is then of its own rows only)."""
    outputs = _given(parts.outputs, parts.givens)
    # No creation stack for the analysis' nodes (as in training.plan_split).
    with pytensor.config.change_flags(traceback__limit=0):
        graph = RowGraph(outputs, sources)
    refused = indexed_past_rows(graph, graph.nodes)
    if refused:
        raise IndexedPastRows(f"{parts.what}: " + "; ".join(refused))
    joined = [graph.clone_of.get(o, o) for o, op in zip(outputs, parts.ops, strict=True)]
    reached = set(ancestors([o for o, op in zip(joined, parts.ops, strict=True) if op not in _OWN]))
    said = mixing_said(graph, [n for n in graph.nodes if n.outputs[0] in reached])
    if said:
        warnings.warn(
            f"{parts.what} returns values that mix rows, not as one device would: "
            + "; ".join(said),
            stacklevel=4,
        )
    return graph, outputs


class In(pytensor.In):
    """An input with Theano's ``value=``: the default a call takes where it omits the
    argument (``pytensor.In`` refuses a default; ``synkhronos.theano.In`` is this class).

    Parameters
    ----------
    variable : Variable
        The input.
    name : str, optional
        As for :class:`pytensor.In`.
    value : optional
        The default, cast to ``variable``'s type; a shared variable or container is
        ``pytensor.In``'s own ``value`` (an implicit input).
    **kwargs
        The rest of :class:`pytensor.In`'s arguments.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> level = pt.scalar("level")
    >>> float(In(level, value=0.2).default)
    0.2
    """

    def __init__(self, variable, name=None, value=None, **kwargs) -> None:
        implicit = isinstance(value, SharedVariable | Container)
        super().__init__(variable, name=name, value=value if implicit else None, **kwargs)
        self.default = None
        if value is not None and not implicit:
            self.default = variable.type.filter(value, allow_downcast=True)


class WithDefaults:
    """A compiled ``pytensor`` function whose inputs made with :class:`In` take their
    defaults where a call omits them (``synkhronos.theano.function``'s); its other
    attributes are the function's."""

    def __init__(self, compiled, inputs: list) -> None:
        self._compiled = compiled
        self._n = len(inputs)
        names = [getattr(e, "name", None) for e in inputs]
        self._positions = {name: k for k, name in enumerate(names) if name is not None}
        self._defaults = {
            k: e.default for k, e in enumerate(inputs) if getattr(e, "default", None) is not None
        }

    def __call__(self, *args, **kwargs):
        ordered, given, rest = in_order(args, kwargs, self._positions, self._defaults, self._n)
        if not all(given):  # pytensor's own error names what is missing
            return self._compiled(*args, **kwargs)
        return self._compiled(*ordered, **rest)

    def __getattr__(self, name: str):
        return getattr(self._compiled, name)


def without_in(entries) -> tuple[list, dict[int, object]]:
    """``entries`` with each ``pytensor.In`` replaced by its variable, and the defaults
    (:class:`In`'s ``value``) by position; ``TypeError`` for an ``In`` that a call
    could not take as one (an update, an implicit value)."""
    variables: list = []
    defaults: dict[int, object] = {}
    for k, entry in enumerate(entries):
        if isinstance(entry, pytensor.In):
            if entry.update is not None or entry.implicit:
                raise TypeError(
                    f"input {k} ({entry}): an In's update or implicit value has no "
                    f"synkhronos form; pass the variable, with value= at most"
                )
            default = getattr(entry, "default", None)
            if default is not None:
                defaults[k] = default
            entry = entry.variable
        variables.append(entry)
    return variables, defaults


def _broadcast_by_themselves(inputs, bcast_inputs) -> tuple[list, list]:
    """``inputs`` less those without the rows (scalars), and ``bcast_inputs`` with them
    first: every rank receives a scalar whole. The call's argument order stays the
    program's, so a scalar may only follow the inputs with the rows (``TypeError``)."""
    inputs = list(inputs)

    def without_rows(var) -> bool:
        return isinstance(var, Variable) and getattr(var.type, "ndim", None) == 0

    first = next((k for k, v in enumerate(inputs) if without_rows(v)), len(inputs))
    after = [k for k in range(first, len(inputs)) if not without_rows(inputs[k])]
    if after:
        raise TypeError(
            f"{label(inputs[first], first, 'input')} is a scalar, which every rank receives "
            f"whole, listed before {label(inputs[after[0]], after[0], 'input')}, whose "
            f"rows are split over the ranks: a call takes the inputs with the rows first, "
            f"so list the scalars after them"
        )
    return inputs[:first], inputs[first:] + list(bcast_inputs or ())


def _drawn_alike(parts: FunctionParts, session) -> None:
    """Where no input has the rows and an update writes more than the generators, every
    rank computes the whole call as one device: its random generators draw with rank
    0's state on every rank (else each rank would draw its own numbers, apply its own
    update, and the ranks would end apart). Warns of a generator an earlier function
    shipped already: each rank has its own state. (Draws that only the outputs read
    stay each rank's own: ``"per_rank"`` samples.)"""
    if parts.inputs or parts.sliceable:
        return
    if all(isinstance(v.type, RandomType) for v, _ in parts.updates):
        return
    generators = random_generators(parts)
    parts.same_on_every_rank = generators
    shipped = shipped_apart(session, generators)
    if shipped:
        warnings.warn(
            f"{parts.what} computes the whole call on every rank, but the random "
            f"generator(s) {', '.join(map(str, shipped))} were shipped with an earlier "
            f"function, so each rank draws its own numbers and the ranks will differ",
            stacklevel=3,
        )


def _selected_split(parts: FunctionParts, selected: tuple) -> tuple | None:
    """The split of ``parts`` whose givens select the minibatch from shared data by
    broadcast inputs (``selected``: :func:`synkhronos.api.given_rows.select`'s), with the
    selection; None where the split of the selected rows cannot be exact (then every
    rank computes the whole minibatch, which is one device's answer)."""
    givens, rows = selected
    made = graph_replace([*parts.outputs, *(u for _, u in parts.updates)], givens, strict=False)
    reshapes = given_rows.batch_size_reshapes(made, rows, parts.bcast_inputs)
    if reshapes:
        warnings.warn(
            f"{parts.what}: its givens select the minibatch, but {reshapes[0].op} "
            f"reshapes it to the shape {reshapes[0].inputs[1].data.tolist()}, with the "
            f"minibatch's length written in, which no rank's share of the rows has: every "
            f"rank computes the whole minibatch (one device's answer, no speed-up); write "
            f"-1 (or x.shape[0]) there for the minibatch to be split over the ranks",
            stacklevel=3,
        )
        return None
    split_parts = replace(parts, inputs=[rows.hidden], givens=givens)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        planned = plan_split(split_parts)
    if planned is None or planned[1].inexact:
        reasons = [str(w.message) for w in caught] + list(planned[1].inexact if planned else ())
        _log.info(
            "%s: its givens' minibatch is computed whole on every rank, not split: %s",
            parts.what,
            "; ".join(reasons) or "no update depends on it",
        )
        return None
    return (*planned, GivenMinibatch(rows, _whole(parts, selected)))


def _whole(parts: FunctionParts, selected: tuple) -> FunctionParts:
    """``parts`` computing the selected minibatch whole on every rank: the selected rows'
    numbers a first broadcast input (JAX slices by static bounds only, but gathers rows
    by a traced index vector)."""
    givens, rows = selected
    return replace(parts, bcast_inputs=[rows.hidden, *parts.bcast_inputs], givens=givens)


def _built(session, parts: FunctionParts, local_updates: bool) -> BaseFunction:
    """The function ``parts`` make: a training function where its updates train (its
    givens' minibatch split where they select one), a :class:`SelectedWhole` where its
    givens select a minibatch that is not split, else a plain ``Function``."""
    planned, split_selected, selected = None, None, None
    if parts.givens and not parts.inputs:
        selected = given_rows.select(parts.givens, parts.bcast_inputs, parts.sliceable)
    if not local_updates and all(op == "avg" for op in parts.update_ops):
        split_selected = _selected_split(parts, selected) if selected else None
        planned = split_selected[:3] if split_selected else plan_split(parts)
    built: BaseFunction
    if planned is None:
        _rows_gathered(parts, None)
        if selected is not None:  # every rank's outputs are rank 0's, which it keeps
            whole = replace(
                _whole(parts, selected),
                ops=[
                    op if given else None
                    for op, given in zip(parts.ops, parts.explicit, strict=True)
                ],
            )
            _drawn_alike(whole, session)
            built = SelectedWhole(session, parts, whole, selected[1])
        else:
            _drawn_alike(parts, session)
            built = Function(session, parts)
    else:
        parts, split, all_updates = planned  # the givens made in parts' graphs
        _rows_gathered(parts, split)
        given = split_selected[3] if split_selected else None
        built = TrainingFunction(session, parts, split, all_updates, given)
    return built


def function(
    inputs=(),
    outputs=None,
    bcast_inputs=None,
    updates=None,
    givens=None,
    sliceable_shareds=None,
    name: str | None = None,
    mode=None,
    local_updates: bool = False,
    collect_modes=None,
    reduce_ops=None,
    **kwargs,
) -> BaseFunction:
    """Build a function that runs data-parallel on every rank.

    Takes what :func:`pytensor.function` takes, split by how each input is distributed.

    Parameters
    ----------
    inputs : list of Variable or pytensor.In
        Inputs scattered along axis 0 across ranks (uneven splits are fine); scalars,
        listed after them, are broadcast (every rank receives them whole). An
        :class:`In` input's ``value`` is the default a call takes where it omits the
        argument.
    outputs : Variable, (Variable, op), or a list of them
        ``op`` reduces the ranks' results: "avg" (weighted by each rank's rows, so a
        per-sample mean equals the single-device mean; the default, but for an output
        whose leading axis is the rows, which takes "gather": every rank's rows come
        back whole, in order, as one device returns them), "sum", "prod", "max", "min",
        "gather" (concatenate along axis 0 in data order), None (rank 0's own result;
        the workers send nothing) or "per_rank" (the list of every rank's result). The
        ``c_`` forms ("c_avg", "c_sum", "c_prod", "c_max", "c_min", "c_gather") give the
        same result reduced from the ranks' replies on the host, never by the
        communicator (an XLA program on GPU ranks).
    bcast_inputs : list of Variable
        Inputs every rank receives whole.
    updates : dict, or list of (SharedVariable, Variable) or (SharedVariable, Variable, op)
        As for :func:`pytensor.function`. Updates that train — they depend on the rows
        and write a variable the rows' computation reads, as
        ``lasagne.updates.adam(loss, params)`` or ``p - lr * grad(loss, p)`` do — give
        every rank one device's update of the whole batch: the function runs as a
        :class:`~synkhronos.api.training.TrainingFunction` (one all-reduce of the
        gradients per call; the ranks stay bit-identical). Its outputs whose op is left
        to the default are then computed as one device would (a mean or a sum over rows
        alike). A warning names what cannot be made exact (batch statistics, random
        draws per row, a reduction over rows that is neither a sum, a maximum nor a
        minimum). Other updates are applied on every rank to its own copy. With
        ``num_slices > 1`` every slice computes from the same values, and the update's
        values are combined over the slices with ``op`` ("avg", row-weighted, for
        pairs; "sum", "prod", "max", "min") and applied once at the end of the call.
    givens : dict or list of pairs
        As for :func:`pytensor.function`. Updates that train are split on the graph the
        givens make, so the rows may reach it through a given's value only
        (``givens={x: x_in}``, or ``{x: x_all}`` with ``x_all`` sliceable). Givens that
        select rows of shared variables by broadcast inputs (``x_all[index * B:(index +
        1) * B]``, ``x_all[order[...]]``) with updates that train: each rank computes its
        share of the selected rows (:mod:`synkhronos.api.given_rows`); a selection of
        fewer rows than ranks is computed whole on every rank.
    sliceable_shareds : list of SharedVariable
        Shared variables whose rows a call may select with ``batch_s``.
    name : str, optional
    mode : str or pytensor Mode, optional
        Compile mode; default: the backend's (PyTensor's default on CPU, "JAX" on GPU).
    collect_modes, reduce_ops : str, None, or a list of them (one per output), optional
        The original Synkhronos' spelling of the outputs' ops, for plain-variable
        ``outputs``: a mode is an op above, or "reduce" (the default when only
        ``reduce_ops`` is given), which takes the output's ``reduce_ops`` entry (default
        "avg"; the original's names "+", "add", "*", "product", "maximum", "minimum",
        "average", "mean" are accepted).
    local_updates : bool
        Apply every update on each rank to its own copy, as the original Synkhronos
        did, even updates that train (then the ranks' copies differ until a collective
        makes them agree).
    **kwargs
        Passed to every underlying :func:`pytensor.function` (``allow_input_downcast``,
        ``on_unused_input``, ...).

    Returns
    -------
    BaseFunction
        A :class:`~synkhronos.Function`, or a
        :class:`~synkhronos.api.training.TrainingFunction` where the updates train (no
        ``Function``: both are ``synkhronos.BaseFunction``).

    Raises
    ------
    TypeError
        If the workers could not unpickle the graph (an Op holding a lambda, a class
        defined in ``__main__`` or in a module a fresh interpreter cannot import), naming
        the Op; or if an input or output is not a tensor of a dtype that can travel.
    ValueError
        If an output whose op is left to the default has the rows on an axis other than
        the first only (name its op, or put the rows first); if an output or broadcast
        input has more than 8 dimensions, or a call's message or
        reply would hold more than 512 arrays.
    Exception
        Whatever :func:`pytensor.function` raises for the graph: rank 0 builds its copy
        here, before anything is shipped (without rewriting or compiling it, except in JAX
        mode; every rank compiles at the function's first call). After any of these the
        session is as it was.

    Examples
    --------
    >>> import numpy as np, pytensor.tensor as pt, synkhronos as synk
    >>> n = synk.fork(2, backend="cpu")
    >>> x = pt.matrix("x")
    >>> f = synk.function([x], [x.mean(), (x.sum(), "sum"), (x.max(axis=1), "gather")])
    >>> mean, total, row_max = f(np.arange(10.0).reshape(5, 2))
    >>> float(mean), float(total), row_max.tolist()
    (4.5, 45.0, [1.0, 3.0, 5.0, 7.0, 9.0])
    >>> synk.close()
    """
    if collect_modes is not None or reduce_ops is not None:
        outputs = _with_collect_modes(outputs, collect_modes, reduce_ops)
    inputs = list(inputs)
    every, defaults = without_in([*inputs, *(bcast_inputs or ())])
    inputs, bcast_inputs = _broadcast_by_themselves(every[: len(inputs)], every[len(inputs) :])
    parts = FunctionParts.parse(
        inputs=inputs,
        outputs=outputs,
        bcast_inputs=bcast_inputs,
        updates=updates,
        givens=givens,
        sliceable=sliceable_shareds,
        name=name,
        mode=mode,
        function_kwargs=dict(kwargs),
    )
    built = _built(launch.current(), parts, local_updates)
    if defaults:
        built._defaults = defaults
    return built


__all__ = ["In", "WithDefaults", "function", "without_in"]
