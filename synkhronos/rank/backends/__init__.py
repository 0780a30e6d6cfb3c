"""Backends: how a rank compiles functions and hands shared-variable values to collectives.

``cpu``: PyTensor's default mode, shared-memory collectives. ``jax-cpu``: PyTensor's JAX
mode on CPU ranks with the same collectives. ``gpu``: JAX mode, one device per rank (a GPU,
or with ``JAX_PLATFORMS=cpu`` a CPU device), values stay on the device, collectives as
XLA programs (:mod:`synkhronos.rank.backends.gpu`).

The registry maps each name to the module and factory that build it; a module is imported
only when its backend is asked for (as :mod:`synkhronos.transport.comm` does for communicators).

Examples
--------
>>> get_backend("cpu").name
'cpu'
"""

from __future__ import annotations

import importlib

from synkhronos.rank.backends.base import Backend

_FACTORIES = {
    "cpu": ("cpu", "cpu_backend"),
    "jax-cpu": ("cpu", "jax_cpu_backend"),
    "gpu": ("gpu", "GpuBackend"),
}
NAMES = tuple(_FACTORIES)


def get_backend(name: str) -> Backend:
    """The backend called ``name`` ("cpu", "jax-cpu" or "gpu")."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown backend {name!r}; use one of {NAMES} or 'auto'")
    module, factory = _FACTORIES[name]
    return getattr(importlib.import_module(f".{module}", __name__), factory)()


__all__ = ["NAMES", "Backend", "get_backend"]
