"""Phases: one command that runs a module-level function on every rank, rank 0 included.

A :class:`~synkhronos.Function` call is one step that every rank runs on its share of the
rows. A *routine* is a whole phase of work that each rank runs by itself (many local steps,
say, exchanging with the others as it goes) until it returns: rank 0 sends one
:attr:`~synkhronos.transport.protocol.Command.ROUTINE` command naming the function and its
arguments, every rank calls ``routine(state, *args)`` with its
:class:`~synkhronos.rank.state.RankState` (the compiled functions of every ``synk.function``,
the shared variables, the communicator), and rank 0 gets back what each rank returned.

The function travels as its module and qualified name (every rank imports it), the
arguments as arrays: numpy arrays are copied into the command, :class:`~synkhronos.Data`
arrays travel as descriptors and each rank maps the shared memory itself. A routine
returns a list of numpy arrays.

Every rank's side, and the message's layout, is :mod:`synkhronos.rank.routine_part`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from synkhronos.rank.routine_part import ARRAY, DATA, resolve_name, text
from synkhronos.session import launch
from synkhronos.transport.channel import WorkerDied, check_count
from synkhronos.transport.protocol import Command
from synkhronos.transport.shared_arrays import Data
from synkhronos.transport.shm import check_travels

__all__ = ["run"]


def _name(routine: Callable) -> str:
    """``"module:qualname"`` of ``routine``, checked to name that very function.

    Every rank imports it by that name, so it must be found there again: lambdas, nested
    functions, bound methods, partials and ``__main__`` functions are refused here, on
    rank 0, rather than failing on the workers.
    """
    module = getattr(routine, "__module__", None)
    qualname = getattr(routine, "__qualname__", None)
    found = None
    if module and qualname and module != "__main__" and "<" not in qualname:
        try:
            found = resolve_name(f"{module}:{qualname}")
        except (ImportError, AttributeError):
            pass
    if found is not routine:
        raise ValueError(
            f"a routine must be a module-level function of an importable "
            f"module (every rank imports it by name), not {routine!r}"
        )
    return f"{module}:{qualname}"


def run(routine: Callable[..., list], *args: np.ndarray | Data) -> list[list[np.ndarray]]:
    """Run ``routine(state, *args)`` on every rank; return each rank's result, by rank.

    Functions built but not shipped yet are distributed first, so the routine finds every
    ``synk.function`` compiled in ``state.functions``.

    Parameters
    ----------
    routine : callable
        A module-level function ``routine(state, *args) -> list of numpy.ndarray``.
    *args : numpy.ndarray or synkhronos.Data
        Its arguments: arrays are sent with the command, ``Data`` arrays are mapped.

    Returns
    -------
    list of list of numpy.ndarray
        What each rank returned (copies), rank 0 first.

    Raises
    ------
    synkhronos.RemoteError
        If the routine raised on a worker (its traceback is in the message).
    synkhronos.WorkerDied
        If a worker died during the routine; when rank 0's own routine raised because of
        it, that error is raised instead, caused by this one.

    Examples
    --------
    >>> def rank_and_sum(state, x):                    # doctest: +SKIP
    ...     return [np.array([state.rank, x.sum()])]
    >>> run(rank_and_sum, np.ones(3))                  # doctest: +SKIP
    [[array([0., 3.])], [array([1., 3.])]]
    """
    session = launch.current()
    name = _name(routine)
    sent = [a if isinstance(a, Data) else np.asarray(a) for a in args]
    check_count(len(sent) + 2, f"routine {name} with {len(sent)} arguments")
    for i, a in enumerate(sent):
        if not isinstance(a, Data):
            check_travels(a.dtype, a.ndim, f"argument {i} of routine {name}")
    session.distribute()
    kinds = np.array([DATA if isinstance(a, Data) else ARRAY for a in sent], np.int64)
    message = [text(name), kinds, *[a.descriptor() if isinstance(a, Data) else a for a in sent]]
    local_args = [a.data if isinstance(a, Data) else a for a in sent]
    local_error: list[BaseException] = []

    def local() -> list[np.ndarray]:
        try:
            return routine(session.state, *local_args)
        except BaseException as error:
            local_error.append(error)
            raise

    # What the routine leaves on rank 0 is each rank's own (an asynchronous trainer's
    # parameters); the program's changes from before it stay to be broadcast.
    variables = session.state.registry.variables
    pending = {id(v) for v in session.agreed.changed(variables)}
    try:
        mine = session.execute(Command.ROUTINE, message, local)
    except WorkerDied as died:
        if local_error:
            raise local_error[0] from died  # rank 0's account of what the death did
        raise
    session.agreed.agree(v for v in variables if id(v) not in pending)
    theirs = [
        [np.array(a) for a in session.channel.reply_arrays(r)] for r in range(1, session.n_ranks)
    ]
    return [[np.asarray(a) for a in mine], *theirs]
