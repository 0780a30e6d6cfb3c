"""``Data`` objects: inputs in shared memory, selected with ``batch``.

A ``synk.data`` array lives in OS shared memory that every rank reads in
place, so a call sends the workers only which rows to use. Run:
``python demos/basics_data.py --ranks 2``.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from basics_runner import run

import synkhronos as synk


def main(n_ranks: int) -> None:
    x = pt.matrix("x")
    y = pt.vector("y")
    f = synk.function(inputs=[x, y], outputs=(x * y[:, None]).mean(axis=0))  # y: row weights
    synk.distribute()

    rng = np.random.default_rng(0)
    x_np = rng.normal(size=(1000, 5)).astype(x.dtype)
    y_np = rng.normal(size=(1000,)).astype(y.dtype)

    # The data used below: built from numpy arrays, then used like numpy arrays.
    x_dat = synk.data(x_np, name="x")
    y_dat = synk.data(y_np, name="y")
    assert x_dat.shape == (1000, 5) and len(y_dat) == 1000 and x_dat.dtype == x_np.dtype
    np.testing.assert_array_equal(x_dat[10:12], x_np[10:12])

    def check(result: np.ndarray, rows) -> None:
        np.testing.assert_allclose(result, f.as_pytensor(x_np[rows], y_np[rows]), rtol=1e-4)

    check(f(x_dat, y_dat), slice(None))  # all rows, split over the ranks
    check(f(x_np, y_np), slice(None))  # numpy inputs also work (copied to shared memory)
    check(f(x_dat, y_dat, batch=100), slice(0, 100))  # the first 100 rows
    check(f(x_dat, y_dat, batch=slice(300, 420)), slice(300, 420))
    index = rng.choice(1000, size=64, replace=False)  # e.g. the next chunk of a permutation
    check(f(x_dat, y_dat, batch=index), index)
    print("batch: int, slice and index array")

    # Writes through [] (or .data, a numpy view) are seen by every rank at the next call.
    x_dat[:] = 2 * x_np
    x_np = 2 * x_np
    check(f(x_dat, y_dat), slice(None))

    # set_value replaces contents and shape; oversize leaves room to grow in place.
    x_np = rng.normal(size=(1500, 5)).astype(x.dtype)
    y_np = rng.normal(size=(1500,)).astype(y.dtype)
    x_dat.set_value(x_np, oversize=2.0)
    y_dat.set_value(y_np, oversize=2.0)
    check(f(x_dat, y_dat), slice(None))
    # set_length keeps the leading rows: here, the first 700.
    x_dat.set_length(700)
    y_dat.set_length(700)
    assert len(x_dat) == 700 and x_dat.alloc_size >= 1500 * 5  # elements
    check(f(x_dat, y_dat), slice(0, 700))
    print("set_value and set_length")

    # A minibatch Data holds only the rows one batch needs, here those a shuffled index
    # selects from the dataset. It is read by position: its row k pairs with the k-th
    # selected row of the full inputs (as in the original Synkhronos).
    index = rng.permutation(len(x_np))[:64]
    x_mb = synk.data(x_np[index], minibatch=True)
    y_mb = synk.data(y_np[index], minibatch=True)
    check(f(x_np, y_mb, batch=index), index)  # full x, minibatch y
    check(f(x_mb, y_mb, batch=40), index[:40])  # both minibatch: the first 40 positions
    print("minibatch Data")


if __name__ == "__main__":
    run(main, __doc__)
