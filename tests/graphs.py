"""Graphs the core tests share, built once per test module (compiling costs seconds)."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

x = pt.matrix("x", dtype="float64")
y = pt.vector("y", dtype="float64")
s = pt.scalar("s", dtype="float64")

# (variable, op) for every reduce op; each is equal, reduced over ranks, to the whole-data
# value except "per_rank", which lists every rank's own.
OUTPUTS = [
    (((x * s) ** 2).mean(), "avg"),
    ((x.sum(axis=1) * y).sum(), "sum"),
    (pt.prod(1.0 + 0.01 * x), "prod"),
    (x.max(), "max"),
    (x.min(), "min"),
    (x.sum(axis=1) + y, "gather"),
    (x.shape[0], "per_rank"),
]


def ops_function():
    """A synk function with every reduce op, and the plain PyTensor reference."""
    f = synk.function([x, y], OUTPUTS, bcast_inputs=[s], name="ops")
    ref = pytensor.function([x, y, s], [v for v, _ in OUTPUTS])
    return f, ref


def random_xy(rng, n: int):
    return rng.normal(size=(n, 3)), rng.normal(size=n)


def check_ops(got, want, rows_per_rank=None, rtol=1e-10):
    """Compare synk outputs of ``ops_function`` with the reference's (``rtol``: relative
    tolerance; JAX on GPUs computes these float64 graphs in float32)."""
    for (_, op), g, w in zip(OUTPUTS, got, want, strict=True):
        if op == "per_rank":
            counts = [int(v) if v is not None else 0 for v in g]
            assert sum(counts) == int(w)
            if rows_per_rank is not None:
                assert counts == rows_per_rank
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * 1e-2, err_msg=op)


def record_reduce_ops(comm) -> list[str]:
    """Make rank 0's communicator ``comm`` record the op of each ``reduce`` it runs (the
    workers' run unchanged); returns the list it appends to. ``del comm.reduce`` undoes it."""
    ops = []
    original = comm.reduce

    def recording_reduce(arrays, op, root=0):
        ops.append(op)
        return original(arrays, op, root)

    comm.reduce = recording_reduce
    return ops
