"""Row partitioning and the reduce ops, against plain numpy (no fork needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synkhronos.transport.partition import selection_length, split_bounds, split_selection
from synkhronos.transport.reduction import (
    BLOCK,
    accumulate,
    check_collective_op,
    check_output_op,
    combine,
    reduce_into,
    reduces_in_place,
)


@given(st.integers(0, 500), st.integers(1, 12))
def test_split_bounds_matches_array_split(n, parts):
    want = [len(p) for p in np.array_split(np.arange(n), parts)]
    bounds = split_bounds(n, parts)
    assert bounds[0] == 0 and bounds[-1] == n
    assert np.diff(bounds).tolist() == want


@settings(deadline=None)
@given(st.integers(0, 30), st.integers(0, 30), st.integers(1, 6), st.booleans())
def test_split_selection_keeps_rows_in_order(start, size, parts, as_index):
    sel = (
        np.arange(start, start + size, dtype=np.int64)[::-1].copy()
        if as_index
        else slice(start, start + size)
    )
    pieces = split_selection(sel, parts)
    assert len(pieces) == parts
    assert sum(selection_length(p) for p in pieces) == selection_length(sel)
    rows = np.arange(100)
    joined = np.concatenate([rows[p] for p in pieces])
    np.testing.assert_array_equal(joined, rows[sel])


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
