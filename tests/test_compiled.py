"""One rank's compiled function run on its share, without a fork: a share of 11 rows, in
one or several chunks, gives the plain function's result on those rows; updates wait
where asked."""

import logging

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.rank import compiled
from synkhronos.rank.compiled import RankFunction, assign, is_jax, without_default_updates
from synkhronos.rank.first_calls import FirstCalls
from synkhronos.rank.graphs import GraphSpec

MODE = "FAST_COMPILE"  # nothing to compile: the results compared come from the same code
ROWS = 11


def _function(inputs, outputs, ops, updates=(), update_ops=(), sliceable=()):
    spec = GraphSpec(0, "f", inputs, [], outputs, ops, list(updates), sliceable=list(sliceable),
                     mode=MODE, update_ops=list(update_ops))  # fmt: skip
    return RankFunction(spec, None, False, FirstCalls(None, lambda: None))


@pytest.fixture
def regression(rng):
    x, y = pt.matrix("x"), pt.vector("y")
    w = pytensor.shared(rng.standard_normal(3), name="w")
    err = pt.dot(x, w) - y
    loss = (err**2).mean()
    new_w = w - 0.1 * pt.grad(loss, w)
    data = [rng.standard_normal((ROWS, 3)), rng.standard_normal(ROWS)]
    return x, y, w, [loss, err], new_w, data


@pytest.mark.parametrize("num_slices", [1, 3])
def test_a_share_in_chunks_gives_the_plain_result_on_its_rows(regression, num_slices):
    x, y, w, outs, new_w, data = regression
    fn = _function([x, y], outs, ["avg", "gather"], [(w, new_w)], ["avg"])
    rows = slice(2, 9)  # 7 rows: chunks of 3, 2, 2
    w0 = w.get_value()
    pending = []
    weight, got = fn.run(data, rows, None, [0, 0], [], None, num_slices, [1, 0], pending)
    assert weight == 7
    plain = pytensor.function([x, y], outs + [new_w], mode=MODE)
    loss, err, expected_w = plain(data[0][rows], data[1][rows])
    np.testing.assert_allclose(got[0], err, rtol=1e-12)
    np.testing.assert_allclose(got[1], loss, rtol=1e-12)
    np.testing.assert_array_equal(w.get_value(), w0)  # waits in pending
    ((var, value),) = pending
    assert var is w
    # chunks: each chunk's gradient from the same w, averaged by rows: the whole share's
    np.testing.assert_allclose(value, expected_w, rtol=1e-12)
    assign(pending)
    np.testing.assert_allclose(w.get_value(), expected_w, rtol=1e-12)


def test_updates_apply_at_once_without_pending_and_no_rows_computes_nothing(regression):
    x, y, w, outs, new_w, data = regression
    fn = _function([x, y], outs[:1], ["sum"], [(w, new_w)], ["avg"])
    index = np.array([10, 0, 4])
    expected_loss, expected_w = pytensor.function([x, y], [outs[0], new_w], mode=MODE)(
        data[0][index], data[1][index]
    )
    weight, (loss,) = fn.run(data, index, None, [0, 0], [], None, 1, [0])
    assert weight == 3
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-12)
    np.testing.assert_allclose(w.get_value(), expected_w, rtol=1e-12)
    assert fn.run(data, slice(5, 5), None, [0, 0], [], None, 1, [0]) == (0, None)


def test_minibatch_inputs_read_by_position(rng):
    x, m = pt.vector("x"), pt.vector("m")
    fn = _function([x, m], [x * m], ["gather"])
    X, M = rng.standard_normal(ROWS), rng.standard_normal(4)
    # x's rows by selection, m's (a minibatch of the selection) by position within it
    weight, (got,) = fn.run([X, M], slice(7, 11), slice(0, 4), [0, 1], [], None, 1, [0])
    np.testing.assert_array_equal(got, X[7:11] * M)


@pytest.mark.parametrize("s_rows", [slice(3, 10), np.array([9, 1, 5])], ids=["slice", "index"])
def test_sliceable_shared_rows(rng, s_rows):
    data = pytensor.shared(rng.standard_normal((ROWS, 2)), name="data")
    fn = _function([], [data.sum(0), data], ["sum", "gather"], sliceable=[data])
    assert fn.sliceable_lengths() == [ROWS]
    weight, (total, rows) = fn.run([], None, None, [], [], s_rows, 2, [0, 1])
    expected = data.get_value()[s_rows]
    assert weight == len(expected)
    np.testing.assert_allclose(total, expected.sum(0), rtol=1e-12)
    np.testing.assert_array_equal(rows, expected)


def test_small_helpers(caplog):
    assert is_jax("jax") and is_jax(pytensor.compile.mode.get_mode("JAX"))
    assert not is_jax(None) and not is_jax("FAST_RUN")
    a, b = pt.vector("a"), pt.vector("b")
    assert without_default_updates(True, [a]) is True
    assert without_default_updates([a], [a, b]) == [a, b]
    assert without_default_updates(False, [b]) == [b]
    f32 = pytensor.shared(np.zeros(2, "float32"))
    assign([(f32, np.ones(2))])  # a float64 value keeps the variable's dtype
    assert f32.get_value().dtype == np.float32
    with caplog.at_level(logging.INFO, compiled.logger.name), compiled.compiling("step x"):
        pass
    assert "done step x in" in caplog.text


@pytest.mark.parametrize("rows", [slice(0, 2), np.array([3, 1]), np.array([5])], ids=str)
def test_more_chunks_than_rows(regression, rows):
    x, y, w, outs, new_w, data = regression
    fn = _function([x, y], [outs[0], x.max(0), x], ["avg", "max", "gather"], [(w, new_w)],
                   ["avg"])  # fmt: skip
    plain = pytensor.function([x, y], [outs[0], x.max(0), x, new_w], mode=MODE)
    *expected, expected_w = plain(data[0][rows], data[1][rows])
    pending = []
    weight, got = fn.run(data, rows, None, [0, 0], [], None, 3, [0, 1, 2], pending)
    assert weight == len(expected[2])
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(pending[0][1], expected_w, rtol=1e-12)
