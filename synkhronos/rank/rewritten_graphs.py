"""Rewritten graphs kept on disk: a function's graph is rewritten once, by one rank, for
every rank and for later runs of the same script.

``pytensor.function`` rewrites a graph (canonicalization, fusion, in-place ops) before it
compiles it; for ResNet-50's training step that takes minutes on a small CPU, every time,
on every rank, since PyTensor keeps compiled code on disk but not rewritten graphs.
:func:`compile_function` does what ``pytensor.function`` does, except that the rewritten
graph is stored in PyTensor's compile folder under a key of everything the rewriting
depends on (the graph before rewriting, the mode, the configuration, the versions of
PyTensor and synkhronos). Another rank, or a later run, links the stored graph instead of
rewriting its own: every rank then runs the same graph, and so the same compiled code.

The key of a graph is computed once, on rank 0 (:func:`graph_key`, at
:func:`synkhronos.function`), and travels with the graph: the workers' copies, being
unpickled, may pickle to other bytes (a set's order follows the process's string hashes).
A stored graph refers to its function's inputs (shared variables included) by position,
so that it can be linked with the inputs of another process. A file that cannot be read
is rewritten and stored again; ``python -m synkhronos sweep --cache`` removes them all.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import io
import logging
import os
import pickle
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import pytensor
from pytensor.compile.io import SymbolicOutput
from pytensor.compile.maker import FunctionMaker
from pytensor.compile.mode import Mode, get_mode
from pytensor.compile.rebuild import construct_function_ins_and_outs
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Apply, Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.traversal import io_toposort
from pytensor.link.vm import VMLinker
from pytensor.misc.frozendict import frozendict

from synkhronos.rank.c_modules import compile_share
from synkhronos.rank.graphs import is_subclass, not_updated, with_default_updates
from synkhronos.rank.inner_functions import compile_inner_functions
from synkhronos.rank.inplace_rewrite import with_fast_inplace
from synkhronos.rank.protection_check import with_fast_protection_check

logger = logging.getLogger(__name__)

FOLDER = "synkhronos-graphs"
"""The folder of stored graphs, in PyTensor's compile folder (``pytensor.config.compiledir``,
which ``PYTENSOR_FLAGS=base_compiledir=...`` moves)."""

# pytensor.function's keyword arguments that compile_function handles; with any other
# (profile, say) the function is compiled by pytensor.function itself, and not stored.
_HANDLED = {
    "updates",
    "givens",
    "no_default_updates",
    "rebuild_strict",
    "allow_input_downcast",
    "on_unused_input",
    "accept_inplace",
}
_REBUILD = ("updates", "givens", "no_default_updates", "rebuild_strict", "allow_input_downcast")


def folder() -> Path:
    """Where the stored graphs of this PyTensor configuration are."""
    return Path(pytensor.config.compiledir) / FOLDER


@functools.cache
def _code_version() -> str:
    """A digest of synkhronos' own source (its ops and rewrites change what is stored)."""
    digest = hashlib.sha256(pytensor.__version__.encode())
    root = Path(__file__).resolve().parent.parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _configuration() -> str:
    """The PyTensor settings that change how a graph is rewritten."""
    config = pytensor.config
    names = (
        "floatX", "mode", "linker", "optimizer", "optimizer_including",
        "optimizer_excluding", "optimizer_requiring", "on_opt_error",
    )  # fmt: skip
    return repr([(n, str(getattr(config, n, None))) for n in names] + [config.get_config_hash()])


def _shared_in_key(number: int, type_name: str) -> None:
    """What a shared variable is in a key: its order of appearance and its type."""


class _KeyPickler(pickle.Pickler):
    """Pickles a graph with each shared variable replaced by its order of appearance and
    type (its value does not change how the graph is rewritten), and each variable and
    node without what depends on the program around the graph rather than on the graph:
    a variable's number among all variables made (``auto_name``) and where it was made
    (``tag.trace``), the function graphs that imported or removed a node."""

    def __init__(self, file):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.shared: dict[int, int] = {}

    def reducer_override(self, obj):
        # (Not persistent_id: pickle asks that of every object, ints and strings too, and
        # not only once per object.) A key is never unpickled: any callable names it.
        if is_subclass(type(obj), SharedVariable):
            number = self.shared.setdefault(id(obj), len(self.shared))
            return (_shared_in_key, (number, str(obj.type)))
        # An inner graph (a scan's) holds sets of its nodes, which pickle in the order of
        # their hashes, another in every process: the key takes its inputs and outputs.
        # (pickle calls no override for a plain set: an op that keeps one in its state
        # gets another key in another run, and is rewritten again, never mistaken.)
        if is_subclass(type(obj), FunctionGraph):
            return (FunctionGraph, (obj.inputs, obj.outputs))
        # A frozendict (in an op's properties) keeps its hash once asked, a hash of
        # strings, another in every process: the key takes its items alone.
        if is_subclass(type(obj), frozendict):
            return (type(obj), (dict(obj),))
        if is_subclass(type(obj), Variable):
            history = _VARIABLE_HISTORY
        elif is_subclass(type(obj), Apply):
            history = _NODE_HISTORY
        else:
            return NotImplemented
        reduced = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        if len(reduced) < 3 or not isinstance(reduced[2], dict):
            return NotImplemented
        func, args, state, *rest = reduced
        state = {k: v for k, v in state.items() if k not in ("auto_name", "tag")}
        tag = vars(getattr(obj, "tag", {}))
        state["tag"] = {k: v for k, v in tag.items() if k not in history}
        return (func, args, state, *rest)


# What PyTensor writes in tags about a graph's history in this process, not about the
# graph: where a variable was made, and which function graphs imported a node and
# removed it (every FunctionGraph built over a node appends to these: a key would
# depend on what the process built before, checks and analyses included).
_VARIABLE_HISTORY = ("trace",)
_NODE_HISTORY = ("imported_by", "removed_by")


def graph_key(variables: list, whole: object, updates: Sequence = ()) -> str | None:
    """(Rank 0) The key of ``whole`` (a function's description: its graph, the kinds of
    its outputs, its keyword arguments...), whose variables are ``variables``; None if it
    does not pickle (then every rank rewrites the graph, as ``pytensor.function`` does).

    The default updates of the shared variables the graph reaches, and of those that these
    reach, are part of the key: a function applies them, except those of the variables
    its explicit ``updates`` (pairs) update.
    """
    roots = with_default_updates(variables, not_updated(list(updates)))
    buffer = io.BytesIO()
    try:
        # The nodes first, inputs before users, so that pickle's recursion stays shallow.
        _KeyPickler(buffer).dump((io_toposort([], roots), roots, whole))
    except Exception as error:  # noqa: BLE001 - anything unpicklable: no key, no store
        logger.debug("synkhronos: graph not stored (%s)", error)
        return None
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def stored_path(key: str, material: list, suffix: str) -> Path:
    """Where what is made of the graph of ``key`` (and of ``material``, a list of what
    else it depends on) is kept, for this PyTensor configuration and this code."""
    digest = hashlib.sha256(repr([key, *material, _configuration(), _code_version()]).encode())
    return folder() / f"{digest.hexdigest()}{suffix}"


def write_whole(path: Path, data: bytes, replace: bool = True) -> bool:
    """Write ``data`` to ``path`` in one step: a reader never sees half a file. Without
    ``replace``, a file already there is kept; whether ``data`` was written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    if replace:
        os.replace(tmp, path)
        return True
    try:
        os.link(tmp, path)  # fails if the file exists, unlike a rename
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


def _checked_path(key: str) -> Path:
    return stored_path(key, [], ".checked")


def was_checked(key: str | None) -> bool:
    """(Rank 0) Whether the graph of ``key`` passed rank 0's checks at
    :func:`synkhronos.function` before (it ships, and it builds), with this PyTensor
    configuration and this code (see :func:`mark_checked`)."""
    return key is not None and _checked_path(key).exists()


def mark_checked(key: str | None) -> None:
    """(Rank 0) Note that the graph of ``key`` passed rank 0's checks (an empty file
    beside the stored graphs; a note that cannot be written is left out)."""
    if key is None:
        return
    try:
        write_whole(_checked_path(key), b"")
    except OSError as error:
        logger.debug("synkhronos: check of %s not noted (%s)", key, error)


class _PositionPickler(pickle.Pickler):
    """Pickles with the given variables by their position in a list."""

    def __init__(self, file, variables: list):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.positions = {id(var): i for i, var in enumerate(variables)}

    def persistent_id(self, obj):
        return self.positions.get(id(obj))


class _PositionUnpickler(pickle.Unpickler):
    def __init__(self, file, variables: list):
        super().__init__(file)
        self.variables = variables

    def persistent_load(self, pid):
        return self.variables[pid]


def dumps_by_position(obj, variables: list) -> bytes:
    """``obj`` pickled with each of ``variables`` by its position: graphs built on
    another run's variables (a function's inputs, a graph's roots), to be loaded onto this
    run's by :func:`loads_by_position`. Graphs in ``obj`` should come as their nodes
    first, inputs before users, so that pickle's recursion stays shallow."""
    buffer = io.BytesIO()
    _PositionPickler(buffer, variables).dump(obj)
    return buffer.getvalue()


def loads_by_position(data: bytes, variables: list):
    """What :func:`dumps_by_position` pickled, onto ``variables``."""
    return _PositionUnpickler(io.BytesIO(data), variables).load()


def _store(path: Path, fgraph: FunctionGraph) -> bool:
    """Write ``fgraph``'s outputs and update mapping to ``path``, its inputs by position,
    unless a graph is stored there already; whether it was written.

    The first graph stored stays: two ranks may rewrite the same graph at once (rank 0
    does not wait for a worker that holds the lock), and every rank must link the same
    one."""
    contents = (io_toposort(fgraph.inputs, fgraph.outputs), fgraph.outputs, fgraph.update_mapping)
    return write_whole(path, dumps_by_position(contents, fgraph.inputs), replace=False)


def _load(path: Path, ins: list, outs: list) -> tuple[FunctionGraph, list] | None:
    """The stored graph at ``path`` as a function graph of ``ins``' variables and
    ``outs``' places, ready to link, and its update values; None when there is none, or
    it does not fit ``ins`` and ``outs``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    variables = [spec.variable for spec in ins]
    try:
        _, outputs, update_mapping = loads_by_position(data, variables)
    except Exception as error:  # noqa: BLE001 - a damaged file is rewritten again
        logger.warning("synkhronos: stored graph %s unreadable (%s); rewriting", path, error)
        path.unlink(missing_ok=True)  # so that the rewritten graph can take its place
        return None
    updated = [i for i, spec in enumerate(ins) if spec.update is not None]
    expected = {len(outs) + k: i for k, i in enumerate(updated)}
    if update_mapping != expected or len(outputs) != len(outs) + len(expected):
        logger.warning("synkhronos: stored graph %s does not fit; rewriting", path)
        path.unlink(missing_ok=True)
        return None
    return FunctionGraph(variables, outputs[: len(outs)], clone=False), outputs[len(outs) :]


class _Prepared:
    """What :func:`compile_function` and :func:`store_ahead` make of their arguments: the
    function's inputs and outputs as ``pytensor.function`` builds them, where the rewritten
    graph is stored, and the mode that rewrites and links it."""

    def __init__(self, inputs: list, outputs: list, mode, name, key: str, kwargs: dict):
        self.ins, self.cloned = construct_function_ins_and_outs(
            inputs, outputs, **{k: kwargs[k] for k in _REBUILD if k in kwargs}
        )
        self.outs = [FunctionMaker.wrap_out(o) for o in self.cloned]
        described = [
            (str(s.variable.type), s.mutable, s.borrow, s.update is not None) for s in self.ins
        ]
        self.path = stored_path(key, [str(mode), described, [o.borrow for o in self.outs]], ".pkl")
        self.mode = with_fast_protection_check(with_fast_inplace(get_mode(mode)))
        self.options = {"on_unused_input": kwargs.get("on_unused_input"), "name": name}
        self.accept_inplace = kwargs.get("accept_inplace", False)

    def load(self) -> tuple[FunctionGraph, list] | None:
        """The stored graph (see :func:`_load`)."""
        return _load(self.path, self.ins, self.outs)

    def rewrite(self) -> FunctionMaker:
        """A function maker, which rewrites the graph."""
        return self.mode.function_maker(
            self.ins, self.outs, self.mode, accept_inplace=self.accept_inplace, **self.options
        )

    @property
    def linked_mark(self) -> Path:
        """An empty file beside the stored graph once a rank linked it: its C modules are
        in the cache."""
        return self.path.with_suffix(".linked")


def shared_inputs(inputs: list, outputs, name, **kwargs) -> list:
    """The shared variables that ``pytensor.function(inputs, outputs, name=name,
    **kwargs)`` reads or updates: its graph built as that builds it (an input missing, an
    update of another type raise here), neither rewritten nor linked."""
    ins, cloned = construct_function_ins_and_outs(
        inputs, outputs, **{k: kwargs[k] for k in _REBUILD if k in kwargs}
    )
    mode = Mode(linker="py", optimizer="None")
    maker = mode.function_maker(
        ins, [FunctionMaker.wrap_out(o) for o in cloned], mode,
        accept_inplace=kwargs.get("accept_inplace", False),
        on_unused_input=kwargs.get("on_unused_input"), name=name,
    )  # fmt: skip
    return [spec.variable for spec in maker.inputs if spec.implicit]


def _storable(outputs, mode, kwargs: dict) -> bool:
    """Whether a function's rewritten graph can be stored, given a key (see
    :func:`compile_function`)."""
    plain = not isinstance(outputs, list) or set(kwargs) - _HANDLED
    return not plain and (mode is None or isinstance(mode, str))


def store_ahead(
    inputs: list,
    outputs: list,
    mode,
    name,
    key: str | None,
    keep_going: Callable[[], bool] = lambda: True,
    **kwargs,
) -> bool:
    """Rewrite and store the graph that ``compile_function`` with the same arguments links,
    unless it is stored already or cannot be, then compile the C modules its link needs
    (in CVM) as long as ``keep_going()`` says so; whether this stored it. No lock is taken:
    a worker does this for a function it will compile later, while it waits for another
    rank's compile (:class:`~synkhronos.rank.first_calls.FirstCalls`). What two ranks
    rewrite at once is stored once, the first (see :func:`_store`)."""
    if key is None or not _storable(outputs, mode, kwargs):
        return False
    prepared = _Prepared(inputs, outputs, mode, name, key, kwargs)
    if prepared.path.exists():
        return False
    written = _store(prepared.path, prepared.rewrite().fgraph)
    if not written:
        return False
    logger.info("synkhronos: rewritten graph of %s stored ahead in %s", name, prepared.path)
    stored = prepared.load()
    if stored is not None and keep_going():
        maker = _linking_maker(prepared, stored)
        if isinstance(maker.linker, VMLinker) and maker.linker.c_thunks:
            compile_share(maker.fgraph, 0, 1, folder(), keep_going)
    return True


def _linking_maker(prepared: _Prepared, stored: tuple[FunctionGraph, list]) -> FunctionMaker:
    """The function maker that links the stored graph (``_load``'s result) as the
    function's inputs and outputs, without rewriting it."""
    fgraph, update_values = stored
    updates = iter(update_values)
    linked_ins = []
    for spec in prepared.ins:
        spec = copy.copy(spec)
        if spec.update is not None:
            spec.update = next(updates)
        linked_ins.append(spec)
    linked_outs = [
        SymbolicOutput(var, borrow=out.borrow)
        for var, out in zip(fgraph.outputs, prepared.outs, strict=True)
    ]
    return prepared.mode.function_maker(
        linked_ins, linked_outs, prepared.mode, accept_inplace=True, fgraph=fgraph,
        no_fgraph_prep=True, **prepared.options,
    )  # fmt: skip


def compile_function(
    inputs: list,
    outputs: list,
    mode,
    name,
    key: str | None,
    lock: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    share: tuple[int, int] = (0, 1),
    **kwargs,
):
    """``pytensor.function(inputs, outputs, mode=mode, name=name, **kwargs)``, with the
    rewritten graph taken from, or stored to, the folder under ``key`` and the variant's
    details (see the module docstring). Without a key, with a mode that is not a name, or
    with arguments beyond those :data:`_HANDLED`, it is ``pytensor.function``.

    ``lock`` is held while a graph is rewritten, not while a stored one is loaded: ranks
    that find the graph stored link it at the same time. A rank that links a graph no rank
    linked before (it rewrote the graph, waited for the rank that did, or found it stored
    ahead) first compiles its ``share`` (its index, the number of ranks) of the C modules
    the link needs (:mod:`synkhronos.rank.c_modules`); a worker that did not find it
    stored compiles the graph's inner functions
    (:mod:`synkhronos.rank.inner_functions`) before it waits for the rank that rewrites it.
    """
    if key is None or not _storable(outputs, mode, kwargs):
        with lock():
            return pytensor.function(inputs, outputs, mode=mode, name=name, **kwargs)
    prepared = _Prepared(inputs, outputs, mode, name, key, kwargs)
    stored, how = prepared.load(), "loaded from"
    if stored is None:
        if share[0] > 0 and isinstance(prepared.mode.linker, VMLinker):
            # A worker waits for rank 0, which rewrites at once: time to compile ahead.
            compile_inner_functions(
                [*prepared.cloned, *(s.update for s in prepared.ins if s.update is not None)]
            )
        with lock():
            stored = prepared.load()  # stored by the rank this one waited for?
            if stored is None:
                maker = prepared.rewrite()
                try:
                    written = _store(prepared.path, maker.fgraph)
                except Exception as error:  # noqa: BLE001 - the next run rewrites again
                    logger.warning("synkhronos: rewritten graph not stored (%s)", error)
                    return maker.create()
                # This rank links the stored graph too, not its own: a graph's order of
                # nodes and users, which code generators follow, is then the same on
                # every rank, and so is the graph where two ranks rewrote it at once.
                how = "stored in" if written else "rewritten, then another rank's loaded from"
                stored = prepared.load()
                if stored is None:
                    return maker.create()
    logger.info("synkhronos: rewritten graph of %s %s %s", name or "a function", how, prepared.path)
    maker = _linking_maker(prepared, stored)
    # Linked before, the graph's C modules are in the cache; alone, a rank gains nothing
    # by compiling them before the link does.
    linked_before = prepared.linked_mark.exists()
    c_thunks = isinstance(maker.linker, VMLinker) and maker.linker.c_thunks
    if not linked_before and share[1] > 1 and c_thunks:
        compile_share(maker.fgraph, *share, folder())
    function = maker.create()
    if not linked_before:
        with contextlib.suppress(OSError):  # unmarked, the next run lists the modules again
            write_whole(prepared.linked_mark, b"")
    return function
