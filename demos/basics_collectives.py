"""Shared variables and every collective.

Every rank holds its own copy of each shared variable a synkhronos function
uses; updates change each rank's copy from that rank's data, and collectives
move values between the copies. Run: ``python demos/basics_collectives.py --ranks 2``.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
from basics_runner import run

import synkhronos as synk


def main(n_ranks: int) -> None:
    x = pt.matrix("x")
    w = pytensor.shared(np.zeros(3, dtype=x.dtype), name="w")
    v = pytensor.shared(np.zeros((4, 3), dtype=x.dtype), name="v")
    # Each rank adds the column sums of ITS rows to ITS copy of w: the copies diverge.
    accumulate = synk.function(inputs=[x], updates=[(w, w + x.sum(axis=0))])
    # A function of v only, so that the workers have v too.
    total_v = synk.function(outputs=(v.sum(), "per_rank"))
    synk.distribute()

    rng = np.random.default_rng(0)
    x_np = rng.normal(size=(11, 3)).astype(x.dtype)
    parts = np.array_split(x_np, n_ranks)  # how rows are scattered: first ranks get extras
    per_rank = np.stack([p.sum(axis=0) for p in parts])

    accumulate(x_np)
    np.testing.assert_allclose(synk.gather(w, nd_up=1), per_rank, rtol=1e-5)  # stacked
    np.testing.assert_allclose(synk.gather(w, nd_up=0), per_rank.reshape(-1), rtol=1e-5)  # concat
    for rank in range(n_ranks):
        np.testing.assert_allclose(synk.get_value(rank, w), per_rank[rank], rtol=1e-5)
    print("gather, get_value: each rank has its own w")

    # reduce: the combination lands in rank 0's copy only; all_reduce: in every copy.
    np.testing.assert_allclose(synk.reduce(w, op="sum"), x_np.sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(w.get_value(), x_np.sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(synk.get_value(n_ranks - 1, w), per_rank[-1], rtol=1e-5)
    synk.set_value(0, w, per_rank[0])  # put rank 0's own sums back (one rank only)
    synk.all_reduce(w, op="max")
    for rank in range(n_ranks):
        np.testing.assert_allclose(synk.get_value(rank, w), per_rank.max(axis=0), rtol=1e-5)
    print("reduce, set_value, all_reduce")

    # broadcast: rank 0's value (or a new one) to every rank.
    synk.broadcast(w, np.arange(3, dtype=x.dtype))
    np.testing.assert_array_equal(synk.gather(w, nd_up=1), np.tile(np.arange(3), (n_ranks, 1)))
    # set_value again: now the ranks differ.
    synk.set_value(n_ranks - 1, w, np.full(3, 7, dtype=x.dtype))
    np.testing.assert_array_equal(synk.get_value(n_ranks - 1, w), np.full(3, 7))
    for rank in range(n_ranks - 1):
        np.testing.assert_array_equal(synk.get_value(rank, w), np.arange(3))
    print("broadcast")

    # scatter: split along axis 0, uneven splits allowed; lengths and shapes then differ.
    rows = np.arange(5 * 3, dtype=x.dtype).reshape(5, 3)
    synk.scatter(v, rows)
    sizes = [len(p) for p in np.array_split(rows, n_ranks)]
    np.testing.assert_array_equal(synk.get_lengths(v), sizes)
    assert synk.get_shapes(v) == [(n, 3) for n in sizes]
    np.testing.assert_array_equal(synk.gather(v, nd_up=0), rows)
    assert sum(total_v()) == rows.sum()  # "per_rank": one sum per rank, from its own rows
    # all_gather: every rank gets the concatenation.
    synk.all_gather(v)
    for rank in range(n_ranks):
        np.testing.assert_array_equal(synk.get_value(rank, v), rows)
    # Several variables at once: one call, one result per variable.
    w_all, v_all = synk.gather([w, v], nd_up=1)
    assert w_all.shape == (n_ranks, 3) and v_all.shape == (n_ranks, 5, 3)
    print("scatter, get_lengths, get_shapes, all_gather")


if __name__ == "__main__":
    run(main, __doc__)
