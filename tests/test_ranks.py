"""Splitting with 1 and 3 ranks: the same answers as pytensor.function on the whole data."""

import numpy as np
import pytest

from tests.graphs import check_ops, ops_function, random_xy

pytestmark = pytest.mark.parametrize("ranks", [1, 3], indirect=True)


@pytest.mark.parametrize("n", [1, 2, 4, 11])
def test_reduce_ops_batches_and_slices(ranks, rng, n):
    f, ref = ops_function()
    xv, yv = random_xy(rng, n)
    expected_rows = [len(p) for p in np.array_split(np.arange(n), ranks)]
    check_ops(f(xv, yv, 0.5), ref(xv, yv, 0.5), rows_per_rank=expected_rows)
    idx = rng.permutation(n)
    got = f(xv, yv, 2.0, batch=idx, num_slices=3, output_subset=range(6))
    check_ops(got + [[n]], ref(xv[idx], yv[idx], 2.0)[:6] + [n])
