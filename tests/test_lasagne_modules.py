"""Numerics of the Lasagne port's regularization, utils, random, nonlinearities, objectives."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne import nonlinearities, objectives, regularization, utils


def small_net(rng):
    inp = L.InputLayer((None, 3))
    hidden = L.DenseLayer(inp, 4, W=rng.standard_normal((3, 4)), b=rng.standard_normal(4))
    out = L.DenseLayer(hidden, 2, W=rng.standard_normal((4, 2)), b=rng.standard_normal(2))
    return hidden, out


def test_penalties_and_network_regularization(rng):
    hidden, out = small_net(rng)
    w1, w2 = hidden.W.get_value(), out.W.get_value()
    x = rng.standard_normal((2, 3))
    assert float(regularization.l2(pt.as_tensor(x)).eval()) == pytest.approx(np.sum(x**2))
    assert float(regularization.l1(pt.as_tensor(x)).eval()) == pytest.approx(np.abs(x).sum())
    # Biases are not regularizable: only the two weight matrices count.
    total = regularization.regularize_network_params(out, regularization.l2)
    assert float(total.eval()) == pytest.approx(np.sum(w1**2) + np.sum(w2**2))
    own = regularization.regularize_layer_params(out, regularization.l1)
    assert float(own.eval()) == pytest.approx(np.abs(w2).sum())
    both = regularization.regularize_layer_params([hidden, out], regularization.l2)
    assert float(both.eval()) == pytest.approx(np.sum(w1**2) + np.sum(w2**2))
    weighted = regularization.regularize_layer_params_weighted(
        {hidden: 0.1, out: 0.5}, regularization.l2
    )
    assert float(weighted.eval()) == pytest.approx(0.1 * np.sum(w1**2) + 0.5 * np.sum(w2**2))
    with_biases = regularization.regularize_network_params(out, regularization.l2, tags={})
    expected = sum(np.sum(p.get_value() ** 2) for p in L.get_all_params(out))
    assert float(with_biases.eval()) == pytest.approx(expected)
    penalty = regularization.apply_penalty([hidden.W, out.W], regularization.l2)
    assert float(penalty.eval()) == pytest.approx(np.sum(w1**2) + np.sum(w2**2))


def test_l2_gradient_is_weight_decay(rng):
    hidden, out = small_net(rng)
    penalty = regularization.regularize_network_params(out, regularization.l2)
    grads = pytensor.grad(penalty, [hidden.W, out.W, out.b], disconnected_inputs="ignore")
    got = pytensor.function([], grads)()
    np.testing.assert_allclose(got[0], 2 * hidden.W.get_value())
    np.testing.assert_allclose(got[1], 2 * out.W.get_value())
    np.testing.assert_array_equal(got[2], 0)


def test_utils(rng):
    labels = np.array([2, 0, 1, 2])
    np.testing.assert_array_equal(utils.one_hot(labels, 4).eval(), np.eye(4)[labels])
    w = rng.standard_normal((3, 2, 2, 2))
    np.testing.assert_allclose(utils.compute_norms(w), np.sqrt((w**2).sum(axis=(1, 2, 3))))
    sym = utils.compute_norms(pt.as_tensor(w), norm_axes=(0, 2)).eval()
    np.testing.assert_allclose(sym, np.sqrt((w**2).sum(axis=(0, 2))))
    a, b = pytensor.shared(1.0, name="a"), pytensor.shared(2.0, name="b")
    assert sorted(v.name for v in utils.collect_shared_vars([a * b + a, b])) == ["a", "b"]
    assert utils.unique([b, a, b]) == [b, a]
    assert utils.as_tuple(np.int64(2), 3) == (2, 2, 2)
    with pytest.raises(ValueError, match="length 3"):
        utils.as_tuple((1, 2), 3)
    with pytest.raises(TypeError):
        utils.as_tuple((1.0, 2), 2, utils.int_types)
    assert utils.inspect_kwargs(L.DenseLayer.__init__)[:2] == ["W", "b"]
    assert utils.shared_empty(2, "int32").get_value().shape == (1, 1)
    assert utils.floatX([1]).dtype == pytensor.config.floatX
    assert utils.create_param(np.ones(2), (2,), "p").name == "p"
    with pytest.raises(TypeError):
        utils.as_theano_expression(object())


@pytest.mark.parametrize("go_backwards", [False, True])
def test_unroll_scan_matches_scan(rng, go_backwards):
    seq = pt.matrix("seq")
    h0 = pt.vector("h0")
    w = pt.matrix("w")

    def step(x_t, h, w):
        return pt.tanh(x_t + h @ w)

    unrolled = utils.unroll_scan(step, [seq], [h0], [w], n_steps=4, go_backwards=go_backwards)[0]
    scanned = pytensor.scan(
        step, sequences=[seq], outputs_info=[h0], non_sequences=[w], go_backwards=go_backwards
    )
    scanned = scanned[0] if isinstance(scanned, tuple) else scanned
    fn = pytensor.function([seq, h0, w], [unrolled, scanned])
    values = rng.standard_normal((4, 3)), rng.standard_normal(3), rng.standard_normal((3, 3))
    got, expected = fn(*values)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_set_rng_takes_a_randomstate_or_a_seed():
    lasagne.random.set_rng(np.random.RandomState(3))
    first = lasagne.init.GlorotUniform()((3, 4))
    assert isinstance(lasagne.random.get_rng().randint(10), int)
    lasagne.random.set_rng(3)
    np.testing.assert_array_equal(lasagne.init.GlorotUniform()((3, 4)), first)
    assert lasagne.init.get_rng is lasagne.random.get_rng


def test_sparse_init():
    lasagne.random.set_rng(0)
    w = lasagne.init.Sparse(sparsity=0.25, std=2.0)((8, 5))
    assert np.all((w != 0).sum(axis=0) == 2)
    with pytest.raises(RuntimeError):
        lasagne.init.Sparse()((2, 2, 2))


def test_new_nonlinearities(rng):
    x = rng.standard_normal(7)
    np.testing.assert_allclose(
        nonlinearities.ScaledTanH(0.5, 2.0)(pt.as_tensor(x)).eval(), 2 * np.tanh(0.5 * x)
    )
    scale, neg = 1.0507009873554805, 1.6732632423543772
    expected = scale * np.where(x > 0, x, neg * np.expm1(x))
    np.testing.assert_allclose(nonlinearities.selu(pt.as_tensor(x)).eval(), expected)
    assert nonlinearities.ScaledTanh is nonlinearities.ScaledTanH


def test_new_objectives(rng):
    p = rng.uniform(0.05, 0.95, 6)
    t = rng.integers(0, 2, 6).astype(float)
    log_odds = np.log(p / (1 - p))
    hinge = objectives.binary_hinge_loss(pt.as_tensor(p), pt.as_tensor(t), log_odds=False).eval()
    np.testing.assert_allclose(hinge, np.maximum(0, 1 - log_odds * (2 * t - 1)))
    # Lasagne's default, log_odds=None, warns and takes the predictions as log-odds
    with pytest.warns(UserWarning, match="log_odds"):
        default = objectives.binary_hinge_loss(pt.as_tensor(log_odds), pt.as_tensor(t))
    np.testing.assert_allclose(default.eval(), hinge)
    scores = rng.standard_normal((4, 3))
    labels = np.array([0, 2, 1, 1])
    got = objectives.multiclass_hinge_loss(pt.as_tensor(scores), pt.as_tensor(labels), 0.5)
    rest = np.where(np.eye(3)[labels] == 1, -np.inf, scores).max(axis=1)
    expected = np.maximum(0, rest - scores[np.arange(4), labels] + 0.5)
    np.testing.assert_allclose(got.eval(), expected)
    one_hot = objectives.multiclass_hinge_loss(
        pt.as_tensor(scores), pt.as_tensor(np.eye(3)[labels])
    )
    np.testing.assert_allclose(
        one_hot.eval(), np.maximum(0, rest - scores[np.arange(4), labels] + 1)
    )
    d = rng.standard_normal(8) * 2
    huber = objectives.huber_loss(pt.as_tensor(d), pt.as_tensor(np.zeros(8)), delta=1.5).eval()
    np.testing.assert_allclose(huber, np.where(abs(d) <= 1.5, d**2 / 2, 1.5 * (abs(d) - 0.75)))
    acc = objectives.binary_accuracy(pt.as_tensor(p), pt.as_tensor(t), threshold=0.4).eval()
    np.testing.assert_array_equal(acc, (p >= 0.4) == t)
