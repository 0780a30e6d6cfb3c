"""Phase splits kept on disk: a training function's graph is analysed once, for every later
run of the same script.

:func:`~synkhronos.api.split.phases.split_phases` infers the shape of every variable of a
training function's graph to find where the rows meet; for ResNet-50's step that was the
largest part of ``synk.function`` on a second run (bench/RESULTS.md, "Time to first
step"). :func:`split_phases_stored` keeps its result beside the stored rewritten graphs
(:mod:`synkhronos.rank.rewritten_graphs`), under the key of everything it is computed from:
the graph (its shared variables by order and type), the arguments, the PyTensor
configuration and the code. A later run with the same key loads the split onto its own
graph's inputs and shared variables instead of analysing it again; a file that cannot be
read is analysed and stored again. ``python -m synkhronos sweep --cache`` removes them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import graph_inputs, io_toposort

from synkhronos.api.split import phases
from synkhronos.api.split.phases import PhaseSplit, split_phases
from synkhronos.rank.graphs import with_default_updates
from synkhronos.rank.rewritten_graphs import (
    dumps_by_position,
    graph_key,
    loads_by_position,
    stored_path,
    write_whole,
)

logger = logging.getLogger(__name__)

#: The stored splits' format, in their key: a split stored by other code is not read.
FORMAT = 6  # 6: statistics' factors taken out of their sums (rounds.factored_sums)


def _variables_in(obj) -> list[Variable]:
    """The variables a split holds (in its lists, pairs and rounds)."""
    if isinstance(obj, Variable):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [v for f in dataclasses.fields(obj) for v in _variables_in(getattr(obj, f.name))]
    if isinstance(obj, list | tuple):
        return [v for item in obj for v in _variables_in(item)]
    return []


def split_phases_stored(
    sources: Sequence[Variable],
    outputs: Sequence[Variable],
    movable: Sequence[bool],
    updates: Sequence[tuple],
    by_position: bool,
    exact_statistics: bool,
    deciding: int,
) -> PhaseSplit | None:
    """:func:`~synkhronos.api.split.phases.split_phases` of these arguments, loaded if it
    is stored, else computed and stored (see the module docstring)."""

    def compute() -> PhaseSplit | None:
        return split_phases(
            sources, outputs, movable, updates, by_position, exact_statistics, deciding
        )

    variables = [*sources, *outputs, *(v for pair in updates for v in pair)]
    arguments = (len(sources), len(outputs), list(movable), by_position, exact_statistics)
    key = graph_key(variables, (*arguments, len(updates), deciding, phases.MAX_ROUNDS, FORMAT))
    if key is None:
        return compute()
    path = stored_path(key, [], ".split")
    # The graph's free variables, in an order that a graph of the same key gives again:
    # the split refers to them by position, and is loaded onto this run's.
    roots = [
        v for v in graph_inputs(with_default_updates(variables)) if not isinstance(v, Constant)
    ]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
    if data is not None:
        try:
            _, split = loads_by_position(data, roots)
        except Exception as error:  # noqa: BLE001 - a damaged file is analysed again
            logger.warning("synkhronos: stored split %s unreadable (%s); analysing", path, error)
        else:
            logger.info("synkhronos: phase split loaded from %s", path)
            return split
    split = compute()
    data = dumps_by_position((io_toposort(roots, _variables_in(split)), split), roots)
    try:
        write_whole(path, data)
    except OSError as error:  # the next run analyses again
        logger.warning("synkhronos: phase split not stored (%s)", error)
    # This run builds from the stored split too, not from its own: the split's graphs
    # then share no node with the function's own graph, in this run as in later ones,
    # and the phases' functions have the same keys (their rewritten graphs are found).
    _, split = loads_by_position(data, roots)
    logger.info("synkhronos: phase split stored in %s", path)
    return split
