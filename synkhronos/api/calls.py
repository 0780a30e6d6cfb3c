"""What every kind of call shares: the command around it and the call it keeps.

A :class:`~synkhronos.api.functions.Function`'s call, a training function's and a chain's
each send one command through :func:`run_command`: what rank 0's program changed among the
shared variables the call reads is broadcast first, :meth:`Session.execute
<synkhronos.session.session.Session.execute>` runs the command (rank 0's part included; on
the only rank of the only node, :attr:`Session.alone
<synkhronos.session.session.Session.alone>`, that part alone, with the same checks), and
what the call wrote is recorded afterwards.

A call's general path checks its arguments and plans it (:mod:`synkhronos.api.planning`);
it ends in what rank 0 runs: a Function's :class:`~synkhronos.rank.compiled.Piece`, a
chain's fused program (:mod:`synkhronos.rank.fused_chain`). The general path keeps that,
with its command's message, as a :class:`KeptCall`; a later call that :func:`reuses` it and
whose arguments it :meth:`~KeptCall.matches` passes the same checks and has the same rows,
and runs the kept part without planning.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from synkhronos.api.collectives import send_changes
from synkhronos.api.planning import PLAIN, CallOptions


def reuses(session, options: CallOptions) -> bool:
    """Whether a call with ``options`` may reuse a kept call: it has no option, and no
    timeline records it (a timeline shows the call's plan and its rows)."""
    return (options is PLAIN or options.plain) and session.timeline_path is None


def stale(what: str) -> RuntimeError:
    """The error of a call of ``what``, built in a session that is no longer the current
    one (every kind of call checks its session first)."""
    return RuntimeError(f"{what} was built before the last synk.fork(); build it again")


def run_command(
    session, code: int, arrays, local: Callable, args: tuple, reads: list, wrote: tuple, note=None
) -> Any:
    """Run a call's command through :meth:`Session.execute
    <synkhronos.session.session.Session.execute>`, with what every call does around it.

    Parameters
    ----------
    code, arrays, local, args
        The command, its message and rank 0's part ``local(*args)``, as ``execute`` takes
        them.
    reads : list
        The shared variables the call reads: those rank 0's program changed are
        broadcast first (:func:`~synkhronos.api.collectives.send_changes`).
    wrote : tuple
        ``(variables, ids)``: what the call leaves as synkhronos' own, and the ids of
        every variable it writes (:func:`_record`).
    note : str, optional
        Added to an error of the command (a chain's: what the ranks may disagree on).

    Returns
    -------
    ``local(*args)``'s result.
    """
    several = not session.alone
    if several:
        send_changes(session, reads)
    try:
        result = session.execute(code, arrays, local, args)
    except Exception as error:
        if note:
            error.add_note(note)
        raise
    _record(session, wrote, several)
    return result


def _record(session, wrote: tuple, several: bool) -> None:
    """After a call: what it wrote is as synkhronos left it on every rank (the records
    decide what ``send_changes`` broadcasts: nothing on one rank of one node), and the
    rows ``batch_s`` may select are found anew where it wrote a sliceable variable."""
    leaves, ids = wrote
    if several:
        session.agreed.agree(leaves)
    if not ids.isdisjoint(session.sliceable_ids):
        session.forget_lengths()


class KeptCall:
    """A call kept for a call like it: the same ``Data`` objects of the same layouts
    (:attr:`Data.layout <synkhronos.transport.shared_arrays.Data.layout>`), or, in the
    places ``hosts`` names, C-contiguous aligned numpy arrays of the same shapes and
    dtypes; weak references name the Data, so that keeping the call keeps none alive.

    Parameters
    ----------
    args : tuple
        The call's arguments: ``Data``, or numpy arrays where ``hosts`` names them. Only
        these are matched; a call has ``count`` arguments in all (those after them, a
        chain's broadcast inputs, are checked by ``run``).
    hosts : list
        Per argument, the ``(shape, dtype)`` of a numpy array that may take its place, or
        None.
    count : int
        How many arguments a call like it has.
    arrays : sequence of arrays
        The command's message.
    run : callable
        Rank 0's part of a call with these arguments: ``run(args)``.
    alone : bool
        Whether ``run`` gives the call's outputs as they are (rank 0 is the only rank:
        :attr:`Session.alone <synkhronos.session.session.Session.alone>`), not rank 0's
        part to collect with the workers'.
    """

    __slots__ = ("_count", "_hosts", "_layouts", "_refs", "alone", "arrays", "run")

    def __init__(
        self, args: tuple, hosts: list, count: int, arrays, run: Callable, alone: bool
    ) -> None:
        self._refs: list = [None if type(a) is np.ndarray else weakref.ref(a) for a in args]
        self._layouts = [None if type(a) is np.ndarray else a.layout for a in args]
        self._hosts, self._count = hosts, count
        self.arrays, self.run, self.alone = arrays, run, alone

    def matches(self, args: tuple) -> bool:
        """Whether a call with ``args`` is like the kept one."""
        if len(args) != self._count:
            return False
        # A loop, not all() of a generator: this is most of a tiny call's own checks.
        for r, a, layout, host in zip(self._refs, args, self._layouts, self._hosts, strict=False):
            if type(a) is np.ndarray:
                if host is None or (a.shape, a.dtype) != host:
                    return False
                flags = a.flags
                if not (flags.c_contiguous and flags.aligned):
                    return False
            elif r is None or r() is not a or a.layout != layout:
                return False
        return True
