"""Training functions that the split once left to each rank, on 2 ranks with uneven rows,
against ``pytensor.function`` in one process.

A small U-Net's one-line training function (issue #48).

Convolutions, a pooling, a strided transposed convolution and a concatenation, with a
per-pixel loss whose targets' channel axis only the targets know: the reduced phase's
mean divides by their lengths, which cross the all-reduce with the frontier (with batch
normalization, the first round keeps them for the last). An embedding read by integer
indices alone: its update depends on the rows of the indices.
"""

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.tensor.math import Min

import synkhronos as synk
from synkhronos.api.training import TrainingFunction
from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne.updates import adam
from tests.test_split import MINIMA, NAMED_COUNTS, OVER_THE_BATCH, clip_loss

ROWS = 9  # 2 ranks: 5/4
MODE = "FAST_COMPILE"


def unet(input_var, batch_norm):
    net = L.InputLayer((None, 1, 8, 8), input_var)
    down = L.Conv2DLayer(net, 2, 3, pad="same")
    if batch_norm:
        down = L.batch_norm(down)
    net = L.MaxPool2DLayer(down, 2)
    net = L.Conv2DLayer(net, 4, 3, pad="same")
    net = L.TransposedConv2DLayer(net, 2, 2, stride=2)
    net = L.ConcatLayer([net, down], axis=1)
    return L.Conv2DLayer(net, 1, 1, nonlinearity=lasagne.nonlinearities.sigmoid)


@pytest.mark.parametrize("batch_norm", [False, True])
def test_unet_trains_as_one_device(ranks, batch_norm):
    lasagne.random.set_rng(np.random.RandomState(5))
    x, t = pt.tensor4("x"), pt.tensor4("t")
    network = unet(x, batch_norm)
    loss = lasagne.objectives.binary_crossentropy(L.get_output(network), t).mean()
    params = L.get_all_params(network, trainable=True)
    updates = adam(loss, params, learning_rate=0.01)
    # Batch normalization's running averages: the reduced phase updates them too.
    running = [
        v
        for v in pytensor.graph.traversal.graph_inputs([loss])
        if getattr(v, "default_update", None) is not None
    ]
    variables = list(updates) + running
    start = [v.get_value() for v in variables]
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(ROWS, 1, 8, 8)).astype(pytensor.config.floatX)
    ts = (rng.random((ROWS, 1, 8, 8)) > 0.5).astype(pytensor.config.floatX)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_fn = synk.function([x, t], loss, updates=updates, mode=MODE)
    said = [str(w.message) for w in caught if "synkhronos" in str(w.message)]
    assert not said, said  # exact: nothing said
    assert isinstance(train_fn, TrainingFunction)
    assert bool(train_fn.round_functions) == batch_norm
    losses = [train_fn(xs, ts) for _ in range(3)]
    synk.verify()
    trained = [v.get_value() for v in variables]
    for v, value in zip(variables, start, strict=True):
        v.set_value(value)
    ref_fn = pytensor.function([x, t], loss, updates=updates, mode=MODE)
    ref_losses = [ref_fn(xs, ts) for _ in range(3)]
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for var, got, want in zip(variables, trained, [v.get_value() for v in variables], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(var))
    synk.broadcast(variables)  # rank 0 holds the reference's values: every rank takes them


def test_embedding_with_integer_inputs_only(ranks):
    rng = np.random.default_rng(4)
    idx = pt.ivector("idx")
    W = pytensor.shared(rng.normal(size=(10, 4)).astype(pytensor.config.floatX), name="W")
    loss = pt.mean(W[idx].sum(axis=1) ** 2)
    updates = [(W, W - 0.1 * pt.grad(loss, W))]
    start = W.get_value()
    train_fn = synk.function([idx], loss, updates=updates, mode=MODE)
    assert isinstance(train_fn, TrainingFunction)
    rows = rng.integers(0, 10, ROWS).astype("int32")
    losses = [train_fn(rows) for _ in range(3)]
    synk.verify()
    trained = W.get_value()
    W.set_value(start)
    ref_fn = pytensor.function([idx], loss, updates=updates, mode=MODE)
    np.testing.assert_allclose(losses, [ref_fn(rows) for _ in range(3)], rtol=1e-5)
    np.testing.assert_allclose(trained, W.get_value(), rtol=1e-5, atol=1e-6)
    synk.broadcast([W])


def _trained(loss_of, said=None):
    """A regression's loss and weights after 3 steps on 2 ranks, against one process;
    the words the function was built with (``said``: a pattern they must match, else
    none)."""
    rng = np.random.default_rng(9)
    floatx = pytensor.config.floatX
    x, y = pt.matrix("x", dtype=floatx), pt.vector("y", dtype=floatx)
    w = pytensor.shared(rng.normal(size=3).astype(floatx), name="w")
    loss = loss_of(x, y, w)
    updates = [(w, w - 0.1 * pt.grad(loss, w))]
    xs, ys = rng.normal(size=(ROWS, 3)).astype(floatx), rng.normal(size=ROWS).astype(floatx)
    start = w.get_value()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_fn = synk.function([x, y], loss, updates=updates, mode=MODE)
    words = [
        str(c.message) for c in caught if "synkhronos" in str(c.message) or "rank" in str(c.message)
    ]
    losses = [train_fn(xs, ys) for _ in range(3)]
    synk.verify()
    trained = w.get_value()
    w.set_value(start)
    ref_fn = pytensor.function([x, y], loss, updates=updates, mode=MODE)
    ref_losses = [ref_fn(xs, ys) for _ in range(3)]
    synk.broadcast([w])  # back to rank 0's values on every rank
    return words, losses, ref_losses, trained, w.get_value()


@pytest.mark.parametrize("loss_of", NAMED_COUNTS.values(), ids=NAMED_COUNTS.keys())
def test_row_count_named_by_the_loss(ranks, loss_of):
    words, losses, ref_losses, trained, ref_trained = _trained(loss_of)
    assert not words, words
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-9)
    np.testing.assert_allclose(trained, ref_trained, rtol=1e-9)


@pytest.mark.parametrize("loss_of", OVER_THE_BATCH.values(), ids=OVER_THE_BATCH.keys())
def test_softmax_over_the_batch(ranks, loss_of):
    """A listwise loss normalizes over the batch: its maximum over the rows all-reduced
    with "max", its sum with "sum", in rounds."""
    words, losses, ref_losses, trained, ref_trained = _trained(loss_of)
    assert not words, words
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-9)
    np.testing.assert_allclose(trained, ref_trained, rtol=1e-9)


@pytest.mark.parametrize("loss_of", MINIMA.values(), ids=MINIMA.keys())
def test_min_over_the_batch(ranks, loss_of):
    """A minimum over the rows that the rows read back: all-reduced with "min" (the Min
    op's) or "max" (PyTensor's min, a negated maximum), in rounds."""
    words, losses, ref_losses, trained, ref_trained = _trained(loss_of)
    assert not words, words
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-9)
    np.testing.assert_allclose(trained, ref_trained, rtol=1e-9)


def extrema_step(floatx: str) -> tuple:
    """(inputs, outputs, updates, data): a step scaled by the spread of the batch's
    gradient contributions (a maximum and a minimum over the rows that only the update
    reads), with outputs ``x.max()`` and ``Min(y)``."""
    rng = np.random.default_rng(12)
    x, y = pt.matrix("x", dtype=floatx), pt.vector("y", dtype=floatx)
    w = pytensor.shared(rng.normal(size=3).astype(floatx), name="w")
    error = pt.dot(x, w) - y
    loss = pt.mean(error**2)
    contributions = x * error[:, None]
    spread = pt.max(pt.abs(contributions)) - Min(axis=None)(contributions)
    updates = [(w, w - 0.1 * pt.grad(loss, w) / spread)]
    data = [rng.normal(size=(ROWS, 3)).astype(floatx), rng.normal(size=ROWS).astype(floatx)]
    return [x, y], [loss, x.max(), Min(axis=None)(y)], updates, data


def assert_extrema_step_exact(mode, rtol: float, num_slices: int = 1) -> None:
    """:func:`extrema_step` for 3 steps on the ranks against one process: a training
    function that says nothing, the ranks identical."""
    inputs, outputs, updates, data = extrema_step(pytensor.config.floatX)
    w = updates[0][0]
    start = w.get_value()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train_fn = synk.function(inputs, outputs, updates=updates, mode=mode)
    assert isinstance(train_fn, TrainingFunction)
    got = [train_fn(*data, num_slices=num_slices) for _ in range(3)]
    synk.verify()
    trained = np.asarray(w.get_value())
    w.set_value(start)
    ref_fn = pytensor.function(inputs, outputs, updates=updates, mode=mode)
    want = [ref_fn(*data) for _ in range(3)]
    synk.broadcast([w])
    np.testing.assert_allclose(np.array(got, float), np.array(want, float), rtol=rtol)
    np.testing.assert_allclose(trained, w.get_value(), rtol=rtol)


@pytest.mark.parametrize("num_slices", [1, 2])
def test_extrema_only_the_update_and_outputs_read(ranks, num_slices):
    """Maxima and minima over the rows that only the update or an output reads
    (:func:`extrema_step`): each crosses to the reduced phase by an all-reduce with
    "max" or "min" (and combines slices with it), exact on 5/4 rows in float64 (was
    warned "not a sum")."""
    assert pytensor.config.floatX == "float64"
    assert_extrema_step_exact(MODE, rtol=1e-9, num_slices=num_slices)


def test_contrastive_loss_is_said(ranks):
    """Every row scored against every row (z1 @ z2.T): each rank pairs its own rows, as
    the warning says (the ranks stay identical, and differ from one device)."""
    words, losses, ref_losses, _, _ = _trained(clip_loss)
    assert len(words) == 1 and "not as one device would" in words[0], words
    assert "matrix product (Dot) of two values of the rows" in words[0]
    assert not np.allclose(losses, ref_losses, rtol=1e-9)
