"""The Theano tutorials' training function, by its line alone (issue #61).

``synk.function([index], cost, updates=..., givens={x: data_x[index * B:(index + 1) * B],
...})``: the index is broadcast by itself, and the minibatch the givens select from shared
data every rank holds is split over the ranks, with one device's answer. A slice of
constant length (the last minibatch short), an index vector read from a shared
permutation (shuffled minibatches), batch normalization, per-row outputs, a corruption
mask drawn per row (the dA tutorial's) and a minibatch of fewer rows than ranks (SdA's
batch of 1), on 2 and 3 CPU ranks in float64 (and 2 GPU ranks on CPU devices), against
``pytensor.function`` with the same line, every rank's state equal after each call.
"""

import copy

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.tensor.random.type import RandomType

import synkhronos as synk
from synkhronos import theano
from synkhronos.api.given_rows import GivenRows
from synkhronos.api.training import TrainingFunction
from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne import layers as L
from synkhronos.ops.random_streams import RandomStreams
from synkhronos.session import launch
from tests import test_training_outputs as training_outputs
from tests.test_training_outputs import _mode

session = training_outputs.session  # its fixture: 2, 3 CPU ranks and 2 GPU ranks

ROWS = 23  # minibatches of 7: 7, 7, 7 and the last 2 (on 3 ranks: 1/1/0 -> whole)
pytestmark = [
    pytest.mark.filterwarnings("error:.*not as one device would:UserWarning"),
    pytest.mark.filterwarnings("error:.*could not be made exact:UserWarning"),
    pytest.mark.filterwarnings("error:.*ranks will differ:UserWarning"),
]


def _shared_data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(ROWS, 4)).astype(pytensor.config.floatX)
    Y = rng.integers(0, 3, ROWS).astype("int32")
    return pytensor.shared(X, name="train_x"), pytensor.shared(Y, name="train_y")


def _as_one_device(session, train, reference, calls, state):
    """``train`` and ``reference`` (a ``pytensor.function`` of the same line) called with
    each of ``calls`` from the same ``state``: the same outputs, the same state after each
    call, and every rank's state equal (``synk.verify``)."""
    _, tol = session
    generators = [v for v in reference.get_shared() if isinstance(v.type, RandomType)]
    state = [*state, *generators]  # rank 0's generators: the reference draws from them
    start = [v.get_value() for v in state]
    got = []
    for args in calls:
        got.append(train(*args))
        synk.verify()
    after = [v.get_value() for v in state]
    for v, value in zip(state, start, strict=True):
        v.set_value(value)  # on rank 0: the reference runs there
    for k, args in enumerate(calls):
        want = reference(*args)
        listed = [(v if isinstance(v, list) else [v]) for v in (got[k], want)]
        for j, (g, w) in enumerate(zip(*listed, strict=True)):
            assert np.shape(g) == np.shape(w), (k, j)
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"call {k} out {j}")
    for v, value in zip(state, after, strict=True):
        if isinstance(v.type, RandomType):  # rank 0's drew as one device's
            assert value.bit_generator.state == v.get_value().bit_generator.state
        else:
            np.testing.assert_allclose(value, v.get_value(), rtol=tol, atol=tol, err_msg=str(v))
    synk.broadcast(state[: len(state) - len(generators)])  # every rank takes the reference's values


def _reference(inputs, outputs, **kwargs):
    """The line in one process (compiled in C: JAX slices by static bounds only)."""
    return pytensor.function(inputs, outputs, **{**kwargs, "mode": training_outputs.MODE})


def _classifier(batch_norm=False):
    x, y, net, norm = training_outputs.classifier(batch_norm)
    prediction = L.get_output(net)
    ce = lasagne.objectives.categorical_crossentropy(prediction, y)
    return x, y, prediction, ce, L.get_all_params(net, trainable=True), norm


def test_slice_of_constant_length(session):
    """The tutorials' line: the mean loss, the per-row predicted classes and the error
    rate; SGD's parameters after every minibatch, the last one short; the labels a cast
    of a float shared variable, as the tutorials' ``shared_dataset`` makes them. The
    tutorials' ``test_model`` (no update), and the training function's reference."""
    x, y, prediction, ce, params, _ = _classifier()
    train_x, labels = _shared_data()
    float_labels = pytensor.shared(labels.get_value().astype(pytensor.config.floatX))
    train_y = pt.cast(float_labels, "int32")
    index, size = pt.lscalar("index"), 7
    errors = pt.mean(pt.neq(pt.argmax(prediction, axis=1), y))
    outputs = [ce.mean(), pt.argmax(prediction, axis=1), errors]
    updates = lasagne.updates.sgd(ce.mean(), params, 0.1)
    givens = {
        x: train_x[index * size : (index + 1) * size],
        y: train_y[index * size : (index + 1) * size],
    }
    train = synk.function([index], outputs, updates=updates, givens=givens, mode=_mode())
    assert isinstance(train, TrainingFunction)
    assert train.inputs == [index]
    assert train.output_modes == ["avg", "gather", "avg"]
    reference = _reference([index], outputs, updates=updates, givens=givens, mode=_mode())
    calls = [(k,) for k in (0, 1, 3, 2)]
    _as_one_device(session, train, reference, calls, params)
    _, tol = session
    start = [p.get_value() for p in params]
    alone = train.as_pytensor(1)  # its reference, on rank 0: it takes the index too
    for p, value in zip(params, start, strict=True):
        p.set_value(value)
    for got, want in zip(alone, reference(1), strict=True):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    synk.broadcast(params)
    test_model = synk.function([index], outputs[1:], givens=givens, mode=_mode())
    test_reference = _reference([index], outputs[1:], givens=givens)
    _as_one_device(session, test_model, test_reference, calls, params)  # no update


def test_selected_rows_computed_once_per_call(session, monkeypatch):
    """Rank 0 computes a call's selected rows once (the call's check of their count and
    its plan share them)."""
    x, y, _, ce, params, _ = _classifier()
    train_x, train_y = _shared_data(4)
    index, size = pt.lscalar("index"), 7
    givens = {
        x: train_x[index * size : (index + 1) * size],
        y: train_y[index * size : (index + 1) * size],
    }
    updates = lasagne.updates.sgd(ce.mean(), params, 0.1)
    train = synk.function([index], ce.mean(), updates=updates, givens=givens, mode=_mode())
    computed = []
    rows = GivenRows.rows
    monkeypatch.setattr(GivenRows, "rows", lambda self, a: computed.append(1) or rows(self, a))
    for k in (0, 1, 0):
        train(k)
    assert len(computed) == 3
    synk.verify()


def test_index_vector_of_shuffled_minibatches(session):
    """``train_x[order[index * B:(index + 1) * B]]``, ``order`` a shared permutation, and
    Adam (its step count too)."""
    x, y, prediction, ce, params, _ = _classifier()
    train_x, train_y = _shared_data(1)
    order = pytensor.shared(np.random.default_rng(5).permutation(ROWS), name="order")
    index, size = pt.lscalar("index"), 9
    chosen = order[index * size : (index + 1) * size]
    updates = lasagne.updates.adam(ce.mean(), params, 0.05)
    givens = {x: train_x[chosen], y: train_y[chosen]}
    outputs = [ce.mean(), prediction]
    train = synk.function([index], outputs, updates=updates, givens=givens, mode=_mode())
    assert isinstance(train, TrainingFunction)
    reference = _reference([index], outputs, updates=updates, givens=givens, mode=_mode())
    _as_one_device(session, train, reference, [(0,), (2,), (1,)], list(updates))


def test_batch_norm_of_the_selected_minibatch(session):
    """Batch normalization's statistics over the whole minibatch, its running averages
    moved by them on every rank."""
    x, y, _, ce, params, norm = _classifier(batch_norm=True)
    train_x, train_y = _shared_data(2)
    index, size = pt.lscalar("index"), 11
    updates = lasagne.updates.sgd(ce.mean(), params, 0.1)
    givens = {
        x: train_x[index * size : (index + 1) * size],
        y: train_y[index * size : (index + 1) * size],
    }
    train = synk.function([index], ce.mean(), updates=updates, givens=givens, mode=_mode())
    assert isinstance(train, TrainingFunction)
    reference = _reference([index], ce.mean(), updates=updates, givens=givens, mode=_mode())
    state = [*params, norm.mean, norm.inv_std]
    _as_one_device(session, train, reference, [(s,) for s in (0, 1, 0)], state)


def _denoising_autoencoder(corrupted: bool = True):
    """The dA tutorial's model: tied weights, a corruption mask drawn per row with
    ``RandomStreams.binomial``, the mean cross-entropy of the reconstruction."""
    rng = np.random.default_rng(7)
    floatX = pytensor.config.floatX
    W = pytensor.shared(rng.uniform(-0.3, 0.3, (4, 3)).astype(floatX), name="W")
    b = pytensor.shared(np.zeros(3, floatX), name="b")
    b_prime = pytensor.shared(np.zeros(4, floatX), name="b_prime")
    x = pt.matrix("x")
    streams = RandomStreams(seed=3)
    level = pt.scalar("corruption_level", dtype=floatX)
    mask = streams.binomial(size=x.shape, n=1, p=1 - level, dtype=floatX)
    tilde = mask * x if corrupted else x
    z = pt.sigmoid(pt.dot(pt.sigmoid(pt.dot(tilde, W) + b), W.T) + b_prime)
    cost = pt.mean(-pt.sum(x * pt.log(z) + (1 - x) * pt.log(1 - z), axis=1))
    params = [W, b, b_prime]
    grads = pytensor.grad(cost, params)
    updates = [(p, p - pt.cast(0.1, floatX) * g) for p, g in zip(params, grads, strict=True)]
    return x, level, cost, updates, params


def _cpu_ranks_only():
    """JAX mode draws from its own copy of each generator, with JAX's bits: the C
    reference is no one-process answer for it."""
    if launch.current().backend.name != "cpu":
        pytest.skip("random draws in JAX mode are JAX's, not the C reference's")


def _drawn_as_its_reference(session, train, calls, params):
    """GPU ranks (JAX mode: JAX's bits, which no C reference draws): ``train``'s calls
    against its own reference in rank 0's process (``as_pytensor``, compiled as the ranks
    compile it), from the same parameters and generator state; every rank's state equal
    (``synk.verify``)."""
    _, tol = session
    generators = [v for v in train.get_shared() if isinstance(v.type, RandomType)]
    assert generators
    start = [p.get_value() for p in params]
    # A JAX generator's state is a dict that set_value does not take back: its storage.
    states = [copy.deepcopy(g.container.storage[0]) for g in generators]
    got = []
    for args in calls:
        got.append(train(*args))
        synk.verify()
    after = [p.get_value() for p in params]
    drawn = [copy.deepcopy(g.container.storage[0]) for g in generators]
    for p, value in zip(params, start, strict=True):
        p.set_value(value)
    for g, state in zip(generators, states, strict=True):
        g.container.storage[0] = state
    for k, args in enumerate(calls):
        np.testing.assert_allclose(got[k], train.as_pytensor(*args), rtol=tol, atol=tol)
    for value, p in zip(after, params, strict=True):
        np.testing.assert_allclose(value, p.get_value(), rtol=tol, atol=tol, err_msg=str(p))
    for g, state in zip(generators, drawn, strict=True):  # as the calls left every rank's
        g.container.storage[0] = state
    synk.broadcast(params)


def _unit_data(rows):
    X = np.random.default_rng(8).uniform(size=(rows, 4)).astype(pytensor.config.floatX)
    return pytensor.shared(X, name="train_x")


def test_corruption_mask_drawn_as_one_device(session):
    """dA's line, its corruption level a second scalar input: every rank draws the whole
    minibatch's mask as one device, and keeps its rows' (GPU ranks: as their reference
    draws it, the last minibatch of 2 rows split, then one of 1 row computed whole)."""
    x, level, cost, updates, params = _denoising_autoencoder()
    train_x = _unit_data(ROWS)
    index, size = pt.lscalar("index"), 7
    givens = {x: train_x[index * size : (index + 1) * size]}
    train = synk.function([index, level], cost, updates=updates, givens=givens, mode=_mode())
    assert isinstance(train, TrainingFunction)
    if launch.current().backend.name != "cpu":
        fx = np.dtype(pytensor.config.floatX).type
        calls = [(0, fx(0.3)), (3, fx(0.3)), (1, fx(0.2))]
        _drawn_as_its_reference(session, train, calls, params)
        one = {x: train_x[index : index + 1]}
        train = synk.function([index, level], cost, updates=updates, givens=one)
        _drawn_as_its_reference(session, train, [(5, fx(0.3)), (22, fx(0.3))], params)
        return
    reference = _reference([index, level], cost, updates=updates, givens=givens, mode=_mode())
    _as_one_device(session, train, reference, [(0, 0.3), (1, 0.3), (3, 0.2)], params)


def test_minibatch_of_fewer_rows_than_ranks(session):
    """SdA's batch of 1 on every rank count: the row computed whole on every rank, its
    mask drawn alike; then a minibatch of 2 rows on 2 ranks splits again."""
    _cpu_ranks_only()
    n, _ = session
    x, level, cost, updates, params = _denoising_autoencoder()
    train_x = _unit_data(ROWS)
    index, size = pt.lscalar("index"), 1
    givens = {x: train_x[index * size : (index + 1) * size]}
    train = synk.function([index, level], cost, updates=updates, givens=givens, mode=_mode())
    reference = _reference([index, level], cost, updates=updates, givens=givens, mode=_mode())
    _as_one_device(session, train, reference, [(k, 0.3) for k in (0, 5, 22)], params)
    two = {x: train_x[index * 2 : (index + 1) * 2]}
    train = synk.function([index, level], cost, updates=updates, givens=two, mode=_mode())
    reference = _reference([index, level], cost, updates=updates, givens=two, mode=_mode())
    _as_one_device(session, train, reference, [(k, 0.3) for k in (0, 11, 4)], params)
    assert n in (2, 3)


def test_num_slices_of_a_minibatch_computed_whole(session):
    """A minibatch of fewer rows than ranks (the last, 1 row), computed whole: its
    ``num_slices`` is checked as the split's (0 refused; 2 refused where the mask is
    drawn per row), and 2 gives one device's answer where nothing is drawn."""
    x, y, _, ce, params, _ = _classifier()
    train_x, train_y = _shared_data(3)
    index, size = pt.lscalar("index"), 11  # minibatches of 11, 11 and 1
    updates = lasagne.updates.sgd(ce.mean(), params, 0.1)
    givens = {
        x: train_x[index * size : (index + 1) * size],
        y: train_y[index * size : (index + 1) * size],
    }
    train = synk.function([index], ce.mean(), updates=updates, givens=givens, mode=_mode())
    reference = _reference([index], ce.mean(), updates=updates, givens=givens, mode=_mode())
    with pytest.raises(ValueError, match="num_slices must be at least 1"):
        train(2, num_slices=0)
    with pytest.raises(TypeError, match="num_slices must be an int"):
        train(2, num_slices=2.0)

    def sliced(k):
        return train(k, num_slices=2)

    _as_one_device(session, sliced, reference, [(2,), (0,), (2,)], params)
    _cpu_ranks_only()
    x, level, cost, updates, params = _denoising_autoencoder()
    givens = {x: _unit_data(ROWS)[index * size : (index + 1) * size]}
    train = synk.function([index, level], cost, updates=updates, givens=givens, mode=_mode())
    with pytest.raises(ValueError, match="draws random numbers per row"):
        train(2, 0.3, num_slices=2)


def test_broadcast_index_of_dA_draws_as_one_device(session):
    """dA's line as the old error said to write it, ``bcast_inputs=[index]``: split as
    its line with the index in ``inputs`` is."""
    _cpu_ranks_only()
    x, level, cost, updates, params = _denoising_autoencoder()
    train_x = _unit_data(ROWS)
    index, size = pt.lscalar("index"), 7
    givens = {x: train_x[index * size : (index + 1) * size]}
    train = synk.function(
        [], cost, bcast_inputs=[index, level], updates=updates, givens=givens, mode=_mode()
    )
    assert isinstance(train, TrainingFunction)
    reference = _reference([index, level], cost, updates=updates, givens=givens, mode=_mode())
    _as_one_device(session, train, reference, [(1, 0.3), (2, 0.3)], params)


def test_whole_shared_minibatch_draws_alike(session):
    """No input with the rows (the minibatch a whole shared variable every rank holds):
    every rank computes the call whole, its mask drawn alike, equal to one process."""
    _cpu_ranks_only()
    x, level, cost, updates, params = _denoising_autoencoder()
    givens = {x: _unit_data(9)}
    train = synk.function([level], cost, updates=updates, givens=givens, mode=_mode())
    assert not isinstance(train, TrainingFunction)
    reference = _reference([level], cost, updates=updates, givens=givens, mode=_mode())
    _as_one_device(session, train, reference, [(0.3,), (0.5,)], params)


def test_scalar_before_rows_refused():
    """A scalar listed before an input with the rows: the call takes the rows first."""
    x, lr = pt.matrix("x"), pt.scalar("lr")
    with pytest.raises(TypeError, match="list the scalars after them"):
        synk.function([lr, x], (x * lr).sum())


def test_inputs_with_defaults(session):
    """``In(var, value=...)`` as Theano took it: dA's corruption level omitted (its
    default), against ``synkhronos.theano.function`` of the same line; a plain
    function's scalar default, omitted or passed by name, and ``pytensor.In`` without
    one."""
    _cpu_ranks_only()
    x, level, cost, updates, params = _denoising_autoencoder()
    train_x = _unit_data(ROWS)
    index, size = pt.lscalar("index"), 7
    givens = {x: train_x[index * size : (index + 1) * size]}
    line = ([index, theano.In(level, value=0.3)], cost)
    train = synk.function(*line, updates=updates, givens=givens, mode=_mode())
    reference = theano.function(*line, updates=updates, givens=givens, mode=_mode())
    _as_one_device(session, train, reference, [(0,), (2,)], params)
    rows, scale = pt.matrix("rows"), pt.scalar("scale")
    total = ((rows * scale).sum(), "sum")
    plain = synk.function([rows, theano.In(scale, value=2.0)], total)
    X = np.ones((5, 2), pytensor.config.floatX)
    assert float(plain(X)) == 20.0 and float(plain(X, 3.0)) == 30.0
    assert float(plain(X, scale=4.0)) == 40.0 and float(plain(X)) == 20.0
    assert float(synk.function([pytensor.In(rows)], (rows.sum(), "sum"))(X)) == 10.0


def test_batch_size_written_in_a_reshape(session):
    """LeNet's ``x.reshape((batch_size, ...))``: no rank's share has that length, so a
    warning names the op and the fix, and every rank computes the minibatch whole."""
    train_x, train_y = _shared_data(3)
    x, y = pt.matrix("x"), pt.ivector("y")
    weights = pytensor.shared(np.full((2, 2), 0.1, pytensor.config.floatX), name="weights")
    index, size = pt.lscalar("index"), 7
    score = (x.reshape((size, 2, 2)) * weights).sum(axis=(1, 2))
    cost = ((score - y) ** 2).mean()
    updates = [(weights, weights - 0.05 * pytensor.grad(cost, weights))]
    givens = {
        x: train_x[index * size : (index + 1) * size],
        y: train_y[index * size : (index + 1) * size],
    }
    with pytest.warns(UserWarning, match=r"Reshape\{3\} reshapes it .* write -1"):
        train = synk.function([index], cost, updates=updates, givens=givens, mode=_mode())
    reference = _reference([index], cost, updates=updates, givens=givens)
    _as_one_device(session, train, reference, [(0,), (2,)], [weights])
