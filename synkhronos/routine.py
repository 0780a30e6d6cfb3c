"""Phases: one command that runs a module-level function on every rank, rank 0 included.

A :class:`~synkhronos.Function` call is one step that every rank runs on its share of the
rows. A *routine* is a whole phase of work that each rank runs by itself (many local steps,
say, exchanging with the others as it goes) until it returns: rank 0 sends one
:attr:`~synkhronos.protocol.Command.ROUTINE` command naming the function and its
arguments, every rank calls ``routine(state, *args)`` with its
:class:`~synkhronos.rank.RankState` (the compiled functions of every ``synk.function``,
the shared variables, the communicator), and rank 0 gets back what each rank returned.

The function travels as its module and qualified name (every rank imports it), the
arguments as arrays: numpy arrays are copied into the command, :class:`~synkhronos.Data`
arrays travel as descriptors and each rank maps the shared memory itself. A routine
returns a list of numpy arrays.

Message layout: ``[name (uint8, "module:qualname"), kinds (int64, one per argument:
0 array, 1 Data descriptor), argument 0, argument 1, ...]``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import numpy as np

from . import launch
from .channel import WorkerDied
from .data import Data
from .protocol import Command
from .rank import RankState

__all__ = ["run", "run_routine", "text", "from_text"]

ARRAY, DATA = 0, 1


def text(value: str) -> np.ndarray:
    """``value`` as a uint8 array, to pass a string to a routine.

    Examples
    --------
    >>> from_text(text("centre"))
    'centre'
    """
    return np.frombuffer(value.encode(), np.uint8)


def from_text(array: np.ndarray) -> str:
    """The string :func:`text` encoded."""
    return bytes(np.asarray(array, np.uint8)).decode()


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
            found = _resolve_name(f"{module}:{qualname}")
        except (ImportError, AttributeError):
            pass
    if found is not routine:
        raise ValueError(f"a routine must be a module-level function of an importable "
                         f"module (every rank imports it by name), not {routine!r}")
    return f"{module}:{qualname}"


def _resolve_name(name: str) -> Callable:
    module, qualname = name.split(":")
    target = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


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
    session.distribute()
    args = [a if isinstance(a, Data) else np.asarray(a) for a in args]
    kinds = np.array([DATA if isinstance(a, Data) else ARRAY for a in args], np.int64)
    message = [text(_name(routine)), kinds,
               *[a.descriptor() if isinstance(a, Data) else a for a in args]]
    local_args = [a.data if isinstance(a, Data) else a for a in args]
    local_error: list[BaseException] = []

    def local() -> list[np.ndarray]:
        try:
            return routine(session.state, *local_args)
        except BaseException as error:
            local_error.append(error)
            raise

    try:
        mine = session.execute(Command.ROUTINE, message, local)
    except WorkerDied as died:
        if local_error:
            raise local_error[0] from died  # rank 0's account of what the death did
        raise
    theirs = [[np.array(a) for a in session.channel.reply_arrays(r)]
              for r in range(1, session.n_ranks)]
    return [[np.asarray(a) for a in mine], *theirs]


def run_routine(state: RankState, arrays: list[np.ndarray], resolve) -> list[np.ndarray]:
    """(Worker) decode a ROUTINE command, run it, and return its reply arrays.

    ``resolve`` maps a ``Data`` descriptor to its array.
    """
    routine = _resolve_name(from_text(arrays[0]))
    args = [resolve(a) if kind == DATA else a
            for kind, a in zip(arrays[1].tolist(), arrays[2:], strict=True)]
    return list(routine(state, *args))
