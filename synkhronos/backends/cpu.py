"""CPU ranks: PyTensor's default mode, or its JAX mode on the CPU ("jax-cpu")."""

from __future__ import annotations

from .base import Backend


def cpu_backend() -> Backend:
    """PyTensor's default mode; outputs come to rank 0 as host arrays."""
    return Backend("cpu", None)


def jax_cpu_backend() -> Backend:
    """PyTensor's JAX mode on CPU ranks."""
    # Outputs go through the communicator as on GPU ranks, so that CI runs that path.
    return Backend("jax-cpu", "JAX", device_outputs=True)
