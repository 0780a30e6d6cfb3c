"""CPU ranks: PyTensor's default mode, or its JAX mode on the CPU ("jax-cpu")."""

from __future__ import annotations

from .base import Backend


def cpu_backend() -> Backend:
    """PyTensor's default mode; outputs come to rank 0 as host arrays."""
    return Backend("cpu", None)


def jax_cpu_backend() -> Backend:
    """PyTensor's JAX mode on CPU ranks; outputs come to rank 0 as host arrays."""
    # Not through the communicator as on GPU ranks: on CPU ranks that path costs two
    # collectives per call (0.5 ms of a 3.5 ms training step, measured); the fake-CuPy
    # GPU tests run it in CI.
    return Backend("jax-cpu", "JAX")
