"""A training function is a synkhronos function like any other: chained with others
(its phases inlined), verified, saved and loaded, timed, and every method of the
original API's functions; on 2 CPU ranks with uneven rows, against the same steps
unchained and against ``pytensor.function`` in one process."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.api.functions import BaseFunction
from synkhronos.api.training import TrainingFunction
from synkhronos.tools import timeline_report

MODE = "FAST_COMPILE"
ROWS = 27  # 2 ranks: 14 and 13 rows
BATCHES = [None, slice(2, 25), np.array([0, 3, 4, 7, 8, 9, 12, 16, 20, 26]), 11]


def mlp(seed=0, name="mlp"):
    """A small MLP's training step (SGD on a mean squared error; the predictions gathered)
    and a function of its parameters with no inputs (their squared norm, and a counter)."""
    init = np.random.default_rng(seed)
    x, y = pt.matrix("x", dtype="float64"), pt.vector("y", dtype="float64")
    w1 = pytensor.shared(init.normal(size=(5, 8)), name=f"{name}_w1")
    b1 = pytensor.shared(np.zeros(8), name=f"{name}_b1")
    w2 = pytensor.shared(init.normal(size=8), name=f"{name}_w2")
    count = pytensor.shared(np.float64(0), name=f"{name}_count")
    params = [w1, b1, w2]
    prediction = pt.tanh(x @ w1 + b1) @ w2
    loss = ((prediction - y) ** 2).mean()
    updates = [(p, p - 0.05 * g) for p, g in zip(params, pytensor.grad(loss, params), strict=True)]
    graph = ([x, y], [loss, (prediction, "gather")], updates)
    norm = sum((p**2).sum() for p in params)
    return graph, (norm, count), params


def synk_mlp(seed=0, name="mlp"):
    (inputs, outputs, updates), (norm, count), params = mlp(seed, name)
    train = synk.function(inputs, outputs, updates=updates, name=name, mode=MODE)
    other = synk.function(
        [], (norm, "max"), updates=[(count, count + 1)], name=f"{name} norm", mode=MODE
    )
    return train, other, params + [count]


def data(rng):
    return rng.standard_normal((ROWS, 5)), rng.standard_normal(ROWS)


def rows(array, batch):
    if batch is None:
        return array
    return array[:batch] if isinstance(batch, int) else array[batch]


def test_a_chained_training_step_equals_the_steps_unchained(ranks, rng):
    x, y = data(rng)
    train, other, chained_state = synk_mlp(name="chained")
    assert isinstance(train, TrainingFunction)
    step = synk.chain(train, other)
    apart_train, apart_other, apart_state = synk_mlp(name="apart")
    (inputs, outputs, updates), (norm, count), reference_state = mlp(name="reference")
    plain = [o[0] if isinstance(o, tuple) else o for o in outputs]
    reference = pytensor.function(inputs, plain, updates=updates, mode=MODE)
    reference_norm = pytensor.function([], norm, updates=[(count, count + 1)], mode=MODE)
    for batch in BATCHES:
        (loss, predictions), total = step(x, y, batch=batch)
        apart_loss, apart_predictions = apart_train(x, y, batch=batch)
        assert total == apart_other()
        np.testing.assert_array_equal(loss, apart_loss)
        np.testing.assert_array_equal(predictions, apart_predictions)
        expected_loss, expected_predictions = reference(rows(x, batch), rows(y, batch))
        np.testing.assert_allclose(loss, expected_loss, rtol=1e-10)
        np.testing.assert_allclose(predictions, expected_predictions, rtol=1e-10)
        np.testing.assert_allclose(total, reference_norm(), rtol=1e-10)
    for chained, apart, expected in zip(
        chained_state, apart_state, [*reference_state, count], strict=True
    ):
        for value in synk.gather(chained):
            np.testing.assert_array_equal(value, synk.gather(apart)[0])
            np.testing.assert_allclose(value, expected.get_value(), rtol=1e-10)
    synk.verify()  # every rank bit-identical
    only_predictions = step(x, y, batch=slice(0, 20), output_subset=[1])
    np.testing.assert_array_equal(only_predictions[0], apart_train(x, y, batch=slice(0, 20))[1])
    assert only_predictions[1] == apart_other()
    synk.verify()


def test_a_training_function_is_a_chain_first_step(ranks, rng):
    x, y = data(rng)
    train, other, _ = synk_mlp(name="order")
    with pytest.raises(TypeError, match="only the chain's first"):
        synk.chain(other, train)
    with pytest.raises(TypeError, match="only the chain's first"):
        synk.chain(train, train)
    step = synk.chain(train, other)
    with pytest.raises(ValueError, match="none to rank"):  # a rank without rows
        step(x, y, batch=1)
    synk.verify()


def test_every_method_of_a_function(ranks, rng):
    x, y = data(rng)
    train, _, state = synk_mlp(name="methods")
    assert isinstance(train, synk.BaseFunction) and synk.BaseFunction is BaseFunction
    assert not isinstance(train, synk.Function)  # a chain of them (docs/api.rst)
    assert train.name == "methods" and repr(train) == "<synkhronos.TrainingFunction methods>"
    assert [v.name for v in train.inputs] == ["x", "y"]
    assert train.output_modes == ["avg", "gather"] and train.update_modes == ["avg"] * 3
    assert train.mode == train.row_function.mode == train.reduced_function.mode
    shared = {id(v) for v in train.get_shared()}
    assert all(id(v) in shared for v in state[:3])
    x_data, y_data = train.build_inputs(x, y, minibatch=[False, False])
    assert isinstance(x_data, synk.Data) and len(y_data) == ROWS
    before = [p.get_value() for p in state[:3]]
    reference = train.as_theano(x[:20], y[:20])  # as_pytensor: in rank 0 alone
    moved = [p.get_value() for p in state[:3]]
    for p, value in zip(state[:3], before, strict=True):
        p.set_value(value)  # as the other rank's again
    by_name = train(y=y, x=x, batch=20)
    np.testing.assert_allclose(by_name[0], reference[0], rtol=1e-10)
    np.testing.assert_allclose(by_name[1], reference[1], rtol=1e-10)
    for p, value in zip(state[:3], moved, strict=True):
        np.testing.assert_allclose(p.get_value(), value, rtol=1e-10)
    synk.verify()
    by_data = train(x_data, y_data, batch=20)  # the same rows, from the moved params
    assert by_data[0] < by_name[0]
    synk.verify()
    loss = train(x, y, output_subset=[0])
    assert np.ndim(loss) == 0
    synk.verify()


def test_verify_save_and_load(ranks, rng, tmp_path):
    x, y = data(rng)
    train, other, state = synk_mlp(name="saved")
    step = synk.chain(train, other)
    step(x, y, batch=17)
    synk.verify()
    path = tmp_path / "run.ckpt"
    synk.save(path, extra={"step": 1})
    saved = [p.get_value() for p in state]
    after = step(x, y)
    train(x, y, batch=slice(3, 26))
    assert synk.load(path) == {"step": 1}
    for p, value in zip(state, saved, strict=True):
        for got in synk.gather(p):
            np.testing.assert_array_equal(got, value)
    again = step(x, y)  # resumed: the same step as after saving
    np.testing.assert_array_equal(again[0][0], after[0][0])
    assert again[1] == after[1]
    synk.verify()
    changed = state[0].get_value() + 1
    state[0].set_value(changed)  # rank 0 alone: pending, sent by the check as by a call
    synk.verify()
    for got in synk.gather(state[0]):
        np.testing.assert_array_equal(got, changed)


def test_the_timeline_shows_every_phase_on_every_rank(ranks, rng, tmp_path):
    x, y = data(rng)
    train, other, _ = synk_mlp(name="timed")
    step = synk.chain(train, other)
    step(x, y)  # compiled outside the timeline
    path = tmp_path / "t.json"
    with synk.timeline(path):
        train(x, y, batch=15)
        step(x, y)
    timeline = timeline_report.read(path)
    assert sorted(timeline.spans) == [0, 1]
    for spans in timeline.spans.values():
        names = [span.name for span in spans]
        assert names.count("CHAIN") == 2
        for phase in ("timed (rows)", "timed (reduced)"):
            assert names.count(phase) == 2, (phase, sorted(set(names)))
        assert names.count("timed norm") == 1


def test_a_fresh_program_loads_before_its_first_call(ranks, rng, tmp_path):
    """Save, then load in a new session before any call (what the phases hand over has
    no shape yet there): the resumed step is the step after saving. Forks anew: the
    module's last test."""
    x, y = data(rng)
    path = tmp_path / "run.ckpt"
    results = []
    for resumed in (False, True):
        synk.close()
        synk.fork(2, backend="cpu")
        step = synk.chain(*synk_mlp(name="fresh")[:2])
        if resumed:
            synk.load(path)
        else:
            step(x, y, batch=slice(4, 21))
            synk.save(path)
        results.append(step(x, y))
        synk.verify()
    np.testing.assert_array_equal(results[0][0][0], results[1][0][0])
    np.testing.assert_array_equal(results[0][0][1], results[1][0][1])
    assert results[0][1] == results[1][1]
