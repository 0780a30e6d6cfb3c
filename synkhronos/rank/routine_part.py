"""A rank's part of a routine: decode a ROUTINE command, run the named function, reply.

The rank 0 side, which sends the command, is :mod:`synkhronos.api.routines`.

Message layout: ``[name (uint8, "module:qualname"), kinds (int64, one per argument:
0 array, 1 Data descriptor), argument 0, argument 1, ...]``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from synkhronos.rank.state import RankState
from synkhronos.transport import trace

__all__ = ["ARRAY", "DATA", "from_text", "resolve_name", "run_routine", "text"]

ARRAY, DATA = 0, 1  # the kinds of a routine's arguments


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


def resolve_name(name: str) -> Callable:
    module, qualname = name.split(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def run_routine(state: RankState, arrays: list[np.ndarray], resolve) -> list[np.ndarray]:
    """(Worker) decode a ROUTINE command, run it, and return its reply arrays.

    ``resolve`` maps a ``Data`` descriptor to its array.
    """
    name = from_text(arrays[0])
    routine = resolve_name(name)
    args = [
        resolve(a) if kind == DATA else a
        for kind, a in zip(arrays[1].tolist(), arrays[2:], strict=True)
    ]
    with trace.span(name.rpartition(".")[2], "checkpoint" if "checkpoint" in name else "routine"):
        return list(routine(state, *args))
