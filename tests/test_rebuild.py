"""The phases' graphs rebuilt for a rank's rows: summed over uneven shares of 11 rows
they give the plain function's result (nothing forked)."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.api.split.analysis import RowGraph
from synkhronos.api.split.rebuild import Substitution, drawn_whole, lengths_read, with_lengths

ROWS = 11
# Python's implementations: nothing to compile, the same results in both graphs compared
MODE = "FAST_COMPILE"


@pytest.mark.parametrize("k", [2, 3])
def test_a_mean_over_the_rows_divides_by_the_whole_count(rng, k):
    x, y = pt.matrix("x"), pt.vector("y")
    W = pytensor.shared(rng.standard_normal(3))
    loss = ((pt.dot(x, W) - y) ** 2).sum() / x.shape[0]
    whole = pt.lscalar("whole")
    (share,) = Substitution(RowGraph([loss], [x, y]), whole).rebuild_all([loss])
    on_share = pytensor.function([x, y, whole], share, mode=MODE)
    X, Y = rng.standard_normal((ROWS, 3)), rng.standard_normal(ROWS)
    expected = np.mean((X @ W.get_value() - Y) ** 2)
    parts = np.array_split(np.arange(ROWS), k)
    assert len({len(p) for p in parts}) == 2  # uneven shares
    total = sum(on_share(X[p], Y[p], ROWS) for p in parts)
    np.testing.assert_allclose(total, expected, rtol=1e-12)


def test_without_counts_a_rank_keeps_its_own_count(rng):
    x = pt.matrix("x")
    mean = x.sum() / x.shape[0]
    whole = pt.lscalar("whole")
    share = Substitution(RowGraph([mean], [x]), whole, counts=False).rebuild(mean)
    X = rng.standard_normal((4, 2))
    np.testing.assert_allclose(pytensor.function([x], share, mode=MODE)(X), X.sum() / 4)


def test_random_draws_per_row_drawn_whole_and_the_ranks_rows_taken(rng):
    x = pt.matrix("x")
    generator = pytensor.shared(np.random.default_rng(5))
    noisy = x + pt.random.normal(0, 1, size=x.shape, rng=generator)
    graph = RowGraph([noisy], [x])
    assert drawn_whole(graph, graph.clone_of[noisy].owner.inputs[1].owner)
    whole, positions = pt.lscalar("whole"), pt.lvector("positions")
    substitution = Substitution(graph, whole, positions=positions)
    share = substitution.rebuild(noisy)
    assert list(substitution.generators) == [generator]
    X = rng.standard_normal((ROWS, 3))
    plain = pytensor.function([x], noisy, mode=MODE)(X)
    on_share = pytensor.function([x, whole, positions], share, mode=MODE)
    for p in np.array_split(np.arange(ROWS), 3):
        np.testing.assert_array_equal(on_share(X[p], ROWS, p), plain[p])


def test_draws_whose_parameters_vary_by_row_are_not_drawn_whole():
    x = pt.matrix("x")
    draw = pt.random.normal(x, 1.0, rng=pytensor.shared(np.random.default_rng(1)))
    graph = RowGraph([draw], [x])
    assert not drawn_whole(graph, graph.clone_of[draw].owner)


def test_lengths_read_and_replaced():
    x, y = pt.matrix("x"), pt.vector("y")
    assert lengths_read([x.shape[0] * 2.0 + y.sum()], [x, y]) == [x]
    assert lengths_read([x.sum()], [x]) == []
    (size,) = with_lengths([x.shape[0] * 2.0 + x.shape[1]], x, pt.as_tensor([22, 3]))
    assert pytensor.function([], size, mode=MODE)() == 47.0
