"""The split's analysis of small graphs: which values are data, rows, counts; which ops
sum over rows (nothing compiled, nothing forked)."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor import scalar as ps
from pytensor.tensor.elemwise import CAReduce

from synkhronos.api.split.analysis import (
    Fact,
    RowGraph,
    extremum,
    index_positions,
    structural,
    sums_rows,
)


@pytest.fixture
def graph():
    x, y = pt.matrix("x"), pt.ivector("y")
    W = pytensor.shared(np.ones((3, 4)), name="W")
    v = {"x": x, "y": y, "W": W}
    v["h"] = pt.dot(x, W)
    v["loss"] = v["h"].sum()
    v["n"] = x.shape[0]
    v["mean"] = v["loss"] / v["n"]
    v["weights_only"] = (W * 2).sum()
    v["emb"] = W[y]
    v["centre"] = x.mean(0)
    v["centred"] = x - v["centre"]
    v["largest"] = x.max(0)
    targets = ["mean", "weights_only", "emb", "centred", "largest"]
    return RowGraph([v[t] for t in targets], [x, y]), v


@pytest.mark.parametrize(
    "name, has, lacks",
    [
        ("h", Fact.ROW | Fact.DATA | Fact.FEEDS_ROWS, Fact.PURE),
        ("loss", Fact.DATA, Fact.ROW | Fact.FEEDS_ROWS),
        ("n", Fact.PURE | Fact.COUNT, Fact.DATA),
        ("mean", Fact.DATA, Fact.ROW | Fact.COUNT),
        ("weights_only", Fact.NONE, Fact.DATA | Fact.ROW),
        ("emb", Fact.ROW | Fact.DATA, Fact.PURE),  # W's rows picked by y's rows
        ("centre", Fact.DATA | Fact.FEEDS_ROWS, Fact.ROW),  # the rows read it
        ("largest", Fact.DATA, Fact.ROW | Fact.FEEDS_ROWS),
    ],
)
def test_facts(graph, name, has, lacks):
    rows, v = graph
    for fact in Fact:
        if fact in has and fact is not Fact.NONE:
            assert rows.of_original(v[name], fact), (name, fact)
        if fact in lacks and fact is not Fact.NONE:
            assert not rows.of_original(v[name], fact), (name, fact)


def test_analysed_copy_maps_back_and_names(graph):
    rows, v = graph
    clone = rows.clone_of[v["h"]]
    assert clone is not v["h"] and rows.original[clone] is v["h"]
    assert rows.label(rows.clone_of[v["W"]]) == "'W'"
    assert rows.row_axes_of(v["x"].T) == []  # not analysed: no axes
    assert rows.row_axes_of(v["emb"]) == [0]
    order = rows.nodes_outputs()
    assert order.index(clone) < order.index(rows.clone_of[v["loss"]])
    # the rows' phase: nodes reading rows or read by them; not those of W alone
    assert rows.row_phase(clone.owner)
    assert not rows.row_phase(rows.clone_of[v["weights_only"]].owner)


def test_op_kinds():
    x, y = pt.matrix("x"), pt.ivector("y")
    assert sums_rows(pt.dot(x, x.T).owner) and sums_rows(x.sum(0).owner)
    assert sums_rows(pt.inc_subtensor(x[y], 1.0).owner)
    assert not sums_rows(x.max(0).owner) and not sums_rows(x.prod(0).owner)
    assert (
        extremum(x.max(0).owner) == "max"
        and extremum(CAReduce(ps.minimum, axis=1)(x).owner) == "min"
    )
    assert extremum(x.sum(0).owner) is None and extremum(None) is None
    assert index_positions(x[y].owner) == {1}
    assert index_positions(pt.set_subtensor(x[y], 0.0).owner) == {2}
    assert index_positions(pt.exp(x).owner) == set()
    assert structural(pt.alloc(0.0, x.shape[0], 3).owner) == {1, 2}
    assert structural(pt.arange(x.shape[0]).owner) == {0, 1, 2}
    assert structural(pt.second(x, 1.0).owner) == {0}
    assert structural(x.reshape((-1,)).owner) == {1}
