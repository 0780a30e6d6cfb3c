"""Shipping graphs to the workers, keeping each shared variable one object per rank.

Every shared variable that reaches the workers gets an index in a registry kept in the same
order on every rank. A later shipment refers to an already shipped variable by its index
(a pickle persistent id), so functions distributed at different times still share it.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.traversal import ancestors, io_toposort


@dataclass
class GraphSpec:
    """Everything a rank needs to compile one synkhronos function."""

    fid: int
    name: str | None
    inputs: list
    bcast_inputs: list
    outputs: list
    output_ops: list
    updates: list = field(default_factory=list)
    givens: list = field(default_factory=list)
    sliceable: list = field(default_factory=list)
    mode: object = None
    update_ops: list = field(default_factory=list)  # combine each update over num_slices
    function_kwargs: dict = field(default_factory=dict)  # more pytensor.function arguments

    def variables(self) -> list:
        """Every variable the spec refers to (for finding its shared variables)."""
        pairs = [v for pair in self.updates + self.givens for v in pair]
        return self.inputs + self.bcast_inputs + self.outputs + pairs + self.sliceable


class SharedRegistry:
    """Shared variables in shipping order; the same order on every rank."""

    def __init__(self):
        self.variables: list[SharedVariable] = []
        self._index: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.variables)

    def __getitem__(self, index: int) -> SharedVariable:
        return self.variables[index]

    def index(self, var) -> int | None:
        """The registry index of ``var``, or None if it was never shipped."""
        return self._index.get(id(var))

    def add(self, var: SharedVariable) -> int:
        self._index[id(var)] = len(self.variables)
        self.variables.append(var)
        return len(self.variables) - 1


def _graph_roots(specs: list[GraphSpec], registry: SharedRegistry) -> list:
    """The specs' variables, plus the ``default_update`` expressions of the shared
    variables they reach that travel now (the workers have the others), and so on."""
    roots, frontier, seen = [], [v for spec in specs for v in spec.variables()], set()
    while frontier:
        roots += frontier
        frontier = []
        for var in ancestors(roots):
            update = getattr(var, "default_update", None)
            if update is not None and id(var) not in seen and registry.index(var) is None:
                seen.add(id(var))
                frontier.append(update)
    return roots


_DEFAULT_UPDATE = "_default_update"  # where PyTensor keeps SharedVariable.default_update


class _Pickler(pickle.Pickler):
    def __init__(self, file, registry: SharedRegistry):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.registry = registry

    def persistent_id(self, obj):
        if isinstance(obj, SharedVariable):
            index = self.registry.index(obj)
            if index is not None:
                return index
        return None

    def reducer_override(self, obj):
        # A shared variable's default update (a batch-norm average, say) is the graph of
        # everything before it; pickled with the variable, at the variable's first use,
        # it would recurse through all of that. It travels on its own, after the nodes.
        if isinstance(obj, SharedVariable) and obj.__dict__.get(_DEFAULT_UPDATE) is not None:
            func, args, state, *rest = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
            return (func, args, {**state, _DEFAULT_UPDATE: None}, *rest)
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, registry: SharedRegistry):
        super().__init__(file)
        self.registry = registry

    def persistent_load(self, pid):
        return self.registry[pid]


def pack(specs: list[GraphSpec], registry: SharedRegistry) -> bytes:
    """(Rank 0) pickle ``specs`` and register the shared variables shipped for the first time."""
    roots = _graph_roots(specs, registry)
    shared = {id(v): v for v in ancestors(roots) if isinstance(v, SharedVariable)}
    new = [v for v in shared.values() if registry.index(v) is None]
    # Pickle recurses along the graph, which deep graphs (ResNet-50's gradient) make deeper
    # than Python allows. The graph's nodes go first, inputs before users: each node then
    # finds its inputs pickled already, and the recursion stays shallow.
    nodes = io_toposort([], roots)
    updates = [(v, v.__dict__.get(_DEFAULT_UPDATE)) for v in new
               if v.__dict__.get(_DEFAULT_UPDATE) is not None]
    buffer = io.BytesIO()
    _Pickler(buffer, registry).dump((nodes, new, specs, updates))
    for var in new:
        registry.add(var)
    return buffer.getvalue()


def unpack(payload: bytes, registry: SharedRegistry, rank: int) -> list[GraphSpec]:
    """(Worker) unpickle specs, registering their new shared variables in shipping order.

    Random generators arrive with rank 0's state; each worker's is reseeded from it and
    its rank, so that ranks draw different numbers (dropout masks, say).
    """
    _, new, specs, updates = _Unpickler(io.BytesIO(payload), registry).load()
    for var, update in updates:
        var.__dict__[_DEFAULT_UPDATE] = update
    for var in new:
        registry.add(var)
        value = var.get_value(borrow=True)
        if isinstance(value, np.random.Generator):
            var.set_value(np.random.default_rng([rank, *value.integers(2**63, size=2)]),
                          borrow=True)
    return specs
