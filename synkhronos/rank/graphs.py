"""Shipping graphs to the workers, keeping each shared variable one object per rank.

Every shared variable that reaches the workers gets an index in a registry kept in the same
order on every rank. A later shipment refers to an already shipped variable by its index
(a pickle persistent id), so functions distributed at different times still share it.

A worker is a fresh interpreter: it finds a class or function by its module path only.
:func:`check_shippable` makes sure, in rank 0 and before anything is sent, that a graph
pickles, unpickles, and refers to nothing the workers could not import (``__main__``,
lambdas, nested functions, modules off the path).
"""

from __future__ import annotations

import functools
import io
import pickle
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytensor
from pytensor.compile.builders import OpFromGraph
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.traversal import ancestors, io_toposort
from pytensor.link.basic import Container

COMPILE_SETTINGS = (
    "floatX", "mode", "linker", "cast_policy", "on_opt_error", "cxx", "gcc__cxxflags",
    "vm__lazy",
)  # fmt: skip
"""The PyTensor settings that a program may change while it runs and that change how a
graph is rewritten or compiled (the optimizer settings cannot change once PyTensor is
imported: every rank reads them from the same environment; BLAS flags are left out, as
asking for them searches for a BLAS library)."""


def compile_settings() -> tuple[tuple[str, Any], ...]:
    """This rank's values of :data:`COMPILE_SETTINGS`, as ``(name, value)`` pairs."""
    return tuple((name, getattr(pytensor.config, name)) for name in COMPILE_SETTINGS)


# A spec's settings with these compile it with Numba's fast-math flags, which every rank
# otherwise compiles without (rank.compiled: fresh and cached code then give the same bits).
FAST_MATH = (("numba__fastmath", True),)


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
    mode: Any = None  # a PyTensor mode, by name or as a Mode; None: the backend's
    update_ops: list = field(default_factory=list)  # combine each update over num_slices
    function_kwargs: dict = field(default_factory=dict)  # more pytensor.function arguments
    # Rank 0's key of the graph: where every rank finds it rewritten (rank.rewritten_graphs)
    key: str | None = None
    # Rank 0's settings when it built the graph: every rank compiles under them, not under
    # its own (a worker took rank 0's environment when it started; the program may have
    # set pytensor.config.mode since, and a rank in another mode computes other bits).
    settings: tuple = field(default_factory=compile_settings)
    # Random generators every rank keeps rank 0's state of (a training function's: every
    # rank draws the whole batch's numbers and takes its rows'); others are reseeded.
    same_on_every_rank: list = field(default_factory=list)
    # Shared variables each call writes before a later step of the call reads them, and
    # nothing reads after the call (a training function's handover between its phases): a
    # fused chain keeps them inside its program (rank.fused_chain).
    handover: list = field(default_factory=list)

    def describe(self) -> tuple:
        """What defines the compiled function (all but its number and key)."""
        return (
            self.name, self.inputs, self.bcast_inputs, self.outputs, self.output_ops,
            self.updates, self.givens, self.sliceable, str(self.mode), self.update_ops,
            self.function_kwargs, self.settings,
        )  # fmt: skip

    def variables(self) -> list:
        """Every variable the spec refers to (for finding its shared variables)."""
        pairs = [v for pair in self.updates + self.givens for v in pair]
        return self.inputs + self.bcast_inputs + self.outputs + pairs + self.sliceable


class SharedRegistry:
    """Shared variables in shipping order; the same order on every rank."""

    def __init__(self) -> None:
        self.variables: list[SharedVariable] = []
        self._index: dict[int, int] = {}
        # A clone of a shared variable shares its storage (its container): a Lasagne batch
        # norm's graph reads a clone of the running averages the user holds.
        self._by_storage: dict[int, int] = {}
        # (Rank 0) The variables and nodes that passed :func:`check_shippable`, by id: a
        # later check takes them as they are (each round of ResNet-110's training function
        # reaches the running averages of the layers before it, and their updates). Held
        # weakly, so that the graphs of functions the program dropped are freed; an entry
        # goes with its object, and :func:`_passed` compares the object itself, as the id
        # may come back with a new one.
        self.checked: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def __len__(self) -> int:
        return len(self.variables)

    def __getitem__(self, index: int) -> SharedVariable:
        return self.variables[index]

    def index(self, var) -> int | None:
        """The registry index of ``var``, or None if it was never shipped."""
        return self._index.get(id(var))

    def holding(self, container: Container) -> int | None:
        """The registry index of the first shipped variable whose storage is ``container``
        (a shared variable's, or its clone's), or None."""
        return self._by_storage.get(id(container))

    def add(self, var: SharedVariable) -> int:
        self._index[id(var)] = len(self.variables)
        self._by_storage.setdefault(id(var.container), len(self.variables))
        self.variables.append(var)
        return len(self.variables) - 1


def with_default_updates(variables: list, include=lambda var: True) -> list:
    """``variables``, plus the ``default_update`` expressions of the shared variables they
    reach (those that ``include`` accepts), plus those that these reach, and so on: what
    a function of ``variables`` computes, as PyTensor applies default updates."""
    roots, frontier, seen = [], list(variables), set()
    while frontier:
        roots += frontier
        frontier = []
        for var in ancestors(roots):
            update = getattr(var, "default_update", None)
            if update is not None and id(var) not in seen and include(var):
                seen.add(id(var))
                frontier.append(update)
    return roots


def not_updated(updates: list):
    """For :func:`with_default_updates`: whether a shared variable's default update applies
    in a function with these explicit ``updates`` (pairs, the variable first): an explicit
    update overrides the default one, as in ``pytensor.function``. (A training function's
    round reads the running averages of the layers before it, each updated explicitly:
    their default updates, the graph up to each layer, are not its graph.)"""
    explicit = {id(pair[0]) for pair in updates}
    return lambda var: id(var) not in explicit


def _graph_roots(specs: list[GraphSpec], registry: SharedRegistry, travels) -> list:
    """The specs' variables, plus the default updates (:func:`with_default_updates`) of the
    shared variables that ``travels`` accepts."""
    variables = [v for spec in specs for v in spec.variables()]
    return with_default_updates(variables, travels)


def _unshipped(registry: SharedRegistry):
    """Whether a shared variable travels with a shipment: the workers have the others."""
    return lambda var: registry.index(var) is None


def _unchecked(registry: SharedRegistry):
    """Whether a shared variable travels with a shipment whose check
    (:func:`check_shippable`) is to come, its default update not checked yet."""
    return lambda var: registry.index(var) is None and not _passed(registry, _update(var))


def _passed(registry: SharedRegistry, obj) -> bool:
    """Whether ``obj`` (a variable or node) passed a check."""
    return registry.checked.get(id(obj)) is obj


def _update(var):
    return var.__dict__.get(_DEFAULT_UPDATE)


_DEFAULT_UPDATE = "_default_update"  # where PyTensor keeps SharedVariable.default_update

_BY_NAME = (type, types.FunctionType, types.BuiltinFunctionType)  # pickled by module path


@functools.cache
def _importable(module: str) -> bool:
    """Whether a fresh interpreter with this ``sys.path`` (the workers get rank 0's) finds
    ``module``'s top-level package: asks the import system's finders, not ``sys.modules``,
    which also holds modules made at run time."""
    top = module.partition(".")[0]
    for finder in sys.meta_path:
        try:
            if finder.find_spec(top, None) is not None:
                return True
        except Exception:  # noqa: BLE001, S112 - a finder that fails finds nothing
            continue
    return False


def _unreachable(obj) -> str | None:
    """Why a worker could not find ``obj`` (a class or function) by its module path, or
    None if it can."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", getattr(obj, "__name__", "?"))
    if module == "__main__":
        return (
            f"{qualname} is defined in __main__ (the script), which the workers do not "
            f"run; define it in a module they can import"
        )
    if "<lambda>" in qualname or "<locals>" in qualname:
        return (
            f"{module}.{qualname} is a lambda, or defined inside a function, which "
            f"pickle cannot name; define it at a module's top level"
        )
    if module is not None and not _importable(module):
        return (
            f"{module}.{qualname}: module {module} cannot be imported by a fresh "
            f"interpreter (it is not on sys.path)"
        )
    return None


@functools.cache
def is_subclass(cls: type, base: type) -> bool:
    """``issubclass(cls, base)``, remembered: a pickler asks of every object of a graph
    whether it is a shared variable, and PyTensor's classes answer ``isinstance`` through
    the ABC machinery, which took half of the time of pickling ResNet-50's step."""
    return issubclass(cls, base)


def _registered(index: int) -> SharedVariable:
    """Stands, in a shipment, for the shared variable of registry ``index``: each rank's
    unpickler (:class:`_Unpickler`) gives its own."""
    raise pickle.UnpicklingError(f"shared variable {index} unpickled without its registry")


def _checked_object(key: int):
    """Stands, in a check's pickle, for a variable or node that passed an earlier check:
    rank 0's unpickler gives the object itself."""
    raise pickle.UnpicklingError(f"checked object {key} unpickled without its registry")


def _storage_of(index: int) -> Container:
    """Stands, in a shipment, for the storage of the shared variable of registry ``index``:
    a variable shipped later that shares it (a clone, or the variable a clone was made
    of) shares it on every rank too."""
    raise pickle.UnpicklingError(f"storage {index} unpickled without its registry")


class _Pickler(pickle.Pickler):
    def __init__(self, file, registry: SharedRegistry, check: bool = False):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.registry = registry
        self.check = check

    def reducer_override(self, obj):
        if self.check and _passed(self.registry, obj):
            return (_checked_object, (id(obj),))
        if is_subclass(type(obj), SharedVariable):
            # A shipped shared variable goes by its registry index. (Not by persistent_id:
            # pickle asks that of every object, ints and strings too, at every reference.)
            index = self.registry.index(obj)
            if index is not None:
                return (_registered, (index,))
            # A new one's default update (a batch-norm average, say) is the graph of
            # everything before it; pickled with the variable, at the variable's first
            # use, it would recurse through all of that. It travels on its own, after the
            # nodes.
            if obj.__dict__.get(_DEFAULT_UPDATE) is not None:
                func, args, state, *rest = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
                return (func, args, {**state, _DEFAULT_UPDATE: None}, *rest)
            return NotImplemented
        if type(obj) is Container:
            index = self.registry.holding(obj)
            return NotImplemented if index is None else (_storage_of, (index,))
        if isinstance(obj, OpFromGraph) and (obj._lop_op_cache or obj._rop_op_cache):
            # The ops of its gradient, cached when it was taken, are functions local to
            # PyTensor's methods, which pickle cannot name (PyTensor 3.3 ships such an op:
            # LogSumExp). The workers take no gradient; one would build them again.
            func, args, state, *rest = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
            return (func, args, {**state, "_lop_op_cache": {}, "_rop_op_cache": None}, *rest)
        if isinstance(obj, _BY_NAME):
            reason = _unreachable(obj)
            if reason is not None:
                raise pickle.PicklingError(reason)
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, registry: SharedRegistry):
        super().__init__(file)
        self.registry = registry

    def find_class(self, module, name):
        if (module, name) == (__name__, _registered.__name__):
            return self.registry.__getitem__
        if (module, name) == (__name__, _storage_of.__name__):
            return lambda index: self.registry[index].container
        if (module, name) == (__name__, _checked_object.__name__):
            return self.registry.checked.__getitem__
        return super().find_class(module, name)


def _contents(specs: list[GraphSpec], registry: SharedRegistry, travels) -> tuple:
    """What a shipment of ``specs`` pickles: ``(nodes, new shared variables, specs, default
    updates)``, the default updates of those new variables that ``travels`` accepts."""
    roots = _graph_roots(specs, registry, travels)
    shared = {id(v): v for v in ancestors(roots) if isinstance(v, SharedVariable)}
    new = [v for v in shared.values() if registry.index(v) is None]
    # Pickle recurses along the graph, which deep graphs (ResNet-50's gradient) make deeper
    # than Python allows. The graph's nodes go first, inputs before users: each node then
    # finds its inputs pickled already, and the recursion stays shallow.
    nodes = io_toposort([], roots)
    updates = [(v, _update(v)) for v in new if _update(v) is not None and travels(v)]
    return nodes, new, specs, updates


def _dumps(obj, registry: SharedRegistry, check: bool = False) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, registry, check).dump(obj)
    return buffer.getvalue()


def pack(specs: list[GraphSpec], registry: SharedRegistry) -> bytes:
    """(Rank 0) pickle ``specs`` and register the shared variables shipped for the first time."""
    contents = _contents(specs, registry, _unshipped(registry))
    payload = _dumps(contents, registry)
    for var in contents[1]:
        registry.add(var)
    return payload


def check_shippable(spec: GraphSpec, registry: SharedRegistry, what: str) -> None:
    """(Rank 0) ``TypeError`` naming what in ``spec`` the workers could not unpickle.

    The spec is pickled as a shipment would pickle it and unpickled again, here, and every
    class and function it names must be importable by module path in a fresh interpreter;
    nothing is registered or sent. The error names the first Op (or shared variable) at
    fault. What passed an earlier check (a variable, a node, a default update) is not
    checked again: a training function's rounds, each checked, read the same running
    averages.
    """
    contents = _contents([spec], registry, _unchecked(registry))
    try:
        _round_trip(contents, registry, check=True)
    except Exception as error:  # noqa: BLE001 - whatever pickle raised, named below
        culprit = _culprit(contents, registry)
        raise TypeError(f"{what} cannot be sent to the workers: {culprit}{error}") from error
    nodes, new, _, updates = contents
    passed = [*nodes, *(v for n in nodes for v in (*n.inputs, *n.outputs)), *new]
    passed += [update for _, update in updates] + spec.variables()
    registry.checked.update((id(obj), obj) for obj in passed)


def _round_trip(obj, registry: SharedRegistry, check: bool = False) -> None:
    _Unpickler(io.BytesIO(_dumps(obj, registry, check)), registry).load()


def _culprit(contents: tuple, registry: SharedRegistry) -> str:
    """``"<what>: "`` for the first Op or new shared variable that does not pickle alone
    (empty if each does)."""
    nodes, new, _, _ = contents
    for label, obj in [
        *((f"Op {n.op} (in {n})", n.op) for n in nodes),
        *((f"shared variable {v}", v) for v in new),
    ]:
        try:
            _round_trip(obj, registry)
        except Exception:  # noqa: BLE001 - the first that fails is the one to name
            return f"{label}: "
    return ""


def unpack(payload: bytes, registry: SharedRegistry, rank: int) -> list[GraphSpec]:
    """(Worker) unpickle specs, registering their new shared variables in shipping order.

    Random generators arrive with rank 0's state; each worker's is reseeded from it and
    its rank, so that ranks draw different numbers (dropout masks, say), except those a
    spec lists in ``same_on_every_rank`` and clones of a generator already held (they
    share its storage, and its state stays as it is).
    """
    _, new, specs, updates = _Unpickler(io.BytesIO(payload), registry).load()
    alike = {id(v) for spec in specs for v in spec.same_on_every_rank}
    for var, update in updates:
        var.__dict__[_DEFAULT_UPDATE] = update
    for var in new:
        reseeded = registry.holding(var.container) is not None  # a clone's: seeded already
        registry.add(var)
        value = var.get_value(borrow=True)
        if isinstance(value, np.random.Generator) and id(var) not in alike and not reseeded:
            var.set_value(
                np.random.default_rng([rank, *value.integers(2**63, size=2)]), borrow=True
            )
    return specs
