"""synkhronos.transport.comm.traced without devices: the traced collectives under
``jax.vmap`` with the mesh axis's name, each mapped row a rank, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from synkhronos.transport.comm.traced import (
    AXIS,
    broadcast_traced,
    reduce_buckets_traced,
    reduce_traced,
    sum_in_order_traced,
)

jax = pytest.importorskip("jax")

N_RANKS = 3


def _over_ranks(body, stacked):
    """``body`` run by each of ``len(stacked)`` ranks on its row, the rows as numpy."""
    return np.asarray(jax.vmap(body, axis_name=AXIS)(stacked))


@pytest.mark.parametrize("op", ["avg", "sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_reductions_match_numpy_and_keep_the_dtype(op, dtype, rng):
    stacked = (rng.normal(size=(N_RANKS, 5, 2)) * 7).astype(dtype)
    got = _over_ranks(lambda x: reduce_traced(x, op, N_RANKS), stacked)
    wide = stacked.astype(np.float64)
    want = {
        "avg": wide.sum(0) / N_RANKS,
        "sum": wide.sum(0),
        "prod": wide.prod(0),
        "max": wide.max(0),
        "min": wide.min(0),
    }[op]
    if dtype == "int32":
        want = np.trunc(want)  # "avg" of integers divides toward zero
    assert got.dtype == np.dtype(dtype)
    for row in got:  # every rank holds the same result
        np.testing.assert_allclose(row, want.astype(dtype), rtol=2e-6)
    one = stacked[:1]
    np.testing.assert_array_equal(_over_ranks(lambda x: reduce_traced(x, op, 1), one), one)


@pytest.mark.parametrize("bucket_bytes", [0, 16, 1000])
def test_buckets_reduce_element_by_element_as_one_all_reduce(bucket_bytes, rng):
    stacked = rng.normal(size=(N_RANKS, 11)).astype(np.float32)  # 4-element buckets: 4, 4, 3
    whole = _over_ranks(lambda x: reduce_traced(x, "avg", N_RANKS), stacked)
    pieces = _over_ranks(lambda x: reduce_buckets_traced(x, "avg", N_RANKS, bucket_bytes), stacked)
    np.testing.assert_array_equal(pieces, whole)
    matrix = stacked.reshape(N_RANKS, 11, 1)  # not a vector: one all-reduce
    np.testing.assert_array_equal(
        _over_ranks(lambda x: reduce_buckets_traced(x, "sum", N_RANKS, 16), matrix)[0, :, 0],
        stacked.sum(0),
    )


@pytest.mark.parametrize("root", [0, 2])
def test_broadcast_gives_the_roots_exact_bits(root, rng):
    stacked = rng.normal(size=(N_RANKS, 6)).astype(np.float32)
    stacked[root, :3] = [-0.0, np.inf, np.nan]  # a float sum would give +0.0 and lose NaN
    got = _over_ranks(lambda x: broadcast_traced(x, root), stacked)
    assert got.dtype == np.float32
    for row in got:
        np.testing.assert_array_equal(row.view(np.uint32), stacked[root].view(np.uint32))
    ints = rng.integers(-50, 50, size=(N_RANKS, 4)).astype(np.int8)
    np.testing.assert_array_equal(
        _over_ranks(lambda x: broadcast_traced(x, root), ints)[1], ints[root]
    )


def test_the_sum_in_order_adds_rank_0s_part_first_on_every_rank():
    """1e16 + 1 - 1e16 is 0 in rank order, 1 in others; every rank gets the same bits."""
    with jax.enable_x64(True):
        stacked = np.array([[1e16, 2.5], [1.0, -0.5], [-1e16, 1e-3]])
        got = _over_ranks(lambda x: sum_in_order_traced(x, N_RANKS), stacked)
        want = stacked[0] + stacked[1] + stacked[2]
        assert want[0] == 0.0
        for row in got:
            assert row.tobytes() == want.tobytes()
        one = stacked[:1]
        np.testing.assert_array_equal(_over_ranks(lambda x: sum_in_order_traced(x, 1), one), one)
