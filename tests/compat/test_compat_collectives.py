"""The collectives as the original had them (spec section "Collectives"), on 2 CPU ranks,
compared with numpy. Variables are named by the variable or its name; one variable in gives
one array out, a list or tuple in gives a tuple out; ``nccl=False`` changes nothing on CPU
ranks."""

import numpy as np
import pytensor
import pytest

import synkhronos as synk

v = pytensor.shared(np.zeros((1, 3)), name="coll_v")
w = pytensor.shared(np.zeros(3), name="coll_w")
N = 2


@pytest.fixture(scope="module")
def shipped(ranks):
    synk.function([], [v.sum(), w.sum()])
    synk.distribute()


def per_rank(rng):
    """Give each rank its own random w; return the values."""
    values = [rng.normal(size=3) for _ in range(N)]
    for r, value in enumerate(values):
        synk.set_value(r, w, value)
    return values


@pytest.mark.parametrize("nccl", [True, False])
def test_broadcast_by_name_and_gather(shipped, rng, nccl):
    new = rng.normal(size=3)
    assert synk.broadcast("coll_w", new, nccl=nccl) is None
    stacked = synk.gather("coll_w", nccl=nccl)  # nd_up=1: one entry per rank
    np.testing.assert_array_equal(stacked, np.stack([new] * N))
    np.testing.assert_array_equal(synk.gather(w, nd_up=0), np.concatenate([new] * N))
    both = synk.gather([v, w])
    assert isinstance(both, tuple) and len(both) == 2
    np.testing.assert_array_equal(synk.gather((w,))[0], stacked)


def test_scatter_batch_and_lengths(shipped, rng):
    values = rng.normal(size=(11, 3))
    batch = [10, 0, 3, 3, 5, 8, 1]
    synk.scatter(v, values, batch=batch)  # 7 selected rows: 4 and 3
    np.testing.assert_array_equal(synk.gather(v, nd_up=0), values[batch])
    assert synk.get_lengths(v).tolist() == [4, 3]
    assert synk.get_shapes("coll_v") == [(4, 3), (3, 3)]
    lengths = synk.get_lengths([v, w])
    assert isinstance(lengths, tuple) and lengths[1].tolist() == [3, 3]
    synk.scatter([v], [values], batch=slice(2, 9))
    np.testing.assert_array_equal(synk.get_value(1, v), values[6:9])


@pytest.mark.parametrize("nccl", [True, False])
def test_all_gather(shipped, rng, nccl):
    whole = rng.normal(size=(7, 3))
    synk.scatter(v, whole)
    np.testing.assert_array_equal(synk.all_gather(v, nccl=nccl), whole)
    for r in range(N):
        np.testing.assert_array_equal(synk.get_value(r, v), whole)


@pytest.mark.parametrize("op", ["avg", "sum", "prod", "max", "min"])
def test_reduce_in_place_or_not(shipped, rng, op):
    want = {"avg": np.mean, "sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
    values = per_rank(rng)
    got = synk.reduce(w, op=op, in_place=False, nccl=False)
    np.testing.assert_allclose(got, want(np.stack(values), axis=0))
    np.testing.assert_array_equal(w.get_value(), values[0])  # rank 0's unchanged
    got = synk.reduce("coll_w", op=op)  # in_place=True
    np.testing.assert_allclose(w.get_value(), want(np.stack(values), axis=0))
    np.testing.assert_array_equal(synk.get_value(1, w), values[1])


@pytest.mark.parametrize("nccl", [True, False])
def test_all_reduce(shipped, rng, nccl):
    values = per_rank(rng)
    assert synk.all_reduce(w, op="sum", nccl=nccl) is None
    for r in range(N):
        np.testing.assert_allclose(synk.get_value(r, w), values[0] + values[1])
    values = per_rank(rng)
    synk.all_reduce([w])  # op="avg" by default
    np.testing.assert_allclose(synk.get_value(1, w), (values[0] + values[1]) / 2)


def test_set_value_batch_and_get_value(shipped, rng):
    values = rng.normal(size=(11, 3))
    synk.set_value(1, v, values, batch=[4, 2, 9])
    np.testing.assert_array_equal(synk.get_value(1, v), values[[4, 2, 9]])
    synk.set_value(0, ["coll_v", w], [values[:2], values[0]])
    got = synk.get_value(0, [v, w])
    assert isinstance(got, tuple)
    np.testing.assert_array_equal(got[0], values[:2])
    np.testing.assert_array_equal(got[1], values[0])
    with pytest.raises(ValueError, match="named 'nothing'"):
        synk.gather("nothing")
