"""Collectives on shared variables: rank 0's API.

Each takes shared variables, or their names, one or a list; one variable in gives one array
out, a list or tuple in gives a tuple out. ``nccl=False`` makes GPU ranks use the host
(shared-memory) path; on CPU ranks that is the only path. Each function checks its
arguments in rank 0, then every rank runs its part
(:mod:`synkhronos.rank.collective_part`) with the same kind and variables. Shared variables
are named by their registry index, the same on every rank (see
:mod:`synkhronos.rank.graphs`). What the wire protocol cannot carry (dtypes or dimensions it
has no code for) is refused here, in rank 0, naming the variable or value.

Any number of variables: a collective of more than one message between ranks carries
(:data:`~synkhronos.transport.channel.MAX_ARRAYS` arrays; a scatter's root sends each rank
its part of every variable, so ``MAX_ARRAYS // n_ranks`` variables) runs as one command per
chunk that fits, in order, and returns their results joined as one command's. Every
argument and variable is checked before the first command, so a refused collective changed
nothing. A rank's failure in a command (unequal shapes in a reduction, a full
``/dev/shm``) stops it there: the error's note names the variables of the failed command;
the commands before it completed, those after it did not run.
"""

from __future__ import annotations

import logging

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable

from synkhronos.rank import collective_part
from synkhronos.session import launch
from synkhronos.transport.channel import MAX_ARRAYS, check_count
from synkhronos.transport.nodes import abort_nodes
from synkhronos.transport.nodes import current as current_nodes
from synkhronos.transport.partition import resolve_rows
from synkhronos.transport.protocol import Collective, Command
from synkhronos.transport.reduction import COLLECTIVE_OPS, check_collective_op, join_rows
from synkhronos.transport.shm import check_travels

logger = logging.getLogger(__name__)

_WRITES = {
    Collective.BROADCAST,
    Collective.SCATTER,
    Collective.ALL_GATHER,
    Collective.REDUCE,
    Collective.ALL_REDUCE,
    Collective.SET_VALUE,
}


def _by_name(session, name: str) -> SharedVariable:
    matches = [v for v in session.state.registry.variables if v.name == name]
    if not matches:
        session.distribute()  # the variable may belong to a function not shipped yet
        matches = [v for v in session.state.registry.variables if v.name == name]
    if len(matches) != 1:
        raise ValueError(
            f"{len(matches) or 'no'} shared variables of synkhronos functions are "
            f"named {name!r}; pass the variable itself"
        )
    return matches[0]


def registered(session, shared_vars) -> tuple[list, np.ndarray, bool]:
    """The variables (found by name where given a string), their registry indices, and
    whether one variable was given."""
    single = isinstance(shared_vars, (SharedVariable, str))
    variables = [shared_vars] if single else list(shared_vars)
    variables = [_by_name(session, v) if isinstance(v, str) else v for v in variables]
    registry = session.state.registry
    if any(registry.index(v) is None for v in variables):
        session.distribute()  # the variable may belong to a function not shipped yet
    indices = []
    for v in variables:
        if not isinstance(v, SharedVariable):
            raise TypeError(f"collectives act on shared variables or their names, got {v!r}")
        index = registry.index(v)
        if index is None:  # the graphs may read a clone of it (a batch norm's averages)
            index = registry.holding(v.container)
        if index is None:
            raise ValueError(
                f"shared variable {v} is not used by any synkhronos function, so "
                f"the workers do not have it"
            )
        indices.append(index)
    return variables, np.array(indices, np.int64), single


def check_tensor(var, what: str, in_data: bool = False) -> None:
    """Refuse, naming ``what``, a variable whose values cannot travel between ranks: not a
    tensor, or a dtype or a number of dimensions the wire protocol has no code for (any
    number, ``in_data``: a ``Data`` array is described by its shape alone)."""
    dtype, ndim = getattr(var.type, "dtype", None), getattr(var.type, "ndim", None)
    if dtype is None or ndim is None:
        raise TypeError(f"{what} is a {var.type}, not a tensor; only tensors travel between ranks")
    check_travels(dtype, 0 if in_data else ndim, what)


def travels(var) -> bool:
    """Whether the values of the shared variable ``var`` can be broadcast between ranks (a
    tensor the wire protocol carries; not a random generator)."""
    try:
        check_tensor(var, str(var))
    except TypeError:
        return False
    return True


def checked_value(var, value, what: str, allow_downcast: bool | None = None) -> np.ndarray:
    """``value`` as ``var``'s type holds it; ``TypeError`` (``ValueError`` for a value of
    the wrong contents) naming ``what`` when it cannot be."""
    try:
        return np.asarray(var.type.filter(value, allow_downcast=allow_downcast))
    except Exception as error:  # noqa: BLE001 - any failure to convert, named
        kind = ValueError if isinstance(error, ValueError) else TypeError
        given = (
            f"dtype {value.dtype}" if hasattr(value, "dtype") else f"type {type(value).__name__}"
        )
        raise kind(f"{what}: cannot use a value of {given} for {var.type}: {error}") from None


def _checked_values(variables: list, values, single: bool, batch) -> list:
    values = [values] if single else list(values)
    if len(values) != len(variables):
        raise ValueError(f"got {len(values)} values for {len(variables)} shared variables")
    checked = []
    for var, value in zip(variables, values, strict=True):
        if batch is not None:
            value = np.asarray(value)
            if value.ndim == 0:
                raise ValueError(f"batch selects rows, but the value for {var} is a scalar")
            value = value[resolve_rows(batch, len(value), "batch")]
        checked.append(checked_value(var, value, f"value for shared variable {var}"))
    return checked


def _collective(
    kind: Collective,
    shared_vars,
    op: str = "avg",
    rank: int = 0,
    values=None,
    nd_up: int = 0,
    nccl: bool = True,
    batch=None,
):
    try:  # abort_nodes inline, as every kind of call does
        session = launch.current()
        variables, indices, single = registered(session, shared_vars)
        n_ranks = current_nodes().n_global  # ranks name global ranks under MPI
        _check_arguments(kind, op, rank, nd_up, n_ranks)
        if values is not None:
            values = _checked_values(variables, values, single, batch)
        size = _check_variables(kind, variables, n_ranks)
        params = np.array(
            [kind, COLLECTIVE_OPS.index(op) if op in COLLECTIVE_OPS else 0, rank, bool(nccl)],
            np.int64,
        )
        out: list | None = None
        # Every variable is checked above, before the first command: only a rank's failure
        # (unequal shapes in a reduction, a full /dev/shm, a dead worker) stops a later one.
        for start in range(0, max(len(variables), 1), size):
            part = slice(start, start + size)
            try:
                result = _command(
                    session, kind, params, variables[part], indices[part], op, rank,
                    None if values is None else values[part], bool(nccl),
                )  # fmt: skip
            except BaseException as error:
                if len(variables) > size:
                    error.add_note(_stopped_at(kind, variables, part))
                raise
            got = _returned(kind, result, len(variables[part]), rank, nd_up)
            out = got if out is None or got is None else out + got
    except BaseException as error:
        abort_nodes("a synkhronos collective", error)
        raise
    if out is None:
        return None
    return out[0] if single else tuple(out)


def _command(session, kind, params, variables, indices, op, rank, values, nccl: bool):
    """One command of a collective, on ``variables`` (registry ``indices``) that one
    message carries; rank 0's result."""
    result = session.execute(
        Command.COLLECTIVE,
        [params, indices],
        lambda: collective_part.run(session.state, kind, variables, op, rank, values, nccl),
    )
    if kind in _WRITES:
        session.forget_lengths()
        if kind != Collective.SET_VALUE or rank == session.state.comm.rank:
            session.agreed.agree(variables)  # rank 0's values, as this collective left them
    return result


def _stopped_at(kind: Collective, variables: list, part: slice) -> str:
    """The note on a chunked collective's error: which variables its commands got to."""
    stop = min(part.stop, len(variables))
    return (
        f"synkhronos: this {kind.name.lower()} of {len(variables)} shared variables runs "
        f"as one command per {part.stop - part.start}; it failed in the command of "
        f"{variables[part.start]} to {variables[stop - 1]}: the {part.start} variables "
        f"before them took part in completed commands, the {len(variables) - stop} after "
        f"them in none"
    )


def _check_arguments(kind: Collective, op: str, rank: int, nd_up: int, n_ranks: int) -> None:
    """Raise if the operation, rank or ``nd_up`` does not fit the collective."""
    if kind in (Collective.REDUCE, Collective.REDUCE_RESULT, Collective.ALL_REDUCE):
        check_collective_op(op)
    if kind in (Collective.SET_VALUE, Collective.GET_VALUE) and not 0 <= rank < n_ranks:
        raise ValueError(f"rank must be in 0..{n_ranks - 1}, got {rank}")
    if nd_up not in (0, 1):
        raise ValueError(f"nd_up must be 0 or 1, got {nd_up}")


def _check_variables(kind: Collective, variables: list, n_ranks: int) -> int:
    """Raise if the shared variables cannot take part in the collective; return how many
    of them one command takes: what one message between ranks carries."""
    if kind != Collective.SHAPES:
        for var in variables:
            check_tensor(var, f"shared variable {var}")
    if kind in (Collective.SCATTER, Collective.ALL_GATHER) and any(v.ndim == 0 for v in variables):
        raise ValueError("scatter and all_gather need shared variables with a first axis")
    # A scatter's root posts every rank's part of each variable in one message.
    per_var = n_ranks if kind == Collective.SCATTER else 1
    check_count(per_var, f"a {kind.name.lower()} of one shared variable")
    return MAX_ARRAYS // per_var


def _returned(kind: Collective, result, n_vars: int, rank: int, nd_up: int) -> list | None:
    """Per variable, what the collective returns from the ranks' ``result`` (None when it
    returns nothing)."""
    if kind == Collective.GET_VALUE:
        return [np.asarray(v) for v in result[rank]]
    if kind in (Collective.GATHER, Collective.ALL_GATHER):
        return [join_rows([r[i] for r in result], new_axis=nd_up == 1) for i in range(n_vars)]
    if kind == Collective.SHAPES:
        return [[tuple(int(s) for s in r[i]) for r in result] for i in range(n_vars)]
    if kind in (Collective.REDUCE, Collective.REDUCE_RESULT):
        return [np.asarray(v) for v in result]
    return None


def send_changes(session, variables: list) -> None:
    """Broadcast from rank 0, before a call that reads them, those of ``variables`` whose
    rank-0 value the program changed since synkhronos last left it there
    (:mod:`synkhronos.session.agreed`): a ``set_value``, a plain PyTensor function's
    update."""
    world = current_nodes()
    if world.n_global == 1:
        return
    changed = session.agreed.changed(variables)
    # Every node sends the same broadcasts, of node 0's values. Each node's program sees
    # only its own changes, so the nodes agree on the union at every call, changed or
    # not: a node that skipped it would leave another alone in a broadcast (a hang).
    if world.mpi is not None:
        ids = {id(v) for v in changed}
        mine = [i for i, v in enumerate(variables) if id(v) in ids]
        changed = [variables[i] for i in sorted(set().union(*world.mpi.allgather(mine)))]
    if changed:
        logger.debug("synkhronos: rank 0 changed %s; broadcasting them", changed)
        _collective(Collective.BROADCAST, changed)


def sliceable_lengths(session, variables: list) -> list[int]:
    """Per rank (global rank under MPI), the rows the sliceable shared ``variables`` have
    in common (cached)."""
    key = tuple(id(v) for v in variables)
    lengths = session.lengths_cache.get(key)
    if lengths is None:
        shapes = _collective(Collective.SHAPES, list(variables))
        lengths = [min(s[r][0] for s in shapes) for r in range(len(shapes[0]))]
        session.lengths_cache[key] = lengths
    return lengths


def broadcast(shared_vars, values=None, nccl: bool = True) -> None:
    """Give every rank rank 0's value of ``shared_vars`` (after setting it to ``values``).

    Examples
    --------
    >>> synk.broadcast([w, b])                     # doctest: +SKIP
    >>> synk.broadcast("w", np.zeros((3, 2)))      # doctest: +SKIP
    """
    _collective(Collective.BROADCAST, shared_vars, values=values, nccl=nccl)


def scatter(shared_vars, values, batch=None) -> None:
    """Split each of ``values`` along axis 0 across ranks (as evenly as possible) and set
    each rank's variable to its part; ``batch`` (int, slice or indices) selects the rows of
    ``values`` first."""
    _collective(Collective.SCATTER, shared_vars, values=values, batch=batch)


def gather(shared_vars, nd_up: int = 1, nccl: bool = True):
    """Every rank's value, stacked along a new first axis in rank order (``nd_up=1``) or
    concatenated along axis 0 (``nd_up=0``)."""
    return _collective(Collective.GATHER, shared_vars, nd_up=nd_up, nccl=nccl)


def all_gather(shared_vars, nccl: bool = True):
    """Set every rank's variable to the concatenation (axis 0) of all ranks' values;
    return it."""
    return _collective(Collective.ALL_GATHER, shared_vars, nccl=nccl)


def reduce(shared_vars, op: str = "avg", in_place: bool = True, nccl: bool = True):
    """Reduce element-wise over ranks; return the result, and with ``in_place`` (the
    default) also set rank 0's variable to it.

    ``op``: "avg", "sum", "prod", "max" or "min". Values must have equal shapes.
    """
    kind = Collective.REDUCE if in_place else Collective.REDUCE_RESULT
    return _collective(kind, shared_vars, op=op, nccl=nccl)


def all_reduce(shared_vars, op: str = "avg", nccl: bool = True) -> None:
    """Reduce element-wise over ranks and give every rank the result.

    With a flat gradient vector (see :mod:`synkhronos.extensions.updates`) one call moves
    every parameter's gradient.

    Examples
    --------
    >>> synk.all_reduce(flat_grad, op="avg")      # doctest: +SKIP
    """
    _collective(Collective.ALL_REDUCE, shared_vars, op=op, nccl=nccl)


def set_value(rank: int, shared_vars, values, batch=None) -> None:
    """Set the value of ``shared_vars`` on one rank only; ``batch`` selects rows of
    ``values`` first."""
    _collective(Collective.SET_VALUE, shared_vars, rank=rank, values=values, batch=batch)


def get_value(rank: int, shared_vars):
    """The value of ``shared_vars`` on one rank."""
    return _collective(Collective.GET_VALUE, shared_vars, rank=rank)


def get_shapes(shared_vars):
    """For each variable, the list of its shapes on every rank."""
    return _collective(Collective.SHAPES, shared_vars)


def get_lengths(shared_vars):
    """For each variable, an array of its length (axis 0) on every rank."""
    shapes = get_shapes(shared_vars)
    if isinstance(shared_vars, (SharedVariable, str)):
        return np.array([s[0] for s in shapes])
    return tuple(np.array([s[0] for s in var_shapes]) for var_shapes in shapes)
