"""The split's allowlist on small graphs: ops that keep the rows apart say nothing, ops
that mix them are named once, and indices numbering the whole batch's rows are refused
(nothing compiled, nothing forked)."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.api.split.analysis import RowGraph
from synkhronos.api.split.keeping import indexed_past_rows, mixes_rows, mixing_said


def _graph(build):
    x, perm = pt.matrix("x"), pt.ivector("perm")
    W = pytensor.shared(np.ones((3, 4)), name="W")
    out = build(x, perm, W)
    graph = RowGraph([out], [x, perm])
    return graph, graph.clone_of[out].owner


@pytest.mark.parametrize(
    "build",
    [
        lambda x, perm, W: pt.exp(x) * 2,
        lambda x, perm, W: pt.dot(x, W),
        lambda x, perm, W: pt.special.softmax(x, axis=-1),
        lambda x, perm, W: pt.cumsum(x, axis=1),
        lambda x, perm, W: x[:, 1:],
        lambda x, perm, W: x.T,
        lambda x, perm, W: x.sum(0),  # a reduction over the rows: judged elsewhere
    ],
    ids=["elemwise", "dot", "softmax_within", "cumsum_within", "columns", "transpose", "sum"],
)
def test_ops_keeping_rows_apart_say_nothing(build):
    graph, node = _graph(build)
    assert mixes_rows(graph, node) is None
    assert mixing_said(graph, graph.nodes) == []


@pytest.mark.parametrize(
    "build, named",
    [
        (lambda x, perm, W: pt.special.softmax(x, axis=0), "softmax"),
        (lambda x, perm, W: pt.cumsum(x, axis=0), "cumulative"),
        (lambda x, perm, W: pt.sort(x, axis=0), "sort"),
        (lambda x, perm, W: x[::-1], "Subtensor"),
    ],
    ids=["softmax_rows", "cumsum_rows", "sort_rows", "reversed"],
)
def test_ops_mixing_rows_are_named(build, named):
    graph, node = _graph(build)
    why = mixes_rows(graph, node)
    assert why is not None and named in why and "axis 0 (the rows)" in why


def test_a_mixing_is_said_once_not_again_downstream():
    graph, _ = _graph(lambda x, perm, W: pt.exp(pt.cumsum(x, axis=0))[::-1] + x)
    said = mixing_said(graph, graph.nodes)
    assert len(said) == 1 and "cumulative" in said[0]


def test_indices_of_the_whole_batch_are_named_own_positions_are_not():
    graph, node = _graph(lambda x, perm, W: x[perm])
    (why,) = indexed_past_rows(graph, [node])
    assert "'perm'" in why and "axis 0 (the rows)" in why
    graph, node = _graph(lambda x, perm, W: x[pt.argsort(x[:, 0])])
    assert indexed_past_rows(graph, [node]) == []  # a rank's own positions
    graph, node = _graph(lambda x, perm, W: W[perm])  # perm's rows pick W's rows
    assert indexed_past_rows(graph, [node]) == []
