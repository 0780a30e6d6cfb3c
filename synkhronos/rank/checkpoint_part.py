"""A rank's part of a checkpoint: digests of its shared variables, their values, and
setting them (routines that :mod:`synkhronos.api.checkpoints` runs on every rank).

Shared variables are named by their registry index, the same on every rank
(:mod:`synkhronos.rank.graphs`). A random generator (a PyTensor ``RandomType`` shared
variable, holding a NumPy ``Generator``) travels as the JSON text of its bit generator's
state (:func:`generator_state`), as a uint8 array.

Examples
--------
>>> g = np.random.default_rng(5)
>>> h = make_generator(generator_state(g))
>>> bool(g.integers(1 << 30) == h.integers(1 << 30))
True
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from synkhronos.rank.routine_part import from_text, text
from synkhronos.rank.state import RankState

__all__ = [
    "digest",
    "generator_state",
    "is_generator",
    "local_values",
    "make_generator",
    "report",
    "set_local",
]


def is_generator(var) -> bool:
    """Whether the shared variable ``var`` holds a NumPy random ``Generator``, or the JAX
    key that JAX mode draws from in its place
    (:func:`~synkhronos.rank.backends.jax_compat.share_generators`)."""
    value = var.container.storage[0]
    return isinstance(value, np.random.Generator) or _is_key(value)


def _is_key(value) -> bool:
    return isinstance(value, dict) and "jax_state" in value


def kept_per_rank(var) -> bool:
    """Whether each rank keeps its own value of the shared variable ``var`` by design: it
    has a ``default_update`` (each rank moves it from its own rows, as batch-norm
    averages)."""
    return getattr(var, "default_update", None) is not None


def digest(value) -> int:
    """A 64-bit digest of an array's dtype, shape and contents (equal arrays, equal
    digests; NaNs compare by their bits).

    Examples
    --------
    >>> digest(np.zeros(3)) == digest(np.zeros(3)), digest(np.zeros(3)) == digest(np.zeros(4))
    (True, False)
    """
    array = np.ascontiguousarray(np.asarray(value))
    hashed = hashlib.blake2b(digest_size=8)
    hashed.update(f"{array.dtype.str}{array.shape}".encode())
    hashed.update(array.data)
    return int.from_bytes(hashed.digest(), "little")


def _jsonable(obj):
    """A bit generator's state with its arrays (MT19937's key) as tagged lists."""
    if isinstance(obj, dict):
        return {key: _jsonable(value) for key, value in obj.items()}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": obj.dtype.str}
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _from_jsonable(obj):
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return np.array(obj["__ndarray__"], dtype=obj["dtype"])
        return {key: _from_jsonable(value) for key, value in obj.items()}
    return obj


def _host(key):
    """A JAX key with its arrays as NumPy arrays."""
    return {k: _host(v) if isinstance(v, dict) else np.asarray(v) for k, v in key.items()}


def generator_state(generator) -> str:
    """The JSON text of ``generator``'s state (its bit generator's, exactly; a JAX key's
    arrays)."""
    if _is_key(generator):
        return json.dumps(_jsonable(_host(generator)))
    return json.dumps(_jsonable(generator.bit_generator.state))


def make_generator(state: str):
    """A ``Generator`` in the state :func:`generator_state` gave (a JAX key, of NumPy
    arrays, where it gave a key's)."""
    fields = _from_jsonable(json.loads(state))
    if _is_key(fields):
        return fields
    bit_generator = getattr(np.random, fields["bit_generator"])()
    bit_generator.state = fields
    return np.random.Generator(bit_generator)


def report(state: RankState, skipped: np.ndarray) -> list[np.ndarray]:
    """(Routine) This rank's digest of every shared variable's value (0 for generators and
    the ``skipped`` indices), and the JSON list of its generators' states, in registry
    order."""
    skip = set(skipped.tolist())
    digests = np.zeros(len(state.registry), np.uint64)
    generators = []
    for index, var in enumerate(state.registry.variables):
        if is_generator(var):
            generators.append(generator_state(var.get_value(borrow=True)))
        elif index not in skip:
            digests[index] = digest(var.get_value(borrow=True))
    return [digests, text(json.dumps(generators))]


def local_values(state: RankState, indices: np.ndarray) -> list[np.ndarray]:
    """(Routine) This rank's values of the shared variables at ``indices`` (host copies)."""
    return [np.array(var.get_value(borrow=True)) for var in state.shared(indices)]


def _as_held(var, generator):
    """``generator`` in the form ``var`` holds: a JAX key where JAX mode draws from the
    variable's storage (set in place: PyTensor's check of a key fails on NumPy arrays)."""
    if _is_key(var.container.storage[0]) and isinstance(generator, np.random.Generator):
        from pytensor.link.jax.dispatch import jax_typify

        return jax_typify(generator)
    return generator


def set_local(
    state: RankState, indices: np.ndarray, n_ranks: np.ndarray, *values: np.ndarray
) -> list[np.ndarray]:
    """(Routine) Set the shared variables at ``indices`` to this rank's values: ``values``
    holds every rank's, variable by variable (``values[k * n_ranks + rank]``), a
    generator's as :func:`generator_state`'s text."""
    n = int(n_ranks[0])
    for k, var in enumerate(state.shared(indices)):
        value = values[k * n + state.rank]
        if is_generator(var):
            var.container.storage[0] = _as_held(var, make_generator(from_text(value)))
        else:
            state.backend.set_value(var, np.asarray(value, dtype=var.dtype))
    return []
