"""Saving a training run's state to one file, and loading it on every rank.

:func:`save` writes, from rank 0, every shared variable of the session's synkhronos
functions (parameters, optimizer state, running averages, random generators, step counts),
after checking which values the ranks agree on; :func:`load` sets every rank from such a
file. The file is a NumPy ``.npz`` archive without pickles (``np.load(path,
allow_pickle=False)`` reads it):

``manifest``
    JSON text (uint8): the format and its version, the synkhronos version, the number of
    ranks, the backend, one entry per shared variable in registry order (its name, its
    PyTensor type, its kind), every rank's random generator states, and the keys of the
    extra values.
``value_<i>``
    The value of variable ``i`` of kind ``"same"`` (the ranks agreed on it).
``value_<i>_rank_<r>``
    Rank ``r``'s value of variable ``i`` of kind ``"per_rank"``.
``extra_<key>``
    The program's own values (``save(path, extra={...})``).

Kinds: ``"same"``; ``"per_rank"``; ``"generator"`` (a random generator: one state per rank,
in the manifest); ``"data"`` (a sliceable shared variable: each rank's part of the data,
not saved); ``"handover"`` (what a training function hands from one phase to the next
within a call, written by every call before it is read: not saved).

Shared variables are matched by their registry index (:mod:`synkhronos.rank.graphs`):
the order in which the functions using them were distributed. A program that builds the
same functions in the same order finds them again; :func:`load` checks every name, type
and shape, and the number of variables, before it sets anything.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from synkhronos.api import routines
from synkhronos.api.collectives import broadcast, registered
from synkhronos.rank import checkpoint_part
from synkhronos.rank.checkpoint_part import is_generator, kept_per_rank
from synkhronos.rank.routine_part import from_text, text
from synkhronos.rank.versions import installed_versions
from synkhronos.session import launch
from synkhronos.transport import trace
from synkhronos.transport.channel import MAX_ARRAYS
from synkhronos.transport.nodes import current as current_nodes

__all__ = ["FORMAT", "VERSION", "load", "save"]

FORMAT = "synkhronos checkpoint"
VERSION = 1
CHUNK = MAX_ARRAYS // 2  # values per message, well within what one carries


def _session():
    session = launch.current()
    if current_nodes().n_nodes > 1:
        raise NotImplementedError(
            "synkhronos.save and load run on one machine; under MPI "
            "(several nodes) they are not supported yet"
        )
    session.distribute()  # every function built so far: its variables get their index
    return session


def handed_over(session) -> list[int]:
    """The registry indices of the shared variables that each call of a session's
    function writes before a later step of the call reads them (a training function's
    phases hand their values over in them): nothing to save, load or compare."""
    ids = {id(v) for f in session.functions for v in f.handover}
    return [i for i, var in enumerate(session.state.registry.variables) if id(var) in ids]


def _chunks(items: list, size: int) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def per_rank_results(session, routine, indices: list[int], *args) -> list[list[np.ndarray]]:
    """Every rank's result of ``routine(state, indices, *args)``, chunk by chunk, joined:
    ``[rank][k]`` for ``indices[k]``."""
    joined: list[list[np.ndarray]] = [[] for _ in range(session.n_ranks)]
    for chunk in _chunks(indices, CHUNK):
        for mine, theirs in zip(
            joined, routines.run(routine, np.array(chunk, np.int64), *args), strict=True
        ):
            mine.extend(theirs)
    return joined


def _describe(var) -> str:
    return f"{var.name or 'unnamed'} ({var.type})"


def save(
    path: str | os.PathLike, extra: Mapping[str, Any] | None = None, per_rank: Iterable = ()
) -> None:
    """Write every shared variable of the session's functions to ``path``, from rank 0.

    Every function built so far is distributed first. The ranks are asked for a digest
    of each value; a value all ranks agree on is written once (rank 0's), and these are
    written per rank: random generators (each rank draws its own numbers), running state
    the ranks disagree on (a shared variable with a ``default_update``, e.g. batch-norm
    averages that each rank updates from its own rows), and the variables in
    ``per_rank``. Sliceable shared variables hold each rank's part of the data and are
    not written, nor is what a training function hands from one phase to the next
    within a call (each call writes it before it is read). The file is written to a
    temporary name beside ``path``, then renamed: ``path`` holds a whole checkpoint, the
    old or the new, at every moment.

    Parameters
    ----------
    path : str or os.PathLike
        The file (a NumPy ``.npz`` archive, whatever its name).
    extra : mapping of str to array_like, optional
        The program's own values to keep with the state (the epoch, the position in its
        data, its data generator's seed), numbers or arrays of numbers; :func:`load`
        returns them.
    per_rank : iterable of shared variables or names, optional
        Variables that the program keeps different on each rank: written per rank.

    Raises
    ------
    ValueError
        If the ranks disagree on a variable that must be equal on every rank (one without
        a ``default_update``, not in ``per_rank``): the message names them.
    TypeError
        If an ``extra`` value is not numbers.

    Examples
    --------
    >>> synk.save("run.ckpt", extra={"step": step})           # doctest: +SKIP
    """
    arrays = {f"extra_{key}": _extra_value(key, value) for key, value in (extra or {}).items()}
    session = _session()
    variables = session.state.registry.variables
    chosen = set(registered(session, list(per_rank))[1].tolist()) if per_rank else set()
    data = [i for i, var in enumerate(variables) if id(var) in session.sliceable_ids]
    handover = handed_over(session)
    reports = routines.run(checkpoint_part.report, np.array(data + handover, np.int64))
    digests = np.stack([digests for digests, _ in reports])
    generators = [json.loads(from_text(states)) for _, states in reports]
    kinds = _kinds(variables, data, handover, chosen, digests)
    separate = [i for i, kind in enumerate(kinds) if kind == "per_rank"]
    for rank, values in enumerate(
        per_rank_results(session, checkpoint_part.local_values, separate)
    ):
        arrays.update({f"value_{i}_rank_{rank}": v for i, v in zip(separate, values, strict=True)})
    for index, kind in enumerate(kinds):
        if kind == "same":
            arrays[f"value_{index}"] = np.array(variables[index].get_value(borrow=True))
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "synkhronos": installed_versions(["synkhronos"])["synkhronos"],
        "n_ranks": session.n_ranks,
        "backend": session.backend.name,
        "variables": [
            {"name": var.name, "type": str(var.type), "kind": kind}
            for var, kind in zip(variables, kinds, strict=True)
        ],
        "generators": generators,  # [rank][k]: the k-th generator in registry order
        "extra": sorted(extra or {}),
    }
    arrays["manifest"] = text(json.dumps(manifest))
    with trace.span("write file", "checkpoint"):
        _write_atomically(os.fspath(path), arrays)


def _kinds(variables, data: list, handover: list, chosen: set, digests: np.ndarray) -> list[str]:
    """How each variable is written (or not): "data", "handover", "generator",
    "per_rank" or "same"; raises ValueError naming those the ranks disagree on that
    should be equal on every rank."""
    kinds, disagreeing = [], []
    for index, var in enumerate(variables):
        if index in data:
            kinds.append("data")
        elif index in handover:
            kinds.append("handover")
        elif is_generator(var):
            kinds.append("generator")
        elif index in chosen:
            kinds.append("per_rank")
        elif (digests[:, index] == digests[0, index]).all():
            kinds.append("same")
        elif kept_per_rank(var):
            kinds.append("per_rank")
        else:
            kinds.append("same")
            disagreeing.append(_describe(var))
    if disagreeing:
        raise ValueError(
            f"the ranks disagree on {len(disagreeing)} shared variable(s) that should be "
            f"equal on every rank: {', '.join(disagreeing)}; make them equal "
            f"(synk.broadcast or synk.all_reduce) before saving, or name them in "
            f"per_rank=[...] to save each rank's value"
        )
    return kinds


def _extra_value(key: str, value) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "biufc":
        raise TypeError(
            f"extra[{key!r}] must be a number or an array of numbers (the file "
            f"holds no pickles), not {type(value).__name__}"
        )
    return array


def _write_atomically(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write the archive to a fresh name in ``path``'s directory, flush it to the disk,
    and rename it to ``path``."""
    folder, name = os.path.split(os.path.abspath(path))
    partial = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as file:
            np.savez(file, allow_pickle=False, **arrays)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise
    try:  # the rename itself, on the disk
        directory = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(directory)
    except OSError:
        pass
    finally:
        os.close(directory)


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Set every rank's shared variables from a file :func:`save` wrote; return its extra
    values.

    Build the run's functions first, as the saving program built them (the same
    functions, in the same order): every function built so far is distributed, and its
    shared variables are matched to the file's by their order, each checked by its name,
    type and shape before anything is set. Values saved once go to every rank; values
    saved per rank (random generators, running state the ranks disagreed on) go to their
    rank, which needs the same number of ranks as the saving program.

    Parameters
    ----------
    path : str or os.PathLike
        A file written by :func:`save`.

    Returns
    -------
    dict
        The ``extra`` values given to :func:`save`, as numpy values (0-d for numbers).

    Raises
    ------
    ValueError
        If the file is not a synkhronos checkpoint, or its variables do not match the
        session's (count, names, types, shapes), or it holds per-rank values of another
        number of ranks.

    Examples
    --------
    >>> extra = synk.load("run.ckpt")                         # doctest: +SKIP
    >>> first_step = int(extra["step"])                       # doctest: +SKIP
    """
    session = _session()
    variables = session.state.registry.variables
    with (
        trace.span("read file", "checkpoint"),
        np.load(os.fspath(path), allow_pickle=False) as archive,
    ):
        arrays = {key: archive[key] for key in archive.files}
    try:
        manifest = json.loads(from_text(arrays["manifest"]))
    except (KeyError, ValueError) as error:
        raise ValueError(f"{os.fspath(path)} is not a synkhronos checkpoint") from error
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"{os.fspath(path)} is not a synkhronos checkpoint of version {VERSION}")
    entries = manifest["variables"]
    _check_match(entries, variables, arrays)
    kinds = [entry["kind"] for entry in entries]
    separate = [i for i, kind in enumerate(kinds) if kind in ("per_rank", "generator")]
    if separate and manifest["n_ranks"] != session.n_ranks:
        raise ValueError(
            f"the checkpoint holds per-rank values of {manifest['n_ranks']} "
            f"ranks ({len(separate)} variables, e.g. random generators), this "
            f"session has {session.n_ranks}: load it with as many ranks"
        )
    same = [i for i, kind in enumerate(kinds) if kind == "same"]
    if same:
        broadcast([variables[i] for i in same], [arrays[f"value_{i}"] for i in same])
    generators = [iter(states) for states in manifest["generators"]]  # in `separate` order
    n = session.n_ranks
    for chunk in _chunks(separate, CHUNK // n):
        values = [
            text(next(generators[rank]))
            if kinds[index] == "generator"
            else arrays[f"value_{index}_rank_{rank}"]
            for index in chunk
            for rank in range(n)
        ]
        routines.run(
            checkpoint_part.set_local, np.array(chunk, np.int64), np.array([n], np.int64), *values
        )
    session.agreed.agree(variables[i] for i in separate)  # each rank's own, as loaded
    session.forget_lengths()
    return {
        key: arrays[f"extra_{key}"][()]
        if arrays[f"extra_{key}"].ndim == 0
        else arrays[f"extra_{key}"]
        for key in manifest["extra"]
    }


def _check_match(entries: list[dict], variables: list, arrays: dict) -> None:
    """``ValueError`` naming the first of the session's variables that does not match the
    file's (by name, type and, for values saved once, shape)."""
    hint = "build the functions the saving program built, in the same order, before synk.load"
    if len(entries) != len(variables):
        raise ValueError(
            f"the checkpoint holds {len(entries)} shared variables, this "
            f"session's functions use {len(variables)}: {hint}"
        )
    for index, (entry, var) in enumerate(zip(entries, variables, strict=True)):
        saved = f"{entry['name'] or 'unnamed'} ({entry['type']})"
        if entry["name"] != var.name or entry["type"] != str(var.type):
            raise ValueError(
                f"shared variable {index} is {_describe(var)} here, "
                f"{saved} in the checkpoint: {hint}"
            )
        if entry["kind"] == "same":
            shape = np.shape(var.get_value(borrow=True))
            if arrays[f"value_{index}"].shape != shape:
                raise ValueError(
                    f"shared variable {index}, {saved}, has shape {shape} here, "
                    f"{arrays[f'value_{index}'].shape} in the checkpoint"
                )
