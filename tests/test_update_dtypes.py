"""An update keeps its variable's dtype on every rank (found by tests/test_differential.py)."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk


def test_jax_cpu_float32_update_keeps_its_dtype():
    """Found by the matrix (jax-cpu, float32, 1 row on 2 ranks): JAX mode's float64 sum
    made the ranks with rows hold a float64 variable, the rank without a float32 one."""
    pytest.importorskip("jax")
    synk.fork(2, backend="jax-cpu")
    try:
        x = pt.matrix("x", dtype="float32")
        acc = pytensor.shared(np.zeros(3, "float32"), name="acc")
        f = synk.function([x], x.sum(), updates=[(acc, acc + x.sum(axis=0), "sum")])
        f(np.ones((1, 3), "float32"))  # rank 1 gets no rows
        assert [synk.get_value(r, acc).dtype for r in range(2)] == [np.float32] * 2
    finally:
        synk.close()
