"""A Lasagne training script goes data-parallel by its function line.

Three scripts of the kind Lasagne's examples are (an MLP with dropout, a CNN, an LSTM),
each built as a user writes it, with ``theano.function`` replaced by ``synk.function``;
5 steps on 2 and 3 ranks with uneven rows, ``batch`` and ``num_slices``, against the
same script run by ``pytensor.function`` in one process: parameters and optimizer state
equal (float tolerance) and bit-identical on every rank.
"""

import logging
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.tensor.random.type import RandomType

import synkhronos as synk
from synkhronos.api.split import phases, stored
from synkhronos.api.training import TrainingFunction
from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne import layers as L
from synkhronos.session import launch

pytestmark = pytest.mark.parametrize("ranks", [2, 3], indirect=True)

MODE = "FAST_COMPILE"  # every rank compiles each graph; the default mode is tested elsewhere
ROWS = 17  # 2 ranks: 9/8, 3 ranks: 6/6/5
STEPS = [(None, 1), (slice(2, 15), 2), (np.array([0, 3, 4, 7, 8, 9, 12, 16]), 1), (11, 1),
         (None, 3)]  # fmt: skip
RULES = {
    "adam": {"learning_rate": 0.01},
    "nesterov_momentum": {"learning_rate": 0.05, "momentum": 0.9},
    "sgd": {"learning_rate": 0.1},
}


def mlp(input_var):
    net = L.InputLayer((None, 6), input_var)
    net = L.DenseLayer(net, 12, nonlinearity=lasagne.nonlinearities.rectify)
    net = L.DropoutLayer(net, p=0.5)
    return L.DenseLayer(net, 3, nonlinearity=lasagne.nonlinearities.softmax)


def cnn(input_var, batch_norm=False):
    net = L.InputLayer((None, 1, 6, 6), input_var)
    net = L.Conv2DLayer(net, 3, (3, 3), nonlinearity=lasagne.nonlinearities.rectify)
    if batch_norm:
        net = L.BatchNormLayer(net)
    net = L.MaxPool2DLayer(net, (2, 2))
    return L.DenseLayer(net, 3, nonlinearity=lasagne.nonlinearities.softmax)


def lstm(input_var):
    net = L.InputLayer((None, 4, 3), input_var)
    net = L.LSTMLayer(net, 5, only_return_final=True)
    return L.DenseLayer(net, 3, nonlinearity=lasagne.nonlinearities.softmax)


def mlp_bn(input_var):
    """Batch normalization, then dropout: the mask's size waits for the statistics."""
    net = L.BatchNormLayer(L.DenseLayer(L.InputLayer((None, 6), input_var), 12))
    net = L.DropoutLayer(net, p=0.5)
    return L.DenseLayer(net, 3, nonlinearity=lasagne.nonlinearities.softmax)


SCRIPTS = {"mlp": (mlp, pt.matrix, (6,)), "mlp_bn": (mlp_bn, pt.matrix, (6,)),
           "cnn": (cnn, pt.tensor4, (1, 6, 6)), "lstm": (lstm, pt.tensor3, (4, 3))}  # fmt: skip


def script(name, rule, aggregate, **kwargs):
    """The script's graph: network, loss, accuracy and the rule's updates."""
    build, input_type, shape = SCRIPTS[name]
    input_var, target_var = input_type("inputs"), pt.ivector("targets")
    network = build(input_var, **kwargs)
    prediction = L.get_output(network)
    loss = lasagne.objectives.categorical_crossentropy(prediction, target_var)
    loss = lasagne.objectives.aggregate(loss, mode=aggregate)
    penalty = 1e-3 * lasagne.regularization.regularize_network_params(
        network, lasagne.regularization.l2
    )
    params = L.get_all_params(network, trainable=True)
    updates = getattr(lasagne.updates, rule)(loss + penalty, params, **RULES[rule])
    accuracy = pt.mean(pt.eq(pt.argmax(prediction, axis=1), target_var), dtype="float64")
    return input_var, target_var, loss, accuracy, updates, shape


def data(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, *shape)).astype(pytensor.config.floatX)
    return x, rng.integers(0, 3, ROWS).astype("int32")


def state_of(variables):
    """Values to compare; a random generator's as its state's numbers (a JAX key's, where
    JAX mode draws from the variable's own storage: ``share_generators``)."""
    return [
        _generator_state(v.get_value()) if isinstance(v.type, RandomType) else v.get_value()
        for v in variables
    ]


def _generator_state(value) -> np.ndarray:
    if isinstance(value, dict):
        return np.asarray(value["jax_state"])
    return np.array(value.bit_generator.state["state"]["state"], dtype=object)


def run_both(name, rule, aggregate, mode=MODE, **kwargs):
    """5 steps data-parallel (checking that the ranks stay bit-identical), then the same
    from the same start in one process (rank 0 alone), both compiled in ``mode``."""
    lasagne.random.set_rng(np.random.RandomState(3))
    input_var, target_var, loss, accuracy, updates, shape = script(name, rule, aggregate, **kwargs)
    x, y = data(shape)
    inputs = list(pytensor.graph.traversal.graph_inputs([loss]))
    running = [
        v
        for v in inputs
        if getattr(v, "default_update", None) is not None and not isinstance(v.type, RandomType)
    ]  # fmt: skip  (batch normalization's averages)
    variables = list(updates) + running + [v for v in inputs if isinstance(v.type, RandomType)]
    start = [v.get_value() for v in variables]
    train_fn = synk.function([input_var, target_var], [loss, accuracy], updates=updates, mode=mode)
    # Dropout and batch statistics: num_slices=1.
    one_slice = name.startswith("mlp") or kwargs.get("batch_norm")
    steps = [(b, 1 if one_slice else k) for b, k in STEPS]
    outs = [train_fn(x, y, batch=batch, num_slices=k) for batch, k in steps]
    assert_identical_on_ranks(variables, launch.current().n_ranks)
    synk.verify()  # every shared variable, less those kept per rank by design
    trained = state_of(variables)
    for v, value in zip(variables, start, strict=True):
        v.set_value(value)  # on rank 0 only: the reference runs there
    ref_fn = pytensor.function(
        [input_var, target_var], [loss, accuracy], updates=updates, mode=mode
    )
    if mode == "JAX":  # it draws from, and moves, the variables, as the ranks do
        from synkhronos.rank.backends.jax_compat import share_generators

        share_generators(ref_fn)
    ref_outs = [ref_fn(*(a if b is None else a[:b] if isinstance(b, int) else a[b] for a in (x, y)))
                for b, _ in STEPS]  # fmt: skip
    # Rank 0 now holds the reference's values: every rank takes them (a later test's
    # synk.verify compares every variable of the session).
    synk.broadcast([v for v in variables if not isinstance(v.type, RandomType)])
    return train_fn, variables, trained, state_of(variables), outs, ref_outs


def assert_identical_on_ranks(variables, ranks):
    variables = [v for v in variables if not isinstance(v.type, RandomType)]
    for var, stacked in zip(variables, synk.gather(variables, nd_up=1), strict=True):
        assert stacked.shape[0] == ranks
        for r in range(1, ranks):
            assert np.array_equal(stacked[r], stacked[0]), (var, r)


CASES = [
    ("mlp", "adam", "mean"),
    ("mlp", "nesterov_momentum", "sum"),
    ("mlp", "sgd", "mean"),
    ("cnn", "adam", "sum"),
    ("cnn", "sgd", "mean"),
    ("lstm", "adam", "mean"),
    ("lstm", "nesterov_momentum", "sum"),
]


@pytest.mark.parametrize("name, rule, aggregate", CASES)
def test_one_device_answer_on_every_rank(ranks, name, rule, aggregate):
    assert_one_device_answer(name, rule, aggregate)


@pytest.mark.parametrize(
    ("rule", "aggregate"), [("adam", "mean"), ("nesterov_momentum", "sum"), ("sgd", "mean")]
)
def test_batch_normalization_uses_the_whole_batchs_statistics(ranks, rule, aggregate):
    """Batch statistics in rounds: each rank's sums, summed over the ranks, before the
    rows go on; the running averages are one device's too."""
    train_fn = assert_one_device_answer("cnn", rule, aggregate, batch_norm=True)
    assert train_fn.round_functions  # the statistics took rounds
    x, y = data((1, 6, 6))
    with pytest.raises(ValueError, match="num_slices=1"):
        train_fn(x, y, num_slices=2)


def test_statistics_past_the_rounds_limit_warn_and_ranks_stay_identical(ranks, monkeypatch):
    monkeypatch.setattr(phases, "MAX_ROUNDS", 2)
    with pytest.warns(
        UserWarning, match=r"computes them from its own rows, since .* over MAX_ROUNDS \(2"
    ):
        train_fn, *_ = run_both("cnn", "adam", "mean", batch_norm=True)  # checks the ranks
    assert not train_fn.round_functions


def assert_one_device_answer(name, rule, aggregate, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_fn, variables, trained, ref, outs, ref_outs = run_both(
            name, rule, aggregate, **kwargs
        )
    assert not [w for w in caught if "synkhronos" in str(w.message)]  # exact: nothing said
    assert isinstance(train_fn, TrainingFunction)
    for var, got, want in zip(variables, trained, ref, strict=True):
        if isinstance(var.type, RandomType):
            assert np.array_equal(got, want), var  # the generators drew one device's numbers
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(var))
    np.testing.assert_allclose(np.array(outs, float), np.array(ref_outs, float), rtol=1e-5)
    return train_fn


def test_draws_per_row_need_one_slice(ranks):
    train_fn, *_ = run_both("mlp", "sgd", "mean")
    x, y = data((6,))
    with pytest.raises(ValueError, match="num_slices=1"):
        train_fn(x, y, num_slices=2)


def test_dropout_after_batch_normalization(ranks):
    """A dropout mask whose size waits for a statistic is drawn in a later round, for the
    whole batch, from the rows' positions that the first round kept."""
    train_fn = assert_one_device_answer("mlp_bn", "adam", "mean")
    assert train_fn.round_functions


@pytest.mark.parametrize("name", ["mlp", "mlp_bn"])
def test_dropout_in_jax_mode(ranks, name):
    """JAX traces the row phase with its inputs' values unknown: the whole batch's mask
    takes its size from an input's length, and the rank's rows by their positions as
    indices (a slice's bounds would have to be known)."""
    if ranks != 2:
        pytest.skip("one rank count suffices (each compiles its own JAX programs)")
    pytest.importorskip("jax")
    assert_one_device_answer(name, "adam", "mean", mode="JAX")


def test_a_stored_split_gives_the_one_device_answer(ranks, caplog):
    """The same script built again (a later run) loads the split the first build stored
    (or found), and still computes one device's answer."""
    with caplog.at_level(logging.INFO, logger=stored.__name__):
        assert_one_device_answer("mlp_bn", "adam", "mean")
        caplog.clear()
        train_fn = assert_one_device_answer("mlp_bn", "adam", "mean")
    assert any("phase split loaded" in r.getMessage() for r in caplog.records)
    assert train_fn.round_functions


def test_running_averages_alone_do_not_train(ranks):
    """The original's two-phase rules write a gradient for an explicit all-reduce: with
    batch normalization (whose running averages the rows read, as Lasagne makes them)
    the function keeps its per-rank meaning, and nothing is said."""
    from synkhronos.extensions import updates as original_rules

    input_var, target_var, loss, _, _, _ = script("cnn", "sgd", "mean", batch_norm=True)
    network_params = [
        v for v in pytensor.graph.traversal.graph_inputs([loss])
        if isinstance(v, pytensor.compile.sharedvalue.SharedVariable)
        and getattr(v, "default_update", None) is None and not isinstance(v.type, RandomType)
    ]  # fmt: skip
    grad_updates, _, _ = original_rules.sgd(loss, network_params, learning_rate=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f_grad = synk.function([input_var, target_var], loss, updates=grad_updates)
    assert not isinstance(f_grad, TrainingFunction)


def test_per_rank_updates_on_request(ranks):
    input_var, target_var, loss, _, updates, shape = script("mlp", "sgd", "mean")
    train_fn = synk.function([input_var, target_var], loss, updates=updates, local_updates=True)
    assert not isinstance(train_fn, TrainingFunction)


def test_an_update_reading_a_maximum_over_rows_is_exact(ranks):
    """A maximum over the rows that only the update reads crosses to the reduced phase
    by an all-reduce with "max" (was warned "not a sum")."""
    x = pt.dmatrix("x")
    w = pytensor.shared(np.ones(3), name="w")
    updates = [(w, w - 0.1 * (x * w).max(axis=0))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = synk.function([x], updates=updates, mode=MODE)
    assert isinstance(f, TrainingFunction)
    xs = np.random.default_rng(3).normal(size=(ROWS, 3))
    for _ in range(2):
        f(xs)
    assert_identical_on_ranks([w], ranks)
    trained = w.get_value()
    w.set_value(np.ones(3))
    ref = pytensor.function([x], updates=updates, mode=MODE)
    for _ in range(2):
        ref(xs)
    np.testing.assert_allclose(trained, w.get_value(), rtol=1e-12)
    synk.broadcast([w])


def test_an_update_that_cannot_be_exact_warns(ranks):
    x = pt.matrix("x")
    w = pytensor.shared(np.ones(3), name="w")
    with pytest.warns(UserWarning, match="not a sum"):
        f = synk.function([x], updates=[(w, w - 0.1 * (x * w).prod(axis=0))], mode=MODE)
    assert isinstance(f, TrainingFunction)
    f(np.arange(12.0).reshape(4, 3))
    assert_identical_on_ranks([w], ranks)


def test_theano_function_keywords(ranks):
    """allow_input_downcast and on_unused_input, where one device's function takes them,
    also by make_step_function."""
    from synkhronos.extensions import train

    x, y, z = pt.fmatrix("x"), pt.fvector("y"), pt.fvector("unused")
    w = pytensor.shared(np.zeros(3, "float32"), name="w")
    loss = pt.mean((x @ w - y) ** 2)
    rule = lasagne.updates.sgd(loss, [w], learning_rate=0.1)
    xs, ys = np.ones((5, 3)), np.arange(5.0)  # float64: downcast to float32
    f = synk.function(
        [x, y, z], loss, updates=rule, allow_input_downcast=True, on_unused_input="ignore"
    )
    f(xs, ys, ys)
    w_after = w.get_value()
    assert np.abs(w_after).max() > 0
    synk.broadcast(w, np.zeros(3, "float32"))
    step = train.make_step_function(
        loss, [w], [x, y, z], lasagne.updates.sgd, learning_rate=0.1,
        allow_input_downcast=True, on_unused_input="ignore",
    )  # fmt: skip
    step(xs, ys, ys)
    np.testing.assert_allclose(w.get_value(), w_after, rtol=1e-6)
    with pytest.raises(TypeError, match="lose precision"):
        synk.function([x, y], loss, updates=rule)(xs, ys)
