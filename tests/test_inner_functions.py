"""Inner functions compiled while a rank waits (:mod:`synkhronos.rank.inner_functions`)."""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
import pytest
from pytensor.compile.builders import OpFromGraph
from pytensor.tensor.special import log_softmax, softmax

from synkhronos.rank import inner_functions, rewritten_graphs


def test_each_inner_function_is_compiled_and_called_once_per_op_and_types(monkeypatch):
    x, v = pt.matrix("x"), pt.vector("v")
    a, b = softmax(x, axis=1), log_softmax(x, axis=1)
    calls = []
    real = OpFromGraph.fn

    def counted(self):
        calls.append(self)
        return real.fget(self)

    monkeypatch.setattr(OpFromGraph, "fn", property(counted))
    assert inner_functions.compile_inner_functions([a, a * 2, b, (v**2).sum()]) == 2
    assert len(calls) == 2 and {id(op) for op in calls} == {id(a.owner.op), id(b.owner.op)}
    got = a.owner.op._fn(np.zeros((1, 1)))  # compiled, and callable as perform calls it
    np.testing.assert_array_equal(got[0], [[1.0]])


def test_a_graph_without_them_compiles_nothing():
    x = pt.matrix("x")
    assert inner_functions.compile_inner_functions([pt.exp(x).sum()]) == 0


@pytest.mark.parametrize(
    ("mode", "share", "ahead"),
    [("CVM", (1, 2), True), ("CVM", (0, 2), False), ("NUMBA", (1, 2), False)],
)
def test_a_worker_that_waits_compiles_them_first_in_an_op_by_op_mode(
    mode, share, ahead, tmp_path, monkeypatch
):
    monkeypatch.setattr(rewritten_graphs, "folder", lambda: tmp_path)
    seen = []
    monkeypatch.setattr(rewritten_graphs, "compile_inner_functions", seen.append)
    x = pt.matrix("x")
    y = softmax(x, axis=1)
    key = rewritten_graphs.graph_key([x, y], ("inner", mode, share))
    fn = rewritten_graphs.compile_function([x], [y], mode, "f", key, share=share)
    assert bool(seen) == ahead
    value = np.array([[0.0, np.log(3.0)]])
    np.testing.assert_allclose(fn(value)[0], [[0.25, 0.75]])
