"""Output reduce ops and ``num_slices``.

Each output of a synkhronos function names how the ranks' results are combined.
Every op is checked against the same graph run on all the data in one process
(``f.as_pytensor``). Run: ``python demos/basics_reduce.py --ranks 2``.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from basics_runner import run

import synkhronos as synk


def main(n_ranks: int) -> None:
    x = pt.matrix("x")
    y = pt.matrix("y")
    z = x * y
    f = synk.function(
        inputs=[x, y],
        outputs=[
            z.mean(axis=0),  # "avg" is the default: weighted by each rank's rows
            (z.sum(axis=0), "sum"),
            (z.prod(axis=0), "prod"),
            (z.max(axis=0), "max"),
            (z.min(axis=0), "min"),
            (z, "gather"),  # rows of every rank, concatenated in data order
            (z.sum(), "per_rank"),  # no reduction: one result per rank
        ],
    )
    synk.distribute()

    rng = np.random.default_rng(0)
    # 101 rows never split evenly, so "avg" must weight ranks by their rows;
    # values near 1 keep the product finite.
    x_dat = rng.uniform(0.9, 1.1, (101, 4)).astype(x.dtype)
    y_dat = rng.uniform(0.9, 1.1, (101, 4)).astype(y.dtype)

    mean, total, prod, high, low, rows, per_rank = f(x_dat, y_dat)
    ref_mean, ref_total, ref_prod, ref_high, ref_low, ref_rows, ref_sum = f.as_pytensor(
        x_dat, y_dat
    )
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-5)
    np.testing.assert_allclose(total, ref_total, rtol=1e-5)
    np.testing.assert_allclose(prod, ref_prod, rtol=1e-4)
    np.testing.assert_array_equal(high, ref_high)
    np.testing.assert_array_equal(low, ref_low)
    np.testing.assert_array_equal(rows, ref_rows)
    assert len(per_rank) == n_ranks
    np.testing.assert_allclose(sum(per_rank), ref_sum, rtol=1e-5)
    print(f"ops on {n_ranks} ranks: avg sum prod max min gather per_rank")

    # num_slices: each rank runs its rows in 3 pieces and combines them itself first;
    # the results are the same, the peak memory per rank is smaller. Op "per_rank" has no
    # meaning across slices, so output_subset leaves that output out.
    sliced = f(x_dat, y_dat, num_slices=3, output_subset=range(6))
    for got, want in zip(sliced, [mean, total, prod, high, low, rows], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4)
    print("num_slices=3 gives the same results")


if __name__ == "__main__":
    run(main, __doc__)
