"""The C modules of a graph compiled by every rank at once, each rank its share.

In a mode that links op by op (CVM), PyTensor compiles the C code of each op into a module
of its compile folder, and holds the folder's lock (a file lock) while the compiler runs.
Ranks that link the same graph at the same time therefore take turns: the first compiles a
module while the others wait for the lock, and then find it; one core compiles at a time.

Before a rank links a graph, :func:`compile_share` compiles the modules that the cache
lacks and that fall to this rank. Every rank lists the graph's modules in the order of
its nodes, the same on every rank, and deals them out the same way: the longest code
first, each to the rank with the least code so far (a compile takes about a second plus
a second per 60 kB of code here). It compiles them as PyTensor
would, but in a folder of its own and without PyTensor's lock, and moves each finished
module, folder and all, into the compile folder, where PyTensor's cache (in any process)
finds it as if it had been compiled there. The link then finds the modules. The
code is PyTensor's, compiled for the key that PyTensor computes; a module that this misses
(another rank is late, an op's key came out otherwise) is compiled by the link, as before.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytensor
from pytensor.graph.fg import FunctionGraph
from pytensor.link.c import basic as c_basic
from pytensor.link.c import cmodule
from pytensor.link.c.op import COp

logger = logging.getLogger(__name__)


def _links_in_c(op) -> bool:
    """Whether the op-by-op linker links ``op`` with :meth:`COp.make_c_thunk` (an op
    that makes its own thunk, as ``Scan`` does, is left to the link)."""
    kind = type(op)
    return (
        isinstance(op, COp)
        and kind.make_thunk is COp.make_thunk
        and kind.make_c_thunk is COp.make_c_thunk
    )


def _is_float16(node) -> bool:
    return any(getattr(v.type, "dtype", "") == "float16" for v in node.inputs + node.outputs)


def _modules(fgraph: FunctionGraph) -> list[tuple]:
    """``(module hash, key, CLinker, length of its code)`` of each C module that linking
    ``fgraph`` op by op uses, in the order of the graph's nodes (the same on every rank
    that loaded the same stored graph). Each is built as :meth:`COp.make_c_thunk` builds
    it (the op-by-op linker passes no ``no_recycling``); ops of other keys with the same
    code share a module, as in PyTensor's cache. An op whose module cannot be described
    here is left out."""
    keys: dict = {}
    for node in fgraph.toposort():
        if not _links_in_c(node.op):
            continue
        if _is_float16(node) and not getattr(node.op, "_f16_ok", False):
            continue
        storage = {v: [None] for v in node.inputs + node.outputs}
        try:
            node.op.prepare_node(node, storage, {v: [False] for v in storage}, "c")
            linker = c_basic.CLinker().accept(FunctionGraph(node.inputs, node.outputs))
            key = linker.cmodule_key()
        except Exception:  # noqa: BLE001 - no C code, or none here: the link decides
            continue
        if key[0]:  # unversioned: PyTensor keeps no such module across processes
            keys.setdefault(key, linker)
    modules: dict[str, tuple] = {}
    for key, linker in keys.items():
        try:
            code = linker.get_src_code()
            module_hash = cmodule.get_module_hash(code, key)
        except Exception:  # noqa: BLE001 - no C code after all: the link decides
            continue
        modules.setdefault(module_hash, (module_hash, key, linker, len(code)))
    return list(modules.values())


# A module's compile, in bytes of its code: the headers every module includes.
_FIXED_COST = 60_000


def deal(lengths: list[int], count: int) -> list[int]:
    """The rank (of ``count``) that compiles each module, given the lengths of their code:
    the longest first, each to the rank with the least work so far, the lowest-numbered
    among equals; the same on every rank.

    Examples
    --------
    >>> deal([10_000, 200_000, 10_000, 10_000], 2)
    [1, 0, 1, 1]
    """
    load = [0] * count
    ranks = [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(count), key=lambda r: (load[r], r))
        ranks[i] = rank
        load[rank] += _FIXED_COST + lengths[i]
    return ranks


def _compile_into(folder: Path, module_hash: str, key, linker) -> Path:
    """Compile ``linker``'s module (of ``module_hash``, from :func:`_modules`) into a new
    module folder in ``folder``, as PyTensor's cache would (the compiler's command, a
    folder named ``tmp...``, the key file that the cache reads, naming the module where it
    will be: in the compile folder), without importing it; the module folder."""
    module = linker.get_dynamic_module()
    made = Path(tempfile.mkdtemp(dir=folder))
    linker.c_compiler().compile_str(
        module_name=module.code_hash,
        src_code=module.code(),
        location=str(made),
        include_dirs=linker.header_dirs(),
        lib_dirs=linker.lib_dirs(),
        libs=linker.libraries(),
        preargs=linker.compile_args(),
        py_module=False,
    )
    final = Path(pytensor.config.compiledir) / made.name
    key_data = cmodule.KeyData(
        keys={key},
        module_hash=module_hash,
        key_pkl=str(final / "key.pkl"),
        entry=str(final / f"{module.code_hash}.{cmodule.get_lib_extension()}"),
    )
    with open(made / "key.pkl", "wb") as file:
        pickle.dump(key_data, file, protocol=pickle.HIGHEST_PROTOCOL)
    return made


def compile_share(
    fgraph: FunctionGraph,
    index: int,
    count: int,
    scratch: Path,
    keep_going: Callable[[], bool] = lambda: True,
) -> int:
    """Compile this rank's share (``index`` of ``count`` ranks) of the C modules that
    linking ``fgraph`` op by op needs and PyTensor's cache lacks, in a new folder under
    ``scratch`` (on the compile folder's file system), and move each into the compile
    folder, as long as ``keep_going()`` says so before each; the number compiled."""
    if not pytensor.config.cxx:
        return 0
    start = time.monotonic()
    modules = _modules(fgraph)
    cache = c_basic.get_module_cache()
    cache.refresh(cleanup=False)
    ranks = deal([length for *_, length in modules], count)
    mine = [
        (module_hash, key, linker)
        for (module_hash, key, linker, _), rank in zip(modules, ranks, strict=True)
        if rank == index
        and module_hash not in cache.module_hash_to_key_data
        and key not in cache.entry_from_key
    ]
    if not mine:
        return 0
    compiled = 0
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        own = Path(tempfile.mkdtemp(prefix="c-modules-", dir=scratch))
    except OSError as error:  # nothing compiled ahead: the link compiles all, as before
        logger.debug("synkhronos: no C modules compiled ahead (%s)", error)
        return 0
    try:
        for module_hash, key, linker in mine:
            if not keep_going():
                break
            try:
                made = _compile_into(own, module_hash, key, linker)
                # One step: PyTensor, in any process, sees the whole folder or none of it.
                os.rename(made, Path(pytensor.config.compiledir) / made.name)
            except Exception as error:  # noqa: BLE001 - the link compiles it, and reports
                logger.debug("synkhronos: C module not compiled ahead (%s)", error)
                continue
            compiled += 1
    finally:
        shutil.rmtree(own, ignore_errors=True)
    cache.refresh(cleanup=False)  # the link finds this rank's modules at once
    logger.info(
        "synkhronos: compiled %d of %d C modules (this rank's share) in %.1f s",
        compiled,
        len(modules),
        time.monotonic() - start,
    )
    return compiled
