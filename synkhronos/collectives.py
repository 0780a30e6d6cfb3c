"""Collectives on shared variables: rank 0's API.

Each function checks its arguments in rank 0, then every rank runs its part
(:mod:`synkhronos.rank_collectives`) with the same kind and variables. Shared variables
are named by their registry index, the same on every rank (see
:mod:`synkhronos.distribute`).
"""

from __future__ import annotations

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable

from . import launch, rank_collectives
from .protocol import Collective, Command
from .reduce import COLLECTIVE_OPS, check_collective_op, join_rows

_WRITES = {Collective.BROADCAST, Collective.SCATTER, Collective.ALL_GATHER, Collective.REDUCE,
           Collective.ALL_REDUCE, Collective.SET_VALUE}


def _registered(session, shared_vars) -> tuple[list, np.ndarray, bool]:
    """The variables, their registry indices, and whether one variable was given."""
    single = isinstance(shared_vars, SharedVariable)
    variables = [shared_vars] if single else list(shared_vars)
    registry = session.state.registry
    if any(registry.index(v) is None for v in variables):
        session.distribute()  # the variable may belong to a function not shipped yet
    indices = []
    for v in variables:
        if not isinstance(v, SharedVariable):
            raise TypeError(f"collectives act on shared variables, got {v!r}")
        index = registry.index(v)
        if index is None:
            raise ValueError(f"shared variable {v} is not used by any synkhronos function, so "
                             f"the workers do not have it")
        indices.append(index)
    return variables, np.array(indices, np.int64), single


def _collective(kind: Collective, shared_vars, op: str = "avg", rank: int = 0, values=None,
                nd_up: int = 0):
    session = launch.current()
    variables, indices, single = _registered(session, shared_vars)
    if kind in (Collective.REDUCE, Collective.ALL_REDUCE):
        check_collective_op(op)
    if kind in (Collective.SET_VALUE, Collective.GET_VALUE) and not 0 <= rank < session.n_ranks:
        raise ValueError(f"rank must be in 0..{session.n_ranks - 1}, got {rank}")
    if nd_up not in (0, 1):
        raise ValueError(f"nd_up must be 0 or 1, got {nd_up}")
    if values is not None:
        values = [values] if single else list(values)
        if len(values) != len(variables):
            raise ValueError(f"got {len(values)} values for {len(variables)} shared variables")
        checked = []
        for var, value in zip(variables, values, strict=True):
            try:
                checked.append(np.asarray(var.type.filter(value)))
            except (TypeError, ValueError) as e:
                raise type(e)(f"value for shared variable {var}: {e}") from None
        values = checked
    if kind in (Collective.SCATTER, Collective.ALL_GATHER) and any(v.ndim == 0 for v in variables):
        raise ValueError("scatter and all_gather need shared variables with a first axis")
    params = np.array([kind, COLLECTIVE_OPS.index(op) if op in COLLECTIVE_OPS else 0, rank],
                      np.int64)
    result = session.execute(
        Command.COLLECTIVE, [params, indices],
        lambda: rank_collectives.run(session.state, kind, variables, op, rank, values))
    if kind in _WRITES:
        session.forget_lengths()
    if kind == Collective.GET_VALUE:
        out = [np.asarray(v) for v in result[rank]]
    elif kind in (Collective.GATHER, Collective.ALL_GATHER):
        out = [join_rows([r[i] for r in result], new_axis=nd_up == 1)
               for i in range(len(variables))]
    elif kind == Collective.SHAPES:
        out = [[tuple(int(s) for s in r[i]) for r in result] for i in range(len(variables))]
    elif kind == Collective.REDUCE:
        out = [np.asarray(v) for v in result]
    else:
        return None
    return out[0] if single else out


def sliceable_lengths(session, variables: list) -> list[int]:
    """Per rank, the rows the sliceable shared ``variables`` have in common (cached)."""
    key = tuple(id(v) for v in variables)
    lengths = session.lengths_cache.get(key)
    if lengths is None:
        shapes = _collective(Collective.SHAPES, list(variables))
        lengths = [min(s[r][0] for s in shapes) for r in range(session.n_ranks)]
        session.lengths_cache[key] = lengths
    return lengths


def broadcast(shared_vars, values=None) -> None:
    """Give every rank rank 0's value of ``shared_vars`` (after setting it to ``values``).

    Examples
    --------
    >>> synk.broadcast([w, b])                     # doctest: +SKIP
    >>> synk.broadcast(w, np.zeros((3, 2)))        # doctest: +SKIP
    """
    _collective(Collective.BROADCAST, shared_vars, values=values)


def scatter(shared_vars, values) -> None:
    """Split each of ``values`` along axis 0 across ranks (as evenly as possible) and set
    each rank's variable to its part."""
    _collective(Collective.SCATTER, shared_vars, values=values)


def gather(shared_vars, nd_up: int = 0):
    """Every rank's value, concatenated along axis 0 in rank order (``nd_up=1``: stacked
    along a new first axis). Returns one array per variable."""
    return _collective(Collective.GATHER, shared_vars, nd_up=nd_up)


def all_gather(shared_vars):
    """Set every rank's variable to the concatenation (axis 0) of all ranks' values;
    return it."""
    return _collective(Collective.ALL_GATHER, shared_vars)


def reduce(shared_vars, op: str = "avg"):
    """Reduce element-wise over ranks into rank 0's variable; return the result.

    ``op``: "avg", "sum", "prod", "max" or "min". Values must have equal shapes.
    """
    return _collective(Collective.REDUCE, shared_vars, op=op)


def all_reduce(shared_vars, op: str = "avg") -> None:
    """Reduce element-wise over ranks and give every rank the result.

    With a flat gradient vector (see :mod:`synkhronos.extensions.updates`) one call moves
    every parameter's gradient.

    Examples
    --------
    >>> synk.all_reduce(flat_grad, op="avg")      # doctest: +SKIP
    """
    _collective(Collective.ALL_REDUCE, shared_vars, op=op)


def set_value(rank: int, shared_vars, values) -> None:
    """Set the value of ``shared_vars`` on one rank only."""
    _collective(Collective.SET_VALUE, shared_vars, rank=rank, values=values)


def get_value(rank: int, shared_vars):
    """The value of ``shared_vars`` on one rank."""
    return _collective(Collective.GET_VALUE, shared_vars, rank=rank)


def get_shapes(shared_vars):
    """For each variable, the list of its shapes on every rank."""
    return _collective(Collective.SHAPES, shared_vars)


def get_lengths(shared_vars):
    """For each variable, an array of its length (axis 0) on every rank."""
    shapes = get_shapes(shared_vars)
    if isinstance(shared_vars, SharedVariable):
        return np.array([s[0] for s in shapes])
    return [np.array([s[0] for s in var_shapes]) for var_shapes in shapes]
