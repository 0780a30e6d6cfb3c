"""``batch_s``: selecting rows of sliceable shared variables on each rank.

The paper's second data layout keeps the dataset inside shared variables, each
rank holding its own part (on a GPU rank: in device memory), and a call picks
rows of each rank's part with ``batch_s``. Run:
``python demos/basics_batch_s.py --ranks 2``.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
from basics_runner import run

import synkhronos as synk


def main(n_ranks: int) -> None:
    x_s = pytensor.shared(np.zeros((0, 4), dtype=pytensor.config.floatX), name="x_s")
    scale = pt.scalar("scale", dtype=x_s.dtype)
    outputs = [((x_s * scale).mean(axis=0), "avg"), ((x_s * scale).sum(axis=0), "sum")]
    f = synk.function(
        bcast_inputs=[scale],
        outputs=outputs + [(x_s, "gather")],  # which rows each rank used, in rank order
        sliceable_shareds=[x_s],  # rows of x_s are selected per call
    )
    synk.distribute()

    # The reference: the same graph in one process, on the rows the ranks selected.
    rows = pt.matrix("rows", dtype=x_s.dtype)
    reference = pytensor.function([rows, scale], [o for o, _ in outputs], givens={x_s: rows})

    def check(result: list, expected_rows: np.ndarray) -> None:
        mean, total, used = result
        np.testing.assert_array_equal(used, expected_rows)
        want_mean, want_total = reference(expected_rows, 0.5)
        np.testing.assert_allclose(mean, want_mean, rtol=1e-5)
        np.testing.assert_allclose(total, want_total, rtol=1e-5)

    # Put the dataset into the ranks' x_s: 23 rows split 12/11 on 2 ranks.
    data = np.arange(23 * 4, dtype=x_s.dtype).reshape(23, 4)
    synk.scatter(x_s, data)
    parts = np.array_split(data, n_ranks)
    np.testing.assert_array_equal(synk.get_lengths(x_s), [len(p) for p in parts])

    check(f(0.5), data)  # no batch_s: every rank uses all its rows
    check(f(0.5, batch_s=slice(2, 6)), np.concatenate([p[2:6] for p in parts]))
    index = [5, 0, 3]  # one selection, applied on every rank to its own part
    check(f(0.5, batch_s=index), np.concatenate([p[index] for p in parts]))
    print("batch_s: one slice or index list for every rank")

    # One selection per rank, e.g. each rank's next chunk of its own permutation.
    rng = np.random.default_rng(0)
    per_rank = [rng.permutation(len(p))[:4] for p in parts]
    expected = np.concatenate([p[i] for p, i in zip(parts, per_rank, strict=True)])
    check(f(0.5, batch_s=per_rank), expected)
    per_rank = [slice(r, r + 3) for r in range(n_ranks)]
    expected = np.concatenate([p[s] for p, s in zip(parts, per_rank, strict=True)])
    check(f(0.5, batch_s=per_rank), expected)
    print("batch_s: a list with one selection per rank")


if __name__ == "__main__":
    run(main, __doc__)
