"""PyTensor's check that no rewrite overwrites a protected variable, with the same answers
at a fraction of the cost on a graph with many inputs.

A compiled function's graph carries a :class:`~pytensor.compile.aliasing.Supervisor`: the
function's inputs that must not be overwritten (every input a caller passes, every shared
variable's value) and its outputs are protected, and every change a rewrite makes is
validated against them. PyTensor's check asks the graph, for each protected variable in
turn, which node overwrites it; each question goes through the graph's feature lookup and
an exception when, as nearly always, there is none. ResNet-50's training step has
hundreds of protected variables and its rewriting validates thousands of changes: a third
of the time it takes on a small CPU, most of it before any node overwrites anything.

:class:`FastProtectionCheck`, a pass that runs first, gives the graph's supervisor a check
that reads the graph's map of overwritten values once per change (nothing to check while
no node overwrites anything) and refuses exactly what PyTensor's refuses, with the same
error. It does so only with PyTensor's regular cycle detection and its own destroy
handler; otherwise PyTensor's check runs.
"""

from __future__ import annotations

import functools
import itertools

from pytensor import config
from pytensor.compile.aliasing import Supervisor
from pytensor.compile.mode import Mode, optdb
from pytensor.graph.destroyhandler import DestroyHandler
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.basic import GraphRewriter
from pytensor.graph.rewriting.db import RewriteDatabaseQuery
from pytensor.graph.utils import InconsistencyError

TAG = "synk_fast_protection_check"
"""The tag (and name) that :func:`with_fast_protection_check` includes in a mode."""


def check_protected(supervisor: Supervisor, fgraph: FunctionGraph) -> bool | None:
    """``supervisor.on_validate(fgraph)``'s answer: raises
    :class:`~pytensor.graph.utils.InconsistencyError` naming the first protected variable
    (the supervisor's, then the graph's outputs) that a node of ``fgraph`` overwrites."""
    handler = getattr(fgraph, "destroy_handler", None)
    if config.cycle_detection == "fast" or type(handler) is not DestroyHandler:
        return Supervisor.on_validate(supervisor, fgraph)
    # What DestroyHandler.destroyers reads: the value each variable views, and the node
    # that overwrites each overwritten value.
    viewed, _, overwriter = handler.refresh_droot_impact()
    if not overwriter:
        return None
    for var in itertools.chain(supervisor.protected, fgraph.outputs):
        if viewed.get(var) in overwriter:
            raise InconsistencyError(f"Trying to destroy a protected variable: {var}")
    return None


class FastProtectionCheck(GraphRewriter):
    """A pass that changes no node: it gives the graph's supervisor
    :func:`check_protected` for every later pass's changes (module docstring)."""

    def apply(self, fgraph: FunctionGraph) -> None:
        for feature in fgraph._features:
            if type(feature) is Supervisor:  # a subclass may check something else
                # An instance's attribute, before its class's method: this graph only.
                check = functools.partial(check_protected, feature)
                feature.on_validate = check  # type: ignore[method-assign]


# Before every other pass: the check serves them all.
optdb.register(TAG, FastProtectionCheck(), position=min(optdb.__position__.values()) - 1)


def with_fast_protection_check(mode: Mode) -> Mode:
    """``mode`` with :class:`FastProtectionCheck` first among its passes: the same
    rewritten graph, sooner; ``mode`` itself if its passes are not a query of PyTensor's
    rewrite database."""
    if not isinstance(mode._optimizer, RewriteDatabaseQuery):
        return mode
    return mode.including(TAG)
