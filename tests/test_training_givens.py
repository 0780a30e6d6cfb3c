"""A training function whose rows reach its graph only through ``givens`` trains as one
device does.

``givens={x: x_in}`` with ``x_in`` an input, or ``givens={x: x_all}`` with ``x_all`` a
sliceable shared variable (the paper's GPU-data pattern): the split must analyse the
graph the givens make, or it sees no rows and every rank applies its own update. A mean
loss with SGD and Adam, per-row outputs, a softmax over the rows and batch normalization's
running averages, on 2 and 3 CPU ranks (and 2 GPU ranks on CPU devices) with 27 rows,
against ``pytensor.function`` with the same givens after 3 steps; every rank's state equal.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.api.training import TrainingFunction
from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne import layers as L
from tests import test_training_outputs as training_outputs
from tests.test_training_outputs import _mode

session = training_outputs.session  # its fixture: 2, 3 CPU ranks and 2 GPU ranks

ROWS = 27  # 2 ranks: 14/13, 3 ranks: 9/9/9 (and 13 rows: 5/4/4)
STEPS = 3
# A split that cannot be exact warns: here every one must be.
pytestmark = [
    pytest.mark.filterwarnings("error:.*not as one device would:UserWarning"),
    pytest.mark.filterwarnings("error:.*could not be made exact:UserWarning"),
]


def _data(rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, 4)).astype(pytensor.config.floatX)
    return X, rng.integers(0, 3, rows).astype("int32")


def _classifier(batch_norm=False):
    """(x, y, prediction, per-row loss, trainable params, running averages)."""
    x, y, net, norm = training_outputs.classifier(batch_norm)
    prediction = L.get_output(net)
    ce = lasagne.objectives.categorical_crossentropy(prediction, y)
    averages = [norm.mean, norm.inv_std] if norm else []
    return x, y, prediction, ce, L.get_all_params(net, trainable=True), averages


def _same_as_one_device(session, train, reference, args, state, running=()):
    """``train``'s outputs and ``state`` after each of STEPS calls equal ``reference``'s
    (a ``pytensor.function`` with the same givens, run on rank 0 from the same start);
    every rank holds the same ``state``, and the same running averages (each rank's)."""
    n, tol = session
    start = [v.get_value() for v in [*state, *running]]
    got = [train(*args) for _ in range(STEPS)]
    synk.verify()
    per_rank = [[synk.get_value(r, v) for r in range(n)] for v in running]
    after = [v.get_value() for v in state]
    for v, value in zip([*state, *running], start, strict=True):
        v.set_value(value)  # on rank 0 only: the reference runs there
    for step in range(STEPS):
        want = reference(*args)
        for k, (g, w) in enumerate(zip(got[step], want, strict=True)):
            assert np.shape(g) == np.shape(w), (step, k)
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"step {step} out {k}")
    for v, value in zip(state, after, strict=True):
        np.testing.assert_allclose(value, v.get_value(), rtol=tol, atol=tol, err_msg=str(v))
    for values, v in zip(per_rank, running, strict=True):
        for r in range(n):
            assert np.array_equal(values[r], values[0]), (v, r)
        np.testing.assert_allclose(values[0], v.get_value(), rtol=tol, atol=tol)
    synk.broadcast([*state, *running])  # every rank takes the reference's values


def test_rows_given_by_inputs_train_as_one_device(session):
    """``givens={x: x_in, y: y_in}``: the loss's mean, the per-row losses and predicted
    classes whole, the loss's sum, and SGD's parameters."""
    x, y, prediction, ce, params, _ = _classifier()
    x_in, y_in = pt.matrix("x_in"), pt.ivector("y_in")
    outputs = [ce.mean(), ce, pt.argmax(prediction, axis=1), ce.sum()]
    updates = lasagne.updates.sgd(ce.mean(), params, 0.1)
    givens = {x: x_in, y: y_in}
    train = synk.function([x_in, y_in], outputs, updates=updates, givens=givens, mode=_mode())
    assert isinstance(train, TrainingFunction)
    assert train.output_modes == ["avg", "gather", "gather", "avg"]
    reference = pytensor.function(
        [x_in, y_in], outputs, updates=updates, givens=givens, mode=_mode()
    )
    _same_as_one_device(session, train, reference, _data(), params)


def test_rows_given_by_sliceable_shareds_train_as_one_device(session):
    """``givens={x: x_all, y: y_all}`` with the rows scattered into ``x_all``, ``y_all``:
    Adam's parameters and its step count, and the per-row predictions in rank order."""
    x, y, prediction, ce, params, _ = _classifier()
    X, Y = _data(seed=1)
    x_all = pytensor.shared(X, name="x_all")
    y_all = pytensor.shared(Y, name="y_all")
    updates = lasagne.updates.adam(ce.mean(), params, 0.05)
    outputs = [ce.mean(), prediction]
    givens = {x: x_all, y: y_all}
    train = synk.function(
        [], outputs, updates=updates, givens=givens, sliceable_shareds=[x_all, y_all], mode=_mode()
    )
    assert isinstance(train, TrainingFunction)
    synk.scatter([x_all, y_all], [X, Y])
    whole = {x: pytensor.shared(X), y: pytensor.shared(Y)}  # the reference's: every row
    reference = pytensor.function([], outputs, updates=updates, givens=whole, mode=_mode())
    _same_as_one_device(session, train, reference, (), list(updates))


def test_softmax_over_given_rows_trains_as_one_device(session):
    """A listwise loss, a softmax over the rows of ``x_in``'s scores (the weights
    themselves, read per row, could not be an output: they read the whole batch's sum)."""
    x, y, prediction, ce, params, _ = _classifier()
    x_in, y_in = pt.matrix("x_in"), pt.ivector("y_in")
    weights = pt.special.softmax(prediction[:, 0], axis=0)
    loss = (weights * ce).sum()
    updates = lasagne.updates.sgd(loss, params, 0.1)
    givens = {x: x_in, y: y_in}
    train = synk.function(
        [x_in, y_in], [loss, ce.sum()], updates=updates, givens=givens, mode=_mode()
    )
    assert isinstance(train, TrainingFunction)
    reference = pytensor.function(
        [x_in, y_in], [loss, ce.sum()], updates=updates, givens=givens, mode=_mode()
    )
    _same_as_one_device(session, train, reference, _data(seed=2), params)


def test_batch_norm_of_given_rows_trains_as_one_device(session):
    """Batch normalization of ``x_in``'s rows: its statistics the whole batch's, and its
    running averages (whose default updates read ``x``) moved by them on every rank."""
    x, y, _, ce, params, averages = _classifier(batch_norm=True)
    x_in, y_in = pt.matrix("x_in"), pt.ivector("y_in")
    updates = lasagne.updates.sgd(ce.mean(), params, 0.1)
    givens = {x: x_in, y: y_in}
    train = synk.function([x_in, y_in], [ce.mean()], updates=updates, givens=givens, mode=_mode())
    assert isinstance(train, TrainingFunction)
    reference = pytensor.function(
        [x_in, y_in], [ce.mean()], updates=updates, givens=givens, mode=_mode()
    )
    _same_as_one_device(session, train, reference, _data(13, seed=3), params, averages)


def test_minibatch_given_by_position(session):
    """The Theano idiom ``givens={x: x_all[idx * B:(idx + 1) * B]}``: from a shared
    variable every rank holds whole, each rank computes its share of the minibatch
    (tests/test_given_rows.py); from a sliceable one, each rank would slice its own
    rows, which is said."""
    x, y, prediction, _, params, _ = _classifier()
    # No arange over the rows (cross-entropy's): JAX mode takes its bounds from shapes only.
    err = (prediction.max(axis=1) - y) ** 2
    X, Y = _data(seed=4)
    idx, size = pt.lscalar("idx"), 9
    batch = slice(idx * size, (idx + 1) * size)
    x_all, y_all = pytensor.shared(X, name="x_all"), pytensor.shared(Y, name="y_all")
    updates = lasagne.updates.sgd(err.mean(), params, 0.1)
    givens = {x: x_all[batch], y: y_all[batch]}
    with pytest.warns(UserWarning, match=r"indexing axis 0 \(the rows\) by position"):
        synk.function(
            [],
            err.mean(),
            bcast_inputs=[idx],
            updates=updates,
            givens=givens,
            sliceable_shareds=[x_all, y_all],
            mode=_mode(),
        )
    train = synk.function(
        [], [err.mean(), err], bcast_inputs=[idx], updates=updates, givens=givens, mode=_mode()
    )
    assert isinstance(train, TrainingFunction)
    reference = pytensor.function(  # in C: JAX slices by static bounds only
        [idx], [err.mean(), err], updates=updates, givens=givens, mode=training_outputs.MODE
    )
    _same_as_one_device(session, train, reference, (1,), params)
