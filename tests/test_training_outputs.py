"""What a function returns is what its line returned in one process (issue #50).

Where no reduce op is named, an output whose leading axis is the rows comes back whole
(every rank's rows, in order) and a scalar as the whole batch's value, for a training
function built by its one line and for a plain function alike; an op the user names is
kept. ``allow_input_downcast`` casts ``synk.data`` inputs as it casts arrays; a batch
norm's running averages are read per rank by the variable the user holds. On 2 and 3 CPU
ranks in float64 (and 2 GPU ranks on CPU devices, in their floatX), with uneven rows,
against ``pytensor.function`` in one process.
"""

import copy

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.api.training import TrainingFunction
from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne import layers as L
from synkhronos.rank.backends import gpu
from synkhronos.session import launch

ROWS = 11  # 2 ranks: 6/5, 3 ranks: 4/4/3
MODE = "FAST_COMPILE"  # every rank compiles each graph


@pytest.fixture(
    scope="module",
    params=[("cpu", 2), ("cpu", 3), pytest.param(("gpu", 2), marks=pytest.mark.gpu)],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def session(request):
    """(ranks, tolerance): GPU ranks compute in their floatX, float32."""
    backend, n = request.param
    if backend == "gpu":
        pytest.importorskip("jax")
        if not gpu.on_cpu_devices():
            pytest.skip("on real GPUs the rank count is the GPUs'")
    synk.fork(n, backend=backend)
    yield n, 1e-9 if pytensor.config.floatX == "float64" else 1e-5
    synk.close()


def _mode():
    return MODE if launch.current().backend.name == "cpu" else None  # GPU ranks: JAX


def classifier(batch_norm=False):
    """A softmax classifier's graph: (x, y, network, the batch-norm layer or None)."""
    lasagne.random.set_rng(np.random.RandomState(2))
    x, y = pt.matrix("x"), pt.ivector("y")
    net = L.DenseLayer(L.InputLayer((None, 4), x), 5)
    norm = L.BatchNormLayer(net) if batch_norm else None
    net = L.DenseLayer(norm or net, 3, nonlinearity=lasagne.nonlinearities.softmax)
    return x, y, net, norm


def data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(ROWS, 4)).astype(pytensor.config.floatX), rng.integers(0, 3, ROWS)


def test_training_function_returns_its_lines_outputs(session):
    """The per-row predictions whole, the mean and the sum of the loss as the batch's."""
    n, tol = session
    x, y, net, _ = classifier()
    prediction = L.get_output(net)
    ce = lasagne.objectives.categorical_crossentropy(prediction, y)
    params = L.get_all_params(net, trainable=True)
    outputs = [ce.mean(), ce.sum(), prediction, pt.argmax(prediction, axis=1)]
    train = synk.function(
        [x, y], outputs, updates=lasagne.updates.sgd(ce.mean(), params, 0.1), mode=_mode()
    )
    assert isinstance(train, TrainingFunction)
    assert train.output_modes == ["avg", "avg", "gather", "gather"]
    reference = pytensor.function([x, y], outputs, mode=_mode())  # from the same parameters
    X, Y = data()
    for batch, slices in ((None, 1), (np.array([10, 0, 3, 3, 7, 1, 9, 2]), 1), (None, 2)):
        sel = slice(None) if batch is None else batch
        want = reference(X[sel], Y[sel].astype("int32"))
        got = train(X, Y.astype("int32"), batch=batch, num_slices=slices)
        assert got[2].shape == want[2].shape  # every rank's rows, in order
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    want = reference(X, Y.astype("int32"))
    got = train(X, Y.astype("int32"), output_subset=[3, 1])
    np.testing.assert_array_equal(got[0], want[3])
    np.testing.assert_allclose(got[1], want[1], rtol=tol)
    synk.verify()


def test_plain_function_gathers_rows_and_keeps_named_ops(session):
    n, tol = session
    x = pt.matrix("x")
    row_sums, column_sums = x.sum(axis=1), x.sum(axis=0)
    f = synk.function([x], [row_sums, x.mean(), column_sums, x], mode=_mode())
    assert f.output_modes == ["gather", "avg", "avg", "gather"]
    X, _ = data(1)
    got = f(X)
    for g, w in zip(got, [X.sum(axis=1), X.mean(), None, X], strict=True):
        if w is not None:
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    # An op named, in either spelling, is the one used: the ranks' rows averaged
    # (the original's meaning; even shares, so that the shapes agree).
    even = X[: 2 * n]
    for named in (
        synk.function([x], (row_sums, "avg"), mode=_mode()),
        synk.function([x], row_sums, collect_modes="reduce", reduce_ops="avg", mode=_mode()),
    ):
        assert named.output_modes == ["avg"]
        np.testing.assert_allclose(
            named(even), even.sum(axis=1).reshape(n, 2).mean(axis=0), rtol=tol
        )


def test_rows_on_another_axis_are_refused(session):
    x = pt.matrix("x")
    with pytest.raises(ValueError, match=r"output 0 \('x_t'\) has the rows on axis 1, not 0"):
        synk.function([x], x.T.copy(name="x_t"), mode=_mode())
    assert synk.function([x], (x.T, "per_rank"), mode=_mode()).output_modes == ["per_rank"]


def test_a_training_functions_outputs_are_analysed_by_its_split_alone(session, monkeypatch):
    """Which outputs hold the rows, a training function takes from its split's analysis
    of the graph: per-row outputs analyse it no more often than a loss alone does; an
    output with the rows on another axis only is refused as a plain function's is."""
    from synkhronos.api.split import analysis, stored

    analyses = []
    built = analysis.RowGraph.__init__

    def counted(self, *args, **kwargs):
        analyses.append(1)
        built(self, *args, **kwargs)

    monkeypatch.setattr(analysis.RowGraph, "__init__", counted)
    monkeypatch.setattr(stored, "graph_key", lambda *_: None)  # analysed, never loaded
    x, y, net, _ = classifier()
    prediction = L.get_output(net)
    ce = lasagne.objectives.categorical_crossentropy(prediction, y)
    updates = lasagne.updates.sgd(ce.mean(), L.get_all_params(net, trainable=True), 0.1)
    counts = {}
    for name, outputs in (("loss", [ce.mean()]), ("rows", [ce.mean(), prediction, ce])):
        analyses.clear()
        f = synk.function([x, y], outputs, updates=updates, mode=_mode())
        assert isinstance(f, TrainingFunction)
        counts[name] = len(analyses)
    assert f.output_modes == ["avg", "gather", "gather"]
    assert counts["rows"] == counts["loss"] > 0
    with pytest.raises(ValueError, match=r"output 1 \('p_t'\) has the rows on axis 1, not 0"):
        synk.function([x, y], [ce.mean(), prediction.T.copy(name="p_t")], updates=updates)


def test_downcast_applies_to_data_inputs(session):
    """int64 targets and float64 rows as ``synk.data`` (minibatch too), cast as arrays are."""
    n, tol = session
    x, y, net, _ = classifier()
    prediction = L.get_output(net)
    loss = lasagne.objectives.categorical_crossentropy(prediction, y).mean()
    X, Y = data(2)
    wide = X.astype("float64")
    with pytest.raises(TypeError, match="allow_input_downcast=True"):
        synk.function([x, y], loss, mode=_mode())(X, synk.data(Y))
    f = synk.function(
        [x, y], [loss, prediction], allow_input_downcast=True, mode=_mode(), name="downcast"
    )
    want = f(wide, Y)
    batch = np.array([1, 4, 5, 8, 9, 10])
    for args, kwargs in (
        ((synk.data(wide), synk.data(Y)), {}),
        ((synk.data(wide), synk.data(Y[batch], minibatch=True)), {"batch": batch}),
    ):
        got = f(*args, **kwargs)
        sel = kwargs.get("batch", slice(None))
        reference = pytensor.function(
            [x, y], [loss, prediction], allow_input_downcast=True, mode=_mode()
        )
        for g, w in zip(got, reference(wide[sel], Y[sel]), strict=True):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    np.testing.assert_allclose(f(synk.data(wide), synk.data(Y))[1], want[1], rtol=tol)
    # A training function's row phase takes them too.
    params = L.get_all_params(net, trainable=True)
    train = synk.function(
        [x, y], loss, updates=lasagne.updates.sgd(loss, params, 0.1), allow_input_downcast=True
    )
    np.testing.assert_allclose(train(synk.data(wide), synk.data(Y)), want[0], rtol=tol)
    synk.verify()


def test_downcast_data_changed_in_place_is_read_anew(session):
    """A call like the last one with ``Data`` cast by ``allow_input_downcast`` (scattered,
    and broadcast) reads the Data's present values, not the cast of the first call's."""
    n, tol = session
    x, c = pt.matrix("x"), pt.vector("c")
    f = synk.function([x], (x * c.sum()).sum(axis=1), bcast_inputs=[c], allow_input_downcast=True)
    rng = np.random.default_rng(9)
    wide, scale = synk.data(rng.normal(size=(ROWS, 3))), synk.data(np.array([1.0, 2.0]))
    for _ in range(3):
        want = (wide.data * scale.data.sum()).sum(axis=1).astype(pytensor.config.floatX)
        np.testing.assert_allclose(f(wide, scale), want, rtol=tol, atol=tol)
        wide.data[...] = rng.normal(size=wide.shape)  # in place: the same Data, layout
        scale.data[...] += 1.0


def test_batch_norm_averages_are_read_by_the_users_variable(session):
    """Its graph updates a clone of each running average; the user's variable reads it on
    every rank, and a function built later (shipped apart) reads the same storage."""
    n, tol = session
    x, y, net, norm = classifier(batch_norm=True)
    loss = lasagne.objectives.categorical_crossentropy(L.get_output(net), y).mean()
    params = L.get_all_params(net, trainable=True)
    updates = lasagne.updates.sgd(loss, params, 0.1)
    averages = [norm.mean, norm.inv_std]
    start = [v.get_value() for v in params + averages]
    train = synk.function([x, y], loss, updates=updates, mode=_mode())
    X, Y = data(3)
    Y = Y.astype("int32")
    train(X, Y)
    synk.broadcast(averages[0], synk.get_value(0, averages[0]))  # a collective by it, too
    test = synk.function([x], L.get_output(net, deterministic=True), mode=_mode())
    test(X)
    train(X, Y)
    got = [[synk.get_value(r, v) for r in range(n)] for v in averages]
    predicted = test(X)
    for v, value in zip(params + averages, start, strict=True):
        v.set_value(value)  # on rank 0 only: the reference runs there
    reference = pytensor.function([x, y], loss, updates=updates, mode=_mode())
    reference(X, Y)
    reference(X, Y)
    for per_rank, v in zip(got, averages, strict=True):
        for r in range(n):
            assert np.array_equal(per_rank[r], per_rank[0]), (v, r)
        np.testing.assert_allclose(per_rank[0], v.get_value(), rtol=tol, atol=tol)
    np.testing.assert_allclose(predicted, test.as_pytensor(X), rtol=tol, atol=tol)
    synk.broadcast(params + averages)  # every rank takes the reference's values


def test_spatial_transformer_returns_its_predictions(session):
    """As the Recipes' spatial transformer program asks: its training function's
    predictions, for the program's own accuracy, every row of the batch."""
    n, tol = session
    lasagne.random.set_rng(np.random.RandomState(4))
    x, y = pt.tensor4("x"), pt.ivector("y")
    l_in = L.InputLayer((None, 1, 8, 8), x)
    b = np.eye(2, 3).ravel().astype(pytensor.config.floatX)  # as the Recipes write it
    loc = L.DenseLayer(l_in, 6, W=lasagne.init.Constant(0.0), b=b)
    net = L.TransformerLayer(l_in, loc, downsample_factor=2)
    net = L.DenseLayer(net, 3, nonlinearity=lasagne.nonlinearities.softmax)
    prediction = L.get_output(net)
    loss = lasagne.objectives.categorical_crossentropy(prediction, y).mean()
    params = L.get_all_params(net, trainable=True)
    train = synk.function(
        [x, y], [loss, prediction], updates=lasagne.updates.adam(loss, params), mode=_mode()
    )
    reference = pytensor.function([x, y], [loss, prediction], mode=_mode())
    rng = np.random.default_rng(5)
    X = rng.normal(size=(ROWS, 1, 8, 8)).astype(pytensor.config.floatX)
    Y = rng.integers(0, 3, ROWS).astype("int32")
    want = reference(X, Y)
    got = train(X, Y)
    assert got[1].shape == (ROWS, 3)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    accuracy = np.mean(np.argmax(got[1], axis=1) == Y)  # the program's own line
    assert accuracy == np.mean(np.argmax(want[1], axis=1) == Y)


def test_a_generator_cloned_later_keeps_its_draws_one_devices(session):
    """A training function's dropout draws the whole batch's numbers from rank 0's state on
    every rank; a function shipped later with a clone of that generator (its storage)
    leaves the state as it is on every rank, so the next step still draws one device's."""
    n, tol = session
    lasagne.random.set_rng(np.random.RandomState(6))
    x, y = pt.matrix("x"), pt.ivector("y")
    net = L.DropoutLayer(L.DenseLayer(L.InputLayer((None, 4), x), 5), p=0.5)
    net = L.DenseLayer(net, 3, nonlinearity=lasagne.nonlinearities.softmax)
    loss = lasagne.objectives.categorical_crossentropy(L.get_output(net), y).mean()
    params = L.get_all_params(net, trainable=True)
    updates = lasagne.updates.sgd(loss, params, 0.1)
    (generator,) = [
        v
        for v in pytensor.graph.traversal.graph_inputs([loss])
        if isinstance(v.type, pytensor.tensor.random.type.RandomType)
    ]
    start = [copy.deepcopy(v.get_value()) for v in [*params, generator]]
    train = synk.function([x, y], loss, updates=updates, mode=_mode())
    X, Y = data(4)
    Y = Y.astype("int32")
    train(X, Y)
    clone = generator.clone()
    draws = synk.function([x], pt.random.normal(size=x.shape, rng=clone), mode=_mode())
    assert draws(X).shape == X.shape
    train(X, Y)
    got = [p.get_value() for p in params]
    for v, value in zip([*params, generator], start, strict=True):
        v.set_value(value)  # on rank 0 only: the reference runs there
    reference = pytensor.function([x, y], loss, updates=updates, mode=_mode())
    reference(X, Y)
    reference(X, Y)
    for g, p in zip(got, params, strict=True):
        np.testing.assert_allclose(g, p.get_value(), rtol=tol, atol=tol)
    synk.broadcast(params)
