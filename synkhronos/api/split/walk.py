"""The one way the split walks a graph: up from some variables to their inputs, each
variable after its inputs, without recursion (a network's graph is deeper than Python's
stack)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any


def walk_up(
    start: Iterable[Any],
    inputs: Callable[[Any], Iterable[Any]],
    done: Callable[[Any], bool] = lambda v: False,
) -> Iterator[Any]:
    """Every variable reached from ``start`` through ``inputs``, each once and after the
    inputs it reaches; a variable ``done`` is neither given nor walked through (a
    memo's entries). ``done`` is asked again when a variable is met, so what the caller
    records for a variable given stops the walk there."""
    seen: set = set()
    stack: list = [(v, False) for v in reversed(list(start))]
    while stack:
        v, inputs_given = stack.pop()
        if inputs_given:
            yield v
            continue
        if v in seen or done(v):
            continue
        seen.add(v)
        stack.append((v, True))
        stack.extend((i, False) for i in reversed(list(inputs(v))) if i not in seen)


def owner_inputs(v: Any) -> list:
    """``v``'s node's inputs (none for a root)."""
    return [] if v.owner is None else list(v.owner.inputs)


__all__ = ["owner_inputs", "walk_up"]
