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
and runs the kept part without planning. On the only rank of the only node a
:class:`OneRankCall`, built by the general path with the call it kept, takes such a call
before any other check of the caller's (a training function's plain graph writes its
broadcast scalars first).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from synkhronos.api.collectives import send_changes
from synkhronos.api.planning import PLAIN, CallOptions
from synkhronos.session.launch import current as current_session
from synkhronos.transport.protocol import Command


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


MISS = object()
"""What :meth:`OneRankCall.__call__` returns for a call it does not take."""


def exact_kind(var, value) -> type | None:
    """The type of a broadcast scalar ``value`` that writing into an array of ``var``'s
    dtype converts exactly as the call's check does (or refuses, raising), or None:
    a Python int for an integer dtype, a Python float for float64, a numpy scalar of
    the dtype itself."""
    kind, dtype = type(value), var.type.dtype
    if kind is int and dtype[0] in "iu":
        return kind
    if kind is float and dtype == "float64":
        return kind
    if isinstance(value, np.generic) and value.dtype == dtype:
        return kind
    return None


class OneRankCall:
    """The fast path of a call on the only rank of the only node (:attr:`Session.alone
    <synkhronos.session.session.Session.alone>`): decided by the general path, which
    builds it with the call it kept, and taken by a later call with arguments of the
    same kinds, which goes straight to the kept call's compiled piece.

    A call it takes is the general path's call without its planning: the same command
    (:func:`run_command`: a broken session refused, released Data forgotten, updates
    applied only where the call succeeded, the call counted for ``verify_every``), on
    the kept call's arguments. It takes no call that has options, that a timeline
    records, of a stale session, or whose arguments the kept call does not
    :meth:`~KeptCall.matches` (after its broadcast scalars are written, each of the
    first call's kind, :func:`exact_kind`): it returns :data:`MISS`, and the general
    path runs the call.

    Parameters
    ----------
    session : Session
        The session it runs in.
    kept : KeptCall
        The kept call, whose ``run`` gives the call's outputs (``kept.alone``).
    touches : tuple
        ``(reads, wrote)`` of :func:`run_command`.
    scalars : list
        Per broadcast scalar that the call takes as a Python or numpy scalar: its
        position, the ``Data`` that holds it in the kept call, and its kind.
    """

    __slots__ = ("_kept", "_scalars", "_session", "_touches")

    def __init__(self, session, kept: KeptCall, touches: tuple, scalars: list) -> None:
        self._session, self._kept, self._touches, self._scalars = session, kept, touches, scalars

    def with_scalars(self, scalars: list) -> OneRankCall:
        """The same fast path for a caller that writes ``scalars`` first."""
        return OneRankCall(self._session, self._kept, self._touches, scalars)

    def __call__(self, args: tuple) -> Any:
        """The call's outputs, or :data:`MISS` where the general path must run it."""
        session = self._session
        if session.timeline_path is not None or current_session() is not session:
            return MISS
        if self._scalars:
            written = self._written(args)
            if written is None:
                return MISS
            args = written
        kept = self._kept
        if not kept.matches(args):
            return MISS
        return run_command(session, Command.CALL, kept.arrays, kept.run, (args,), *self._touches)

    def _written(self, args: tuple) -> tuple | None:
        """``args`` with each broadcast scalar written into its Data, the Data in its
        place; None where one is of another kind or out of its dtype's range."""
        values = list(args)
        for k, data, kind in self._scalars:
            if k >= len(values) or type(values[k]) is not kind:
                return None
            try:
                data.data[...] = values[k]
            except (OverflowError, ValueError, TypeError):
                return None
            values[k] = data
        return tuple(values)
