"""synkhronos.ops.conv.linkers: every convolution and pooling Op runs in PyTensor's Numba
and JAX linkers as in the Python linker (which calls the kernels from ``perform``), with no
fallback warned (the folds: test_folds.py)."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.traversal import io_toposort

from synkhronos.ops.conv import (
    Conv2dGradInputs,
    Conv2dGradWeights,
    MaxPool2dGather,
    Pool2dGrad,
    conv2d,
    pool2d,
)


def _every_op():
    """Inputs, and outputs computed by every Op of the package at least once."""
    x, w, gy, gp = (pt.tensor4(n) for n in ("x", "w", "gy", "gp"))
    y = conv2d(x, w, (2, 1), ((1, 0), (1, 2)), (1, 2), groups=2)
    gx, gw = pytensor.grad(None, [x, w], known_grads={y: gy})
    top = pool2d(y, 2, ignore_border=False)
    inc = pool2d(y, 3, 2, 1, True, "average_inc_pad")
    exc = pool2d(y, (3, 2), (1, 2), (1, 0), True, "average_exc_pad")
    g_pool = pytensor.grad((top**2).sum() + inc.sum() + (exc**2).sum(), y)
    gathered = pytensor.grad((pytensor.grad((top * gp).sum(), y) * y).sum(), gp)
    return [x, w, gy, gp], [y, gx, gw, top, inc, exc, g_pool, gathered]


@pytest.mark.parametrize("mode", ["NUMBA", "JAX"])
def test_every_op_runs_in_the_linker_as_in_python(mode, rng):
    if mode == "JAX" and importlib.util.find_spec("jax") is None:
        pytest.skip("JAX is not installed")
    inputs, outputs = _every_op()
    ops = {type(n.op) for n in io_toposort(inputs, outputs)}
    assert {Conv2dGradInputs, Conv2dGradWeights, Pool2dGrad, MaxPool2dGather} <= ops
    x = rng.standard_normal((2, 4, 7, 6))
    w = rng.standard_normal((6, 2, 3, 2))
    python = pytensor.function(inputs[:2], outputs[0], mode="FAST_COMPILE")
    y = python(x, w)
    top_shape = (2, 6, (y.shape[2] + 1) // 2, (y.shape[3] + 1) // 2)
    values = [x, w, rng.standard_normal(y.shape), rng.standard_normal(top_shape)]
    want = pytensor.function(inputs, outputs, mode="FAST_COMPILE")(*values)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no Op falls back to object mode
        got = pytensor.function(inputs, outputs, mode=mode)(*values)
    for name, a, b in zip(
        ["y", "gx", "gw", "max", "inc", "exc", "gpool", "gather"], got, want, strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-10, err_msg=name)
