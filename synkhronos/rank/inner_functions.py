"""Inner functions of a graph's ``OpFromGraph`` nodes compiled ahead, while the rank waits.

A linker that runs a graph op by op (CVM) runs an ``OpFromGraph`` node (PyTensor's softmax
and log-softmax are such nodes) through its ``perform``, which compiles the node's inner
graph at its first call, in PyTensor's default mode: Numba, whose compile of these two on
a new machine was most of a training step's first call (bench/RESULTS.md, "Time to first
step"). A rank that is about to wait for another rank's rewriting of the graph
(:func:`~synkhronos.rank.rewritten_graphs.compile_function`) has that time: it compiles
and calls each inner function first, with arrays of the node's input types, so that
Numba's code is in its on-disk cache by the first call, which then loads it.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from pytensor.compile.builders import OpFromGraph
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import io_toposort
from pytensor.tensor.type import TensorType

logger = logging.getLogger(__name__)


def _example(var: Variable) -> np.ndarray | None:
    """A C-ordered array of ``var``'s type (one along each dimension of unknown length);
    None if ``var`` is not a tensor."""
    if not isinstance(var.type, TensorType):
        return None
    return np.zeros([1 if n is None else n for n in var.type.shape], dtype=var.type.dtype)


def compile_inner_functions(outputs: list[Variable]) -> int:
    """Compile and call once the inner function of each ``OpFromGraph`` node of the graph
    of ``outputs`` whose inputs are tensors (as the node's first ``perform`` would); the
    number called."""
    start, called, seen = time.monotonic(), 0, set()
    for node in io_toposort([], outputs):
        if not isinstance(node.op, OpFromGraph):
            continue
        examples = [_example(v) for v in node.inputs]
        signature = (node.op, tuple(str(v.type) for v in node.inputs))
        if signature in seen or any(e is None for e in examples):
            continue
        seen.add(signature)
        try:
            node.op.fn(*examples)
        except Exception as error:  # noqa: BLE001 - the first call compiles it instead
            logger.debug("synkhronos: inner function of %s not compiled ahead (%s)", node, error)
            continue
        called += 1
    if called:
        logger.info(
            "synkhronos: compiled %d inner functions ahead in %.1f s",
            called,
            time.monotonic() - start,
        )
    return called
