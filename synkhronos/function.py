"""``Function``: a PyTensor function run data-parallel on every rank.

Where a call goes: :meth:`Function.__call__` checks every argument in rank 0 (nothing runs
on any rank before that), builds a :class:`~synkhronos.callplan.CallPlan`, and
:meth:`Session.execute <synkhronos.launch.Session.execute>` sends it through the command
channel. Every rank, rank 0 included, runs its rows (:func:`synkhronos.rank.run_plan`),
and :mod:`synkhronos.outputs` brings the ranks' outputs together in rank 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable

from . import launch
from .callplan import CallPlan, RankRows
from .collectives import sliceable_lengths
from .compiled import is_jax
from .data import Data
from .distribute import GraphSpec
from .outputs import collect_outputs
from .partition import Selection, selection_length
from .protocol import Arg, Command
from .rank import run_plan
from .reduce import check_output_op


def _pairs(mapping, what: str) -> list[tuple]:
    if mapping is None:
        return []
    items = mapping.items() if hasattr(mapping, "items") else mapping
    pairs = [tuple(p) for p in items]
    if any(len(p) != 2 for p in pairs):
        raise TypeError(f"{what} must be a dict or a list of (variable, value) pairs")
    return pairs


def _parse_outputs(outputs) -> tuple[list, list, bool]:
    """Split ``outputs`` into variables and reduce ops; also say whether it was single."""
    def is_pair(o):
        return (isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], Variable)
                and not isinstance(o[1], Variable))

    if outputs is None:
        return [], [], False
    single = isinstance(outputs, Variable) or is_pair(outputs)
    entries = [outputs] if single else list(outputs)
    variables, ops = [], []
    for i, entry in enumerate(entries):
        var, op = entry if is_pair(entry) else (entry, "avg")
        if not isinstance(var, Variable):
            raise TypeError(f"output {i} is not a PyTensor variable: {var!r}")
        check_output_op(op, f"output {i} ({var})")
        variables.append(var)
        ops.append(op)
    return variables, ops, single


def _label(var, i: int, kind: str) -> str:
    return f"{kind} {i} ({var.name!r})" if var.name else f"{kind} {i}"


def _check_static_shape(var, shape, what: str, skip_first: bool) -> None:
    if len(shape) != var.ndim:
        raise TypeError(f"{what}: expected {var.ndim} dimensions, got {len(shape)}")
    static = getattr(var.type, "shape", None)
    if not static or static.count(None) == len(static):
        return
    for axis, (want, got) in enumerate(zip(static, shape, strict=True)):
        if want is not None and want != got and not (skip_first and axis == 0):
            raise ValueError(f"{what}: axis {axis} must have length {want}, got {got}")


def resolve_rows(spec, length: int | None, what: str) -> Selection:
    """A ``batch``/``batch_s`` value as a selection of rows (slice or int64 indices).

    ``length`` is the number of rows the selection refers to (None if unknown: then
    slices need explicit bounds). Raises ``TypeError``/``ValueError`` naming ``what``.
    """
    if isinstance(spec, (bool, np.bool_)):
        raise TypeError(f"{what} must be an int, a slice or an index array, not a bool")
    if isinstance(spec, (int, np.integer)):
        n = int(spec)
        if n < 0 or (length is not None and n > length):
            raise ValueError(f"{what}={n} is outside 0..{length}")
        return slice(0, n)
    if isinstance(spec, slice):
        if length is None:
            if spec.stop is None or (spec.start or 0) < 0 or spec.stop < 0:
                raise ValueError(f"{what}: give explicit non-negative slice bounds for "
                                 f"minibatch data")
            length = spec.stop
        for bound in (spec.start, spec.stop):
            if bound is not None and not -length <= bound <= length:
                raise ValueError(f"{what}: slice bound {bound} is outside the {length} rows")
        start, stop, step = spec.indices(length)
        if step == 1:
            return slice(start, max(start, stop))
        return np.arange(start, stop, step, dtype=np.int64)
    try:
        index = np.asarray(spec)
    except Exception as e:  # noqa: BLE001 - any failure means an unusable index
        raise TypeError(f"{what} must be an int, a slice or an index array") from e
    if index.dtype == bool:
        if index.ndim != 1 or (length is not None and len(index) != length):
            raise ValueError(f"{what}: a boolean mask must be 1-D with {length} entries")
        return np.flatnonzero(index).astype(np.int64)
    if index.ndim != 1 or (index.size and index.dtype.kind not in "iu"):
        raise TypeError(f"{what} must be a 1-D array of integer row indices, got dtype "
                        f"{index.dtype} and {index.ndim} dimensions")
    index = index.astype(np.int64)
    if index.size and index.min() < 0:
        raise ValueError(f"{what}: negative row indices are not supported")
    if index.size and length is not None and index.max() >= length:
        raise ValueError(f"{what}: row index {index.max()} is out of range for {length} rows")
    return index


def _first_row(sel: Selection) -> int:
    if isinstance(sel, slice):
        return sel.start
    return int(sel.min()) if len(sel) else 0


def _last_row(sel: Selection) -> int:
    if isinstance(sel, slice):
        return sel.stop - 1
    return int(sel.max()) if len(sel) else -1


class Function:
    """A synkhronos function: built by :func:`synkhronos.function`, called like PyTensor's.

    Attributes
    ----------
    name : str or None
        The name given at build time.
    inputs : list
        Scattered inputs, then broadcast inputs (the call's argument order).
    output_modes : list
        The reduce op of each output.
    """

    def __init__(self, session, inputs, outputs, bcast_inputs, updates, givens,
                 sliceable_shareds, name, mode):
        inputs, bcast_inputs = list(inputs), list(bcast_inputs)
        for i, var in enumerate(inputs + bcast_inputs):
            if not isinstance(var, Variable) or var.owner is not None:
                raise TypeError(f"input {i} must be a free PyTensor variable, got {var!r}")
            if isinstance(var, SharedVariable):
                raise TypeError(f"input {i} is a shared variable; shared variables are used "
                                f"implicitly (see sliceable_shareds)")
        for i, var in enumerate(inputs):
            if var.ndim < 1:
                raise TypeError(f"{_label(var, i, 'input')} is scattered along axis 0, so it "
                                f"needs at least one dimension; pass scalars in bcast_inputs")
        sliceable = list(sliceable_shareds)
        for i, var in enumerate(sliceable):
            if not isinstance(var, SharedVariable) or var.ndim < 1:
                raise TypeError(f"sliceable_shareds[{i}] must be a shared variable with at "
                                f"least one dimension")
        variables, ops, self._single = _parse_outputs(outputs)
        self._session = session
        self.name = name
        self.inputs = inputs + bcast_inputs
        self.output_modes = ops
        self._spec = GraphSpec(len(session.functions), name, inputs, bcast_inputs, variables,
                               ops, _pairs(updates, "updates"), _pairs(givens, "givens"),
                               sliceable, mode)
        self._all_outputs = np.arange(len(variables), dtype=np.int64)
        self._shipped = False
        self._scratch: dict[int, Data] = {}
        self._reference = None
        self._update_targets = {id(v) for v, _ in self._spec.updates}
        session.sliceable_ids.update(id(s) for s in sliceable)
        session.functions.append(self)

    def __repr__(self) -> str:
        return f"<synkhronos.Function {self.name or self._spec.fid}>"

    @property
    def _what(self) -> str:
        return f"synkhronos function {self.name!r}" if self.name else "synkhronos function"

    # ---- the reference -------------------------------------------------------------------
    def as_pytensor(self, *args):
        """Run the same graph in this process alone on whole numpy arrays (the reference).

        Arguments are the scattered inputs then the broadcast inputs, as for a call.
        Updates apply to rank 0's shared variables.
        """
        import pytensor

        spec = self._spec
        if self._reference is None:
            mode = spec.mode if spec.mode is not None else self._session.backend.mode
            if is_jax(mode):
                from . import jax_compat  # noqa: F401
            self._reference = pytensor.function(
                spec.inputs + spec.bcast_inputs, spec.outputs, updates=spec.updates,
                givens=spec.givens, mode=mode, on_unused_input="ignore")
        outs = self._reference(*[np.asarray(a) for a in args])
        outs = [np.asarray(o) for o in outs]
        return outs[0] if self._single else outs

    as_theano = as_pytensor

    def build_inputs(self, *args, force_cast: bool = False, oversize: float = 1.0) -> list[Data]:
        """Shared-memory ``Data`` objects holding ``args``, typed for this function's inputs."""
        if len(args) != len(self.inputs):
            raise TypeError(f"{self._what}: expected {len(self.inputs)} arguments, "
                            f"got {len(args)}")
        return [Data(a, dtype=v.dtype, force_cast=force_cast, oversize=oversize)
                for v, a in zip(self.inputs, args, strict=True)]

    # ---- a call --------------------------------------------------------------------------
    def __call__(self, *args, batch=None, batch_s=None, num_slices: int = 1,
                 output_subset: Sequence[int] | None = None):
        """Run data-parallel on every rank and return the reduced outputs.

        Parameters
        ----------
        *args : Data or array_like
            Scattered inputs (split along axis 0 across ranks), then broadcast inputs.
            Numpy arrays are copied into shared memory; ``Data`` is read in place.
        batch : int, slice or array of int, optional
            Rows of the scattered inputs to use (the first ``n``, a slice, or indices),
            split across ranks in order. For ``Data`` made with ``minibatch=True`` the rows
            are counted from the lowest selected row.
        batch_s : slice or array of int, or a list of them (one per rank), optional
            Rows of the sliceable shared variables each rank uses (default: all).
        num_slices : int
            Each rank computes in this many sequential chunks and combines them, which
            bounds memory; outputs equal the unsliced call's. ``updates`` run once per
            chunk, so updates meant to equal one unsliced step must accumulate (see
            ``extensions.updates.two_phase(..., n_rows=...)``).
        output_subset : sequence of int, optional
            Indices of the outputs to return (a list is returned).

        Returns
        -------
        The reduced outputs: one value for a single output, else a list.
        """
        session = launch.current()
        if session is not self._session:
            raise RuntimeError(f"{self._what} was built before the last synk.fork(); build it "
                               f"again")
        if not self._shipped:
            session.distribute()
        plan = self._plan(session, args, batch, batch_s, num_slices, output_subset)
        arrays = plan.encode() if session.n_ranks > 1 else ()
        weight, host, reduced = session.execute(
            Command.CALL, arrays, lambda: run_plan(session.state, plan, lambda d: d.data))
        if not self._update_targets.isdisjoint(session.sliceable_ids):
            session.forget_lengths()  # the rows batch_s may select have changed
        return collect_outputs(session, self._spec, plan.subset, weight, host, reduced,
                               output_subset is None and self._single)

    def _plan(self, session, args, batch, batch_s, num_slices, output_subset) -> CallPlan:
        spec = self._spec
        n_in, n_b = len(spec.inputs), len(spec.bcast_inputs)
        if len(args) != n_in + n_b:
            raise TypeError(f"{self._what}: expected {n_in + n_b} arguments ({n_in} scattered "
                            f"inputs, then {n_b} broadcast inputs), got {len(args)}")
        if isinstance(num_slices, bool) or not isinstance(num_slices, (int, np.integer)):
            raise TypeError(f"num_slices must be an int, got {num_slices!r}")
        if num_slices < 1:
            raise ValueError(f"num_slices must be at least 1, got {num_slices}")
        n_out = len(spec.outputs)
        if output_subset is None:
            subset = self._all_outputs
        else:
            subset = np.asarray(list(output_subset))
            if subset.ndim != 1 or (subset.size and (subset.dtype.kind not in "iu" or subset.min()
                                                     < 0 or subset.max() >= n_out)):
                raise ValueError(f"output_subset must list output indices in 0..{n_out - 1}")
            subset = subset.astype(np.int64)
        if num_slices > 1 and any(spec.output_ops[i] is None for i in subset):
            raise ValueError("outputs with reduce op None cannot be combined over num_slices > 1")
        scatter = [self._scattered(i, var, arg)
                   for i, (var, arg) in enumerate(zip(spec.inputs, args[:n_in], strict=True))]
        bcast, kinds = [], []
        for i, (var, arg) in enumerate(zip(spec.bcast_inputs, args[n_in:], strict=True)):
            what = f"{self._what}, {_label(var, i, 'broadcast input')}"
            if isinstance(arg, Data):
                if arg.dtype != var.dtype:
                    raise TypeError(f"{what}: Data has dtype {arg.dtype}, expected {var.dtype}")
                _check_static_shape(var, arg.shape, what, skip_first=False)
                bcast.append(arg)
                kinds.append(Arg.DATA)
            else:
                try:
                    value = np.asarray(var.type.filter(arg))
                except (TypeError, ValueError) as e:
                    raise type(e)(f"{what}: {e}") from None
                bcast.append(value)
                kinds.append(Arg.VALUE)
        offsets, rows = np.zeros(n_in, np.int64), None
        if n_in:
            sel = self._batch_rows(scatter, batch)
            for i, d in enumerate(scatter):
                offsets[i] = _first_row(sel) if d.minibatch else 0
                if _last_row(sel) - offsets[i] >= len(d):
                    raise ValueError(f"{self._what}: batch selects row {_last_row(sel)} but "
                                     f"{_label(spec.inputs[i], i, 'input')} has {len(d)} rows"
                                     + (" (minibatch: counted from the lowest selected row)"
                                        if d.minibatch else ""))
            rows = RankRows.split(sel, session.n_ranks)
        elif batch is not None:
            raise ValueError(f"{self._what} has no scattered inputs; batch does not apply")
        s_rows = None
        if batch_s is not None:
            s_rows = RankRows.per_rank(self._batch_s_rows(session, batch_s))
        return CallPlan(spec.fid, int(num_slices), subset, scatter, offsets,
                        rows, bcast, np.array(kinds, np.int64), s_rows)

    def _scattered(self, i: int, var, arg) -> Data:
        what = f"{self._what}, {_label(var, i, 'input')}"
        if isinstance(arg, Data):
            if arg.dtype != var.dtype:
                raise TypeError(f"{what}: Data has dtype {arg.dtype}, expected {var.dtype} "
                                f"(make it with dtype={var.dtype!s})")
            _check_static_shape(var, arg.shape, what, skip_first=True)
            return arg
        value = np.asarray(arg)
        if value.dtype != var.dtype and not np.can_cast(value.dtype, var.dtype, "same_kind"):
            raise TypeError(f"{what}: cannot use an array of dtype {value.dtype} for an input "
                            f"of dtype {var.dtype}")
        if value.dtype != var.dtype and not np.can_cast(value.dtype, var.dtype, "safe"):
            raise TypeError(f"{what}: casting {value.dtype} to {var.dtype} would lose "
                            f"precision; cast it first")
        _check_static_shape(var, value.shape, what, skip_first=True)
        scratch = self._scratch.get(i)
        if scratch is None:
            scratch = self._scratch[i] = Data(dtype=var.dtype, name=f"{var.name or i} scratch")
        scratch.set_value(value, oversize=1.25)
        return scratch

    def _batch_rows(self, scatter: list[Data], batch) -> Selection:
        full = [len(d) for d in scatter if not d.minibatch]
        if batch is None:
            lengths = {len(d) for d in scatter}
            if len(lengths) > 1:
                names = ", ".join(f"{_label(v, i, 'input')}: {len(d)}" for i, (v, d) in
                                  enumerate(zip(self._spec.inputs, scatter, strict=True)))
                raise ValueError(f"{self._what}: scattered inputs have different lengths "
                                 f"({names}); give batch= to select rows")
            sel = slice(0, lengths.pop())
        else:
            sel = resolve_rows(batch, min(full) if full else None, "batch")
        if selection_length(sel) == 0:
            raise ValueError(f"{self._what}: batch selects no rows")
        return sel

    def _batch_s_rows(self, session, batch_s) -> list[Selection]:
        if not self._spec.sliceable:
            raise ValueError(f"{self._what} has no sliceable_shareds; batch_s does not apply")
        lengths = sliceable_lengths(session, self._spec.sliceable)
        n = session.n_ranks
        per_rank = (isinstance(batch_s, (list, tuple)) and len(batch_s) == n and all(
            isinstance(b, (slice, list, tuple, np.ndarray)) for b in batch_s))
        specs = list(batch_s) if per_rank else [batch_s] * n
        return [resolve_rows(s, lengths[r], f"batch_s (rank {r})") for r, s in enumerate(specs)]


def function(inputs=(), outputs=None, bcast_inputs=(), updates=None, givens=None,
             sliceable_shareds=(), name: str | None = None, mode=None) -> Function:
    """Build a function that runs data-parallel on every rank.

    Takes what :func:`pytensor.function` takes, split by how each input is distributed.

    Parameters
    ----------
    inputs : list of Variable
        Inputs scattered along axis 0 across ranks (uneven splits are fine).
    outputs : Variable, (Variable, op), or a list of them
        ``op`` reduces the ranks' results: "avg" (default; weighted by each rank's rows,
        so a per-sample mean equals the single-device mean), "sum", "prod", "max", "min",
        "gather" (concatenate along axis 0 in data order) or None (list of every rank's).
    bcast_inputs : list of Variable
        Inputs every rank receives whole.
    updates : dict or list of (SharedVariable, Variable)
        Applied on every rank to its own copy; nothing is synchronised implicitly.
    givens : dict or list of pairs
        As for :func:`pytensor.function`.
    sliceable_shareds : list of SharedVariable
        Shared variables whose rows a call may select with ``batch_s``.
    name : str, optional
    mode : str or pytensor Mode, optional
        Compile mode; default: the backend's (PyTensor's default on CPU, "JAX" on GPU).

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
    return Function(launch.current(), inputs, outputs, bcast_inputs, updates, givens,
                    sliceable_shareds, name, mode)

