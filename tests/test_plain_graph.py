"""A training function on one CPU rank runs its line's plain graph (issue #61).

On one rank the phases' split buys nothing: the call runs one Function of the line as
``pytensor.function`` compiles it. Against ``pytensor.function`` of the same line on
random data (11 rows; the givens' minibatches of 7 from 23 rows, the last short), and
against the phases' path on one rank (the same outputs, of the same types and shapes):
``batch=`` on Data, ``output_subset``, batch normalization's running averages, a
corruption mask drawn per row (the generator advances as one process's), the givens'
slice, ``num_slices > 1`` (the phases), errors, ``synk.verify()`` and a checkpoint.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.tensor.random.type import RandomType

import synkhronos as synk
from synkhronos.api.calls import MISS, OneRankCall
from synkhronos.api.plain_graph import PlainGraph
from synkhronos.api.planning import CallOptions
from synkhronos.api.training import TrainingFunction
from synkhronos.extensions import lasagne
from tests import test_given_rows as given_minibatch
from tests import test_training_outputs as training_outputs

MODE = training_outputs.MODE
TOL = 1e-9 if pytensor.config.floatX == "float64" else 1e-5


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    synk.fork(1, backend="cpu")
    yield
    synk.close()


def _calls(f, calls: list, state: list) -> tuple[list, list]:
    """``f`` called with each of ``calls`` (``(args, kwargs)``), ``synk.verify()`` after
    each; its outputs and the values of ``state`` afterwards, ``state`` put back."""
    start = [v.get_value() for v in state]
    got = []
    for args, kwargs in calls:
        got.append(f(*args, **kwargs))
        synk.verify()
    after = [v.get_value() for v in state]
    for v, value in zip(state, start, strict=True):
        v.set_value(value)
    return got, after


def _same(got: list, want: list, exact_types: bool = False) -> None:
    """Each call's outputs and the state after them equal (of the same types)."""
    for g, w in zip(got, want, strict=True):
        listed = [(v if isinstance(v, list) else [v]) for v in (g, w)]
        assert type(g) is type(w)
        for a, b in zip(*listed, strict=True):
            assert np.shape(a) == np.shape(b)
            if exact_types:
                assert type(a) is type(b) and np.asarray(a).dtype == np.asarray(b).dtype
            if isinstance(a, np.random.Generator):
                assert a.bit_generator.state == b.bit_generator.state
            else:
                np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)


def _subsets(reference):
    """``reference`` taking ``output_subset`` as a synkhronos call does (one index: the
    value, else a list)."""

    def call(*args, output_subset=None):
        outputs = reference(*args)
        if output_subset is None:
            return outputs
        chosen = [outputs[k] for k in output_subset]
        return chosen[0] if len(chosen) == 1 else chosen

    return call


def _counted(ran: list, result):
    """``result`` of a fast path's call, counted in ``ran`` where it ran the call."""
    if result is not MISS:
        ran.append(1)
    return result


def _against_both(train, reference, synk_calls, reference_calls, state, monkeypatch) -> None:
    """``train``'s calls on the plain graph equal ``reference``'s (a ``pytensor.function``
    of the line) and the phases' (the same types); the plain graph ran."""
    ran = []
    with monkeypatch.context() as patched:
        run, fast = PlainGraph.__call__, OneRankCall.__call__
        patched.setattr(PlainGraph, "__call__", lambda *a: ran.append(1) or run(*a))
        patched.setattr(OneRankCall, "__call__", lambda *a: _counted(ran, fast(*a)))
        plain = _calls(train, synk_calls, state)
    assert len(ran) == len(synk_calls)
    _same(plain[0], _calls(reference, reference_calls, state)[0])
    _same([plain[1]], [_calls(reference, reference_calls, state)[1]])
    with monkeypatch.context() as patched:
        patched.setattr(PlainGraph, "runs", lambda self, options: False)
        patched.setattr(train, "_fast", None)
        phases = _calls(train, synk_calls, state)
        assert train._fast is None  # the phases' calls made none
    _same(plain[0], phases[0], exact_types=True)
    _same([plain[1]], [phases[1]])


def test_arrays_data_batch_and_output_subset(monkeypatch, rng):
    """The classifier's mean and summed loss, per-row predictions and classes with
    Adam: arrays, Data with ``batch=``, ``output_subset``."""
    x, y, net, _ = training_outputs.classifier()
    prediction = lasagne.layers.get_output(net)
    ce = lasagne.objectives.categorical_crossentropy(prediction, y)
    params = lasagne.layers.get_all_params(net, trainable=True)
    updates = lasagne.updates.adam(ce.mean(), params, 0.05)
    outputs = [ce.mean(), ce.sum(), prediction, pt.argmax(prediction, axis=1)]
    train = synk.function([x, y], outputs, updates=updates, mode=MODE)
    assert isinstance(train, TrainingFunction)
    reference = pytensor.function([x, y], outputs, updates=updates, mode=MODE)
    X = rng.normal(size=(11, 4)).astype(pytensor.config.floatX)
    Y = rng.integers(0, 3, 11).astype("int32")
    data = train.build_inputs(X, Y)
    synk_calls = [
        ((X, Y), {}),
        ((*data,), {"batch": slice(2, 9)}),
        ((*data,), {"batch": [7, 1, 4]}),
        ((X, Y), {"output_subset": [3, 0]}),
        ((X[:5], Y[:5]), {"output_subset": [1]}),
    ]
    reference_calls = [
        ((X, Y), {}),
        ((X[2:9], Y[2:9]), {}),
        ((X[[7, 1, 4]], Y[[7, 1, 4]]), {}),
        ((X, Y), {"output_subset": [3, 0]}),
        ((X[:5], Y[:5]), {"output_subset": [1]}),
    ]
    state = list(updates)
    _against_both(train, _subsets(reference), synk_calls, reference_calls, state, monkeypatch)


def _sgd_line(batch_norm: bool = False, **kwargs):
    """The classifier's SGD line: ``(x, y, params, norm, loss, updates, train)``, ``train``
    built by ``synk.function`` with ``kwargs``."""
    x, y, net, norm = training_outputs.classifier(batch_norm=batch_norm)
    ce = lasagne.objectives.categorical_crossentropy(lasagne.layers.get_output(net), y)
    params = lasagne.layers.get_all_params(net, trainable=True)
    updates = lasagne.updates.sgd(ce.mean(), params, 0.1)
    train = synk.function([x, y], ce.mean(), updates=updates, **kwargs)
    return x, y, params, norm, ce.mean(), updates, train


def test_batch_norm_running_averages(monkeypatch, rng):
    """A batch norm's running averages move as one process's (default updates)."""
    x, y, params, norm, loss, updates, train = _sgd_line(batch_norm=True, mode=MODE)
    reference = pytensor.function([x, y], loss, updates=updates, mode=MODE)
    X = rng.normal(size=(11, 4)).astype(pytensor.config.floatX)
    Y = rng.integers(0, 3, 11).astype("int32")
    calls = [((X, Y), {}), ((X[3:], Y[3:]), {})]
    state = [*params, norm.mean, norm.inv_std]
    _against_both(train, reference, calls, calls, state, monkeypatch)


def test_givens_slice_with_a_corruption_mask(monkeypatch):
    """dA's line: the givens' slice (the last minibatch short), a mask drawn per row; the
    generator's state after the calls is one process's, and the phases'."""
    x, level, cost, updates, params = given_minibatch._denoising_autoencoder()
    train_x = given_minibatch._unit_data(23)
    index, size = pt.lscalar("index"), 7
    givens = {x: train_x[index * size : (index + 1) * size]}
    train = synk.function([index, level], cost, updates=updates, givens=givens, mode=MODE)
    assert isinstance(train, TrainingFunction) and train.inputs == [index, level]
    reference = pytensor.function([index, level], cost, updates=updates, givens=givens, mode=MODE)
    generators = [v for v in reference.get_shared() if isinstance(v.type, RandomType)]
    assert generators
    calls = [((k, 0.3), {}) for k in (0, 3, 1)]
    _against_both(train, reference, calls, calls, [*params, *generators], monkeypatch)
    with pytest.raises(ValueError, match="batch and batch_s do not apply"):
        train(0, 0.3, batch=slice(0, 2))
    with pytest.raises(TypeError, match="index"):  # as pytensor.function refuses it
        train(1.5, 0.3)
    calls = [((synk.data(np.array(2)), 0.3), {}), ((np.int32(1), np.float64(0.2)), {})]
    reference_calls = [((2, 0.3), {}), ((1, 0.2), {})]
    _against_both(train, reference, calls, reference_calls, [*params, *generators], monkeypatch)


def test_num_slices_runs_the_phases(monkeypatch, rng):
    """``num_slices=2`` takes the phases' path (their slices combine the update)."""
    x, y, params, _, loss, updates, train = _sgd_line(mode=MODE)
    reference = pytensor.function([x, y], loss, updates=updates, mode=MODE)
    X = rng.normal(size=(11, 4)).astype(pytensor.config.floatX)
    Y = rng.integers(0, 3, 11).astype("int32")
    monkeypatch.setattr(PlainGraph, "__call__", None)  # not called
    got, after = _calls(train, [((X, Y), {"num_slices": 2})], params)
    want, expected = _calls(reference, [((X, Y), {})], params)
    _same(got, want)
    _same([after], [expected])


def test_errors_and_checkpoint(tmp_path, rng):
    """A wrong argument count and a bad ``num_slices`` are refused as the phases refuse
    them; a checkpoint after plain calls restores the parameters."""
    _, _, params, _, _, _, train = _sgd_line(mode=MODE)
    X = rng.normal(size=(11, 4)).astype(pytensor.config.floatX)
    Y = rng.integers(0, 3, 11).astype("int32")
    with pytest.raises(TypeError, match="expected 2"):
        train(X)
    with pytest.raises(TypeError, match="num_slices must be an int"):
        train(X, Y, num_slices=True)
    train(X, Y)
    saved = [p.get_value() for p in params]
    synk.save(str(tmp_path / "step.npz"))
    train(X, Y)
    synk.load(str(tmp_path / "step.npz"))
    for p, value in zip(params, saved, strict=True):
        np.testing.assert_array_equal(p.get_value(), value)
    synk.verify()


def test_plain_graph_compiles_as_pytensor_function():
    """The plain graph keeps PyTensor's fast-math flags, as ``pytensor.function`` compiles
    the line (the ranks' functions compile without them, so that fresh and cached code
    agree across ranks: the MLP tutorial's step 1.4x as long)."""
    train = _sgd_line()[-1]
    assert train._plain.runs(CallOptions())
    assert dict(train._plain._function.spec.settings)["numba__fastmath"] is True
    assert dict(train.row_function.spec.settings).get("numba__fastmath") is None


def test_fast_path_keeps_the_general_paths_rules(rng):
    """Calls like the last (an index of the same kind) take the fast path straight to
    the kept call, with the general path's rules: the outputs and parameters equal
    ``pytensor.function``'s; an index of another kind or out of its dtype's range goes
    the general path (its error); a call that fails leaves the parameters as they were;
    a broken session is refused; calls are counted for ``verify_every``; a timeline
    records the call (the general path)."""
    from pytensor.raise_op import Assert

    from synkhronos.session import launch

    data = pytensor.shared(rng.normal(size=(23, 3)), name="data")
    target = pytensor.shared(rng.normal(size=23), name="target")
    w = pytensor.shared(np.zeros(3), name="w")
    x, y, index = pt.matrix("x"), pt.vector("y"), pt.iscalar("index")
    size = 5
    givens = {
        x: data[index * size : (index + 1) * size],
        y: target[index * size : (index + 1) * size],
    }
    loss = Assert("index past the data")(((x @ w - y) ** 2).mean(), index < 4)
    updates = [(w, w - 0.1 * pytensor.grad(loss, w))]
    train = synk.function([index], loss, updates=updates, givens=givens)
    reference = pytensor.function([index], loss, updates=updates, givens=givens)
    session, start = launch.current(), w.get_value()
    hits = []
    fast_call = OneRankCall.__call__

    def counted(fast, args):
        return _counted(hits, fast_call(fast, args))

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(OneRankCall, "__call__", counted)
        got = [train(k) for k in (0, 3, 1, 2)]
        assert len(hits) == 3
        with pytest.raises(TypeError, match="index"):
            train(1.5)  # another kind: the general path's error
        with pytest.raises(TypeError, match="index"):
            train(2**40)  # out of int32's range: the same
        before = w.get_value()
        with pytest.raises(AssertionError, match="index past the data"):
            train(4)  # on the fast path: no update applied
        assert len(hits) == 3
        np.testing.assert_array_equal(w.get_value(), before)
        got.append(train(0))
        assert len(hits) == 4
        session.verify_every, calls = 1000, session.calls
        try:
            got.append(train(1))
            assert session.calls == calls + 1 and len(hits) == 5
        finally:
            session.verify_every = None
        session.broken = True
        try:
            with pytest.raises(RuntimeError, match="session is broken"):
                train(2)
        finally:
            session.broken = False
    trained = w.get_value()
    w.set_value(start)
    want = [reference(k) for k in (0, 3, 1, 2)]
    with pytest.raises(AssertionError):
        reference(4)
    want += [reference(0), reference(1)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(trained, w.get_value(), rtol=1e-12)


def test_fast_path_leaves_a_timeline_to_the_general_path(tmp_path, monkeypatch):
    """Under a timeline a call like the last is planned (the timeline shows its rows)."""
    x, level, cost, updates, params = given_minibatch._denoising_autoencoder()
    index, size = pt.lscalar("index"), 7
    givens = {x: given_minibatch._unit_data(23)[index * size : (index + 1) * size]}
    train = synk.function([index, level], cost, updates=updates, givens=givens, mode=MODE)
    train(0, 0.3)
    train(1, 0.3)
    assert train._fast is not None
    planned = []
    run = PlainGraph.__call__
    monkeypatch.setattr(PlainGraph, "__call__", lambda *a: planned.append(1) or run(*a))
    with synk.timeline(tmp_path / "timeline.json"):
        train(2, 0.3)
    assert planned == [1]
    train(0, 0.3)
    assert planned == [1]
