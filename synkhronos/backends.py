"""Backends: how a rank compiles functions and moves shared-variable values to the host.

``cpu``: PyTensor's default mode, shared-memory collectives. ``jax-cpu``: PyTensor's JAX
mode on CPU ranks with the same collectives, so CI runs the JAX code path. ``gpu``: JAX
mode, one GPU per rank, NCCL collectives (see :mod:`synkhronos.comm.nccl`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NAMES = ("cpu", "jax-cpu", "gpu")


@dataclass(frozen=True)
class Backend:
    """What differs between ranks of different kinds."""

    name: str
    mode: str | None  # PyTensor compile mode; None = PyTensor's default

    def host_value(self, var) -> np.ndarray:
        """A shared variable's value as a numpy array (a view where the backend allows)."""
        return np.asarray(var.get_value(borrow=True))

    def set_value(self, var, value: np.ndarray) -> None:
        """Set a shared variable's value (copying ``value``)."""
        current = var.get_value(borrow=True)
        if (isinstance(current, np.ndarray) and current.flags.writeable
                and current.shape == value.shape and current.dtype == value.dtype):
            np.copyto(current, value)  # in place: keeps the storage the function uses
        else:
            var.set_value(np.array(value, dtype=var.dtype))


def get_backend(name: str) -> Backend:
    """The backend called ``name`` ("cpu", "jax-cpu" or "gpu")."""
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}; use one of {NAMES} or 'auto'")
    return Backend(name, None if name == "cpu" else "JAX")
