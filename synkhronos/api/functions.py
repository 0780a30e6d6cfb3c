"""``Function``: a PyTensor function run data-parallel on every rank.

Where a call goes: :meth:`Function.__call__` checks every argument in rank 0 (nothing runs
on any rank before that), builds a :class:`~synkhronos.transport.callplan.CallPlan`, and
:meth:`Session.execute <synkhronos.session.session.Session.execute>` sends it through the
command channel. Every rank, rank 0 included, runs its rows
(:func:`synkhronos.rank.state.run_share`),
and :mod:`synkhronos.rank.outputs` brings the ranks' outputs together in rank 0. A call
like the last one (the same ``Data``, or arrays of the same shapes, and no option) skips
most checks and the plan: it reuses the last call's
(:class:`~synkhronos.api.calls.KeptCall`).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.traversal import graph_inputs

from synkhronos.api import mode_choice
from synkhronos.api.calls import KeptCall, OneRankCall, reuses, run_command, stale
from synkhronos.api.collectives import (
    check_tensor,
    sliceable_lengths,
)
from synkhronos.api.function_parts import FunctionParts, shared_reads_writes
from synkhronos.api.planning import (
    PLAIN,
    CallOptions,
    Planner,
    Ranks,
    check_arguments,
    in_order,
    label,
    single_result,
)
from synkhronos.rank.compiled import is_jax
from synkhronos.rank.graphs import GraphSpec, check_shippable
from synkhronos.rank.outputs import collect_outputs, own_outputs
from synkhronos.rank.rewritten_graphs import graph_key, mark_checked, was_checked
from synkhronos.rank.state import run_piece, run_share, share_of
from synkhronos.session import launch
from synkhronos.transport import trace
from synkhronos.transport.callplan import CallPlan
from synkhronos.transport.channel import check_count
from synkhronos.transport.nodes import abort_nodes
from synkhronos.transport.nodes import current as current_nodes
from synkhronos.transport.protocol import Command
from synkhronos.transport.shared_arrays import Data

# Arrays a call's message holds besides its broadcast values: the plan's words, two index
# arrays, a chain's step table, the released Data ids.
_MESSAGE_ARRAYS = 5


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
    reads_call_plan : bool
        Whether it reads its call's plan beyond its arguments (a training function: the
        whole batch's row count) and needs rows on every rank (its later steps read what
        its first wrote): then it is a chain's first step, and the chain refuses a rank
        without rows.
    """

    reads_call_plan = False
    # Per call position, the value a call takes where it omits the argument
    # (``In(var, value=...)``; synk.function sets it).
    _defaults: dict = {}

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
    def spec(self) -> GraphSpec:
        """The graph every rank compiles, as shipped to the workers."""
        return self._spec

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
    def chain_entries(self) -> list:
        """What it runs as, as :func:`synkhronos.chain`'s steps: Functions and collectives."""

    @abstractmethod
    def plan(
        self, session, args, options: CallOptions, every_rank_rows=False, selected=None
    ) -> CallPlan:
        """The plan of a call with these arguments, checked: its first Function's;
        ``selected``: where the givens select the minibatch, its rows, if the caller
        computed them already (:meth:`GivenRows.rows
        <synkhronos.api.given_rows.GivenRows.rows>`)."""

    @abstractmethod
    def outputs_from(self, results: list, output_subset: Sequence[int] | None):
        """What a call returns, from its Functions' results (each as called alone)."""

    def _check_session(self) -> Any:
        """The current session; ``RuntimeError`` unless it is the one built in."""
        session = launch.current()
        if session is not self._session:
            raise stale(self._what)
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
        check_arguments(self._what, self._spec, args)
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

    def _arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, CallOptions]:
        """A call's arguments in the inputs' order (those given by name put in their
        places, the defaults filled in), and its options."""
        options, kwargs = CallOptions.split(kwargs) if kwargs else (PLAIN, kwargs)
        if kwargs or (self._defaults and len(args) < len(self.inputs)):
            args = self.ordered_arguments(args, kwargs)
        return args, options

    def ordered_arguments(self, args: tuple, kwargs: dict) -> tuple:
        """The positional arguments, with those given by name put in their places and the
        defaults filled in (:func:`~synkhronos.api.planning.in_order`)."""
        ordered, given, rest = in_order(
            args, kwargs, self._positions, self._defaults, len(self.inputs)
        )
        for name in rest:
            if name in self._positions:
                raise TypeError(f"{self._what}: input {name!r} given twice")
            raise TypeError(f"{self._what} has no input named {name!r}")
        if not all(given):
            missing = [label(v, i, "input") for i, v in enumerate(self.inputs) if not given[i]]
            raise TypeError(f"{self._what}: missing {', '.join(missing)}")
        return tuple(ordered)


def _local_array(d: Data) -> np.ndarray:
    """Rank 0's array of a plan's ``Data`` entry: the Data's own view."""
    return d.data


def _views(args: tuple, n: int) -> tuple[list, list]:
    """Rank 0's arrays of a kept call's arguments (``n`` scattered ones: numpy arrays as
    they are, Data's views taken anew), the broadcast inputs'."""
    return [a if type(a) is np.ndarray else a.data for a in args[:n]], [d.data for d in args[n:]]


class Function(BaseFunction):
    """A synkhronos function: built by :func:`synkhronos.function`, called like PyTensor's;
    one compiled function on every rank (its attributes: :class:`BaseFunction`'s, and
    those below, which a chain of it reads).

    Attributes
    ----------
    planner : Planner
        Checks a call's arguments and plans it (:class:`~synkhronos.api.planning.Planner`).
    reads, writes : list
        The shared variables a call reads that rank 0's program may change, and those it
        leaves as synkhronos' own (:func:`~synkhronos.api.function_parts.shared_reads_writes`).
    handover : list
        The shared variables each call writes before a later step of the call reads
        them (a training function's row phase's, from one phase to the next): never
        saved, loaded or compared between ranks.
    fast : OneRankCall or None
        On the only rank, the fast path of calls like the kept one
        (:class:`~synkhronos.api.calls.OneRankCall`), for a caller that wraps this
        function (a training function's plain graph); None before a call was kept. The
        function's own calls take the kept call on the general path, as fast.
    """

    def __init__(self, session, parts: FunctionParts) -> None:
        inputs = parts.inputs + parts.bcast_inputs
        roots = parts.outputs + [u for _, u in parts.updates]
        mode = mode_choice.choose(parts.mode, session.backend.mode, inputs, roots, parts.what)
        super().__init__(session, parts, parts.spec(len(session.functions), mode))
        # Everything below may fail, and must leave the session as it was: nothing in it
        # changes before rank 0's copy is checked.
        self._check_wire(parts.inputs, parts.bcast_inputs, parts.outputs, parts.ops)
        self._spec.key = graph_key(
            self._spec.variables(), self._spec.describe(), self._spec.updates
        )
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
        self.planner = Planner(self._spec, self._what, self._downcast, parts.counts_rows)
        self._all_outputs = self.planner.all_outputs
        self._shipped = False
        self._kept: KeptCall | None = None
        self.fast: OneRankCall | None = None  # for a wrapping caller (PlainGraph)
        self.handover = list(parts.handover)
        session.sliceable_ids.update(id(s) for s in parts.sliceable)
        self.reads, self.writes = shared_reads_writes(parts, session.sliceable_ids)
        # What a call reads and writes (run_command's reads and wrote).
        self._touches = (self.reads, (self.writes, {id(v) for v, _ in self._spec.updates}))
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
            check_tensor(var, f"{self._what}, {label(var, i, 'input')}", in_data=True)
        for i, var in enumerate(bcast_inputs):
            check_tensor(var, f"{self._what}, {label(var, i, 'broadcast input')}")
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

    def chain_entries(self) -> list:
        return [self]

    def outputs_from(self, results: list, output_subset: Sequence[int] | None):
        return results[0]  # collected with the plan's subset

    # ---- a call --------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """Run data-parallel on every rank and return the reduced outputs.

        Parameters
        ----------
        *args : Data or array_like
            Scattered inputs (split along axis 0 across ranks), then broadcast inputs.
            Numpy arrays are copied into shared memory; ``Data`` is read in place.
        **kwargs
            The call's options (:class:`~synkhronos.api.planning.CallOptions`: ``batch``,
            ``batch_s``, ``num_slices``, ``output_subset``), and inputs (``Data`` or
            array_like) by their variables' names, as ``pytensor`` functions take them.

        Returns
        -------
        The reduced outputs: one value for a single output, else a list.
        """
        # abort_nodes inline, as every kind of call does: a wrapper adds a frame per call.
        try:
            session = self._check_session()
            options = PLAIN
            if kwargs:
                options, kwargs = CallOptions.split(kwargs)
            if kwargs or (self._defaults and len(args) < len(self.inputs)):
                args = self.ordered_arguments(args, kwargs)
            if not self._shipped:
                session.distribute()
                self._shipped = True
            reuse = reuses(session, options)
            args, kept = self._as_called(args, reuse)
            if kept is None:
                return self._call(session, args, options, reuse)
            result = run_command(
                session, Command.CALL, kept.arrays, kept.run, (args,), *self._touches
            )
            # Alone, rank 0's part gives the outputs (own_outputs).
            return result if kept.alone else self._collected(session, result, None)
        except BaseException as error:
            abort_nodes("a synkhronos function call", error)
            raise

    def _as_called(self, args: tuple, reuse: bool) -> tuple[tuple, KeptCall | None]:
        """``args`` as the call takes them (:meth:`Planner.in_data
        <synkhronos.api.planning.Planner.in_data>`), and the kept call they match, if any
        (``reuse``: the call may reuse one, :func:`~synkhronos.api.calls.reuses`)."""
        kept = self._kept if reuse else None
        if kept is not None and kept.matches(args):
            return args, kept  # the kept call's own Data: nothing to copy or cast
        if len(args) == self.planner.n_args:  # (a wrong count is the plan's error)
            args = self.planner.in_data(args)
        return args, kept if kept is not None and kept.matches(args) else None

    def _call(self, session, args: tuple, options: CallOptions, reuse: bool):
        """:meth:`__call__` by the general path: planned, and kept where a call like it
        may reuse it (``reuse``)."""
        with trace.span("check and plan", "rank 0"):
            plan = self.plan(session, args, options)
        subset, arrays = plan.subset.tolist(), plan.encode() if session.n_ranks > 1 else ()
        keep = reuse and self.planner.reusable(args)
        state = session.state

        def local():
            with trace.span("select rows", "rows"):
                fn, share = share_of(state, plan, _local_array)
            if not keep:
                return run_share(state, fn, share, state.pending)
            piece = fn.piece(
                share["rows"], share["positions"], share["by_position"], share["s_rows"],
                subset, pending=True,
            )  # fmt: skip
            self._kept = self._keep(session, args, arrays, fn, piece)
            return run_piece(state, fn, piece, *_views(args, len(plan.scatter)), subset)

        result = run_command(session, Command.CALL, arrays, local, (), *self._touches)
        return self._collected(session, result, plan.subset, options.output_subset)

    def _collected(self, session, result: tuple, subset, output_subset=None):
        """The call's outputs (:meth:`collected`), the workers' replies read."""
        replies = [session.channel.reply_arrays(r) for r in range(1, session.n_ranks)]
        with trace.span("collect outputs", "outputs"):
            return self.collected(replies, result, subset, output_subset)

    def collected(self, replies: list, result: tuple, subset=None, output_subset=None):
        """What a call of this function returns (a chain's step too), from rank 0's
        ``(weight, host, reduced)`` and the workers' ``replies``; ``subset``: the plan's
        (None: every output), ``output_subset``: the call's option."""
        subset = self._all_outputs if subset is None else subset
        single = single_result(self._single, output_subset, subset)
        weight, host, reduced = result
        return collect_outputs(replies, self._spec, subset, weight, host, reduced, single)

    def _keep(self, session, args: tuple, arrays, fn, piece) -> KeptCall:
        """The kept call of a plain call with ``args`` (all Data), whose message was
        ``arrays`` and whose share of rank 0 is ``piece`` (None without rows). Where rank 0
        runs alone, a numpy array of a scratch Data's shape and dtype (C-contiguous and
        aligned, as the scratch is) may take that Data's place, as it is (no worker reads
        the scratch); rank 0's part applies the updates as it returns (no other rank can
        fail) and gives the outputs as one rank's
        (:func:`~synkhronos.rank.outputs.own_outputs`); there :attr:`fast` offers a
        wrapping caller a call like it."""
        state, spec, single, n = session.state, self._spec, self._single, len(self._spec.inputs)
        subset = self._all_outputs.tolist()
        alone = session.alone and piece is not None
        scratch = self.planner.scratch if alone else {}
        own = [scratch.get(i) for i in range(len(args))]
        hosts = [
            (d.shape, d.dtype) if d is not None and a is d and not d.minibatch else None
            for a, d in zip(args, own, strict=True)
        ]
        if not alone:
            self.fast = None
            return KeptCall(
                args, hosts, len(args), arrays,
                lambda args: run_piece(state, fn, piece, *_views(args, n), subset), False,
            )  # fmt: skip

        def run(args: tuple):
            outs = piece.run(*_views(args, n), None, None)
            return own_outputs(spec, subset, outs, piece.weight, single)

        kept = KeptCall(args, hosts, len(args), arrays, run, True)
        self.fast = OneRankCall(session, kept, self._touches, [])
        return kept

    def plan(
        self, session, args, options: CallOptions, every_rank_rows: bool = False, selected=None
    ) -> CallPlan:
        """The call's plan, every argument checked (:meth:`Planner.plan
        <synkhronos.api.planning.Planner.plan>`); no givens select its rows
        (``selected`` is None)."""
        ranks = Ranks(session.n_ranks, current_nodes(), partial(sliceable_lengths, session))
        return self.planner.plan(args, options, ranks, every_rank_rows)
