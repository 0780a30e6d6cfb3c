"""``Function``: a PyTensor function run data-parallel on every rank.

Where a call goes: :meth:`Function.__call__` checks every argument in rank 0 (nothing runs
on any rank before that), builds a :class:`~synkhronos.transport.callplan.CallPlan`, and
:meth:`Session.execute <synkhronos.session.launch.Session.execute>` sends it through the command
channel. Every rank, rank 0 included, runs its rows (:func:`synkhronos.rank.state.run_plan`),
and :mod:`synkhronos.rank.outputs` brings the ranks' outputs together in rank 0. A call
like the last one (the same ``Data``, or arrays of the same shapes, and no option) skips
most checks and the plan: it reuses the last call's (:class:`_LastCall`).
"""

from __future__ import annotations

import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import graph_inputs

from synkhronos.api import mode_choice
from synkhronos.api.collectives import (
    check_tensor,
    checked_value,
    send_changes,
    sliceable_lengths,
    travels,
)
from synkhronos.rank.compiled import is_jax
from synkhronos.rank.graphs import GraphSpec, check_shippable, with_default_updates
from synkhronos.rank.outputs import collect_outputs, own_outputs
from synkhronos.rank.rewritten_graphs import graph_key, mark_checked, was_checked
from synkhronos.rank.state import run_piece, run_share_of, share_of
from synkhronos.session import launch
from synkhronos.transport import trace
from synkhronos.transport.callplan import CallPlan, RankRows
from synkhronos.transport.channel import check_count
from synkhronos.transport.nodes import abort_nodes
from synkhronos.transport.nodes import current as current_nodes
from synkhronos.transport.partition import Selection, resolve_rows, selection_length, split_bounds
from synkhronos.transport.protocol import Arg, Command
from synkhronos.transport.reduction import check_output_op, check_update_op
from synkhronos.transport.shared_arrays import Data, released_ids


def pairs_of(mapping, what: str) -> list[tuple]:
    if mapping is None:
        return []
    items = mapping.items() if hasattr(mapping, "items") else mapping
    pairs = [tuple(p) for p in items]
    if any(len(p) != 2 for p in pairs):
        raise TypeError(f"{what} must be a dict or a list of (variable, value) pairs")
    return pairs


def update_pairs(updates) -> tuple[list[tuple], list]:
    """``updates`` (a dict, or pairs and ``(var, update, op)`` triples) as pairs and the op
    combining each over slices ("avg" for pairs)."""
    if updates is None:
        return [], []
    items = updates.items() if hasattr(updates, "items") else updates
    pairs, ops = [], []
    for i, item in enumerate(items):
        item = tuple(item)
        if len(item) not in (2, 3):
            raise TypeError(
                "updates must be a dict or a list of (variable, update) pairs or "
                "(variable, update, op) triples"
            )
        op = item[2] if len(item) == 3 else "avg"
        check_update_op(op, f"update {i} ({item[0]})")
        pairs.append(item[:2])
        ops.append(op)
    return pairs, ops


def parse_outputs(outputs) -> tuple[list, list, list, bool]:
    """Split ``outputs`` into variables, reduce ops and whether each op was given; also
    say whether ``outputs`` was a single one."""

    def is_pair(o):
        return (
            isinstance(o, tuple)
            and len(o) == 2
            and isinstance(o[0], Variable)
            and not isinstance(o[1], Variable)
        )

    if outputs is None:
        return [], [], [], False
    single = isinstance(outputs, Variable) or is_pair(outputs)
    entries = [outputs] if single else list(outputs)
    variables, ops, explicit = [], [], []
    for i, entry in enumerate(entries):
        var, op = entry if is_pair(entry) else (entry, "avg")
        if not isinstance(var, Variable):
            raise TypeError(f"output {i} is not a PyTensor variable: {var!r}")
        check_output_op(op, f"output {i} ({var})")
        variables.append(var)
        ops.append(op)
        explicit.append(is_pair(entry))
    return variables, ops, explicit, single


# Arrays a call's message holds besides its broadcast values: the plan's words, two index
# arrays, a chain's step table, the released Data ids.
_MESSAGE_ARRAYS = 5


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


def _last_row(sel: Selection) -> int:
    if isinstance(sel, slice):
        return sel.stop - 1
    return int(sel.max()) if len(sel) else -1


_64_BIT = ("float64", "complex128", "int64", "uint64")


def _warn_if_computed_in_32_bits(spec: GraphSpec, what: str) -> None:
    """Warn when JAX mode will compute this function's 64-bit values in 32 bits.

    PyTensor turns JAX's 64-bit mode on only with floatX float64; otherwise JAX computes
    float64 as float32 and int64 as int32, where PyTensor's default mode keeps them.
    """
    import jax

    if jax.config.read("jax_enable_x64"):
        return
    shared = [
        v
        for v in graph_inputs(list(spec.outputs) + [u for _, u in spec.updates])
        if isinstance(v, SharedVariable)
    ]
    labels: dict = {}
    for i, v in enumerate([*spec.inputs, *spec.bcast_inputs]):
        labels.setdefault(v, v.name or f"input {i}")
    for j, v in enumerate(spec.outputs):
        labels.setdefault(v, f"output {j}")
    for v in shared:
        labels.setdefault(v, v.name or "a shared variable")
    wide = [
        f"{label} ({v.type.dtype})"
        for v, label in labels.items()
        if getattr(v.type, "dtype", None) in _64_BIT
    ]
    if wide:
        warnings.warn(
            f"{what}: JAX mode computes in 32 bits while floatX is float32, so "
            f"{', '.join(wide)} are computed as 32-bit values; for exact 64-bit results use "
            f"floatX=float64, or on CPU ranks backend='cpu' (backend='auto' takes 'jax-cpu' "
            f"where JAX mode measured faster; SYNK_CPU_BACKEND=cpu keeps the default mode)",
            stacklevel=4,
        )


def shared_reads_writes(parts: FunctionParts, sliceable_ids: set[int]) -> tuple[list, list]:
    """The shared variables a call of ``parts`` reads that rank 0 broadcasts when the
    program changed them (tensors, less the sliceable ones, each rank's own rows, and what
    the call hands over between its phases), and those a call writes (its updates' and
    the default updates' targets)."""
    roots = [*parts.outputs, *(u for _, u in parts.updates), *(g for _, g in parts.givens)]
    shared = [v for v in graph_inputs(with_default_updates(roots)) if isinstance(v, SharedVariable)]
    own = sliceable_ids | {id(v) for v in [*parts.sliceable, *parts.handover]}
    reads = [v for v in shared if id(v) not in own and travels(v)]
    writes = [v for v, _ in parts.updates]
    writes += [v for v in shared if getattr(v, "default_update", None) is not None]
    return reads, writes


@dataclass(kw_only=True)
class FunctionParts:
    """What a :class:`Function` is made of: :func:`synkhronos.function`'s arguments,
    checked and sorted (:meth:`parse`), or a training function's phase."""

    inputs: list = field(default_factory=list)
    bcast_inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    explicit: list = field(default_factory=list)  # per output: its reduce op was given
    single: bool = False
    updates: list = field(default_factory=list)  # (variable, value) pairs
    update_ops: list = field(default_factory=list)  # per update: its op over num_slices
    givens: list = field(default_factory=list)
    sliceable: list = field(default_factory=list)
    name: str | None = None
    mode: Any = None
    function_kwargs: dict = field(default_factory=dict)
    # The last broadcast input is the call's whole row count, which the plan writes
    # (a training function's row phase: PhaseSplit.rows).
    counts_rows: bool = False
    # Shared variables that each call writes before a later step of the call reads them
    # (a training function's, from one phase to the next): never saved, loaded or
    # compared between ranks.
    handover: list = field(default_factory=list)
    # Random generators every rank draws from with rank 0's state (GraphSpec's).
    same_on_every_rank: list = field(default_factory=list)

    @classmethod
    def parse(
        cls,
        *,
        inputs=(),
        outputs=None,
        bcast_inputs=None,
        updates=None,
        givens=None,
        sliceable=None,
        **rest,
    ) -> FunctionParts:
        """The parts of :func:`synkhronos.function`'s arguments, as it takes them
        (``sliceable``: its ``sliceable_shareds``; ``rest``: ``name``, ``mode``,
        ``function_kwargs``); ``TypeError`` for an input that cannot be one."""
        inputs, bcast_inputs = list(inputs), list(bcast_inputs or ())
        for i, var in enumerate(inputs + bcast_inputs):
            if not isinstance(var, Variable) or var.owner is not None:
                raise TypeError(f"input {i} must be a free PyTensor variable, got {var!r}")
            if isinstance(var, SharedVariable):
                raise TypeError(
                    f"input {i} is a shared variable; shared variables are used "
                    f"implicitly (see sliceable_shareds)"
                )
        for i, var in enumerate(inputs):
            if var.ndim < 1:
                raise TypeError(
                    f"{_label(var, i, 'input')} is scattered along axis 0, so it "
                    f"needs at least one dimension; pass scalars in bcast_inputs"
                )
        sliceable = list(sliceable or ())
        for i, var in enumerate(sliceable):
            # getattr: a shared random generator has no dimensions to give
            if not isinstance(var, SharedVariable) or getattr(var.type, "ndim", 0) < 1:
                raise TypeError(
                    f"sliceable_shareds[{i}] must be a shared variable with at least one dimension"
                )
        variables, ops, explicit, single = parse_outputs(outputs)
        pairs, update_ops = update_pairs(updates)
        return cls(
            inputs=inputs,
            bcast_inputs=bcast_inputs,
            outputs=variables,
            ops=ops,
            explicit=explicit,
            single=single,
            updates=pairs,
            update_ops=update_ops,
            givens=pairs_of(givens, "givens"),
            sliceable=sliceable,
            **rest,
        )

    @property
    def what(self) -> str:
        return f"synkhronos function {self.name!r}" if self.name else "synkhronos function"

    def spec(self, fid: int, mode) -> GraphSpec:
        """The graph every rank compiles, numbered ``fid``, in ``mode``."""
        return GraphSpec(
            fid,
            self.name,
            list(self.inputs),
            list(self.bcast_inputs),
            list(self.outputs),
            list(self.ops),
            list(self.updates),
            list(self.givens),
            list(self.sliceable),
            mode,
            list(self.update_ops),
            dict(self.function_kwargs),
            same_on_every_rank=list(self.same_on_every_rank),
            handover=list(self.handover),
        )


class BaseFunction(ABC):
    """What every synkhronos function is to the public API, whether it runs as one
    compiled function (:class:`Function`) or as a chain of them
    (:class:`~synkhronos.api.training.TrainingFunction`): called, inspected, referenced
    (``as_pytensor``) and chained (:func:`synkhronos.chain`) alike. Exported as
    ``synkhronos.BaseFunction``: the class to test a function against, for a training
    function is no :class:`Function`.

    Attributes
    ----------
    name : str or None
        The name given at build time.
    inputs : list
        Scattered inputs, then broadcast inputs (the call's argument order).
    output_modes : list
        The reduce op of each output.
    update_modes : list
        The op combining each update over ``num_slices`` ("avg" for pairs).
    """

    # Whether it reads its call's plan beyond its arguments (a training function: the
    # whole batch's row count) and needs rows on every rank (its later steps read what
    # its first wrote): then it is a chain's first step, and the chain refuses a rank
    # without rows.
    _reads_call_plan = False

    def __init__(self, session, parts: FunctionParts, spec: GraphSpec) -> None:
        self._session = session
        self.name = parts.name
        self.inputs = list(parts.inputs) + list(parts.bcast_inputs)
        self.output_modes = list(parts.ops)
        self.update_modes = list(parts.update_ops)
        self._positions = {v.name: i for i, v in enumerate(self.inputs) if v.name}
        self._single = parts.single
        self._downcast = bool(parts.function_kwargs.get("allow_input_downcast"))
        self._spec = spec
        self._reference = None

    @property
    def _what(self) -> str:
        return f"synkhronos function {self.name!r}" if self.name else "synkhronos function"

    @abstractmethod
    def __call__(self, *args, **kwargs) -> Any:
        """Run on every rank; return the outputs as one device would (see
        :meth:`Function.__call__`)."""

    @property
    @abstractmethod
    def mode(self) -> Any:
        """The compile mode (every phase's, for a training function)."""

    @abstractmethod
    def get_shared(self) -> list:
        """The shared variables the function uses (as ``pytensor`` functions' ``get_shared``)."""

    @abstractmethod
    def _chain_entries(self) -> list:
        """What it runs as, as :func:`synkhronos.chain`'s steps: Functions and collectives."""

    @abstractmethod
    def _plan(
        self, session, args, batch, batch_s, num_slices, output_subset, every_rank_rows=False
    ) -> CallPlan:
        """The plan of a call with these arguments, checked: its first Function's."""

    @abstractmethod
    def _collect(self, results: list, output_subset: Sequence[int] | None):
        """What a call returns, from its Functions' results (each as called alone)."""

    def _check_session(self) -> Any:
        """The current session; ``RuntimeError`` unless it is the one built in."""
        session = launch.current()
        if session is not self._session:
            raise RuntimeError(
                f"{self._what} was built before the last synk.fork(); build it again"
            )
        return session

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
                from synkhronos.rank.backends import jax_compat  # noqa: F401
            with pytensor.config.change_flags(**dict(spec.settings)):  # as the ranks compile
                self._reference = pytensor.function(
                    spec.inputs + spec.bcast_inputs,
                    spec.outputs,
                    updates=spec.updates,
                    givens=spec.givens,
                    mode=mode,
                    **{"on_unused_input": "ignore", **spec.function_kwargs},
                )
        outs = self._reference(*[np.asarray(a) for a in args])
        outs = [np.asarray(o) for o in outs]
        return outs[0] if self._single else outs

    as_theano = as_pytensor

    def build_inputs(
        self,
        *args,
        force_cast: bool = False,
        oversize: float = 1.0,
        minibatch: bool | Sequence[bool] = False,
    ) -> Data | list[Data]:
        """Shared-memory ``Data`` objects holding ``args``, typed for this function's inputs.

        ``minibatch`` is one flag for every input or a list of one per input. Returns one
        ``Data`` for a function of one input, else a list.
        """
        if len(args) != len(self.inputs):
            raise TypeError(f"{self._what}: expected {len(self.inputs)} arguments, got {len(args)}")
        flags: list = (
            list(minibatch) if isinstance(minibatch, (list, tuple)) else [minibatch] * len(args)
        )
        if len(flags) != len(args):
            raise ValueError(
                f"{self._what}: got {len(flags)} minibatch flags for {len(args)} inputs"
            )
        built = [
            Data(a, var=v, force_cast=force_cast, oversize=oversize, minibatch=mb)
            for v, a, mb in zip(self.inputs, args, flags, strict=True)
        ]
        return built[0] if len(built) == 1 else built

    def _by_name(self, args: tuple, kwargs: dict) -> tuple:
        """The positional arguments, with those given by name put in their places."""
        ordered = list(args) + [None] * (len(self.inputs) - len(args))
        given = [True] * len(args) + [False] * (len(self.inputs) - len(args))
        for name, value in kwargs.items():
            i = self._positions.get(name)
            if i is None:
                raise TypeError(f"{self._what} has no input named {name!r}")
            if given[i]:
                raise TypeError(f"{self._what}: input {name!r} given twice")
            ordered[i], given[i] = value, True
        if not all(given):
            missing = [_label(v, i, "input") for i, v in enumerate(self.inputs) if not given[i]]
            raise TypeError(f"{self._what}: missing {', '.join(missing)}")
        return tuple(ordered)


def _local_array(d: Data) -> np.ndarray:
    """Rank 0's array of a plan's ``Data`` entry: the Data's own view."""
    return d.data


class _LastCall:
    """A function's last call, kept for a call like it: the same ``Data`` objects (a
    scattered numpy array is copied into the function's own scratch Data), of the same
    layouts (:attr:`Data.layout <synkhronos.transport.shared_arrays.Data.layout>`),
    and no option (``batch``, ``batch_s``, ``num_slices``, ``output_subset``). Such a call
    passes the same checks and has the same plan, so the message to the workers and rank
    0's share of it (its :class:`~synkhronos.rank.compiled.Piece`) are reused. Where rank
    0 is the only rank (``alone``), a numpy array of the scratch Data's shape and dtype
    (C-contiguous and aligned, as the scratch is) passes those checks too, and is taken
    as it is: no worker reads the scratch. Weak references name the Data, so that
    keeping the call keeps none alive; rank 0's views of them are taken anew at each
    call."""

    __slots__ = ("_host", "_layouts", "_n", "_refs", "alone", "arrays", "fn", "piece", "subset")

    def __init__(
        self,
        args: tuple,
        arrays,
        fn,
        piece,
        subset: list[int],
        n_scattered: int,
        alone: bool = False,
        scratch: dict | None = None,
    ):
        self._refs = [weakref.ref(a) for a in args]
        self._layouts = [a.layout for a in args]
        self.arrays, self.fn, self.piece, self.subset = arrays, fn, piece, subset
        self._n = n_scattered
        self.alone = alone  # whether rank 0 is the only rank (Function._call_alone)
        # Per argument, the (shape, dtype) of a numpy array taken in its place, where the
        # argument is the function's scratch Data (``scratch``, by input) and rank 0 alone.
        own = [scratch.get(i) if alone and scratch else None for i in range(len(args))]
        self._host = [
            (d.shape, d.dtype) if d is not None and a is d and not d.minibatch else None
            for a, d in zip(args, own, strict=True)
        ]

    def matches(self, args: tuple) -> bool:
        """Whether ``args`` are the kept call's Data, of the same layouts (or numpy arrays
        that may take a scratch Data's place)."""
        if len(args) != len(self._refs):
            return False
        # A loop, not all() of a generator: this is most of a tiny call's own checks.
        for r, a, layout, host in zip(self._refs, args, self._layouts, self._host, strict=True):
            if type(a) is np.ndarray:
                if host is None or (a.shape, a.dtype) != host:
                    return False
                flags = a.flags
                if not (flags.c_contiguous and flags.aligned):
                    return False
            elif not isinstance(a, Data) or a.layout != layout or r() is not a:
                return False
        return True

    def views(self, args: tuple) -> tuple[list, list]:
        """Rank 0's arrays of ``args``: the scattered inputs', the broadcast inputs'."""
        n = self._n
        scattered = [a if type(a) is np.ndarray else a.data for a in args[:n]]
        return scattered, [d.data for d in args[n:]]

    def run(self, state, args: tuple) -> tuple:
        """Rank 0's share of a call with ``args`` (:func:`~synkhronos.rank.state.run_piece`)."""
        return run_piece(state, self.fn, self.piece, *self.views(args), self.subset)


class Function(BaseFunction):
    """A synkhronos function: built by :func:`synkhronos.function`, called like PyTensor's;
    one compiled function on every rank (its attributes: :class:`BaseFunction`'s)."""

    def __init__(self, session, parts: FunctionParts) -> None:
        inputs = parts.inputs + parts.bcast_inputs
        roots = parts.outputs + [u for _, u in parts.updates]
        mode = mode_choice.choose(parts.mode, session.backend.mode, inputs, roots, parts.what)
        super().__init__(session, parts, parts.spec(len(session.functions), mode))
        self._counts_rows = parts.counts_rows
        # Everything below may fail, and must leave the session as it was: nothing in it
        # changes before rank 0's copy is checked.
        self._check_wire(parts.inputs, parts.bcast_inputs, parts.outputs, parts.ops)
        self._spec.key = graph_key(self._spec.variables(), self._spec.describe())
        # A graph that passed both checks before (an earlier run of the script) is not
        # checked again: for ResNet-50's step they took a third of synk.function.
        checked = was_checked(self._spec.key)
        if not checked:
            check_shippable(self._spec, session.state.registry, self._what)
        # Check rank 0's copy now: a graph error raises here, before anything is shipped.
        compiled = session.state.add_function(self._spec, check=not checked)
        if not checked:
            mark_checked(self._spec.key)
        if is_jax(compiled.mode):
            _warn_if_computed_in_32_bits(self._spec, self._what)
        self._all_outputs = np.arange(len(parts.outputs), dtype=np.int64)
        self._shipped = False
        self._scratch: dict[int, Data] = {}
        self._in_dtypes = [np.dtype(v.dtype) for v in self._spec.inputs]
        self._last: _LastCall | None = None
        self._update_targets = {id(v) for v, _ in self._spec.updates}
        self._handover = list(parts.handover)
        session.sliceable_ids.update(id(s) for s in parts.sliceable)
        self._reads, self._writes = shared_reads_writes(parts, session.sliceable_ids)
        session.functions.append(self)

    def __repr__(self) -> str:
        return f"<synkhronos.Function {self.name or self._spec.fid}>"

    @property
    def mode(self):
        """The compile mode: the one named, or the one chosen for the graph
        (:mod:`synkhronos.api.mode_choice`); None: the backend's."""
        return self._spec.mode

    def _check_wire(self, inputs, bcast_inputs, outputs, ops) -> None:
        """Refuse, naming it, what the wire protocol could not carry in a call: a tensor of
        a dtype or number of dimensions it has no code for, more arrays than a message
        holds."""
        for i, var in enumerate(inputs):
            check_tensor(var, f"{self._what}, {_label(var, i, 'input')}", in_data=True)
        for i, var in enumerate(bcast_inputs):
            check_tensor(var, f"{self._what}, {_label(var, i, 'broadcast input')}")
        sent = [
            (i, var) for i, (var, op) in enumerate(zip(outputs, ops, strict=True)) if op is not None
        ]  # op None: rank 0's own result, never sent
        for i, var in sent:
            check_tensor(var, f"{self._what}, output {i}")
        check_count(
            len(bcast_inputs) + _MESSAGE_ARRAYS,
            f"{self._what} has {len(bcast_inputs)} broadcast inputs (each travels as "
            f"an array of a call's message)",
        )
        check_count(
            len(sent) + 1,
            f"{self._what} has {len(sent)} outputs the workers send "
            f"back (each an array of a worker's reply, with its rows)",
        )

    def get_shared(self) -> list:
        """The shared variables the function uses (as ``pytensor`` functions' ``get_shared``)."""
        return self._session.state.functions[self._spec.fid].get_shared()

    def _chain_entries(self) -> list:
        return [self]

    def _collect(self, results: list, output_subset: Sequence[int] | None):
        return results[0]  # collected with the plan's subset

    # ---- a call --------------------------------------------------------------------------
    def __call__(
        self,
        *args,
        batch=None,
        batch_s=None,
        num_slices: int = 1,
        output_subset: Sequence[int] | None = None,
        **kwargs,
    ):
        """Run data-parallel on every rank and return the reduced outputs.

        Parameters
        ----------
        *args : Data or array_like
            Scattered inputs (split along axis 0 across ranks), then broadcast inputs.
            Numpy arrays are copied into shared memory; ``Data`` is read in place.
        batch : int, slice or array of int, optional
            Rows of the scattered inputs to use (the first ``n``, a slice, or indices),
            split across ranks in order. ``Data`` made with ``minibatch=True`` is read by
            position: its row k pairs with the k-th selected row.
        batch_s : slice or array of int, or a list of them (one per rank), optional
            Rows of the sliceable shared variables each rank uses (default: all).
        num_slices : int
            Each rank computes in this many sequential chunks and combines them, which
            bounds memory; outputs equal the unsliced call's. Every chunk computes from
            the same shared values; each update's values are combined over the chunks with
            its op (see :func:`function`) and applied once, at the end.
        output_subset : sequence of int, optional
            Indices of the outputs to return (one index: the value, else a list).
        **kwargs : Data or array_like
            Inputs by their variables' names, as ``pytensor`` functions take them.

        Returns
        -------
        The reduced outputs: one value for a single output, else a list.
        """
        # abort_on_error inline: its wrapper's frame cost a tiny one-rank call 3%.
        try:
            session = self._check_session()
            if kwargs:
                args = self._by_name(args, kwargs)
            if not self._shipped:
                session.distribute()
            plain = batch is None and batch_s is None and num_slices == 1 and output_subset is None
            args, last = self._as_called(args, plain)
            # One rank of one node: no worker to command (unless a timeline records it).
            if last is not None and last.alone and session.timeline_path is None:
                return self._call_alone(session, last, args)
            return self._call(session, args, last, plain, batch, batch_s, num_slices, output_subset)
        except BaseException as error:
            abort_nodes("a synkhronos function call", error)
            raise

    def _call(self, session, args: tuple, last, plain: bool, *options):
        """:meth:`__call__` through the workers: ``args`` as called (``last``: the kept
        call they match), ``plain``: a call with no option of ``options``."""
        batch, batch_s, num_slices, output_subset = options
        state = session.state
        if last is not None:
            subset, arrays = last.subset, last.arrays

            def local():
                return last.run(state, args)

        else:
            with trace.span("check and plan", "rank 0"):
                plan = self._plan(session, args, batch, batch_s, num_slices, output_subset)
            subset, arrays = plan.subset.tolist(), plan.encode() if session.n_ranks > 1 else ()
            reusable = plain and self._reusable(args)

            def local():
                with trace.span("select rows", "rows"):
                    fn, share = share_of(state, plan, _local_array)
                if not reusable:
                    return run_share_of(state, fn, share, state.pending)
                piece = fn.piece(
                    share["rows"], share["positions"], share["by_position"], share["s_rows"],
                    subset, pending=True,
                )  # fmt: skip
                alone = session.n_ranks == 1 and current_nodes().n_global == 1
                alone = alone and piece is not None and not session.verify_every
                self._last = _LastCall(
                    args, arrays, fn, piece, subset, len(self._spec.inputs), alone, self._scratch
                )
                return self._last.run(state, args)

        send_changes(session, self._reads)
        weight, host, reduced = session.execute(Command.CALL, arrays, local)
        self._wrote(session)
        single = self._single if output_subset is None else len(subset) == 1
        replies = [session.channel.reply_arrays(r) for r in range(1, session.n_ranks)]
        with trace.span("collect outputs", "outputs"):
            return collect_outputs(replies, self._spec, subset, weight, host, reduced, single)

    def _as_called(self, args: tuple, plain: bool) -> tuple[tuple, _LastCall | None]:
        """``args`` as the call takes them (:meth:`_in_data`), and the kept call they
        match, if any (``plain``: the call has no option)."""
        last = self._last if plain else None
        if last is not None and last.matches(args):
            return args, last  # the kept call's own Data: nothing to copy or cast
        if len(args) == len(self.inputs):  # (a wrong count is _plan's error)
            args = self._in_data(args)
        return args, last if last is not None and last.matches(args) else None

    def _in_data(self, args: tuple) -> tuple:
        """``args`` with the scattered inputs' arrays, and Data cast by
        allow_input_downcast, in the scratch Data."""
        for i, dtype in enumerate(self._in_dtypes):
            a = args[i]
            if not (isinstance(a, Data) and a.dtype == dtype):
                args = (*args[:i], self._scattered(i, self._spec.inputs[i], a), *args[i + 1 :])
        return args

    def _call_alone(self, session, last: _LastCall, args):
        """A call like the last one where rank 0 is the only rank of the only node: no
        worker to command, no shared variable to send (``send_changes``), no other rank's
        outputs to combine. Its piece runs at once, its updates applied as it returns
        (no other rank can fail), and the outputs are one rank's
        (:func:`~synkhronos.rank.outputs.own_outputs`)."""
        session.check_sound()
        # Released Data: no worker to tell to unmap them (a command does, Session._send).
        released_ids.clear()
        piece = last.piece
        outs = piece.run(*last.views(args), None, None)
        self._wrote(session)
        return own_outputs(self._spec, last.subset, outs, piece.weight, self._single)

    def _wrote(self, session) -> None:
        """After a call: what it wrote is as synkhronos left it on every rank."""
        session.agreed.agree(self._writes)
        if not self._update_targets.isdisjoint(session.sliceable_ids):
            session.forget_lengths()  # the rows batch_s may select have changed

    def _reusable(self, args) -> bool:
        """Whether a call like this one may reuse its plan (:class:`_LastCall`): its
        arguments all ``Data`` (scattered numpy arrays are in the scratch Data by then);
        not where a call's plan depends on more (a broadcast input's value, the lengths of
        sliceable shared variables) or where its plan writes a broadcast input (the row
        count of a training function's row phase). A broadcast Data of another dtype
        travels as its values (allow_input_downcast): no reuse either."""
        spec = self._spec
        if (
            spec.sliceable
            or self._counts_rows
            or len(args) != len(self.inputs)
            or not all(isinstance(a, Data) for a in args)
        ):
            return False
        bcast = args[len(spec.inputs) :]
        return all(a.dtype == v.dtype for a, v in zip(bcast, spec.bcast_inputs, strict=True))

    def _plan(
        self,
        session,
        args,
        batch,
        batch_s,
        num_slices,
        output_subset,
        every_rank_rows: bool = False,
    ) -> CallPlan:
        """The call's plan, every argument checked; with ``every_rank_rows``, a call that
        gives some rank (of any node) no rows is refused too."""
        spec = self._spec
        n_in, n_b = len(spec.inputs), len(spec.bcast_inputs)
        if len(args) != n_in + n_b:
            raise TypeError(
                f"{self._what}: expected {n_in + n_b} arguments ({n_in} scattered "
                f"inputs, then {n_b} broadcast inputs), got {len(args)}"
            )
        if isinstance(num_slices, bool) or not isinstance(num_slices, (int, np.integer)):
            raise TypeError(f"num_slices must be an int, got {num_slices!r}")
        if num_slices < 1:
            raise ValueError(f"num_slices must be at least 1, got {num_slices}")
        subset = self._subset(output_subset, num_slices)
        scatter = [
            self._scattered(i, var, arg)
            for i, (var, arg) in enumerate(zip(spec.inputs, args[:n_in], strict=True))
        ]
        bcast, kinds = self._broadcast(args[n_in:])
        rows, s_rows, total = self._rows(session, scatter, batch, batch_s, every_rank_rows)
        if self._counts_rows:  # the plan carries the count (PhaseSplit.rows)
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
        spec = self._spec
        n_out = len(spec.outputs)
        if output_subset is None:
            subset = self._all_outputs
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

    def _broadcast(self, args) -> tuple[list[Data | np.ndarray], list[Arg]]:
        """The broadcast inputs' values, checked, and how each travels."""
        bcast: list[Data | np.ndarray] = []
        kinds = []
        for i, (var, arg) in enumerate(zip(self._spec.bcast_inputs, args, strict=True)):
            what = f"{self._what}, {_label(var, i, 'broadcast input')}"
            if isinstance(arg, Data) and (arg.dtype == var.dtype or not self._downcast):
                if arg.dtype != var.dtype:
                    raise TypeError(f"{what}: Data has dtype {arg.dtype}, expected {var.dtype}")
                _check_static_shape(var, arg.shape, what, skip_first=False)
                bcast.append(arg)
                kinds.append(Arg.DATA)
            else:  # a value (a Data of another dtype, allow_input_downcast: its values)
                arg = arg.data if isinstance(arg, Data) else arg
                bcast.append(checked_value(var, arg, what, self._downcast or None))
                kinds.append(Arg.VALUE)
        return bcast, kinds

    def _rows(
        self, session, scatter: list[Data], batch, batch_s, every_rank_rows: bool
    ) -> tuple[RankRows | None, RankRows | None, int]:
        """Each rank's rows of the scattered inputs and of the sliceable shared variables,
        and the call's rows on every rank of every node."""
        spec = self._spec
        rows = None
        total = 0
        if scatter:
            whole = self._batch_rows(scatter, batch)
            total = selection_length(whole)
            n_global = current_nodes().n_global  # one rank has the rows, at least one
            if every_rank_rows and n_global > 1:  # ranks take split_bounds shares of them
                self._refuse_empty_ranks("batch", split_bounds(total, n_global))
            sel = current_nodes().node_share(whole)
            self._check_rows_exist(scatter, sel)
            rows = RankRows.split(sel, session.n_ranks)
        elif batch is not None:
            raise ValueError(f"{self._what} has no scattered inputs; batch does not apply")
        s_rows = None
        if batch_s is not None:
            everyone = self._global_batch_s_rows(session, batch_s)
            total = total or sum(selection_length(s) for s in everyone)
            if every_rank_rows and not scatter:
                self._refuse_empty_ranks(
                    "batch_s", [0, *np.cumsum([selection_length(s) for s in everyone])]
                )
            world = current_nodes()
            s_rows = RankRows.per_rank(everyone[world.offset : world.offset + session.n_ranks])
        elif spec.sliceable and not scatter and (every_rank_rows or self._counts_rows):
            lengths = sliceable_lengths(session, spec.sliceable)  # each rank takes all its rows
            total = int(np.sum(lengths))
            if every_rank_rows:
                self._refuse_empty_ranks("the sliceable shared data", [0, *np.cumsum(lengths)])
        return rows, s_rows, total

    def _check_rows_exist(self, scatter: list[Data], sel: Selection) -> None:
        """``ValueError`` unless every scattered input holds the rows ``sel`` selects."""
        for i, d in enumerate(scatter):
            if d.minibatch and selection_length(sel) > len(d):
                raise ValueError(
                    f"{self._what}: batch selects {selection_length(sel)} "
                    f"rows but {_label(self._spec.inputs[i], i, 'input')} (minibatch "
                    f"data, read by position) has {len(d)}"
                )
            if not d.minibatch and _last_row(sel) >= len(d):
                raise ValueError(
                    f"{self._what}: batch selects row {_last_row(sel)} but "
                    f"{_label(self._spec.inputs[i], i, 'input')} has {len(d)} rows"
                )

    def _scattered(self, i: int, var, arg) -> Data:
        what = f"{self._what}, {_label(var, i, 'input')}"
        if not isinstance(arg, Data):
            return self._in_scratch(i, arg)
        if arg.dtype != var.dtype:
            if not self._downcast:
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
        var = self._spec.inputs[i]
        value = np.asarray(arg)
        what = f"{self._what}, {_label(var, i, 'input')}"
        if value.dtype != var.dtype:
            if not np.can_cast(value.dtype, var.dtype, "same_kind"):
                raise TypeError(
                    f"{what}: cannot use an array of dtype {value.dtype} for an input "
                    f"of dtype {var.dtype}"
                )
            if not self._downcast and not np.can_cast(value.dtype, var.dtype, "safe"):
                raise TypeError(
                    f"{what}: casting {value.dtype} to {var.dtype} would lose precision; "
                    f"cast it first"
                )
        _check_static_shape(var, value.shape, what, skip_first=True)
        scratch = self._scratch.get(i)
        if scratch is None:
            scratch = self._scratch[i] = Data(var=var, name=f"{var.name or i} scratch")
        scratch.set_value(value, force_cast=self._downcast, oversize=1.25)
        scratch.minibatch = minibatch  # read by position as the Data it was cast from
        return scratch

    def _batch_rows(self, scatter: list[Data], batch) -> Selection:
        full = [len(d) for d in scatter if not d.minibatch]
        sel: Selection
        if batch is None:
            # Minibatch data is read by position: it may be longer (checked in _plan).
            lengths = {len(d) for d in scatter if not d.minibatch} or {len(d) for d in scatter}
            if len(lengths) > 1:
                names = ", ".join(
                    f"{_label(v, i, 'input')}: {len(d)}"
                    for i, (v, d) in enumerate(zip(self._spec.inputs, scatter, strict=True))
                )
                raise ValueError(
                    f"{self._what}: scattered inputs have different lengths "
                    f"({names}); give batch= to select rows"
                )
            sel = slice(0, lengths.pop())
        else:
            sel = resolve_rows(batch, min(full) if full else None, "batch")
        if selection_length(sel) == 0:
            raise ValueError(f"{self._what}: batch selects no rows")
        return sel

    def _refuse_empty_ranks(self, what: str, bounds) -> None:
        """``ValueError`` if a global rank's share ``bounds[r]:bounds[r + 1]`` is empty (the
        same answer on every node)."""
        counts = np.diff(np.asarray(bounds, np.int64))
        empty = np.flatnonzero(counts == 0).tolist()
        if empty:
            raise ValueError(
                f"{self._what}: {what} gives {int(counts.sum())} row(s) to {len(counts)} "
                f"ranks, none to rank(s) {empty}; in this chain every rank needs at least one "
                f"row (a later step reads what this function writes): drop or pad the last "
                f"short batch"
            )

    def _global_batch_s_rows(self, session, batch_s) -> list[Selection]:
        """Every global rank's rows of the sliceable shared variables for ``batch_s``."""
        if not self._spec.sliceable:
            raise ValueError(f"{self._what} has no sliceable_shareds; batch_s does not apply")
        lengths = sliceable_lengths(session, self._spec.sliceable)  # per global rank
        world = current_nodes()
        n = world.n_global
        per_rank = (
            isinstance(batch_s, (list, tuple))
            and len(batch_s) == n
            and all(isinstance(b, (slice, list, tuple, np.ndarray)) for b in batch_s)
        )
        specs = list(batch_s) if per_rank else [batch_s] * n
        return [resolve_rows(specs[r], lengths[r], f"batch_s (rank {r})") for r in range(n)]
