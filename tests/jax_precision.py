"""A routine for tests/test_gpu_session.py, in a module of its own: a worker imports the
routine's module, and a test module's imports (synkhronos' JAX code) would set the precision
that the routine checks."""

import numpy as np


def precision(state) -> list:
    """Whether this rank's JAX computes in 64 bits (the bytes of a float it makes)."""
    import jax.numpy as jnp

    return [np.array([jnp.asarray(1.5).dtype.itemsize])]
