"""The jax-cpu backend: PyTensor's JAX mode on CPU ranks, the GPU ranks' code path."""

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from tests.graphs import check_ops, ops_function, random_xy, record_reduce_ops, x

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
    f = synk.function(
        [], (data.sum(), "sum"), updates={w: w + data.sum(axis=0)}, sliceable_shareds=[data]
    )
    whole = rng.normal(size=(6, 3))
    synk.scatter(data, whole)
    np.testing.assert_allclose(f(batch_s=slice(0, 2)), whole[[0, 1, 3, 4]].sum())
    per_rank = synk.gather(w, nd_up=1)
    np.testing.assert_allclose(per_rank[1], whole[3:5].sum(axis=0))
    synk.all_reduce(w, op="sum")
    np.testing.assert_allclose(
        synk.gather(w, nd_up=1), np.stack([whole[[0, 1, 3, 4]].sum(axis=0)] * 2)
    )


def test_mode_is_jax(jax_ranks):
    assert synk.backend() == "jax-cpu"
    f = synk.function([x], x.sum())
    f(np.ones((2, 3)))
    from synkhronos.session import launch

    compiled = launch.current().state.functions[f._spec.fid]._function("plain")
    assert "JAX" in type(compiled.maker.linker).__name__


def test_outputs_come_by_the_host(jax_ranks, rng):
    """On jax-cpu, as on cpu, outputs reach rank 0 in the replies: no collective per call
    (GPU ranks reduce through the communicator; tests/test_gpu.py)."""
    from synkhronos.session import launch

    f, ref = ops_function()
    comm = launch.current().state.comm
    ops_seen = record_reduce_ops(comm)
    try:
        xv, yv = random_xy(rng, 11)
        check_ops(f(xv, yv, 0.3), ref(xv, yv, 0.3), rows_per_rank=[6, 5])
        check_ops(f(xv, yv, 0.3, batch=[4]), ref(xv[[4]], yv[[4]], 0.3), rows_per_rank=[1, 0])
        assert ops_seen == []
    finally:
        del comm.reduce


def test_row_dependent_shapes_and_one_rank_failing(jax_ranks, rng):
    xv = rng.normal(size=(9, 3))  # 5 rows on rank 0, 4 on rank 1
    rows_first = synk.function([x], (x[:, 0] * 2, "sum"))
    with pytest.raises(ValueError, match="same shape on every rank"):
        rows_first(xv)
    # Fails on rank 0, then on rank 1; the other rank, waiting to reduce, must give up.
    for rows, error in ((4, TypeError), (5, synk.RemoteError)):
        f = synk.function([x], (x.reshape((rows, 3)).sum(), "sum"))
        with pytest.raises(error, match="reshape"):
            f(xv)
    ok = synk.function([x], (x.sum(), "sum"))
    np.testing.assert_allclose(ok(xv), xv.sum())


def test_collectives_never_write_into_storage_jax_may_read(jax_ranks, rng):
    """JAX takes an aligned NumPy array without a copy and computes after the call
    returns: a collective's result is 64-byte aligned (so JAX need not copy it) and
    read-only, and no later collective writes into it."""
    from synkhronos.session import launch

    v = pytensor.shared(np.zeros(1001), name="v_no_write")
    total = pytensor.shared(np.zeros(1001), name="total_no_write")
    bump = synk.function([], updates={v: v + 1.0})  # v's storage becomes JAX's
    accumulate = synk.function([], updates={total: total + v})
    bump()
    per_rank = [rng.normal(size=1001) for _ in range(jax_ranks)]
    for r, value in enumerate(per_rank):
        synk.set_value(r, v, value)
    synk.all_reduce(v, op="sum")
    first = v.get_value(borrow=True)
    assert isinstance(first, np.ndarray) and not first.flags.writeable
    assert first.ctypes.data % 64 == 0
    want = sum(per_rank)
    accumulate()  # JAX reads v; may run after the call returns
    synk.all_reduce(v, op="sum")  # in place would overwrite what JAX reads
    synk.broadcast(v)
    np.testing.assert_array_equal(first, want)  # never written into
    np.testing.assert_allclose(synk.gather(v, nd_up=1), np.stack([2 * want] * jax_ranks))
    np.testing.assert_allclose(synk.gather(total, nd_up=1), np.stack([want] * jax_ranks))
    assert not launch.current().state.backend.writes_in_place


@pytest.mark.parametrize("op", ["avg", "sum", "prod", "max", "min"])
def test_accumulate_matches_combine(op, rng):
    import jax.numpy as jnp

    from synkhronos.transport.reduction import accumulate, combine

    values = [rng.normal(size=(3, 2)) for _ in range(3)]
    weights = [4, 1, 2]
    want = combine(op, values, weights)
    np.testing.assert_allclose(accumulate(op, values, weights), want, rtol=1e-12)
    got = accumulate(op, [jnp.asarray(v) for v in values], weights)
    assert not isinstance(got, np.ndarray)  # stayed a JAX array
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


def test_op_jax_mode_lacks_says_what_to_do(jax_ranks):
    import pytensor.tensor as pt

    with pytest.raises(NotImplementedError) as info:  # rank 0 compiles as it builds
        # JAX mode lacks gammaincinv in PyTensor 3.0 and 3.3 (3.3 added erfcx, used before).
        synk.function([x], pt.gammaincinv(x, x).sum())
    assert "fork with backend='cpu'" in "\n".join(getattr(info.value, "__notes__", []))
    assert synk.function([x], (x.sum(), "sum"))(np.ones((4, 3))) == 12  # the session goes on
