"""The original's ``synk.function(...)`` (spec section "function"), on 2 CPU ranks with 7 rows
(4 on rank 0, 3 on rank 1), compared with plain ``pytensor.function``."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.session import launch

x = pt.matrix("x", dtype="float64")
y = pt.vector("y", dtype="float64")
ROWS_0 = 4  # rank 0's share of 7 rows

EXPRS = [
    ((x * 2) ** 2).mean(),
    (x.sum(axis=1) * y).sum(),
    pt.prod(1 + 0.01 * x),
    x.max(),
    x.min(),
    x.sum(axis=1) + y,
]
OPS = ["avg", "sum", "prod", "max", "min", "gather"]


@pytest.fixture(scope="module")
def every_op(ranks):
    """Every output op, the plain and the host-forcing ("c_") forms, and None."""
    outputs = [(e, op) for e, op in zip(EXPRS, OPS, strict=True)]
    outputs += [(e, "c_" + op) for e, op in zip(EXPRS, OPS, strict=True)]
    outputs += [(x.sum(axis=1) + y, None)]
    f = synk.function([x, y], outputs, name="every_op")
    ref = pytensor.function([x, y], EXPRS + [x.sum(axis=1) + y])
    return f, ref


def test_output_ops_and_c_forms(every_op, rng):
    f, ref = every_op
    xv, yv = rng.normal(size=(7, 3)), rng.normal(size=7)
    got, want = f(xv, yv), ref(xv, yv)
    for j in range(6):
        np.testing.assert_allclose(got[j], want[j], rtol=1e-10, err_msg=OPS[j])
        np.testing.assert_allclose(got[6 + j], want[j], rtol=1e-10, err_msg="c_" + OPS[j])
    assert f.output_modes == OPS + ["c_" + op for op in OPS] + [None]


def test_op_none_is_rank_0s_own_result(every_op, rng):
    f, ref = every_op
    xv, yv = rng.normal(size=(7, 3)), rng.normal(size=7)
    got = f(xv, yv, output_subset=[12])  # one output: the value itself
    np.testing.assert_allclose(got, ref(xv[:ROWS_0], yv[:ROWS_0])[-1])


def test_output_forms(ranks, rng):
    """outputs: a variable, (var, op), or a list of them; a single one returns the value."""
    xv = rng.normal(size=(7, 3))
    single = synk.function([x], x.sum(axis=0))  # op "avg": weighted by each rank's rows
    want = (ROWS_0 * xv[:ROWS_0].sum(axis=0) + 3 * xv[ROWS_0:].sum(axis=0)) / 7
    np.testing.assert_allclose(single(xv), want)
    pair = synk.function([x], (x.sum(), "sum"))
    np.testing.assert_allclose(pair(xv), xv.sum())
    listed = synk.function([x], [x.mean(), (x.max(), "max")])
    mean, biggest = listed(xv)
    np.testing.assert_allclose([mean, biggest], [xv.mean(), xv.max()])


def test_kwargs_go_to_pytensor_function(ranks, rng):
    from pytensor.compile import UnusedInputError

    x32 = pt.matrix("x32", dtype="float32")
    unused = pt.scalar("unused", dtype="float64")
    f = synk.function(
        [x32],
        (x32.sum(), "sum"),
        bcast_inputs=[unused],
        allow_input_downcast=True,
        on_unused_input="ignore",
        name="kw",
        mode="FAST_COMPILE",
    )
    xv = rng.normal(size=(7, 3))  # float64 for a float32 input: a downcast
    # A float32 sum of 21 values, split over the ranks: compare with the exact sum of the
    # downcast values, to float32 rounding of the partial sums (they can cancel).
    np.testing.assert_allclose(f(xv, 1.0), xv.astype("float32").sum(dtype="float64"), atol=1e-5)
    assert f.name == "kw"
    strict = synk.function([x32], x32.sum())
    with pytest.raises(TypeError, match="lose precision"):
        strict(xv)
    with pytest.raises(UnusedInputError):
        synk.function([x], x.sum(), bcast_inputs=[unused], on_unused_input="raise")


def test_updates_pairs_dict_and_triples_over_slices(ranks, rng):
    """Every slice computes from the original values; the update values are combined over
    slices with their op ("avg", row-weighted, for pairs) and applied once at the end."""
    mean_w = pytensor.shared(np.zeros(3), name="mean_w")
    total_w = pytensor.shared(np.zeros(3), name="total_w")
    count = pytensor.shared(np.float64(0), name="count")
    f = synk.function(
        [x],
        (x.sum(), "sum"),
        updates=[
            (mean_w, mean_w + x.mean(axis=0)),
            (total_w, x.sum(axis=0), "sum"),
            (count, count + 1, "max"),
        ],
    )
    assert f.update_modes == ["avg", "sum", "max"]
    xv = rng.normal(size=(7, 3))
    parts = [xv[:ROWS_0], xv[ROWS_0:]]
    for num_slices in (1, 3):
        synk.broadcast([mean_w, total_w, count], [np.zeros(3), np.zeros(3), 0.0])
        np.testing.assert_allclose(f(xv, num_slices=num_slices), xv.sum())
        got_mean, got_total, got_count = synk.gather([mean_w, total_w, count])
        for r, part in enumerate(parts):
            np.testing.assert_allclose(got_mean[r], part.mean(axis=0))
            np.testing.assert_allclose(got_total[r], part.sum(axis=0))
        assert got_count.tolist() == [1.0, 1.0]  # once per call, not once per slice
    ordered = synk.function([x], x.mean(), updates={count: count + 2})  # a dict
    ordered(xv, num_slices=2)
    assert synk.gather(count).tolist() == [3.0, 3.0]


def test_graph_error_raises_in_rank_0_at_function(ranks, rng):
    z = pt.vector("z")
    session = launch.current()
    n_functions = len(session.functions)
    with pytest.raises(pytensor.graph.utils.MissingInputError):
        synk.function([x], x.sum() + z.sum())
    with pytest.raises(ValueError, match="reduce op"):
        synk.function([x], (x.sum(), "median"))
    assert len(session.functions) == n_functions  # nothing was kept to ship
    g = synk.function([x], (x.sum(), "sum"))  # the session is usable
    xv = rng.normal(size=(7, 3))
    np.testing.assert_allclose(g(xv), xv.sum())


def test_any_iterable_where_a_list_is_taken(ranks, rng):
    """As in Theano, every list argument of ``function`` (inputs, outputs, updates, givens,
    sliceable_shareds) and of the collectives may be any iterable: a generator, a dict view."""
    s = pt.scalar("s", dtype="float64")
    q = pt.vector("q", dtype="float64")
    w = pytensor.shared(np.zeros(2), name="w_iter")
    d = pytensor.shared(np.zeros(1), name="d_iter")
    outputs = {"total": (x.sum() * s, "sum"), "y_and_d": ((2 * q).sum() + d.sum(), "sum")}
    f = synk.function(
        iter([x, y]),
        outputs.values(),
        bcast_inputs=(v for v in [s]),
        updates=((v, v + s) for v in [w]),
        givens={q: y}.items(),
        sliceable_shareds=iter([d]),
    )
    params = {"w": w, "d": d}
    synk.scatter(iter([d]), (v for v in [np.arange(4.0)]))  # rank 0: 0, 1; rank 1: 2, 3
    xv, yv = rng.normal(size=(7, 3)), rng.normal(size=7)
    total, y_and_d = f(xv, yv, 2.0, batch_s=slice(0, 1))
    np.testing.assert_allclose(total, 2 * xv.sum())
    np.testing.assert_allclose(y_and_d, 2 * yv.sum() + 0.0 + 2.0)
    np.testing.assert_array_equal(synk.gather(params.values())[0], [[2.0, 2.0]] * ranks)
    synk.broadcast(params.values(), (v for v in [np.ones(2), np.ones(3)]))
    got_w, got_d = synk.get_value(1, params.values())
    np.testing.assert_array_equal(got_w, np.ones(2))
    np.testing.assert_array_equal(got_d, np.ones(3))
    synk.all_reduce(iter([w]), op="sum")
    np.testing.assert_array_equal(synk.get_value(1, w), [ranks, ranks])
