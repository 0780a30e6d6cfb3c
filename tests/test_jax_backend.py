"""The jax-cpu backend: PyTensor's JAX mode on CPU ranks, the GPU ranks' code path."""

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from tests.graphs import check_ops, ops_function, random_xy, x

pytest.importorskip("jax")


@pytest.fixture(scope="module")
def jax_ranks():
    synk.fork(2, backend="jax-cpu")
    yield 2
    synk.close()


def test_reduce_ops_batch_and_slices(jax_ranks, rng):
    f, ref = ops_function()
    assert f(np.ones((2, 3)), np.ones(2), 1.0) is not None
    xv, yv = random_xy(rng, 9)
    check_ops(f(xv, yv, 0.5), ref(xv, yv, 0.5), rows_per_rank=[5, 4])
    idx = rng.permutation(9)[:7]
    got = f(xv, yv, 1.5, batch=idx, num_slices=2, output_subset=range(6))
    check_ops(got + [[7]], ref(xv[idx], yv[idx], 1.5)[:6] + [7])


def test_updates_stay_per_rank_and_all_reduce(jax_ranks, rng):
    w = pytensor.shared(np.zeros(3), name="w_jax")
    data = pytensor.shared(np.zeros((1, 3)), name="rows_jax")
    f = synk.function([], (data.sum(), "sum"), updates={w: w + data.sum(axis=0)},
                      sliceable_shareds=[data])
    whole = rng.normal(size=(6, 3))
    synk.scatter(data, whole)
    np.testing.assert_allclose(f(batch_s=slice(0, 2)), whole[[0, 1, 3, 4]].sum())
    per_rank = synk.gather(w, nd_up=1)
    np.testing.assert_allclose(per_rank[1], whole[3:5].sum(axis=0))
    synk.all_reduce(w, op="sum")
    np.testing.assert_allclose(synk.gather(w, nd_up=1),
                               np.stack([whole[[0, 1, 3, 4]].sum(axis=0)] * 2))


def test_mode_is_jax(jax_ranks):
    f = synk.function([x], x.sum())
    f(np.ones((2, 3)))
    from synkhronos import launch

    compiled = launch.current().state.functions[f._spec.fid]._function("plain")
    assert "JAX" in type(compiled.maker.linker).__name__
