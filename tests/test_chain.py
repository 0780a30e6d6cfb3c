"""synk.chain: functions and collectives on every rank with one command.

Compared with numpy formulas and plain PyTensor on uneven splits (7 and 11 rows on 2 and
3 ranks); a failing step names its rank and step, and the session goes on.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.raise_op import Assert

import synkhronos as synk
from synkhronos.session import launch
from synkhronos.transport.partition import split_bounds

pytestmark = pytest.mark.parametrize("ranks", [2, 3], indirect=True)
MODE = "FAST_COMPILE"  # the default (Numba) mode compiles for seconds per graph and rank


def per_rank_rows(rows, n_ranks):
    bounds = split_bounds(len(rows), n_ranks)
    return [rows[bounds[r] : bounds[r + 1]] for r in range(n_ranks)]


def test_step_matches_numpy_on_uneven_splits(ranks, rng):
    """Phase one writes each rank's column sums, all_reduce adds them, phase two scales:
    every rank ends with the whole batch's column sums; the outputs are reduced as calls."""
    x = pt.matrix("x")
    acc = pytensor.shared(np.zeros(3), name="acc")
    scale = pytensor.shared(np.ones(3), name="scale")
    first = synk.function(
        [x],
        [x.mean(), (x.max(axis=1), "gather"), (x.sum(), "sum")],
        updates=[(acc, x.sum(axis=0), "sum")],
        mode=MODE,
    )
    second = synk.function([], [(acc.sum(), "max")], updates=[(scale, acc * 0.5)], mode=MODE)
    step = synk.chain(first, ("all_reduce", acc, "sum"), second)
    data = rng.normal(size=(11, 3))
    for batch, num_slices in ((None, 1), (7, 2), (np.array([0, 2, 3, 5, 8, 9, 10]), 1)):
        rows = data if batch is None else data[:batch] if isinstance(batch, int) else data[batch]
        (mean, row_max, total), (acc_sum,) = step(data, batch=batch, num_slices=num_slices)
        np.testing.assert_allclose(mean, rows.mean(), rtol=1e-12)
        np.testing.assert_allclose(row_max, rows.max(axis=1), rtol=1e-12)
        np.testing.assert_allclose(total, rows.sum(), rtol=1e-12)
        np.testing.assert_allclose(acc_sum, rows.sum(), rtol=1e-12)
        for got in synk.gather(scale, nd_up=1):
            np.testing.assert_allclose(got, 0.5 * rows.sum(axis=0), rtol=1e-12)
    # Per rank, before the all-reduce: what the first function alone computes there.
    first(data, batch=7)
    parts = per_rank_rows(data[:7], ranks)
    np.testing.assert_allclose(
        synk.gather(acc, nd_up=1), [p.sum(axis=0) for p in parts], rtol=1e-12
    )


def test_outputs_match_plain_pytensor_and_output_subset(ranks, rng):
    x, y = pt.matrix("x"), pt.vector("y")
    w = pytensor.shared(rng.normal(size=3), name="w")
    loss = pt.mean((x @ w - y) ** 2)
    grad = pytensor.grad(loss, w)
    g = pytensor.shared(np.zeros(3), name="g")
    # Row-weighted gradient (loss * rows) and the row count, summed over ranks.
    rows = pytensor.shared(np.float64(0), name="rows")
    f_grad = synk.function(
        [x, y],
        [loss, (x.shape[0], "sum")],
        updates=[(g, grad * x.shape[0]), (rows, pt.cast(x.shape[0], "float64"))],
        mode=MODE,
    )
    f_update = synk.function([], updates=[(w, w - 0.1 * g / rows)], mode=MODE)
    step = synk.chain(f_grad, ("all_reduce", [g, rows], "sum"), f_update)
    ref_w = pytensor.shared(w.get_value().copy())
    ref_x, ref_y = pt.matrix("x"), pt.vector("y")
    ref_loss = pt.mean((ref_x @ ref_w - ref_y) ** 2)
    ref = pytensor.function(
        [ref_x, ref_y], ref_loss, updates=[(ref_w, ref_w - 0.1 * pytensor.grad(ref_loss, ref_w))]
    )
    for _ in range(3):
        xs, ys = rng.normal(size=(7, 3)), rng.normal(size=7)
        (got_loss, got_rows), none = step(xs, ys)
        assert none == [] and int(got_rows) == 7
        np.testing.assert_allclose(got_loss, ref(xs, ys), rtol=1e-12)
        for got in synk.gather(w, nd_up=1):
            np.testing.assert_allclose(got, ref_w.get_value(), rtol=1e-12)
    (only_loss, _) = step(xs, y=ys, output_subset=[0])  # one index: the value itself
    assert np.ndim(only_loss) == 0


def test_other_collectives(ranks, rng):
    v = pytensor.shared(np.zeros(2), name="v")
    rows_s = pytensor.shared(np.zeros((1, 2)), name="rows_s")
    x = pt.matrix("x")
    own = synk.function([x], updates=[(v, x.sum(axis=0)), (rows_s, x[:1])], mode=MODE)
    step = synk.chain(own, ("reduce", v, "max"), ("broadcast", v), ("all_gather", rows_s))
    data = rng.normal(size=(7, 2))
    assert step(data) == [[]]
    parts = per_rank_rows(data, ranks)
    want = np.max([p.sum(axis=0) for p in parts], axis=0)
    np.testing.assert_allclose(synk.gather(v, nd_up=1), [want] * ranks, rtol=1e-12)
    firsts = np.concatenate([p[:1] for p in parts])
    np.testing.assert_allclose(synk.gather(rows_s, nd_up=1), [firsts] * ranks, rtol=1e-12)
    # A chain of collectives alone takes no arguments.
    synk.set_value(ranks - 1, v, np.full(2, 5.0))
    synk.chain(("all_reduce", v, "min"))()
    np.testing.assert_allclose(synk.gather(v, nd_up=1), [np.minimum(want, 5.0)] * ranks)


@pytest.mark.parametrize("bad_rank", ["first", "last"])
def test_failing_step_names_rank_and_step(ranks, bad_rank):
    """A function failing on one rank: rank 0 raises, naming the rank and the step; the
    ranks waiting in the all-reduce give up, and the session stays usable."""
    x = pt.vector("x")
    total = pytensor.shared(np.float64(0), name="total")
    checked = Assert("values below 100")(x, pt.all(x < 100))
    f = synk.function([x], checked.sum(), updates=[(total, checked.sum())], mode=MODE)
    after = synk.function([], updates=[(total, total + 1)], mode=MODE)
    step = synk.chain(f, ("all_reduce", total, "sum"), after)
    rank = 0 if bad_rank == "first" else ranks - 1
    data = np.zeros(7)
    data[per_rank_rows(np.arange(7), ranks)[rank]] = 1000.0
    if rank == 0:
        with pytest.raises(AssertionError, match="values below 100") as info:
            step(data)
        assert (
            f"in step 0 (function {f._spec.fid}) of a synkhronos chain, on rank 0"
            in info.value.__notes__
        )
    else:
        with pytest.raises(synk.RemoteError, match=f"worker rank {rank} failed") as info:
            step(data)
        assert f"in step 0 (function {f._spec.fid}) of a synkhronos chain, on rank {rank}" in (
            str(info.value)
        )
    assert not launch.current().broken
    step(np.arange(7.0))
    np.testing.assert_allclose(synk.gather(total, nd_up=1), [22.0] * ranks)


def test_failing_collective_step(ranks):
    """Shapes that differ over the ranks: every rank raises in the all-reduce step."""
    x = pt.vector("x")
    v = pytensor.shared(np.zeros(2), name="v_shapes")
    f = synk.function([x], x.sum(), updates=[(v, pt.zeros_like(v) + x.sum())], mode=MODE)
    step = synk.chain(f, ("all_reduce", v, "sum"))
    synk.set_value(ranks - 1, v, np.zeros(3))
    with pytest.raises(ValueError, match="equal shapes") as info:
        step(np.ones(7))
    assert (
        "in step 1 (all_reduce of 1 variable(s), op 'sum') of a synkhronos chain, on rank 0"
    ) in info.value.__notes__
    synk.set_value(ranks - 1, v, np.zeros(2))
    step(np.ones(7))
    np.testing.assert_allclose(synk.gather(v, nd_up=1), np.full((ranks, 2), 7.0))


def test_bad_chains_raise(ranks):
    x = pt.vector("x")
    v = pytensor.shared(np.zeros(2), name="v_bad")
    f = synk.function([x], x.sum(), updates=[(v, v + x.sum())], mode=MODE)
    with pytest.raises(TypeError, match="only the chain's first function"):
        synk.chain(f, f)
    with pytest.raises(TypeError, match="a chain step is"):
        synk.chain(f, ("gather", v))
    with pytest.raises(ValueError, match="unknown reduce op"):
        synk.chain(f, ("all_reduce", v, "mean"))
    with pytest.raises(TypeError, match="broadcast takes no op"):
        synk.chain(f, ("broadcast", v, "sum"))
    with pytest.raises(ValueError, match="not used by any synkhronos function"):
        synk.chain(f, ("all_reduce", pytensor.shared(np.zeros(2))))
    with pytest.raises(TypeError, match="no function to take arguments"):
        synk.chain(("broadcast", v))(np.zeros(2))


def test_every_rank_rows_refuses_a_rank_without_rows(ranks):
    """With every_rank_rows=True a call leaving a rank without rows fails in rank 0, before
    any rank runs; without it, that rank skips the function."""
    x = pt.matrix("x")
    total = pytensor.shared(np.float64(0), name="total_rows")
    add = synk.function([x], x.sum(), updates=[(total, x.sum())], mode=MODE)
    strict = synk.chain(add, ("all_reduce", total, "sum"), every_rank_rows=True)
    data = np.ones((ranks + 1, 3))
    strict(data)
    assert float(total.get_value()) == data.sum()
    with pytest.raises(
        ValueError,
        match=rf"batch gives 1 row\(s\) to {ranks} ranks, none to "
        rf"rank\(s\) \[1",
    ):
        strict(data, batch=[0])
    assert float(total.get_value()) == data.sum()  # nothing ran
    loose = synk.chain(add, ("all_reduce", total, "sum"))
    loose(data, batch=[0])  # rank 0 writes 3, the others keep their last value
    assert float(total.get_value()) == 3 + (ranks - 1) * data.sum()


def test_every_rank_rows_with_batch_s(ranks):
    rows = pytensor.shared(np.zeros((1, 2)), name="rows_every_rank")
    acc = pytensor.shared(np.float64(0), name="acc_every_rank")
    f = synk.function([], updates=[(acc, rows.sum())], sliceable_shareds=[rows], mode=MODE)
    strict = synk.chain(f, ("all_reduce", acc, "sum"), every_rank_rows=True)
    synk.scatter(rows, np.ones((2 * ranks, 2)))
    strict(batch_s=slice(0, 1))
    assert float(acc.get_value()) == 2 * ranks
    per_rank = [slice(0, 1)] * (ranks - 1) + [slice(0, 0)]
    with pytest.raises(ValueError, match=rf"batch_s gives .* none to rank\(s\) \[{ranks - 1}\]"):
        strict(batch_s=per_rank)
    synk.scatter(rows, np.ones((ranks - 1, 2)))  # the last rank holds no rows
    with pytest.raises(
        ValueError,
        match=rf"sliceable shared data gives {ranks - 1} row\(s\) "
        rf"to {ranks} ranks, none to rank\(s\) \[{ranks - 1}\]",
    ):
        strict()
