"""The wire protocol between rank 0 and the workers, named.

Every value that crosses the command channel as a bare integer has its name here:
command codes (the control segment's command word), collective kinds (the first word of
a collective command), the status word each worker sets when it reports, and the markers
inside a :class:`~synkhronos.transport.callplan.CallPlan`'s int64 word vector. See
``docs/internals.rst`` for the layouts.

Examples
--------
>>> Command.CALL | FORGET_DATA
258
>>> Command((Command.CALL | FORGET_DATA) & ~FORGET_DATA).name
'CALL'
"""

from __future__ import annotations

from enum import IntEnum


class Command(IntEnum):
    """What rank 0 asks of the workers (the control segment's command word)."""

    STOP = 0  #: leave the worker loop
    DISTRIBUTE = 1  #: unpickle and compile functions (one uint8 array: the pickle)
    CALL = 2  #: run a share of a function call (arrays: an encoded CallPlan)
    COLLECTIVE = 3  #: run a part of a collective (arrays: [kind, op, rank, nccl], indices)
    ROUTINE = 4  #: run a module-level function on every rank (see synkhronos.api.routines)
    CHAIN = 5  #: run functions and collectives in turn (arrays: step table, CallPlan)


FORGET_DATA = 1 << 8
"""Flag or-ed into a command word: its last array lists released ``Data`` ids."""

DISCARD_UPDATES = 1 << 9
"""Flag or-ed into a command word: the previous call failed on some rank, so drop its
updates (without it, a worker applies them before running the command)."""

TIMELINE = 1 << 10
"""Flag or-ed into a command word: record this rank's timeline (:mod:`synkhronos.transport.trace`)
while commands carry it."""


class Collective(IntEnum):
    """Which collective a COLLECTIVE command runs."""

    BROADCAST = 0
    SCATTER = 1
    GATHER = 2
    ALL_GATHER = 3
    REDUCE = 4
    ALL_REDUCE = 5
    SET_VALUE = 6
    GET_VALUE = 7
    SHAPES = 8
    REDUCE_RESULT = 9  #: reduce, leaving rank 0's variables unchanged (in_place=False)


class Status(IntEnum):
    """A worker's status word after it reports on a command."""

    OK = 0
    FAILED = 1  #: its reply mailbox holds the traceback (utf-8 bytes)
    ABORTED = 2  #: it gave up a collective because another rank failed
    FAILED_NOTE = 3  #: failed; its note in the control words says how (no traceback sent)
    SHM_FULL = 4  #: failed for want of room in /dev/shm; its note says how much it needed


class Rows(IntEnum):
    """The marker word opening a rows description in a CallPlan's word vector."""

    NONE = -1  #: no rows (no scattered inputs, or no ``batch_s``)
    RANGES = 0  #: one contiguous ``start, stop`` range per rank
    INDICES = 1  #: one index array (sent as its own array), cut at per-rank bounds


class Arg(IntEnum):
    """How a broadcast input travels in a CallPlan."""

    DATA = 0  #: a ``Data`` descriptor: every rank reads the shared memory itself
    VALUE = 1  #: the value, as an array of the message
    #: int8 zeros of the length the word gives: a training function's whole row count
    #: (JAX takes a count from a shape, never from a value)
    ROWS = 2


__all__ = [
    "DISCARD_UPDATES",
    "FORGET_DATA",
    "TIMELINE",
    "Arg",
    "Collective",
    "Command",
    "Rows",
    "Status",
]
