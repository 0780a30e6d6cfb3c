"""The "gpu" backend end to end on CPU ranks, with ``tests/fake_cupy`` standing in for CuPy.

Everything GPU ranks do apart from CUDA itself runs here: ``fork(backend="gpu")`` (GPUs
listed, one per rank), JAX mode, shared variables kept as JAX arrays, collectives through
:class:`~synkhronos.transport.comm.nccl.NcclCommunicator` (the fake NCCL does real collectives
between the processes), and function outputs reduced through the communicator. Results
are checked against numpy on the whole data, with uneven splits.

Run as a script, this file is rank 0 of such a session (the test starts it with the fake
first on ``PYTHONPATH``, so that the workers import it too).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FAKE_CUPY = ROOT / "tests" / "fake_cupy"
N_RANKS = 3


def _close(got, want, what: str, rtol: float = 1e-5) -> None:
    assert isinstance(got, np.ndarray), f"{what}: got {type(got)}, not a numpy array"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 1e-2, err_msg=what)


def _session() -> None:
    """Rank 0: fork GPU ranks on the fake GPUs and check functions and collectives."""
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk
    from synkhronos.rank.backends import gpu
    from synkhronos.session import launch
    from synkhronos.transport.comm.nccl import NcclCommunicator
    from tests.graphs import record_reduce_ops

    gpu.gpu_table = lambda: [(str(i), "Fake GPU", "1 MiB") for i in range(N_RANKS)]
    assert synk.fork(backend="gpu") == N_RANKS
    try:
        comm = launch.current().state.comm
        assert isinstance(comm, NcclCommunicator)
        assert pytensor.config.floatX == "float32"
        reduce_ops = record_reduce_ops(comm)

        # Outputs: reductions through NCCL, gather and "per_rank" through the host.
        x, y, s = pt.matrix("x"), pt.vector("y"), pt.scalar("s")
        w = pytensor.shared(np.zeros(3, "float32"), name="w")
        f = synk.function([x, y], [((x * s) ** 2).mean(), ((x.sum(axis=1) * y).sum(), "sum"),
                                   (x.max(axis=0), "max"), (x.min(), "min"),
                                   (x.sum(axis=1) + y, "gather"), (x.shape[0], "per_rank")],
                          bcast_inputs=[s], updates={w: w + x.sum(axis=0)})
        rng = np.random.default_rng(5)
        xv = rng.normal(size=(10, 3)).astype("float32")
        yv = rng.normal(size=10).astype("float32")

        def want(rows, sv):
            xr, yr = xv[rows], yv[rows]
            return [((xr * sv) ** 2).mean(), (xr.sum(axis=1) * yr).sum(), xr.max(axis=0),
                    xr.min(), xr.sum(axis=1) + yr]

        def check(got, rows, sv, counts, what):
            for i, (g, v) in enumerate(zip(got[:5], want(rows, sv), strict=True)):
                _close(g, v, f"{what}, output {i}")
            assert [0 if c is None else int(c) for c in got[5]] == counts, (what, got[5])

        check(f(xv, yv, 0.5), slice(None), 0.5, [4, 3, 3], "all rows")
        assert reduce_ops == ["sum", "max", "min"], reduce_ops  # avg goes with sum
        idx = rng.permutation(10)[:8]
        got = f(xv, yv, 1.5, batch=idx, num_slices=2, output_subset=range(5))
        for i, (g, v) in enumerate(zip(got, want(idx, 1.5), strict=True)):
            _close(g, v, f"batch and num_slices, output {i}")
        reduce_ops.clear()
        check(f(xv, yv, 2.0, batch=[7]), [7], 2.0, [1, 0, 0], "ranks without rows")
        assert reduce_ops == [], "ranks without rows: every output by the host"

        # Dtypes NCCL cannot reduce come by the host.
        odd = synk.function([x], [((x > 0).any(), "max"), (pt.cast(x.shape[0], "int16"), "sum"),
                                  (x.astype("complex64").sum(), "sum")])
        any_positive, n_rows, total = odd(xv)
        assert reduce_ops == [], reduce_ops
        assert any_positive.dtype == bool and bool(any_positive)
        assert n_rows.dtype == np.int16 and int(n_rows) == 10
        _close(total, xv.sum(), "complex64 sum")

        # Row-dependent shapes: refused on every rank in the exchange before NCCL.
        try:
            synk.function([x], (x[:, 0] * 2, "sum"))(xv)
        except ValueError as error:
            assert "same shape on every rank" in str(error), error
        else:
            raise AssertionError("outputs of row-dependent shapes were reduced")
        assert reduce_ops == [], reduce_ops

        # Shared variables stay JAX arrays; every collective through the NCCL communicator.
        import jax  # after fork(), which must see to the GPUs before JAX loads

        assert isinstance(w.get_value(borrow=True), jax.Array)
        def sliced(rows):  # num_slices=2: the slices' updates, row-weighted "avg"
            return sum(len(p) / len(rows) * xv[p].sum(0) for p in np.array_split(rows, 2))

        per_rank = synk.gather(w, nd_up=1)
        _close(per_rank, [xv[:4].sum(0) + sliced(idx[:3]) + xv[7], xv[4:7].sum(0) +
                          sliced(idx[3:6]), xv[7:].sum(0) + sliced(idx[6:])], "gather")
        synk.all_reduce(w, op="avg")
        _close(synk.gather(w, nd_up=1), np.stack([per_rank.mean(axis=0)] * N_RANKS),
               "all_reduce avg")
        synk.broadcast(w, np.arange(3, dtype="float32"))
        synk.set_value(2, w, np.full(3, 7, "float32"))
        _close(synk.reduce(w, op="max"), [7, 7, 7], "reduce max")
        reduce_ops.clear()
        _close(synk.reduce(w, op="max", nccl=False), [7, 7, 7], "reduce max, host path")
        assert reduce_ops == [], "nccl=False: NCCL's reduce is not used"
        _close(synk.get_value(1, w), np.arange(3), "get_value")
        data = pytensor.shared(np.zeros((1, 3), "float32"), name="data")
        g = synk.function([], (data.sum(axis=0), "sum"), sliceable_shareds=[data])
        synk.scatter(data, xv)
        _close(g(batch_s=[0, 2]), xv[[0, 2, 4, 6, 7, 9]].sum(axis=0), "batch_s")
        _close(synk.all_gather(data), xv, "all_gather")
    finally:
        synk.close()
    print("gpu backend on fake GPUs: ok")


def test_gpu_backend_with_fake_cupy():
    from tests.conftest import shm_entries

    fake_nccl = f"synk_fakenccl{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",
                                                             "PYTENSOR_FLAGS")}
    env.update(JAX_PLATFORMS="cpu", FAKE_NCCL_PREFIX=fake_nccl, FAKE_NCCL_TIMEOUT="60",
               PYTHONPATH=os.pathsep.join(filter(None, [str(FAKE_CUPY), str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    rank0 = subprocess.Popen([sys.executable, __file__], env=env, cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = rank0.communicate(timeout=300)
    finally:
        rank0.kill()
    assert rank0.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert "imported before synk.fork" not in err
    assert "rank 2: GPU 2, Fake GPU" in out  # one line per GPU, as the paper's tool
    assert shm_entries(f"synk_{rank0.pid}_") + shm_entries(fake_nccl) == [], "left in /dev/shm"


if __name__ == "__main__":
    _session()
