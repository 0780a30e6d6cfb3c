"""Reductions over several MPI "nodes" give the session-wide result for every dtype and op.

Each run is ``mpiexec -n 2`` of a script (as in :mod:`tests.test_nodes`): every global rank
holds its own values, and ``synk.all_reduce`` / ``synk.reduce`` must give numpy's reduction
over every global rank on every rank of every node (not a node-local one), for dtypes the
devices reduce and those that take the host path (int16, bool, complex), alone and mixed in
one call.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.test_nodes import MPIEXEC, _launch

pytestmark = pytest.mark.skipif(
    not MPIEXEC.exists() or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpi4py and mpiexec next to the interpreter (pip install 'synkhronos[mpi]' mpich)",
)

SCRIPT = r"""
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.transport import nodes

synk.fork(int(sys.argv[1]), backend=sys.argv[2])
world = nodes.current()
N = world.n_global
DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
          "bool", "complex64", "complex128"]
UFUNCS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
failed = []


def held(rank, dtype):
    # Different on every rank, small enough that prod fits int8, and uneven for min/max.
    base = (np.arange(5) * (rank + 2)) % 5 + 1
    if dtype == "bool":
        return (base + rank) % 3 == 0
    if dtype.startswith("complex"):
        return (base + 1j * (rank - base)).astype(dtype)
    return base.astype(dtype)


def want(op, dtype):
    stack = np.stack([held(r, dtype) for r in range(N)])
    if op == "avg":
        total = UFUNCS["sum"].reduce(stack, axis=0, dtype=dtype)
        if stack.dtype.kind in "fc":
            return total * stack.dtype.type(1.0 / N)
        return (total / N).astype(dtype)  # integers truncate; bools: any
    return UFUNCS[op].reduce(stack, axis=0, dtype=dtype)


def check(name, got, expected, dtype):
    got = np.asarray(got)
    rows = got.reshape(N, -1)
    if any(row.tobytes() != rows[0].tobytes() for row in rows):
        failed.append(f"{name}: ranks differ: {got.tolist()}")
    tol = 1e-2 if dtype == "float16" else 1e-5
    # JAX mode computes 64-bit values in 32 bits (a documented warning): compare the kind.
    if got.dtype.kind != np.dtype(dtype).kind or not np.allclose(got[0], expected, rtol=tol):
        failed.append(f"{name}: got {got[0].tolist()} ({got.dtype}), want {expected.tolist()}")


vs = {d: pytensor.shared(np.zeros(5, d), name=f"v_{d}") for d in DTYPES}
x = pt.vector("x")
f = synk.function([x], x.sum() + sum(pt.real(v).astype("float64").sum() for v in vs.values()))


def plant(names):
    for r in range(N):
        for d in names:
            synk.set_value(r, vs[d], held(r, d))


for op in ("sum", "avg", "prod", "max", "min"):
    for d in DTYPES:
        plant([d])
        synk.all_reduce(vs[d], op)
        check(f"all_reduce {op} {d}", synk.gather(vs[d], nd_up=1), want(op, d), d)
mixed = ["int16", "int32", "float32", "bool", "complex64"]
plant(mixed)
synk.all_reduce([vs[d] for d in mixed], "sum")
for d in mixed:
    check(f"mixed all_reduce sum {d}", synk.gather(vs[d], nd_up=1), want("sum", d), d)
plant(mixed)
got = synk.reduce([vs[d] for d in mixed], "max", in_place=False)
for d, g in zip(mixed, got):
    check(f"mixed reduce max {d}", np.stack([g] * N), want("max", d), d)
print(f"node {world.node}: " + ("ok" if not failed else "FAILED " + "; ".join(failed)),
      flush=True)
synk.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("local", "backend"), [(1, "gpu"), (2, "gpu"), (1, "cpu"), (2, "cpu")])
def test_reductions_span_every_node_for_every_dtype(tmp_path, local, backend):
    """2 nodes x ``local`` ranks: every op of every dtype, alone and mixed in one call, is
    numpy's reduction over every global rank, bit-identical on every rank. "gpu" runs GPU
    ranks on CPU devices; int16, bool and complex take its host path."""
    if backend == "gpu" and importlib.util.find_spec("jax") is None:
        pytest.skip("needs jax")
    proc, _ = _launch(tmp_path, SCRIPT, str(local), backend)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for node in (0, 1):
        assert f"node {node}: ok" in out, out
