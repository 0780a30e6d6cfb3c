"""The compile mode of a function that names none, chosen for its graph on rank 0.

PyTensor's default mode (Numba) compiles a whole graph into one function: quick to run, but
its compile time grows faster than the graph (ResNet-50's training step did not compile
within 10 minutes on a 2-core machine). The C VM (``"CVM"``) compiles op by op and keeps
each op's code on disk, shared by every graph that uses the op. On the models of
``bench/first_step.py`` (``bench/RESULTS.md``, "Time to first step") CVM made the first
step sooner than Numba from the LSTM (about 300 nodes) up, and its later steps were no
slower there; for the MLP and the CNN (100 to 150 nodes) Numba's steps were the faster.
So a graph of at least :data:`LARGE_GRAPH_NODES` nodes (before rewriting) compiles in
:data:`LARGE_GRAPH_MODE` when neither the function nor the backend names a mode and a C
compiler is configured. Rank 0 chooses, and the mode travels with the graph: every rank
compiles it the same way. A mode the user names is kept.
"""

from __future__ import annotations

import logging

import pytensor
from pytensor.graph.traversal import io_toposort

logger = logging.getLogger(__name__)

LARGE_GRAPH_NODES = 250
"""Nodes from which a graph compiles in :data:`LARGE_GRAPH_MODE` by default."""

LARGE_GRAPH_MODE = "CVM"
"""The mode of a large graph when no mode is named."""


def choose(mode, backend_mode, inputs: list, roots: list, what: str):
    """The mode to compile the graph from ``inputs`` to ``roots`` (outputs and update
    values) in: ``mode`` if one is named, else the backend's, else :data:`LARGE_GRAPH_MODE`
    for a large graph and None (PyTensor's default) for others."""
    if mode is not None or backend_mode is not None or not pytensor.config.cxx:
        return mode
    nodes = len(io_toposort(inputs, roots))
    if nodes < LARGE_GRAPH_NODES:
        return None
    logger.info(
        "synkhronos: %s has %d nodes (at least %d): it compiles in mode %r, op by op, "
        "rather than in PyTensor's default mode (name a mode to choose another)",
        what, nodes, LARGE_GRAPH_NODES, LARGE_GRAPH_MODE,
    )  # fmt: skip
    return LARGE_GRAPH_MODE
