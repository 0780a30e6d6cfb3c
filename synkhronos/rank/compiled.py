"""One rank's compiled copy of a synkhronos function, and how it runs its share of a call.

Rank 0 and the workers run the same code here; only where the arrays come from differs.
A function with updates has two compiled forms, each made on first use. A call uses the
one that returns the updates' values as extra outputs, so that they wait until every
rank has computed the call (:attr:`RankState.pending
<synkhronos.rank.state.RankState.pending>`): a call that fails on any rank changes no
shared variable. A chain's step whose updates a later step reads, or a routine's, uses the
one where PyTensor applies them, in place where it can (a parameter update then writes no
new array); a step that updates a variable no later step reads (a training function's
last) uses the first, and those updates wait as a call's
(:func:`~synkhronos.rank.chain_part.held_updates`).

Numba compiles without fast-math flags on every rank. A process that compiles a function
runs the code it just compiled; one that finds it in the on-disk cache runs the cached
object code. With PyTensor's default fast-math flags (contract, reassoc, arcp, afn) the two
computed 1 ulp apart (a two-phase SGD step, float64: the cold-compiling rank and the
cache-loading one drifted from the first update on), so which code a rank ran, and so its
parameters, depended on the state of the caches. Without the flags LLVM keeps IEEE
semantics: fresh and cached code give the same bits, whichever rank compiles first or
whatever another program writes to the cache meanwhile. (A function rank 0 runs alone,
a training function's plain graph on one rank, keeps the flags: ``GraphSpec.settings``.)
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.traversal import io_toposort
from pytensor.tensor.variable import TensorVariable

from synkhronos.rank.first_calls import FirstCalls
from synkhronos.rank.graphs import GraphSpec
from synkhronos.rank.rewritten_graphs import (
    compile_function,
    shared_inputs,
    store_ahead,
    stored_path,
    write_whole,
)
from synkhronos.transport import trace
from synkhronos.transport.partition import Selection, selection_length, split_selection
from synkhronos.transport.reduction import accumulate, combine, reduces_in_place


def is_jax(mode) -> bool:
    """Whether ``mode`` (a name or a PyTensor Mode) compiles with JAX."""
    if mode is None:
        return False
    if isinstance(mode, str):
        return mode.upper() == "JAX"
    return type(getattr(mode, "linker", None)).__name__.upper().startswith("JAX")


logger = logging.getLogger(__name__)

PROGRESS_S = 10.0
"""Seconds between the "still compiling" lines of a long compile."""


@contextlib.contextmanager
def compiling(what: str) -> Iterator[None]:
    """Log the start and the duration of a compile step, and every :data:`PROGRESS_S`
    seconds that it is still going (a big graph's compile takes minutes, silently else)."""
    logger.info("synkhronos: %s", what)
    start, done = time.monotonic(), threading.Event()

    def progress() -> None:
        while not done.wait(PROGRESS_S):
            logger.info("synkhronos: still %s (%.0f s)", what, time.monotonic() - start)

    ticker = threading.Thread(target=progress, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        logger.info("synkhronos: done %s in %.1f s", what, time.monotonic() - start)


def _compile_flags(spec: GraphSpec) -> contextlib.AbstractContextManager:
    """PyTensor's settings while a function compiles and makes its first call: rank 0's
    when it built the graph, without fast-math flags (see the module docstring) unless
    the spec asks them (:data:`~synkhronos.rank.graphs.FAST_MATH`: rank 0 alone)."""
    return pytensor.config.change_flags(**{"numba__fastmath": False, **dict(spec.settings)})


def assign(updates: list[tuple]) -> None:
    """Give each shared variable of ``(variable, value)`` pairs its new value, as PyTensor
    stores an update (the values are a function's fresh outputs), in the variable's
    dtype."""
    for var, value in updates:
        dtype = getattr(var.type, "dtype", None)
        if dtype is not None and getattr(value, "dtype", dtype) != dtype:
            # JAX in 64-bit mode gives a float32 variable's sum as float64: every rank
            # keeps the variable's type (one with no rows never computed it).
            value = value.astype(dtype)
        var.container.storage[0] = value


def without_default_updates(given, variables: list):
    """``pytensor.function``'s ``no_default_updates`` that leaves out, beyond ``given``
    (a bool or a list of variables), the default updates of ``variables``."""
    if given is True:
        return True
    listed = list(given or [])
    ids = {id(v) for v in listed}
    return listed + [v for v in variables if id(v) not in ids]


class RankFunction:
    """The compiled function of one rank.

    Functions with sliceable shared variables compile a variant taking ``start, stop``
    (rows ``s[start:stop]``, a view) and, on first use of an index list, one taking an
    index vector (``s[idx]``).

    Parameters
    ----------
    spec : GraphSpec
        The graph, as built by the user (rank 0) or unpickled (workers).
    default_mode : str or pytensor Mode or None
        The backend's mode, used when the spec names none.
    device_outputs : bool
        Keep the outputs that :func:`~synkhronos.transport.reduction.reduces_in_place` allows in the
        function's own arrays (JAX device arrays) instead of copying them to the host.
    first_calls : FirstCalls
        The lock each variant's first call takes, so that ranks compile its machine code
        one after another and all but the first load it from the cache
        (:mod:`synkhronos.rank.first_calls`; in JAX mode XLA's program, which JAX's
        persistent cache keeps: :mod:`~synkhronos.rank.backends.jax_compat`).
    """

    def __init__(
        self, spec: GraphSpec, default_mode, device_outputs: bool, first_calls: FirstCalls
    ):
        self.spec = spec
        self.mode = spec.mode if spec.mode is not None else default_mode
        self.first_calls = first_calls
        self._called: set[tuple] = set()  # variants called at least once
        self.on_device = [
            device_outputs and reduces_in_place(op, var.dtype)
            for var, op in zip(spec.outputs, spec.output_ops, strict=True)
        ]
        # Outputs of op None: rank 0's own result; the workers do not send theirs.
        self.rank_0_only = {i for i, op in enumerate(spec.output_ops) if op is None}
        # JAX traces slices with static bounds only, so JAX ranks select rows by index.
        self.slices_by_index = is_jax(self.mode)
        if self.slices_by_index:
            from synkhronos.rank.backends import jax_compat  # noqa: F401 - registers fixes to PyTensor's JAX backend
        self._compiled: dict[tuple[str, bool], Any] = {}  # (variant, updates as outputs)
        self._direct: dict[tuple[str, bool], Any] = {}  # their direct calls (JAX mode)
        self.fused_steps: dict = {}  # its steps of fused chains (rank.fused_chain), kept
        self._shared: list | None = None  # found by check()

    def check(self) -> None:
        """Build the graph of a plain call without rewriting or compiling it (rank 0, when
        the function is built): a graph error (an input missing, an update of another
        type) raises here, before anything is shipped.

        Every rank compiles a form of the function at its first use (see
        :meth:`_function`): the ranks then rewrite the graph at the same time, and a form
        no call uses (the call's, for a function only ever chained) is never made. In JAX
        mode, where compiling stops short of XLA (which compiles at the first call), the
        plain call's form is compiled here: an op JAX mode lacks raises here too.
        """
        if is_jax(self.mode):
            self._shared = self._function(self._default_variant(), True).get_shared()
            return
        inputs, outputs, kwargs = self._graph(self._default_variant(), updates_as_outputs=True)
        self._shared = shared_inputs(inputs, outputs, self.spec.name, **kwargs)

    def _default_variant(self) -> str:
        if not self.spec.sliceable:
            return "plain"
        return "index" if self.slices_by_index else "slice"

    def _graph(self, variant: str, updates_as_outputs: bool) -> tuple[list, list, dict]:
        """``pytensor.function``'s inputs, outputs and keyword arguments (but the mode)
        for ``variant``, as :meth:`_function` describes it."""
        spec = self.spec
        outputs, updates, givens, extra = spec.outputs, spec.updates, spec.givens, []
        rows: slice | TensorVariable
        if variant != "plain":
            if variant == "slice":
                extra = [
                    pt.scalar("synk_start", dtype="int64"),
                    pt.scalar("synk_stop", dtype="int64"),
                ]
                rows = slice(extra[0], extra[1])
            else:
                extra = [pt.vector("synk_rows", dtype="int64")]
                rows = extra[0]
            # One substitution, the row selection first: PyTensor resolves a later pair's
            # value through the earlier ones, so the user's x -> x_shared becomes
            # x -> x_shared[rows] everywhere PyTensor rewrites the graph, the default
            # updates (random generators' next states) included.
            givens = [(s, s[rows]) for s in spec.sliceable] + list(givens)
        kwargs = {"on_unused_input": "ignore", **spec.function_kwargs}
        if updates_as_outputs and updates:
            # An update made an output must still override its variable's default update
            # (PyTensor would apply that one): the variable keeps its value until the
            # call's updates apply. Left out, not updated to itself: PyTensor's JAX mode
            # would give a random generator updated to itself its compile-time state (a
            # NumPy Generator, which the next call refuses).
            outputs = list(outputs) + [u for _, u in updates]
            kwargs["no_default_updates"] = without_default_updates(
                kwargs.get("no_default_updates", False), [v for v, _ in updates]
            )
            updates = []
        kwargs.update(updates=updates, givens=givens)
        return spec.inputs + spec.bcast_inputs + extra, outputs, kwargs

    def _function(self, variant: str, updates_as_outputs: bool = False):
        """The compiled ``variant`` ("plain", "slice" or "index"), compiled at its first
        use; with ``updates_as_outputs`` the update values are extra outputs and nothing
        is updated (a call's updates wait for every rank; ``num_slices > 1`` combines them
        over the chunks)."""
        updates_as_outputs = updates_as_outputs and bool(self.spec.updates)
        fn = self._compiled.get((variant, updates_as_outputs))
        if fn is None:
            spec = self.spec
            inputs, outputs, kwargs = self._graph(variant, updates_as_outputs)
            nodes = len(io_toposort(inputs, [*outputs, *(u for _, u in kwargs["updates"])]))
            what = f"compiling {self._label(variant)} ({nodes} nodes, mode {self.mode})"
            try:
                # One program: see the module docstring.
                # One rank rewrites the graph and stores it; the others wait and load it.
                lock = self.first_calls.one_at_a_time
                with _compile_flags(self.spec), compiling(what):
                    fn = compile_function(
                        inputs, outputs, self.mode, spec.name,
                        self._key(variant, updates_as_outputs), lock,
                        self.first_calls.share, **kwargs,
                    )  # fmt: skip
            except NotImplementedError as error:
                if is_jax(self.mode) and spec.mode is None:  # the backend's mode
                    error.add_note(
                        "PyTensor's JAX mode lacks an op of this graph; on CPU "
                        "ranks fork with backend='cpu' (or set SYNK_CPU_BACKEND"
                        "=cpu: backend='auto' takes 'jax-cpu' where it measured "
                        "JAX mode faster)"
                    )
                raise
            fn.trust_input = True  # rank 0 checked every argument before the call was sent
            if is_jax(self.mode):
                from synkhronos.rank.backends.jax_compat import (
                    direct_call,
                    drop_compile_time_copies,
                    share_generators,
                )

                drop_compile_time_copies(fn)
                share_generators(fn)
                self._direct[(variant, updates_as_outputs)] = direct_call(fn)
            self._compiled[(variant, updates_as_outputs)] = fn
        return fn

    def _key(self, variant: str, updates_as_outputs: bool) -> str | None:
        """The key of ``variant``'s graph among stored graphs (rank 0 computed the
        function's key: :mod:`synkhronos.rank.rewritten_graphs`)."""
        return None if self.spec.key is None else f"{self.spec.key} {variant} {updates_as_outputs}"

    def store_ahead(self, updates_as_outputs: bool = False) -> None:
        """Rewrite and store, unless compiled or stored already, the graph that a call
        without arguments links (a chain's later step: plain, its updates applied or, with
        ``updates_as_outputs``, waiting), and compile its C modules while another rank
        holds the compile lock, for when this rank calls it
        (:func:`~synkhronos.rank.rewritten_graphs.store_ahead`)."""
        updates_as_outputs = updates_as_outputs and bool(self.spec.updates)
        if ("plain", updates_as_outputs) in self._compiled:
            return
        inputs, outputs, kwargs = self._graph("plain", updates_as_outputs=updates_as_outputs)
        key = self._key("plain", updates_as_outputs)
        with _compile_flags(self.spec):
            store_ahead(
                inputs, outputs, self.mode, self.spec.name, key,
                self.first_calls.held_by_another, **kwargs,
            )  # fmt: skip

    def _label(self, variant: str) -> str:
        return f"function {self.spec.name or self.spec.fid!r} ({variant})"

    def _first_call(self, variant: tuple) -> contextlib.AbstractContextManager:
        """The lock for ``variant``'s first call (its machine code's compile, or load from
        the cache), logged as a compile; nothing for later calls (no generator: every
        call passes here)."""
        if variant in self._called:
            return contextlib.nullcontext()
        self._called.add(variant)
        return self._first_call_compiling(variant)

    @contextlib.contextmanager
    def _first_call_compiling(self, variant: tuple) -> Iterator[None]:
        # Without fast-math flags, as at the compile: an OpFromGraph node compiles its
        # inner function in Numba at its first call (see the module docstring). Under rank
        # 0's settings, which the mark's path depends on, as the stored graph's does.
        with _compile_flags(self.spec):
            key = self._key(*variant)
            mark = None if key is None else stored_path(key, [str(self.mode)], ".called")
            # A variant first called before, in this run or an earlier one, has its machine
            # code in the cache: the ranks load it at once, and its first call is a step
            # like any other (the lock made ranks take ResNet-50's 2.9 s step one after
            # another).
            called_before = mark is not None and mark.exists()
            lock = contextlib.nullcontext() if called_before else self.first_calls.one_at_a_time()
            span = trace.around(lock, "first call", "compile", {"function": self.spec.name})
            with span, compiling(f"first call of {self._label(variant[0])}: machine code"):
                yield
            if mark is not None and not called_before:
                with contextlib.suppress(OSError):  # unmarked, the next run takes the lock
                    write_whole(mark, b"")

    def get_shared(self) -> list:
        """The shared variables the function uses (rank 0: found by :meth:`check`, which
        runs now if it was skipped when the function was built)."""
        if self._shared is None:
            self.check()
        return self._shared or []

    def sliceable_lengths(self) -> list[int]:
        """Rows of each sliceable shared variable on this rank."""
        return [int(np.shape(s.get_value(borrow=True))[0]) for s in self.spec.sliceable]

    @staticmethod
    def _weight(rows: Selection | None, s_rows: Selection | None) -> int:
        """How many rows a share (or a chunk of it) computes on: its data rows, else its
        rows of the sliceable variables, else 1."""
        if rows is not None:
            return selection_length(rows)
        return selection_length(s_rows) if s_rows is not None else 1

    def _share(self, rows: Selection | None, s_rows: Selection | None):
        """The rows this rank computes on (its weight), its rows of the sliceable variables
        as this mode selects them, and the variant that does so."""
        weight = self._weight(rows, s_rows)
        if isinstance(s_rows, slice) and self.slices_by_index:
            s_rows = np.arange(s_rows.start, s_rows.stop, dtype=np.int64)
        variant = "plain" if s_rows is None else ("slice" if isinstance(s_rows, slice) else "index")
        return weight, s_rows, variant

    def prepare(
        self,
        scattered: list,
        rows: Selection | None,
        positions: Selection | None,
        by_position: list[int],
        bcast_values: list,
        s_rows: Selection | None,
    ):
        """This rank's whole share as one slice, not run: ``(weight, compiled function,
        arguments)`` (arguments as for :meth:`run`; ``(0, None, None)`` without rows)."""
        weight, s_rows, variant = self._share(rows, s_rows)
        if weight == 0:
            return 0, None, None
        piece = Piece(self, variant, False, rows, positions, by_position, s_rows, [], weight)
        return weight, piece.fn, piece.arguments(scattered, bcast_values)

    def piece(
        self,
        rows: Selection | None,
        positions: Selection | None,
        by_position: list[int],
        s_rows: Selection | None,
        subset: list[int],
        pending: bool,
    ) -> Piece | None:
        """This rank's whole share of a call as one :class:`Piece` (arguments as for
        :meth:`run`; ``pending``: whether its updates are to wait for every rank); None
        without rows."""
        weight, s_rows, variant = self._share(rows, s_rows)
        if weight == 0:
            return None
        deferred = bool(self.spec.updates) and pending
        return Piece(self, variant, deferred, rows, positions, by_position, s_rows, subset, weight)

    def run(
        self,
        scattered: list,
        rows: Selection | None,
        positions: Selection | None,
        by_position: list[int],
        bcast_values: list,
        s_rows: Selection | None,
        num_slices: int,
        subset: list[int],
        pending: list | None = None,
        held: set[int] | None = None,
    ) -> tuple[int, list | None]:
        """Run this rank's share in ``num_slices`` chunks and combine the chunks.

        Parameters
        ----------
        scattered : list of array_like
            The whole arrays of the scattered inputs (shared-memory views).
        rows : Selection or None
            This rank's rows of the scattered inputs (None when there are none).
        positions : Selection or None
            Where this rank's rows sit within the call's selection (a slice): the rows of
            the inputs read by position (minibatch data).
        by_position : list of int
            Per scattered input, 1 when it is read at ``positions`` rather than ``rows``.
        bcast_values : list
            Values of the broadcast inputs.
        s_rows : Selection or None
            This rank's rows of the sliceable shared variables (None when there are none).
        num_slices : int
            Number of sequential chunks. With more than one, every chunk computes from the
            same shared values, and each update's values are combined over the chunks with
            its op and applied once at the end.
        subset : list of int
            Indices of the outputs to return.
        pending : list, optional
            Where to put the updates, as ``(variable, value)`` pairs, instead of applying
            them (a call applies them once every rank has computed it). Without it
            PyTensor applies them, in place where it can.
        held : set of int, optional
            With ``pending``: the ids of the only variables whose updates go there (a
            chain's step: those no later step reads); the others apply at once.

        Returns
        -------
        weight : int
            Rows this rank computed on (1 when the function has no row-wise input).
        outputs : list or None
            The combined outputs in ``subset`` order (host arrays, except those kept
            :attr:`on_device`); None when ``weight`` is 0.
        """
        weight, s_rows, variant = self._share(rows, s_rows)
        if weight == 0:
            return 0, None
        k = num_slices if (rows is not None or s_rows is not None) else 1
        deferred = bool(self.spec.updates) and (pending is not None or k > 1)
        if k == 1:  # the whole share in one piece: the usual call
            piece = Piece(
                self, variant, deferred, rows, positions, by_position, s_rows, subset, weight
            )
            return weight, piece.run(scattered, bcast_values, pending, held)
        pieces = [
            Piece(self, variant, deferred, chunk, pos, by_position, s_chunk, subset, w)
            for chunk, pos, s_chunk in zip(
                split_selection(rows, k) if rows is not None else [None] * k,
                split_selection(positions, k) if positions is not None else [None] * k,
                split_selection(s_rows, k) if s_rows is not None else [None] * k,
                strict=True,
            )
            if (w := self._weight(chunk, s_chunk))
        ]
        computed = [p.compute(scattered, bcast_values) for p in pieces]
        weights = [p.weight for p in pieces]
        if deferred:
            updates = self._updates([u for _, u in computed], weights)
            self.put_updates(updates, pending, held)
        if len(computed) == 1:
            return weight, computed[0][0]
        ops = self.spec.output_ops
        return weight, [
            (accumulate if self.on_device[i] else combine)(
                ops[i], [r[j] for r, _ in computed], weights
            )
            for j, i in enumerate(subset)
        ]

    def put_updates(
        self, updates: list[tuple], pending: list | None, held: set[int] | None
    ) -> None:
        """Apply ``updates`` (``(variable, value)`` pairs) now, or put them in ``pending``
        (only those of the variables in ``held``, where given): see :meth:`run`."""
        if pending is None:
            assign(updates)
        elif held is None:
            pending += updates
        else:
            assign([u for u in updates if id(u[0]) not in held])
            pending += [u for u in updates if id(u[0]) in held]

    def _updates(self, update_values: list[list], weights: list[int]) -> list[tuple]:
        """``(variable, value)`` of each update; over several chunks, each update's values
        combined with its op."""
        targets = [var for var, _ in self.spec.updates]
        if len(update_values) == 1:
            return list(zip(targets, update_values[0], strict=True))
        return [
            (
                var,
                np.asarray(
                    combine(op, [np.asarray(u[j]) for u in update_values], weights), dtype=var.dtype
                ),
            )
            for j, (var, op) in enumerate(zip(targets, self.spec.update_ops, strict=True))
        ]


class Piece:
    """A share of a call (or one chunk of it) ready to run on this rank: the compiled
    function, which rows of each scattered input it reads, and which of its outputs come
    back as host arrays. Rank 0 keeps the piece of its last call and runs it again for a
    call like it (:class:`synkhronos.api.calls.KeptCall`): what is decided once per
    plan is not decided again per call."""

    __slots__ = (
        "_call",
        "_deferred",
        "_extra",
        "_first",
        "_n_out",
        "_owner",
        "_subset",
        "_takes",
        "_warm",
        "fn",
        "weight",
    )

    def __init__(
        self,
        owner: RankFunction,
        variant: str,
        deferred: bool,
        rows: Selection | None,
        positions: Selection | None,
        by_position: list[int],
        s_rows: Selection | None,
        subset: list[int],
        weight: int,
    ) -> None:
        self._owner, self.weight, self._deferred = owner, weight, deferred
        self._first = (variant, deferred)
        self.fn = owner._function(variant, updates_as_outputs=deferred)
        self._call = owner._direct.get(self._first) or self.fn
        self._warm = self._first in owner._called  # its variant's first call made
        self._takes = None if rows is None else [positions if mb else rows for mb in by_position]
        if isinstance(s_rows, slice):
            # 0-d arrays, not numpy scalars: trusted inputs skip PyTensor's conversion
            self._extra = [np.array(s_rows.start, np.int64), np.array(s_rows.stop, np.int64)]
        else:
            self._extra = [] if s_rows is None else [s_rows]
        self._subset = [(i, owner.on_device[i]) for i in subset]
        self._n_out = len(owner.spec.outputs)

    def arguments(self, scattered: list, bcast_values: list) -> list:
        """The compiled function's arguments: its rows of the ``scattered`` inputs' whole
        arrays, the broadcast values, its rows of the sliceable variables."""
        takes = self._takes
        args = [] if takes is None else [x[t] for x, t in zip(scattered, takes, strict=True)]
        args += bcast_values
        args += self._extra
        return args

    def compute(self, scattered: list, bcast_values: list) -> tuple[list, list]:
        """Run the compiled function: its outputs (host arrays, except those kept
        :attr:`~RankFunction.on_device`) and its updates' values (none unless deferred)."""
        args = self.arguments(scattered, bcast_values)
        if self._warm:  # (the first call's with statement costs a microsecond)
            outs = self._call(*args)
        else:
            with self._owner._first_call(self._first):
                outs = self.fn(*args)
            self._warm = True
        results = [outs[i] if device else np.asarray(outs[i]) for i, device in self._subset]
        return results, outs[self._n_out :]

    def run(
        self, scattered: list, bcast_values: list, pending: list | None, held: set[int] | None
    ) -> list:
        """:meth:`compute`, its updates applied or put in ``pending``
        (:meth:`RankFunction.put_updates`); returns the outputs."""
        results, update_values = self.compute(scattered, bcast_values)
        if self._deferred:
            targets = [var for var, _ in self._owner.spec.updates]
            self._owner.put_updates(list(zip(targets, update_values, strict=True)), pending, held)
        return results
