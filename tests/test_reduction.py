"""The reduce ops of synkhronos.transport.reduction, against plain numpy (no fork needed)."""

from __future__ import annotations

import numpy as np
import pytest

from synkhronos.transport.reduction import (
    BLOCK,
    accumulate,
    bare_op,
    check_collective_op,
    check_output_op,
    check_update_op,
    combine,
    empty_aligned,
    join_rows,
    reduce_into,
    reduces_in_place,
)


@pytest.mark.parametrize("op", ["avg", "sum", "prod", "max", "min"])
def test_combine_and_accumulate_match_numpy(op, rng):
    values = [rng.normal(size=(3, 2)) for _ in range(3)]
    weights = [2, 5, 4]
    stacked = np.stack(values)
    want = {
        "avg": np.average(stacked, axis=0, weights=weights),
        "sum": stacked.sum(0),
        "prod": stacked.prod(0),
        "max": stacked.max(0),
        "min": stacked.min(0),
    }[op]
    np.testing.assert_allclose(combine(op, values, weights), want, rtol=1e-12)
    np.testing.assert_allclose(accumulate(op, values, weights), want, rtol=1e-12)


def test_combine_skips_empty_pieces_and_gathers(rng):
    a, b = rng.normal(size=(2, 3)), rng.normal(size=(4, 3))
    np.testing.assert_array_equal(
        combine("gather", [a, np.zeros((0, 3)), b], [2, 0, 4]), np.concatenate([a, b])
    )
    assert combine("sum", [a], [0]) is None
    assert combine("per_rank", [1, 2], [1, 1]) == [1, 2]
    np.testing.assert_array_equal(combine("c_sum", [a, a], [2, 2]), 2 * a)
    assert combine("avg", [np.int64(3)], [1]).dtype == np.float64


@pytest.mark.parametrize("op", ["avg", "sum", "max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_reduce_into_matches_numpy_across_blocks(op, dtype, rng):
    n = BLOCK + 17  # a partial second block
    inputs = [(rng.normal(size=n) * 100).astype(dtype) for _ in range(3)]
    out, copy = np.empty(n, dtype), np.empty(n, dtype)
    reduce_into(op, inputs, out, (copy,))
    stacked = np.stack(inputs).astype(np.float64)
    want = {
        "avg": stacked.sum(0) / 3,
        "sum": stacked.sum(0),
        "max": stacked.max(0),
        "min": stacked.min(0),
    }[op]
    if dtype == "int32":
        want = np.trunc(want)
    np.testing.assert_allclose(out, want.astype(dtype), rtol=1e-5, atol=1e-3)  # float32 sums
    np.testing.assert_array_equal(copy, out)


def test_op_checks_name_the_ops():
    with pytest.raises(ValueError, match="use one of"):
        check_output_op("mean")
    with pytest.raises(ValueError, match="use one of"):
        check_collective_op("gather")
    assert reduces_in_place("avg", "float32") and not reduces_in_place("avg", "int32")
    with pytest.raises(ValueError, match="for the loss"):
        check_update_op("gather", "the loss")
    assert bare_op("c_gather") == "gather" and bare_op("per_rank") == "per_rank"


def test_combine_keeps_float_dtypes_and_copies_a_lone_value(rng):
    a, b = (rng.normal(size=(5, 3)).astype(np.float32) for _ in range(2))
    avg = combine("avg", [a, b], [3, 1])
    assert avg.dtype == np.float32
    np.testing.assert_allclose(avg, 0.75 * a + 0.25 * b, rtol=1e-6)
    alone = combine("sum", [a, b], [0, 4])
    assert alone is not b and np.array_equal(alone, b)
    ints = combine("avg", [np.array([1, 2]), np.array([2, 2])], [1, 1])
    assert ints.dtype == np.float64 and ints.tolist() == [1.5, 2.0]
    np.testing.assert_array_equal(combine("gather", [np.float32(1), np.float32(2)], [1, 1]), [1, 2])
    assert combine("gather", [np.float32(3)], [1]).shape == (1,)


def test_join_rows_concatenates_or_stacks(rng):
    parts = [rng.normal(size=(n, 2)) for n in (1, 0, 3)]
    np.testing.assert_array_equal(join_rows(parts), np.concatenate(parts))
    same = [rng.normal(size=(2, 2)) for _ in range(3)]
    assert join_rows(same, new_axis=True).shape == (3, 2, 2)


@pytest.mark.parametrize("shape", [(), (7,), (3, 5, 2)])
@pytest.mark.parametrize("dtype", ["float64", "int8", "complex64"])
def test_empty_aligned_starts_on_64_bytes(shape, dtype):
    for _ in range(4):
        a = empty_aligned(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
        assert a.ctypes.data % 64 == 0


def test_integer_avg_divides_and_truncates_toward_zero():
    n = 49  # 49 * (1/49) is just below 1: a multiplication would give 0
    inputs = [np.array([1, -1, 3], np.int64)] * n
    out = np.empty(3, np.int64)
    reduce_into("avg", inputs, out)
    assert out.tolist() == [1, -1, 3]
    reduce_into("avg", [np.array([3, -3], np.int32), np.array([0, 0], np.int32)], out[:2])
    assert out[:2].tolist() == [1, -1]
    one = np.empty(2, np.float32)
    reduce_into("sum", [np.array([1.5, 2.5], np.float32)], one)
    assert one.tolist() == [1.5, 2.5]


def test_accumulate_keeps_the_dtype_and_reduces_in_place_of_known_dtypes():
    values = [np.full(3, 2, np.float32), np.full(3, 4, np.float32)]
    got = accumulate("c_avg", values, [1, 3])
    assert got.dtype == np.float32 and got.tolist() == [3.5] * 3
    assert reduces_in_place("sum", "int8") and reduces_in_place("max", np.float16)
    assert not reduces_in_place("sum", "bool") and not reduces_in_place("sum", "complex64")
    assert not reduces_in_place("gather", "float32") and not reduces_in_place("c_sum", "float32")
