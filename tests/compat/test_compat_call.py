"""Calling a Function as the original did (spec section "Calling a Function"), on 2 CPU ranks
with uneven splits, compared with plain ``pytensor.function`` and numpy."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk

x = pt.matrix("x", dtype="float64")
y = pt.vector("y", dtype="float64")
s = pt.scalar("s", dtype="float64")
EXPRS = [((x * s) ** 2).mean(), x.sum(axis=1) * y]


@pytest.fixture(scope="module")
def fns(ranks):
    f = synk.function([x, y], [EXPRS[0], (EXPRS[1], "gather")], bcast_inputs=[s], name="call")
    ref = pytensor.function([x, y, s], EXPRS)
    return f, ref


def check(got, want):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10)


def test_inputs_by_keyword(fns, rng):
    f, ref = fns
    xv, yv = rng.normal(size=(7, 3)), rng.normal(size=7)
    want = ref(xv, yv, 0.5)
    check(f(xv, y=yv, s=0.5), want)
    check(f(s=0.5, y=yv, x=xv), want)
    with pytest.raises(TypeError, match="no input named"):
        f(xv, yv, q=0.5)
    with pytest.raises(TypeError, match="given twice"):
        f(xv, yv, 0.5, x=xv)


def test_data_and_numpy_inputs(fns, rng):
    f, ref = fns
    xv, yv = rng.normal(size=(11, 3)), rng.normal(size=11)
    check(f(synk.data(xv), yv, 2.0), ref(xv, yv, 2.0))


@pytest.mark.parametrize("batch", [5, slice(2, 9), [9, 0, 4, 4, 7, 1]])
def test_batch_int_slice_list(fns, rng, batch):
    f, ref = fns
    xv, yv = rng.normal(size=(11, 3)), rng.normal(size=11)
    idx = np.arange(batch) if isinstance(batch, int) else np.arange(11)[batch]
    check(f(xv, yv, 1.0, batch=batch), ref(xv[idx], yv[idx], 1.0))
    check(f(xv, yv, 1.0, batch=np.array(idx)), ref(xv[idx], yv[idx], 1.0))


@pytest.mark.parametrize("batch", [5, slice(3, 10), [9, 0, 4, 4, 7, 1]])
def test_minibatch_data_by_position(fns, rng, batch):
    """Row k of minibatch Data pairs with the k-th selected row, for int, slice and list."""
    f, ref = fns
    xv = rng.normal(size=(11, 3))
    idx = np.arange(batch) if isinstance(batch, int) else np.arange(11)[batch]
    y_mb = synk.data(rng.normal(size=len(idx)), minibatch=True)
    assert y_mb.minibatch
    check(f(xv, y_mb, 1.0, batch=batch), ref(xv[idx], y_mb.data, 1.0))


def test_batch_s_and_num_slices(ranks, rng):
    data = pytensor.shared(np.zeros((1, 3)), name="call_data")
    f = synk.function(
        [], [(data**2).mean(), (data.sum(axis=1), "gather")], sliceable_shareds=[data]
    )
    whole = rng.normal(size=(9, 3))
    synk.scatter(data, whole)  # rank 0: rows 0..4, rank 1: rows 5..8
    mean, sums = f(batch_s=slice(1, 4))
    idx = [1, 2, 3, 6, 7, 8]
    np.testing.assert_allclose(mean, (whole[idx] ** 2).mean())
    np.testing.assert_allclose(sums, whole[idx].sum(axis=1))
    mean, sums = f(batch_s=[[0, 2], [1]])  # one per rank
    np.testing.assert_allclose(sums, whole[[0, 2, 6]].sum(axis=1))
    for num_slices in (2, 3):
        mean, sums = f(num_slices=num_slices)
        np.testing.assert_allclose(mean, (whole**2).mean())
        np.testing.assert_allclose(sums, whole.sum(axis=1))


def test_output_subset(fns, rng):
    f, ref = fns
    xv, yv = rng.normal(size=(7, 3)), rng.normal(size=7)
    want = ref(xv, yv, 1.0)
    np.testing.assert_allclose(f(xv, yv, 1.0, output_subset=[1]), want[1])  # the value
    check(f(xv, yv, 1.0, output_subset=[1, 0]), [want[1], want[0]])


def test_methods_and_attributes(fns, rng):
    f, ref = fns
    xv, yv = rng.normal(size=(7, 3)), rng.normal(size=7)
    check(f.as_theano(xv, yv, 1.5), ref(xv, yv, 1.5))
    xd, yd, sd = f.build_inputs(
        xv, yv, 1.5, force_cast=False, oversize=1.5, minibatch=[False, True, False]
    )
    assert (xd.minibatch, yd.minibatch) == (False, True) and xd.ndim == 2
    check(f(xd, yd, sd), ref(xv, yv, 1.5))
    assert f.name == "call" and f.output_modes == ["avg", "gather"] and f.update_modes == []
    one = synk.function([x], x.sum())
    built = one.build_inputs(xv.astype("float32"), minibatch=True)
    assert isinstance(built, synk.Data) and built.minibatch and built.dtype == "float64"
    w = pytensor.shared(np.ones(3), name="call_w")
    uses_w = synk.function([x], (x @ w).sum(), updates=[(w, w * 2, "max")])
    assert uses_w.get_shared() == [w] and uses_w.update_modes == ["max"]
