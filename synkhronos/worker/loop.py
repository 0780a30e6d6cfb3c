"""The worker loop: wait for a command from rank 0, run this rank's part, report.

Started by :func:`synkhronos.fork` as ``python -m synkhronos.worker SESSION PREFIX RANK
N_RANKS MASTER_PID BACKEND``.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
from collections.abc import Callable

from synkhronos.rank.heap import keep_freed_memory
from synkhronos.transport import trace
from synkhronos.transport.channel import Aborted, Channel, ControlBlock
from synkhronos.transport.log_records import forward_records
from synkhronos.transport.names import sweep
from synkhronos.transport.protocol import DISCARD_UPDATES, FORGET_DATA, TIMELINE, Command

_COMMAND_NAMES = {int(c): c.name for c in Command}  # the spans' names


def _die_with_parent(master_pid: int, prefix: str) -> None:
    """Exit on SIGTERM, removing rank 0's names if rank 0 is gone.

    Rank 0's end reaches a worker in two other ways: rank 0's guardian process SIGKILLs
    every worker of rank 0 (busy, blocked or stopped) and removes its names
    (:func:`synkhronos.transport.names.guard`), and every blocked wait checks the parent.
    """

    def on_term(signum, frame):
        if os.getppid() != master_pid:
            sweep(prefix)  # rank 0 is gone and cannot clean up
        os._exit(1)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle
    if os.getppid() != master_pid:
        on_term(signal.SIGTERM, None)


def _prepare_process(master_pid: int, prefix: str) -> None:
    """Arm the death signal first, then set up logging, output, memory and imports as rank
    0 has them."""
    _die_with_parent(master_pid, prefix)
    forward_records()  # this worker's log records go to rank 0's logging
    # Line by line: rank 0 passes whole lines on, and a line held back is lost if the
    # worker is killed.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    keep_freed_memory()  # as rank 0 does at fork; this process ends with the session
    sys.path[:0] = [
        p for p in json.loads(os.environ.get("SYNK_SYS_PATH", "[]")) if p not in sys.path
    ]


def _handlers(rank: int) -> dict[int, Callable]:
    """This rank's part of each command: (state, arrays, resolve) -> reply arrays (None: no
    reply), keyed by the code's int (Command is an IntEnum). STOP is the loop's own."""
    # Imported only now: the death signal is armed first, and these load PyTensor (slow).
    from synkhronos.rank.chain_part import run_chain
    from synkhronos.rank.collective_part import run_collective
    from synkhronos.rank.graphs import unpack
    from synkhronos.rank.routine_part import run_routine
    from synkhronos.rank.state import run_call

    def distribute(state, arrays, resolve) -> None:
        state.add_functions(unpack(bytes(arrays[0]), state.registry, rank))

    return {
        Command.DISTRIBUTE: distribute,
        Command.CALL: run_call,
        Command.COLLECTIVE: lambda state, arrays, resolve: run_collective(state, arrays),
        Command.ROUTINE: run_routine,
        Command.CHAIN: run_chain,
    }


def main(argv: list[str]) -> None:
    session, prefix, backend_name = argv[0], argv[1], argv[5]
    rank, n_ranks, master_pid = (int(a) for a in argv[2:5])
    _prepare_process(master_pid, prefix)
    control = ControlBlock(session, n_ranks, create=False)
    heartbeat = control.heartbeat(rank)

    def check_parent() -> None:
        """Polled by every blocked wait: tell rank 0 this rank is alive, and that rank 0 is."""
        heartbeat[0] += 1
        if os.getppid() != master_pid:
            sweep(prefix)
            os._exit(1)

    handlers = _handlers(rank)
    # Imported only now, as the handlers' modules: these load PyTensor (slow).
    from synkhronos.rank.backends import get_backend
    from synkhronos.rank.first_calls import FirstCalls
    from synkhronos.rank.state import RankState
    from synkhronos.transport.comm import make_communicator
    from synkhronos.transport.shared_arrays import DataViews

    channel = Channel(session, rank, n_ranks, control, check_parent)
    backend = get_backend(backend_name)
    comm = make_communicator(backend_name, session, rank, n_ranks, control, check_parent)
    comm.start()
    if backend.mode == "JAX":  # rank 0's precision from the start (jax_compat.match_precision)
        from synkhronos.rank.backends.jax_compat import match_precision

        match_precision()
    state = RankState(
        rank,
        n_ranks,
        comm,
        backend,
        FirstCalls(control.segment.fd, check_parent, share=(rank, n_ranks)),
    )
    views = DataViews(prefix)
    channel.report()  # ready
    while True:
        code, arrays = _receive(channel, state, views, session, rank)
        if code == Command.STOP:
            comm.close()
            channel.report()
            return
        _run_command(channel, handlers, code, state, arrays, views)


def _receive(channel: Channel, state, views, session: str, rank: int) -> tuple[int, list]:
    """Wait for the next command; apply or drop the last call's updates and unmap released
    Data as it says; return its code without those flags, and its arrays."""
    idle_since = time.monotonic_ns()
    code, arrays = channel.receive()
    trace.follow(bool(code & TIMELINE), session, rank)
    trace.mark("wait for command", "wait", idle_since)
    code &= ~TIMELINE
    # The last call's updates: every rank computed it unless rank 0 says otherwise.
    if code & DISCARD_UPDATES:
        state.pending.clear()
        code &= ~DISCARD_UPDATES
    elif state.pending:
        with trace.span("apply updates", "updates"):
            state.apply_pending()
    if code & FORGET_DATA:
        views.forget(arrays[-1])
        code, arrays = code & ~FORGET_DATA, arrays[:-1]
    return code, arrays


def _run_command(channel: Channel, handlers: dict, code: int, state, arrays, views) -> None:
    """Run this rank's part of a command, reply if it has a reply, and report how it went."""
    try:
        handler = handlers.get(code)  # by the int: no Command built per command
        if handler is None:
            raise ValueError(f"unknown synkhronos command {code}")
        with trace.span(_COMMAND_NAMES[code], "command"):
            reply = handler(state, arrays, views.view)
            if reply is not None:
                with trace.span("reply", "reply"):
                    channel.reply(reply)
                trace.count_bytes("reply", reply)
    except Aborted:
        channel.report(aborted=True)
    except BaseException as error:  # noqa: BLE001 - reported to rank 0
        channel.report(error)
    else:
        channel.report()
