"""The rounds' plan (synkhronos.api.split.rounds), in one process: how many rounds batch
normalization takes, the statistics' factors taken out of their sums, and the names a
message gives a statistic; each split evaluated on two uneven parts of a batch against
the one-process function (tests/test_split.py's ``assert_one_process``)."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.api.split.analysis import RowGraph
from synkhronos.api.split.phases import split_phases
from synkhronos.api.split.rounds import _depths, factored_sums, read_with, statistics_read
from synkhronos.api.training import _all_reduces
from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne import layers as L
from synkhronos.transport.channel import MAX_ARRAYS
from tests.test_split import FLOAT, MODE, ROWS, assert_one_process


def batch_norm_mlp(layers: int, seed: int = 0):
    """Dense layers with batch normalization, a softmax on top: sources, outputs, updates
    (SGD's, then the running averages'), arrays."""
    lasagne.random.set_rng(np.random.RandomState(seed))
    x, t = pt.matrix("x", dtype=FLOAT), pt.ivector("t")
    net = L.InputLayer((None, 4), x)
    for k in range(layers):
        net = L.batch_norm(L.DenseLayer(net, 3, name=f"dense{k}"))
    net = L.DenseLayer(net, 2, nonlinearity=lasagne.nonlinearities.softmax)
    loss = lasagne.objectives.categorical_crossentropy(L.get_output(net), t).mean()
    params = L.get_all_params(net, trainable=True)
    updates = [(p, p - 0.1 * g) for p, g in zip(params, pt.grad(loss, params), strict=True)]
    running = [
        (v, v.default_update)
        for v in pytensor.graph.traversal.graph_inputs([loss])
        if getattr(v, "default_update", None) is not None
    ]
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=(ROWS, 4)).astype(FLOAT), rng.integers(0, 2, ROWS).astype("int32")]
    return [x, t], [loss], updates + running, arrays


@pytest.mark.parametrize("layers", [1, 3])
def test_batch_norm_takes_three_rounds_a_layer(layers):
    """The mean, the variance, the gradient's two sums in one round (the mean's gradient
    reads the variance's only as a factor, taken out of its sum): 3 rounds a layer, not 4;
    and the result is one device's."""
    sources, outputs, updates, arrays = batch_norm_mlp(layers)
    split = split_phases_of(sources, outputs, updates, layers)
    assert not split.inexact, split.inexact
    assert len(split.rounds) == 3 * layers
    assert_one_process(sources, outputs, updates, arrays, split)


def split_phases_of(sources, outputs, updates, layers):
    """The split, with the parameters' updates deciding (the running averages follow)."""
    deciding = len(updates) - 2 * layers  # each layer's running mean and inv_std
    return split_phases(sources, outputs, [True] * len(outputs), updates, True, True, deciding)


def centred_sum(scale_of):
    """``sum(scale * (x - mean))`` over the rows, with ``scale`` a statistic: the graph
    analysed, and the loss."""
    rng = np.random.default_rng(4)
    x = pt.matrix("x", dtype=FLOAT)
    w = pytensor.shared(rng.normal(size=(3, 2)).astype(FLOAT), name="w")
    h = pt.dot(x, w)
    mean = h.mean(axis=0)
    scale = scale_of(h, mean)
    total = (scale * (h - mean)).sum(axis=0)
    loss = ((h - total) ** 2).mean()
    return x, w, loss


def test_a_factor_constant_over_the_rows_leaves_the_sum():
    """``sum(var * (x - mean))`` waits for the variance (round 2); ``var * sum(x - mean)``'s
    sum waits only for the mean (round 1); the same value."""
    x, _, loss = centred_sum(lambda h, mean: ((h - mean) ** 2).mean(axis=0))
    graph = RowGraph([loss], [x])
    assert latest_statistic(graph) == 2
    rewritten = factored_sums(graph)
    assert rewritten is not None
    assert latest_statistic(RowGraph(rewritten, [x])) == 1
    arrays = np.random.default_rng(5).normal(size=(ROWS, 3)).astype(FLOAT)
    want = pytensor.function([x], loss, mode=MODE)(arrays)
    got = pytensor.function([x], rewritten[0], mode=MODE)(arrays)
    np.testing.assert_allclose(got, want, rtol=1e-10 if FLOAT == "float64" else 1e-5)


def latest_statistic(graph):
    """The most statistics one statistic waits for, one after another."""
    sums, _ = statistics_read(graph, [n for n in graph.nodes if graph.row_phase(n)])
    depth, _ = _depths(graph, sums)
    return max(depth[v] for v in sums)


def test_a_factor_of_the_rows_stays_in_the_sum():
    """A factor with the rows' length (or none of the rows' data) is no statistic's."""
    x, _, loss = centred_sum(lambda h, mean: h)
    assert factored_sums(RowGraph([loss], [x])) is None
    x, _, loss = centred_sum(lambda h, mean: pt.constant(2.0, dtype=FLOAT))
    assert factored_sums(RowGraph([loss], [x])) is None


def test_a_factor_varying_along_a_summed_axis_stays():
    """``sum(g * y, axes=(0, 1))`` with ``g`` varying along axis 1: not a factor."""
    rng = np.random.default_rng(6)
    x = pt.matrix("x", dtype=FLOAT)
    w = pytensor.shared(rng.normal(size=(3, 2)).astype(FLOAT), name="w")
    h = pt.dot(x, w)
    g = h.mean(axis=0, keepdims=True)  # (1, 2): along axis 1, not constant
    loss = ((h - (g * h).sum()) ** 2).mean()
    assert factored_sums(RowGraph([loss], [x])) is None


def test_a_statistic_is_named_by_its_layer():
    """A batch normalization's mean is read with its layer's named shared variables."""
    sources, outputs, updates, _ = batch_norm_mlp(1)
    graph = RowGraph(outputs + [u for _, u in updates], sources)
    sums, _ = statistics_read(graph, [n for n in graph.nodes if graph.row_phase(n)])
    names = {read_with(graph, v) for v in sums}
    assert names and all(n.startswith("dense0") for n in names), names


def test_all_reduces_carry_at_most_a_message_each():
    """ResNet-110's 659 frontier variables: two all-reduces, each within one message."""
    held = [(pytensor.shared(np.zeros(1), name=f"v{k}"), None) for k in range(659)]
    entries = _all_reduces(held, ["sum"] * 658 + ["max"])
    assert [(kind, len(v), op) for kind, v, op in entries] == [
        ("all_reduce", MAX_ARRAYS, "sum"),
        ("all_reduce", 658 - MAX_ARRAYS, "sum"),
        ("all_reduce", 1, "max"),
    ]
    assert [v for _, chosen, _ in entries for v in chosen] == [v for v, _ in held]
