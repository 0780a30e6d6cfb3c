"""Small outputs of GPU ranks reduced through the host replies (2 and 3 ranks, CPU devices
here): a scalar "avg" and "sum" with uneven rows equal one process's ``pytensor.function``,
come back the same on every call, and start no XLA collective; an output above
``SYNK_HOST_REDUCE_BYTES`` still goes through the communicator."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.rank.backends import gpu
from synkhronos.rank.outputs import HOST_BYTES
from synkhronos.session import launch
from tests.graphs import record_reduce_ops

pytest.importorskip("jax")


@pytest.mark.gpu
@pytest.mark.parametrize(("n_ranks", "n_rows"), [(2, 27), (3, 28)])
def test_small_outputs_of_gpu_ranks_reduce_through_the_host(n_ranks, n_rows, rng):
    if not gpu.on_cpu_devices() and len(gpu.visible_gpus()) < n_ranks:
        pytest.skip(f"needs {n_ranks} GPUs")
    synk.fork(n_ranks, backend="gpu")
    comm = launch.current().state.comm
    gathers: list = []
    all_gather = comm.all_gather
    comm.all_gather = lambda arrays: gathers.append(arrays) or all_gather(arrays)
    reduce_ops = record_reduce_ops(comm)
    try:
        x, y = pt.matrix("x"), pt.vector("y")
        wide = pytensor.shared(rng.random(HOST_BYTES // 4 + 1).astype("float32"), name="wide")
        scalars = [(((x * 2) ** 2).mean(), "avg"), ((x.sum(axis=1) * y).sum(), "sum")]
        columns = [(x.sum(axis=0), "sum")]  # its size shows in its shape only
        outputs = [*scalars, *columns, (x.sum() * wide, "sum")]
        xv = rng.random((n_rows, 3)).astype("float32")
        yv = rng.random(n_rows).astype("float32")
        want = pytensor.function([x, y], [v for v, _ in outputs])(xv, yv)

        f_scalars = synk.function([x, y], scalars)
        got = f_scalars(xv, yv)
        for g, w in zip(got, want[:2], strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6)
            assert g.dtype == np.float32
        assert gathers == [] and reduce_ops == []  # no exchange, no collective
        again = f_scalars(xv, yv)
        assert [a.tobytes() for a in again] == [g.tobytes() for g in got]

        got = synk.function([x, y], outputs)(xv, yv)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6)
        assert len(gathers) == 1  # the shapes, then only the wide output by XLA
        assert reduce_ops == ["sum"]
    finally:
        del comm.reduce, comm.all_gather
        synk.close()
