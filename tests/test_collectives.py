"""Every collective on 3 CPU ranks (uneven splits), checked element by element."""

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from tests.graphs import x

pytestmark = pytest.mark.parametrize("ranks", [3], indirect=True)

a = pytensor.shared(np.zeros((4, 3)), name="a")
b = pytensor.shared(np.zeros(5, dtype="int32"), name="b")
c = pytensor.shared(np.float32(0), name="c")


@pytest.fixture(scope="module")
def shipped(ranks):
    f = synk.function([x], x.sum() + a.sum() + b.sum() + c)
    synk.distribute()
    return f


def per_rank(rng, n):
    return [rng.normal(size=(4, 3)) for _ in range(n)], [
        rng.integers(-9, 9, size=5).astype("int32") for _ in range(n)
    ]


def set_each(values_a, values_b):
    for r, (va, vb) in enumerate(zip(values_a, values_b, strict=True)):
        synk.set_value(r, [a, b], [va, vb])


def test_set_get_value(shipped, ranks, rng):
    va, vb = per_rank(rng, ranks)
    set_each(va, vb)
    for r in range(ranks):
        got_a, got_b = synk.get_value(r, [a, b])
        np.testing.assert_array_equal(got_a, va[r])
        np.testing.assert_array_equal(got_b, vb[r])
    np.testing.assert_array_equal(a.get_value(), va[0])  # rank 0's is the user's variable


def test_broadcast(shipped, ranks, rng):
    va, vb = per_rank(rng, ranks)
    set_each(va, vb)
    synk.broadcast([a, b])
    np.testing.assert_array_equal(synk.gather(a, nd_up=1), np.stack([va[0]] * ranks))
    new = rng.normal(size=(4, 3))
    synk.broadcast(a, new)
    np.testing.assert_array_equal(synk.gather(a, nd_up=1), np.stack([new] * ranks))


def test_scatter_uneven_and_gather(shipped, ranks, rng):
    whole = rng.normal(size=(8, 3))
    synk.scatter(a, whole)
    assert synk.get_lengths(a).tolist() == [3, 3, 2]
    assert synk.get_shapes([a])[0] == [(3, 3), (3, 3), (2, 3)]
    np.testing.assert_array_equal(synk.gather(a, nd_up=0), whole)
    np.testing.assert_array_equal(synk.get_value(2, a), whole[6:])
    synk.all_gather(a)
    np.testing.assert_array_equal(synk.gather(a, nd_up=1), np.stack([whole] * ranks))


@pytest.mark.parametrize("op", ["avg", "sum", "prod", "max", "min"])
def test_reduce_and_all_reduce(shipped, ranks, rng, op):
    va, vb = per_rank(rng, ranks)
    want = {"avg": np.mean, "sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
    set_each(va, vb)
    got_a, got_b = synk.reduce([a, b], op=op)
    np.testing.assert_allclose(got_a, want(np.stack(va), axis=0), rtol=1e-12)
    np.testing.assert_array_equal(got_b, want(np.stack(vb), axis=0).astype("int32"))
    np.testing.assert_allclose(a.get_value(), got_a)
    np.testing.assert_array_equal(synk.get_value(1, a), va[1])  # only rank 0 receives
    set_each(va, vb)
    synk.all_reduce([a, b], op=op)
    gathered = synk.gather([a, b], nd_up=1)
    for r in range(ranks):
        np.testing.assert_array_equal(gathered[0][r], got_a)  # bitwise equal on every rank
        np.testing.assert_array_equal(gathered[1][r], got_b)


def test_scalar_variable(shipped, ranks):
    for r in range(ranks):
        synk.set_value(r, c, np.float32(r + 1))
    assert synk.gather(c).tolist() == [1, 2, 3]
    synk.all_reduce(c, op="sum")
    assert synk.gather(c).tolist() == [6, 6, 6]


def test_all_reduce_large_vector(shipped, ranks, rng):
    big = pytensor.shared(np.zeros(1_000_003, dtype="float32"), name="big")
    synk.function([], big.sum())
    values = [rng.normal(size=1_000_003).astype("float32") for _ in range(ranks)]
    for r, v in enumerate(values):
        synk.set_value(r, big, v)
    synk.all_reduce(big, op="avg")
    want = (values[0] + values[1] + values[2]) * np.float32(1 / 3)
    np.testing.assert_allclose(big.get_value(), want, rtol=1e-6)
    np.testing.assert_array_equal(synk.get_value(2, big), big.get_value())


def test_mismatched_shapes_raise_on_every_rank(shipped, ranks):
    synk.scatter(a, np.ones((7, 3)))  # 3, 2, 2 rows
    with pytest.raises((ValueError, synk.RemoteError), match="equal shapes"):
        synk.all_reduce(a)
    synk.broadcast(a, np.ones((4, 3)))  # the session is still usable
    np.testing.assert_array_equal(synk.reduce(a, op="sum"), np.full((4, 3), 3.0))


def test_bad_values(shipped, ranks):
    with pytest.raises(ValueError, match="2 values for 1"):
        synk.broadcast([a], [np.ones((4, 3)), np.ones(2)])
    with pytest.raises(TypeError, match="shared variable b"):
        synk.broadcast(b, np.ones(5))  # float64 into int32
    with pytest.raises(ValueError, match="rank"):
        synk.get_value(3, a)
