"""Which axes have the rows' length, read from PyTensor's shape inference."""

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.tensor.shape import Shape_i

from synkhronos.api.split.analysis import RowGraph
from synkhronos.api.split.lengths import Tracks, is_shape


class _Twice(Op):
    """An op shape inference knows nothing of (no ``infer_shape``)."""

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = inputs[0] * 2


def _axes(targets, sources):
    rows = RowGraph(targets, sources)
    return [rows.row_axes_of(t) for t in targets], rows


def test_row_axes_through_common_ops():
    x = pt.matrix("x")
    W = pytensor.shared(np.ones((3, 4)))
    cases = {
        "dot": (pt.dot(x, W), [0]),
        "transpose": (x.T, [1]),
        "expand": (pt.expand_dims(x, 0), [1]),
        "flatten": (x.reshape((-1,)), [0]),
        "swap": (x.reshape((x.shape[1], x.shape[0])), [1]),
        "sum over rows": (x.sum(0), []),
        "sum within rows": (x.sum(1), [0]),
        "outer": (pt.outer(x[:, 0], pt.ones(5)), [0]),
        "weights": (W * 2, []),
        "unknown op": (_Twice()(x), [0]),
    }
    found, _ = _axes([v for v, _ in cases.values()], [x])
    assert dict(zip(cases, found, strict=True)) == {k: axes for k, (_, axes) in cases.items()}


def test_a_length_that_only_involves_the_count_does_not_track_it():
    x = pt.matrix("x")
    three = pt.alloc(0.0, (x.shape[0] * 3) // x.shape[0], 2)  # n * 3 / n rows
    n_rows = pt.alloc(0.0, x.shape[0] * 1, 2)
    (a, b), rows = _axes([three, n_rows], [x])
    assert a == b == []  # computed from shapes alone: no rank's rows in them
    lengths = rows.lengths
    assert lengths.row_axes(rows.clone_of[three]) == []
    assert lengths.row_axes(rows.clone_of[n_rows]) == [0]


def test_tracks_and_is_shape():
    x = pt.matrix("x")
    W = pytensor.shared(np.ones((3, 4)))
    _, rows = _axes([pt.dot(x, W)], [x])
    cx, cw = rows.clone_of[x], rows.clone_of[W]
    assert rows.lengths.tracks(cx.shape[0] * 2) == Tracks.ROW
    assert rows.lengths.tracks(cx.shape[1] + 1) == Tracks.NO
    assert rows.lengths.tracks(cw.shape[0]) == Tracks.NO
    assert rows.lengths.has_row_axis(cx) and not rows.lengths.has_row_axis(cw)
    assert is_shape(x.shape) and is_shape(Shape_i(1)(x)) and not is_shape(x)
