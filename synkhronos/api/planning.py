"""A call's options, its arguments checked, its rows chosen: its plan, built in rank 0.

:class:`CallOptions` holds what a call takes besides its arguments, the same for every
kind of call (a :class:`~synkhronos.api.functions.Function`'s, a training function's, a
chain's): each ``__call__`` takes it from its keyword arguments
(:meth:`CallOptions.split`) and hands it, whole, to the plan. A :class:`Planner` (one per
:class:`~synkhronos.api.functions.Function`) checks a call's arguments and options and
builds its :class:`~synkhronos.transport.callplan.CallPlan`: nothing in it runs on any
rank, and it reads the session only through :class:`Ranks`, so that
``tests/test_planning.py`` tests it without forking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from synkhronos.api.collectives import checked_value
from synkhronos.rank.graphs import GraphSpec
from synkhronos.transport.callplan import CallPlan, RankRows
from synkhronos.transport.nodes import World
from synkhronos.transport.partition import Selection, resolve_rows, selection_length, split_bounds
from synkhronos.transport.protocol import Arg
from synkhronos.transport.shared_arrays import Data


@dataclass(frozen=True, slots=True)
class CallOptions:
    """The options of one call, as :meth:`Function.__call__
    <synkhronos.api.functions.Function.__call__>` and every other call take them by name.

    Attributes
    ----------
    batch : int, slice or array of int, optional
        Rows of the scattered inputs to use (the first ``n``, a slice, or indices),
        split across ranks in order. ``Data`` made with ``minibatch=True`` is read by
        position: its row k pairs with the k-th selected row.
    batch_s : slice or array of int, or a list of them (one per rank), optional
        Rows of the sliceable shared variables each rank uses (default: all).
    num_slices : int
        Each rank computes in this many sequential chunks and combines them, which
        bounds memory; outputs equal the unsliced call's. Every chunk computes from the
        same shared values; each update's values are combined over the chunks with its op
        (see :func:`synkhronos.function`) and applied once, at the end.
    output_subset : sequence of int, optional
        Indices of the outputs to return (one index: the value, else a list).
    """

    batch: Any = None
    batch_s: Any = None
    num_slices: int = 1
    output_subset: Sequence[int] | None = None

    @classmethod
    def split(cls, kwargs: dict) -> tuple[CallOptions, dict]:
        """The options among a call's keyword arguments, and the rest (inputs by name)."""
        given = {k: kwargs[k] for k in _NAMES if k in kwargs}
        if not given:
            return PLAIN, kwargs
        return cls(**given), {k: v for k, v in kwargs.items() if k not in given}

    @property
    def plain(self) -> bool:
        """Whether the call has no option: every one its default (a call like the last one
        may then reuse what it kept)."""
        return self is PLAIN or all(
            _is_default(getattr(self, f.name), f.default) for f in fields(self)
        )


def _is_default(value, default) -> bool:
    # An int option given as an equal int (num_slices=1) is the default; True is not 1.
    return value is default or (
        type(default) is int
        and isinstance(value, (int, np.integer))
        and not isinstance(value, bool)
        and value == default
    )


_NAMES = tuple(f.name for f in fields(CallOptions))
PLAIN = CallOptions()
"""A call without options."""


def label(var, i: int, kind: str) -> str:
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


def single_result(single: bool, output_subset, subset) -> bool:
    """Whether a call returns one value, not a list: where it gives ``output_subset``,
    whether that names one output (``subset``: those it names, as a list or an array);
    else ``single``, whether the function was built with one output."""
    return single if output_subset is None else len(subset) == 1


def in_order(
    args: tuple, kwargs: dict, positions: dict[str, int], defaults: dict[int, Any], n: int
) -> tuple[list, list[bool], dict]:
    """A call's ``n`` arguments in its inputs' order: ``args``, then those ``kwargs`` give
    by name (``positions``: each named input's position), then ``defaults`` (by position)
    where neither gives one. Returns them, which positions have one, and the ``kwargs``
    that place none (naming no input, or one given already). Serves
    :class:`~synkhronos.api.functions.BaseFunction` and ``synkhronos.theano.function``'s
    ``In`` defaults alike."""
    ordered = list(args) + [None] * (n - len(args))
    given = [True] * len(args) + [False] * (n - len(args))
    rest = {}
    for name, value in kwargs.items():
        i = positions.get(name)
        if i is None or given[i]:
            rest[name] = value
        else:
            ordered[i], given[i] = value, True
    for i, value in defaults.items():
        if not given[i]:
            ordered[i], given[i] = value, True
    return ordered, given, rest


def check_arguments(what: str, spec: GraphSpec, args) -> None:
    """``TypeError`` unless ``args`` holds one argument per input of ``spec``."""
    n_in, n_b = len(spec.inputs), len(spec.bcast_inputs)
    if len(args) != n_in + n_b:
        raise TypeError(
            f"{what}: expected {n_in + n_b} arguments ({n_in} scattered "
            f"inputs, then {n_b} broadcast inputs), got {len(args)}"
        )


def _last_row(sel: Selection) -> int:
    if isinstance(sel, slice):
        return sel.stop - 1
    return int(sel.max()) if len(sel) else -1


@dataclass(frozen=True)
class Ranks:
    """What a plan needs of the ranks it runs on.

    Attributes
    ----------
    n_ranks : int
        This node's ranks.
    world : World
        Where this node sits among the nodes (:func:`synkhronos.transport.nodes.current`).
    lengths : callable
        Per global rank, the rows that sliceable shared variables have in common
        (:func:`~synkhronos.api.collectives.sliceable_lengths`).
    """

    n_ranks: int
    world: World
    lengths: Callable[[list], list[int]]


def check_num_slices(num_slices) -> int:
    """``num_slices``, refused unless an int of at least 1 (a bool is not one)."""
    if isinstance(num_slices, bool) or not isinstance(num_slices, (int, np.integer)):
        raise TypeError(f"num_slices must be an int, got {num_slices!r}")
    if num_slices < 1:
        raise ValueError(f"num_slices must be at least 1, got {num_slices}")
    return int(num_slices)


class Planner:
    """The checks and the plans of one function's calls (rank 0).

    Parameters
    ----------
    spec : GraphSpec
        The function's graph.
    what : str
        How errors name the function.
    downcast : bool
        Whether the function was built with ``allow_input_downcast``.
    counts_rows : bool
        Whether its last broadcast input is the call's whole row count, which the plan
        writes (a training function's row phase: ``PhaseSplit.rows``).

    Attributes
    ----------
    scratch : dict
        Per scattered input, the ``Data`` its numpy arguments are copied into (the same
        Data at every call: a call like the last one then reuses its plan).
    """

    def __init__(self, spec: GraphSpec, what: str, downcast: bool, counts_rows: bool) -> None:
        self.spec, self.what, self.downcast, self.counts_rows = spec, what, downcast, counts_rows
        self.n_args = len(spec.inputs) + len(spec.bcast_inputs)
        self.scratch: dict[int, Data] = {}
        self.in_dtypes = [np.dtype(v.dtype) for v in spec.inputs]
        self.all_outputs = np.arange(len(spec.outputs), dtype=np.int64)

    def in_data(self, args: tuple) -> tuple:
        """``args`` with the scattered inputs' arrays, and Data cast by
        allow_input_downcast, in the scratch Data."""
        for i, dtype in enumerate(self.in_dtypes):
            a = args[i]
            if not (isinstance(a, Data) and a.dtype == dtype):
                args = (*args[:i], self._scattered(i, self.spec.inputs[i], a), *args[i + 1 :])
        return args

    def reusable(self, args) -> bool:
        """Whether a call like this one may reuse its plan (a kept call): its arguments
        all ``Data`` (scattered numpy arrays are in the scratch Data by then); not where
        a call's plan depends on more (a broadcast input's value, the lengths of sliceable
        shared variables) or where its plan writes a broadcast input (the row count of a
        training function's row phase). A broadcast Data of another dtype travels as its
        values (allow_input_downcast): no reuse either."""
        spec = self.spec
        if (
            spec.sliceable
            or self.counts_rows
            or len(args) != self.n_args
            or not all(isinstance(a, Data) for a in args)
        ):
            return False
        bcast = args[len(spec.inputs) :]
        return all(a.dtype == v.dtype for a, v in zip(bcast, spec.bcast_inputs, strict=True))

    def plan(
        self, args, options: CallOptions, ranks: Ranks, every_rank_rows: bool = False
    ) -> CallPlan:
        """The call's plan, every argument checked; with ``every_rank_rows``, a call that
        gives some rank (of any node) no rows is refused too."""
        spec = self.spec
        n_in = len(spec.inputs)
        check_arguments(self.what, spec, args)
        num_slices = check_num_slices(options.num_slices)
        subset = self._subset(options.output_subset, num_slices)
        scatter = [
            self._scattered(i, var, arg)
            for i, (var, arg) in enumerate(zip(spec.inputs, args[:n_in], strict=True))
        ]
        bcast, kinds = self.broadcast(args[n_in:])
        rows, s_rows, total = self._rows(ranks, scatter, options, every_rank_rows)
        if self.counts_rows:  # the plan carries the count (PhaseSplit.rows)
            bcast[-1], kinds[-1] = np.zeros(total, np.int8), Arg.ROWS
        return CallPlan(
            spec.fid,
            int(num_slices),
            subset,
            scatter,
            np.array([d.minibatch for d in scatter], np.int64),
            rows,
            bcast,
            np.array(kinds, np.int64),
            s_rows,
        )

    def _subset(self, output_subset, num_slices) -> np.ndarray:
        """The indices of the outputs a call computes, checked."""
        spec = self.spec
        n_out = len(spec.outputs)
        if output_subset is None:
            subset = self.all_outputs
        else:
            subset = np.asarray(list(output_subset))
            if subset.ndim != 1 or (
                subset.size
                and (subset.dtype.kind not in "iu" or np.min(subset) < 0 or np.max(subset) >= n_out)
            ):
                raise ValueError(f"output_subset must list output indices in 0..{n_out - 1}")
            subset = subset.astype(np.int64)
        if num_slices > 1 and any(spec.output_ops[i] in (None, "per_rank") for i in subset):
            raise ValueError(
                "outputs with reduce op None or 'per_rank' cannot be combined over num_slices > 1"
            )
        return subset

    def broadcast(self, args) -> tuple[list[Data | np.ndarray], list[Arg]]:
        """The broadcast inputs' values, checked, and how each travels."""
        bcast: list[Data | np.ndarray] = []
        kinds = []
        for i, (var, arg) in enumerate(zip(self.spec.bcast_inputs, args, strict=True)):
            what = f"{self.what}, {label(var, i, 'broadcast input')}"
            if isinstance(arg, Data) and (arg.dtype == var.dtype or not self.downcast):
                if arg.dtype != var.dtype:
                    raise TypeError(f"{what}: Data has dtype {arg.dtype}, expected {var.dtype}")
                _check_static_shape(var, arg.shape, what, skip_first=False)
                bcast.append(arg)
                kinds.append(Arg.DATA)
            else:  # a value (a Data of another dtype, allow_input_downcast: its values)
                arg = arg.data if isinstance(arg, Data) else arg
                bcast.append(checked_value(var, arg, what, self.downcast or None))
                kinds.append(Arg.VALUE)
        return bcast, kinds

    def _rows(
        self, ranks: Ranks, scatter: list[Data], options: CallOptions, every_rank_rows: bool
    ) -> tuple[RankRows | None, RankRows | None, int]:
        """Each rank's rows of the scattered inputs and of the sliceable shared variables,
        and the call's rows on every rank of every node."""
        spec = self.spec
        batch, batch_s = options.batch, options.batch_s
        rows = None
        total = 0
        if scatter:
            whole = self._batch_rows(scatter, batch)
            total = selection_length(whole)
            n_global = ranks.world.n_global  # one rank has the rows, at least one
            if every_rank_rows and n_global > 1:  # ranks take split_bounds shares of them
                self._refuse_empty_ranks("batch", split_bounds(total, n_global))
            sel = ranks.world.node_share(whole)
            self._check_rows_exist(scatter, sel)
            rows = RankRows.split(sel, ranks.n_ranks)
        elif batch is not None:
            raise ValueError(f"{self.what} has no scattered inputs; batch does not apply")
        s_rows = None
        if batch_s is not None:
            everyone = self._global_batch_s_rows(ranks, batch_s)
            total = total or sum(selection_length(s) for s in everyone)
            if every_rank_rows and not scatter:
                self._refuse_empty_ranks(
                    "batch_s", [0, *np.cumsum([selection_length(s) for s in everyone])]
                )
            world = ranks.world
            s_rows = RankRows.per_rank(everyone[world.offset : world.offset + ranks.n_ranks])
        elif spec.sliceable and not scatter and (every_rank_rows or self.counts_rows):
            lengths = ranks.lengths(spec.sliceable)  # each rank takes all its rows
            total = int(np.sum(lengths))
            if every_rank_rows:
                self._refuse_empty_ranks("the sliceable shared data", [0, *np.cumsum(lengths)])
        return rows, s_rows, total

    def _check_rows_exist(self, scatter: list[Data], sel: Selection) -> None:
        """``ValueError`` unless every scattered input holds the rows ``sel`` selects."""
        for i, d in enumerate(scatter):
            if d.minibatch and selection_length(sel) > len(d):
                raise ValueError(
                    f"{self.what}: batch selects {selection_length(sel)} "
                    f"rows but {label(self.spec.inputs[i], i, 'input')} (minibatch "
                    f"data, read by position) has {len(d)}"
                )
            if not d.minibatch and _last_row(sel) >= len(d):
                raise ValueError(
                    f"{self.what}: batch selects row {_last_row(sel)} but "
                    f"{label(self.spec.inputs[i], i, 'input')} has {len(d)} rows"
                )

    def _scattered(self, i: int, var, arg) -> Data:
        what = f"{self.what}, {label(var, i, 'input')}"
        if not isinstance(arg, Data):
            return self._in_scratch(i, arg)
        if arg.dtype != var.dtype:
            if not self.downcast:
                raise TypeError(
                    f"{what}: Data has dtype {arg.dtype}, expected {var.dtype} "
                    f"(make it with dtype={var.dtype!s}, or build the function with "
                    f"allow_input_downcast=True)"
                )
            # allow_input_downcast: cast into the input's scratch, as an array is
            return self._in_scratch(i, arg.data, minibatch=arg.minibatch)
        _check_static_shape(var, arg.shape, what, skip_first=True)
        return arg

    def _in_scratch(self, i: int, arg, minibatch: bool = False) -> Data:
        """Scattered input ``i``'s array, checked, in this function's scratch ``Data`` for
        that input (the same Data at every call: a call like the last one then reuses
        its plan); ``minibatch``: read by position, as the Data it was cast from."""
        var = self.spec.inputs[i]
        value = np.asarray(arg)
        what = f"{self.what}, {label(var, i, 'input')}"
        if value.dtype != var.dtype:
            if not np.can_cast(value.dtype, var.dtype, "same_kind"):
                raise TypeError(
                    f"{what}: cannot use an array of dtype {value.dtype} for an input "
                    f"of dtype {var.dtype}"
                )
            if not self.downcast and not np.can_cast(value.dtype, var.dtype, "safe"):
                raise TypeError(
                    f"{what}: casting {value.dtype} to {var.dtype} would lose precision; "
                    f"cast it first"
                )
        _check_static_shape(var, value.shape, what, skip_first=True)
        scratch = self.scratch.get(i)
        if scratch is None:
            scratch = self.scratch[i] = Data(var=var, name=f"{var.name or i} scratch")
        scratch.set_value(value, force_cast=self.downcast, oversize=1.25)
        scratch.minibatch = minibatch  # read by position as the Data it was cast from
        return scratch

    def _batch_rows(self, scatter: list[Data], batch) -> Selection:
        full = [len(d) for d in scatter if not d.minibatch]
        sel: Selection
        if batch is None:
            # Minibatch data is read by position: it may be longer (checked in Function.plan).
            lengths = {len(d) for d in scatter if not d.minibatch} or {len(d) for d in scatter}
            if len(lengths) > 1:
                names = ", ".join(
                    f"{label(v, i, 'input')}: {len(d)}"
                    for i, (v, d) in enumerate(zip(self.spec.inputs, scatter, strict=True))
                )
                raise ValueError(
                    f"{self.what}: scattered inputs have different lengths "
                    f"({names}); give batch= to select rows"
                )
            sel = slice(0, lengths.pop())
        else:
            sel = resolve_rows(batch, min(full) if full else None, "batch")
        if selection_length(sel) == 0:
            raise ValueError(f"{self.what}: batch selects no rows")
        return sel

    def _refuse_empty_ranks(self, what: str, bounds) -> None:
        """``ValueError`` if a global rank's share ``bounds[r]:bounds[r + 1]`` is empty (the
        same answer on every node)."""
        counts = np.diff(np.asarray(bounds, np.int64))
        empty = np.flatnonzero(counts == 0).tolist()
        if empty:
            raise ValueError(
                f"{self.what}: {what} gives {int(counts.sum())} row(s) to {len(counts)} "
                f"ranks, none to rank(s) {empty}; in this chain every rank needs at least one "
                f"row (a later step reads what this function writes): drop or pad the last "
                f"short batch"
            )

    def _global_batch_s_rows(self, ranks: Ranks, batch_s) -> list[Selection]:
        """Every global rank's rows of the sliceable shared variables for ``batch_s``."""
        if not self.spec.sliceable:
            raise ValueError(f"{self.what} has no sliceable_shareds; batch_s does not apply")
        lengths = ranks.lengths(self.spec.sliceable)  # per global rank
        world = ranks.world
        n = world.n_global
        per_rank = (
            isinstance(batch_s, (list, tuple))
            and len(batch_s) == n
            and all(isinstance(b, (slice, list, tuple, np.ndarray)) for b in batch_s)
        )
        specs = list(batch_s) if per_rank else [batch_s] * n
        return [resolve_rows(specs[r], lengths[r], f"batch_s (rank {r})") for r in range(n)]
