"""What every rank (rank 0 included) keeps and runs: its state, and its share of a call."""

from __future__ import annotations

import numpy as np

from synkhronos.rank.backends import Backend
from synkhronos.rank.compiled import Piece, RankFunction, assign
from synkhronos.rank.first_calls import FirstCalls
from synkhronos.rank.graphs import GraphSpec, SharedRegistry
from synkhronos.rank.outputs import host_reduce_bytes, share_outputs
from synkhronos.transport import trace
from synkhronos.transport.callplan import CallPlan
from synkhronos.transport.comm import Communicator
from synkhronos.transport.protocol import Arg

_EMPTY = np.zeros(0, np.int64)


class RankState:
    """What one rank holds between commands.

    Parameters
    ----------
    rank, n_ranks : int
        This rank and the number of ranks.
    comm : Communicator
        The collectives of this rank.
    backend : Backend
        How this rank compiles and moves values.
    first_calls : FirstCalls
        The lock the first call of each compiled function takes.
    """

    def __init__(
        self, rank: int, n_ranks: int, comm: Communicator, backend: Backend, first_calls: FirstCalls
    ):
        self.rank, self.n_ranks = rank, n_ranks
        self.comm, self.backend = comm, backend
        self.first_calls = first_calls
        # Read once per session, by every rank alike (the workers inherit the variable).
        self.host_bytes = host_reduce_bytes()
        self.registry = SharedRegistry()
        self.functions: dict[int, RankFunction] = {}
        self.fused: dict = {}  # chains run as one XLA program (rank.fused_chain), by key
        # (The only rank) the program the last chained call ran as, with its weights (rows
        # per function step), or None: a call like it runs it again (api.chains).
        self.last_fused: tuple | None = None
        self.held: dict = {}  # per chain, what each step's updates leave pending (chain_part)
        # The last call's updates, (shared variable, value) pairs, applied once every rank
        # computed the call (see Session.execute): a call failing on any rank changes none.
        self.pending: list[tuple] = []
        # (Worker) the last CALL's message of words alone, and its decoded plan (run_call)
        self.last_plan: tuple[bytes, CallPlan] | None = None

    def apply_pending(self) -> None:
        """Apply the last call's updates (every rank computed it)."""
        assign(self.pending)
        self.pending.clear()

    def add_function(self, spec: GraphSpec, check: bool = False) -> RankFunction:
        """Keep ``spec`` as this rank's function; it compiles at its first call. With
        ``check`` (rank 0, when the function is built) its graph is checked first
        (:meth:`RankFunction.check <synkhronos.rank.compiled.RankFunction.check>`), and a
        graph that fails is not kept."""
        function = RankFunction(
            spec, self.backend.mode, self.backend.device_outputs, self.first_calls
        )
        if check:
            function.check()
        self.functions[spec.fid] = function
        return function

    def add_functions(self, specs: list[GraphSpec]) -> None:
        """Keep those of ``specs`` not kept yet (their shared variables are registered
        already)."""
        for spec in specs:
            if spec.fid not in self.functions:
                self.add_function(spec)

    def shared(self, indices) -> list:
        """The shared variables with these registry indices."""
        return [self.registry[int(i)] for i in indices]


def share_of(state: RankState, plan: CallPlan, resolve) -> tuple[RankFunction, dict]:
    """This rank's function of a planned call, and the arguments of its
    :meth:`~synkhronos.rank.compiled.RankFunction.run` for this rank's share (run by
    :func:`run_share`).

    ``resolve`` turns a ``Data`` entry of the plan into its array (rank 0: the ``Data``
    object; workers: a descriptor).
    """
    fn = state.functions[plan.fid]
    rank = state.rank
    data = int(Arg.DATA)
    bcast = [
        resolve(v) if k == data else v
        for v, k in zip(plan.bcast, plan.bcast_kinds.tolist(), strict=True)
    ]
    rows = positions = None
    if plan.rows is not None:
        rows, positions = plan.rows.for_rank(rank), plan.rows.positions(rank)
    if plan.s_rows is not None:
        s_rows = plan.s_rows.for_rank(rank)
    elif fn.spec.sliceable:
        s_rows = slice(0, min(fn.sliceable_lengths()))
    else:
        s_rows = None
    return fn, {
        "scattered": [resolve(d) for d in plan.scatter],
        "rows": rows,
        "positions": positions,
        "by_position": plan.by_position.tolist(),
        "bcast_values": bcast,
        "s_rows": s_rows,
        "num_slices": plan.num_slices,
        "subset": [int(i) for i in plan.subset],
    }


def bare_plan(state: RankState, fid: int) -> CallPlan:
    """The plan of an argument-free call of function ``fid``, returning every output."""
    n_out = len(state.functions[fid].spec.outputs)
    return CallPlan(fid, 1, np.arange(n_out, dtype=np.int64), [], _EMPTY, None, [], _EMPTY, None)


def step_plans(state: RankState, steps: list, plan: CallPlan | None) -> list[CallPlan]:
    """The plan of each function step of a chain (fids among ``steps``): the call's
    ``plan`` for the first, where there is one; the others are called without arguments."""
    fids = [s for s in steps if isinstance(s, int)]
    return [
        plan if i == 0 and plan is not None else bare_plan(state, fid) for i, fid in enumerate(fids)
    ]


def run_share(
    state: RankState,
    fn: RankFunction,
    share: dict,
    pending: list | None = None,
    held: set[int] | None = None,
) -> tuple[int, list, dict]:
    """Run this rank's share of a planned call (rank 0 and workers alike), as
    :func:`share_of` gives it. The updates go to ``pending`` where given (only those of
    the variables in ``held``, where given), else are applied at once (a chain's later
    steps read them). Returns the rows it computed on and
    :func:`synkhronos.rank.outputs.share_outputs`'s result.
    """
    with trace.span(fn.spec.name or "unnamed function", "compute"):
        weight, outs = fn.run(**share, pending=pending, held=held)
    return _outputs_shared(state, fn, share["subset"], weight, outs)


def run_piece(
    state: RankState, fn: RankFunction, piece: Piece | None, scattered: list, bcast: list, subset
) -> tuple[int, list, dict]:
    """:func:`run_share` of a call in one piece (``fn.piece``'s, None without rows), its
    updates pending: rank 0's part of a call like the last one, and of the call it was
    kept from."""
    with trace.span(fn.spec.name or "unnamed function", "compute"):
        outs = None if piece is None else piece.run(scattered, bcast, state.pending, None)
    return _outputs_shared(state, fn, subset, 0 if piece is None else piece.weight, outs)


def _outputs_shared(state: RankState, fn: RankFunction, subset, weight: int, outs) -> tuple:
    with trace.span("share outputs", "outputs"):
        return (weight, *share_outputs(state, fn, subset, weight, outs))


def run_call(state: RankState, arrays: list[np.ndarray], resolve) -> list[np.ndarray]:
    """(Worker) decode a CALL command, run this rank's share, and return the reply arrays:
    ``[weight]`` (int64), then the host outputs."""
    with trace.span("select rows", "rows"):
        fn, share = share_of(state, _decoded(state, arrays), resolve)
    weight, host, _ = run_share(state, fn, share, state.pending)
    return [np.array([weight], np.int64), *host]


def _decoded(state: RankState, arrays: list[np.ndarray]) -> CallPlan:
    """The plan of a CALL command. A message of words alone (no index array, no broadcast
    value) equal to the last one, as rank 0 sends for a call like the last one, is not
    decoded again: the plan is a function of the words, and is only read."""
    if len(arrays) > 1:
        return CallPlan.decode(arrays)
    key = arrays[0].tobytes()
    if state.last_plan is None or state.last_plan[0] != key:
        state.last_plan = (key, CallPlan.decode(arrays))
    return state.last_plan[1]
