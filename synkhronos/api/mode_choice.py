"""The compile mode of a function that names none, chosen for its graph on rank 0.

PyTensor's default mode (Numba) compiles a whole graph into one function: its steps were
the fastest on the models of ``bench/first_step.py`` that it compiles in minutes (an MLP, a
CNN, an LSTM, a U-Net-like network: up to about 600 nodes), but its compile time grows
faster than the graph, and ResNet-50's training step (about 6,300 nodes) did not compile
within 10 minutes on a 2-core machine. The C VM (``"CVM"``) compiles op by op and keeps
each op's code on disk, shared by every graph that uses the op: its first steps came
sooner on every one of those models, its later steps were as fast for the MLP and the
LSTM and slower for the convolutional ones (``bench/RESULTS.md``, "Time to first step").
So only a graph of at least :data:`LARGE_GRAPH_NODES` nodes (before rewriting), one that
Numba would take many minutes to compile, compiles in :data:`LARGE_GRAPH_MODE` when
neither the function, the backend nor PyTensor's configuration names a mode and a C
compiler is configured. A mode the user names is kept. Rank 0 chooses, and the mode
travels with the graph, with rank 0's PyTensor settings (``GraphSpec.settings``): every
rank compiles it the same way.

A training function's phases (:mod:`synkhronos.api.training`) all compile in the mode
chosen for the whole line (:func:`choose_for_line`): where batch statistics cut its row
phase into rounds, each round is a small graph, but hundreds of them (ResNet-110's 327)
would each take Numba a compile of its own, where the C VM reuses each op's code.
"""

from __future__ import annotations

import logging

import pytensor
from pytensor.graph.traversal import io_toposort

logger = logging.getLogger(__name__)

LARGE_GRAPH_NODES = 2000
"""Nodes from which a graph compiles in :data:`LARGE_GRAPH_MODE` by default: between the
U-Net's 600 (Numba: under 2 minutes) and ResNet-50's 6,300 (Numba: over 10 minutes)."""

LARGE_GRAPH_MODE = "CVM"
"""The mode of a large graph when no mode is named."""


def configured() -> bool:
    """Whether PyTensor's configuration names a mode or a linker (``PYTENSOR_FLAGS``, or
    ``pytensor.config.mode = ...`` in the program)."""
    config = pytensor.config
    return str(config.mode).upper() != "MODE" or config.linker != "auto"


def choose(mode, backend_mode, inputs: list, roots: list, what: str):
    """The mode to compile the graph from ``inputs`` to ``roots`` (outputs and update
    values) in: ``mode`` if one is named, else None where the backend or PyTensor's
    configuration names one (:func:`configured`), else :data:`LARGE_GRAPH_MODE` for a
    large graph and None (PyTensor's default) for others."""
    named = mode is not None or backend_mode is not None or configured()
    if named or not pytensor.config.cxx:
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


def choose_for_line(parts, backend_mode, all_updates: list) -> object:
    """The mode of every phase of a training function: :func:`choose`'s for its whole
    line, the graph from ``parts``' inputs to its outputs and ``all_updates``' values
    (its running averages' too)."""
    inputs = parts.inputs + parts.bcast_inputs
    roots = parts.outputs + [value for _, value in all_updates]
    return choose(parts.mode, backend_mode, inputs, roots, parts.what)
