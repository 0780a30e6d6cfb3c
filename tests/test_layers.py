"""Tests of synkhronos.extensions.lasagne.layers, init, nonlinearities and objectives.

Layer outputs are checked against hand computations in NumPy/SciPy.  Graphs compile
with the Python linker (``FAST_COMPILE``): these tests are about layer semantics, and
tests/test_ops2d.py covers the conv/pool kernels under each linker.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from scipy.signal import convolve2d, correlate2d

from synkhronos.extensions.lasagne import init, nonlinearities, objectives
from synkhronos.extensions.lasagne.layers import (
    BatchNormLayer,
    ConcatLayer,
    Conv2DLayer,
    DenseLayer,
    DropoutLayer,
    ElemwiseSumLayer,
    FlattenLayer,
    GlobalPoolLayer,
    InputLayer,
    MaxPool2DLayer,
    NonlinearityLayer,
    Pool2DLayer,
    ReshapeLayer,
    batch_norm,
    count_params,
    get_all_layers,
    get_all_param_values,
    get_all_params,
    get_output,
    set_all_param_values,
)

MODE = "FAST_COMPILE"
floatX = pytensor.config.floatX


def evaluate(layer, x, **kwargs):
    """Output of ``layer`` for the value ``x`` of its network's single input."""
    (input_layer,) = [lay for lay in get_all_layers(layer) if isinstance(lay, InputLayer)]
    out = get_output(layer, **kwargs)
    return pytensor.function([input_layer.input_var], out, mode=MODE)(np.asarray(x, floatX))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_input_layer():
    layer = InputLayer((None, 3, 5), name="x")
    assert layer.output_shape == (None, 3, 5)
    assert layer.input_var.type.shape == (None, 3, 5)
    assert layer.input_var.name == "x.input"
    with pytest.raises(ValueError, match="dimensions"):
        InputLayer((None, 3), input_var=pt.tensor3())
    with pytest.raises(ValueError, match="positive"):
        InputLayer((None, 0))


def test_dense_layer(rng):
    net = InputLayer((None, 2, 3))
    dense = DenseLayer(net, 4, name="fc")
    assert dense.output_shape == (None, 4)
    assert dense.W.get_value().shape == (6, 4) and dense.W.name == "fc.W"
    dense.b.set_value(rng.standard_normal(4).astype(floatX))
    x = rng.standard_normal((5, 2, 3))
    expected = np.maximum(x.reshape(5, 6) @ dense.W.get_value() + dense.b.get_value(), 0)
    np.testing.assert_allclose(evaluate(dense, x), expected, rtol=1e-6)

    per_row = DenseLayer(net, 4, num_leading_axes=2, b=None, nonlinearity=None)
    assert per_row.output_shape == (None, 2, 4) and per_row.b is None
    np.testing.assert_allclose(evaluate(per_row, x), x @ per_row.W.get_value(), rtol=1e-6)
    assert get_all_params(per_row) == [per_row.W]
    with pytest.raises(ValueError, match="requires a fixed input shape"):
        DenseLayer(InputLayer((None, None)), 3)


def conv_by_hand(x, w, pad, flip):
    """Sum over input channels of 2-d (true or cross-) correlations, stride 1."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    op = convolve2d if flip else correlate2d
    return np.stack(
        [[sum(op(img[c], f[c], mode="valid") for c in range(len(f))) for f in w] for img in xp]
    )


@pytest.mark.parametrize(
    ("pad", "pad_pair", "flip"),
    [("same", (1, 2), True), ("valid", (0, 0), False), ("full", (2, 4), True), (1, (1, 1), False)],
)
def test_conv2d_layer_values(rng, pad, pad_pair, flip):
    net = InputLayer((None, 3, 6, 7))
    conv = Conv2DLayer(net, 2, (3, 5), pad=pad, flip_filters=flip)
    conv.b.set_value(rng.standard_normal(2).astype(floatX))
    x = rng.standard_normal((2, 3, 6, 7))
    out = evaluate(conv, x)
    expected = conv_by_hand(x, conv.W.get_value(), pad_pair, flip)
    expected = np.maximum(expected + conv.b.get_value()[:, None, None], 0)
    assert out.shape == expected.shape == (2, *conv.output_shape[1:])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_conv2d_layer_options(rng):
    net = InputLayer((None, 4, 9, 8))
    strided = Conv2DLayer(net, 6, 3, stride=(2, 3), pad=1, num_groups=2, untie_biases=True)
    assert strided.output_shape == (None, 6, 5, 3)
    assert strided.W.get_value().shape == (6, 2, 3, 3)
    assert strided.b.get_value().shape == (6, 5, 3)
    strided.b.set_value(rng.standard_normal((6, 5, 3)).astype(floatX))
    x = rng.standard_normal((2, 4, 9, 8))
    w = strided.W.get_value()
    # Group g sees input channels 2g, 2g+1; stride picks every 2nd row, 3rd column.
    full = np.concatenate(
        [conv_by_hand(x[:, 2 * g : 2 * g + 2], w[3 * g : 3 * g + 3], (1, 1), True) for g in (0, 1)],
        axis=1,
    )
    expected = np.maximum(full[:, :, ::2, ::3] + strided.b.get_value(), 0)
    np.testing.assert_allclose(evaluate(strided, x), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(NotImplementedError, match="odd"):
        Conv2DLayer(net, 2, 2, pad="same")
    with pytest.raises(ValueError, match="num_groups"):
        Conv2DLayer(net, 3, 3, num_groups=2)


def test_pool_layers():
    x = np.arange(25, dtype=float).reshape(1, 1, 5, 5)
    net = InputLayer((None, 1, 5, 5))
    max_pool = MaxPool2DLayer(net, 2)
    assert max_pool.output_shape == (None, 1, 2, 2)
    np.testing.assert_array_equal(evaluate(max_pool, x)[0, 0], [[6, 8], [16, 18]])
    # ignore_border=False adds the partial last row/column windows.
    partial = MaxPool2DLayer(net, 2, ignore_border=False)
    assert partial.output_shape == (None, 1, 3, 3)
    np.testing.assert_array_equal(evaluate(partial, x)[0, 0, 2], [21, 23, 24])
    # 3x3 windows, stride 2, padding 1: corner window holds rows/cols 0-1 (4 cells of 9).
    inc = Pool2DLayer(net, 3, stride=2, pad=1, mode="average_inc_pad")
    exc = Pool2DLayer(net, 3, stride=2, pad=1, mode="average_exc_pad")
    assert inc.output_shape == (None, 1, 3, 3)
    np.testing.assert_allclose(evaluate(inc, x)[0, 0, 0, 0], (0 + 1 + 5 + 6) / 9)
    np.testing.assert_allclose(evaluate(exc, x)[0, 0, 0, 0], (0 + 1 + 5 + 6) / 4)
    np.testing.assert_allclose(evaluate(exc, x)[0, 0, 1, 1], x[0, 0, 1:4, 1:4].mean())

    glob = GlobalPoolLayer(InputLayer((None, 3, 2, 4)))
    y = np.random.default_rng(1).standard_normal((2, 3, 2, 4))
    assert glob.output_shape == (None, 3)
    np.testing.assert_allclose(evaluate(glob, y), y.mean(axis=(2, 3)), rtol=1e-6)


def test_batch_norm_train_and_inference(rng):
    net = InputLayer((None, 3, 2, 2))
    bn = BatchNormLayer(net, alpha=0.25)
    bn.gamma.set_value(np.array([1.0, 2.0, 0.5], floatX))
    bn.beta.set_value(np.array([0.0, -1.0, 3.0], floatX))
    assert set(get_all_params(bn, trainable=True)) == {bn.beta, bn.gamma}
    assert set(get_all_params(bn, regularizable=True)) == {bn.gamma}
    x_var = net.input_var
    train = pytensor.function([x_var], get_output(bn), mode=MODE)
    infer = pytensor.function([x_var], get_output(bn, deterministic=True), mode=MODE)
    x = rng.standard_normal((4, 3, 2, 2)) * 3 + 1
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    inv_std = 1 / np.sqrt(var + 1e-4)

    def by_hand(m, s):
        scale = (s * bn.gamma.get_value())[:, None, None]
        return (x - m[:, None, None]) * scale + bn.beta.get_value()[:, None, None]

    np.testing.assert_allclose(train(x), by_hand(mean, inv_std), rtol=1e-5)
    # One training call moves the running averages a quarter of the way.
    np.testing.assert_allclose(bn.mean.get_value(), 0.25 * mean, rtol=1e-6)
    np.testing.assert_allclose(bn.inv_std.get_value(), 0.75 + 0.25 * inv_std, rtol=1e-6)
    running = bn.mean.get_value(), bn.inv_std.get_value()
    np.testing.assert_allclose(infer(x), by_hand(*running), rtol=1e-5)
    # Inference leaves the averages alone.
    np.testing.assert_array_equal(bn.mean.get_value(), running[0])
    np.testing.assert_array_equal(bn.inv_std.get_value(), running[1])

    dense_bn = BatchNormLayer(InputLayer((None, 5)), beta=None, gamma=None)
    assert dense_bn.axes == (0,) and get_all_params(dense_bn, trainable=True) == []
    # A user's shared variable without a static shape is updated too.
    mean = pytensor.shared(np.zeros(3, floatX))
    assert mean.type.shape == (None,)
    shared_bn = BatchNormLayer(net, mean=mean)
    pytensor.function([x_var], get_output(shared_bn), mode=MODE)(x)
    np.testing.assert_allclose(mean.get_value(), 0.1 * x.mean(axis=(0, 2, 3)), rtol=1e-6)


def test_batch_norm_helper():
    conv = Conv2DLayer(InputLayer((None, 2, 4, 4)), 3, 3, name="c")
    out = batch_norm(conv)
    assert isinstance(out, NonlinearityLayer) and out.nonlinearity is nonlinearities.rectify
    assert isinstance(out.input_layer, BatchNormLayer) and out.input_layer.name == "c_bn"
    assert conv.b is None and conv.nonlinearity is nonlinearities.linear
    assert count_params(out, trainable=True) == 3 * 2 * 9 + 2 * 3


def test_nonlinearity_and_sum_layers(rng):
    a, b = InputLayer((None, 3)), InputLayer((None, 3))
    total = ElemwiseSumLayer([a, NonlinearityLayer(b, nonlinearities.tanh)], coeffs=[2, -1])
    assert total.output_shape == (None, 3)
    x, y = rng.standard_normal((2, 4, 3))
    out = pytensor.function([a.input_var, b.input_var], get_output(total), mode=MODE)(x, y)
    np.testing.assert_allclose(out, 2 * x - np.tanh(y), rtol=1e-6)
    with pytest.raises(ValueError, match="mismatched"):
        _ = ElemwiseSumLayer([a, InputLayer((None, 4))]).output_shape


def test_dropout(rng):
    net = InputLayer((None, 8, 10, 10))
    drop = DropoutLayer(net, p=0.25)
    x = rng.standard_normal((4, 8, 10, 10)) + 5
    np.testing.assert_array_equal(evaluate(drop, x, deterministic=True), x.astype(floatX))
    fn = pytensor.function([net.input_var], get_output(drop), mode=MODE)
    first, second = fn(x), fn(x)
    kept = first != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(first[kept], x[kept] / 0.75, rtol=1e-6)
    assert not np.array_equal(first, second)  # a new mask per call
    maps = evaluate(DropoutLayer(net, p=0.5, shared_axes=(2, 3)), x)
    zeroed = (maps == 0).all(axis=(2, 3))
    assert ((maps != 0).all(axis=(2, 3)) | zeroed).all() and zeroed.any()


def test_shape_and_concat_layers(rng):
    net = InputLayer((None, 2, 3, 4))
    flat = FlattenLayer(net)
    assert flat.output_shape == (None, 24)
    assert FlattenLayer(net, outdim=3).output_shape == (None, 2, 12)
    reshaped = ReshapeLayer(net, ([0], -1, 4))
    assert reshaped.output_shape == (None, 6, 4)
    assert ReshapeLayer(InputLayer((5, 2, 3)), ([0], 3, -1)).output_shape == (5, 3, 2)
    with pytest.raises(ValueError, match="total size mismatches"):
        ReshapeLayer(InputLayer((5, 2, 3)), (4, -1))
    x = rng.standard_normal((3, 2, 3, 4))
    np.testing.assert_allclose(evaluate(flat, x), x.reshape(3, 24))
    np.testing.assert_allclose(evaluate(reshaped, x), x.reshape(3, 6, 4))
    cat = ConcatLayer([flat, DenseLayer(flat, 5)], axis=1)
    assert cat.output_shape == (None, 29)
    assert evaluate(cat, x).shape == (3, 29)


def test_helpers(rng):
    net = InputLayer((None, 4), name="in")
    hidden = DenseLayer(net, 3, name="h")
    out = DenseLayer(hidden, 2, nonlinearity=nonlinearities.softmax, name="out")
    assert get_all_layers(out) == [net, hidden, out]
    assert get_all_params(out) == [hidden.W, hidden.b, out.W, out.b]
    assert get_all_params(out, regularizable=True) == [hidden.W, out.W]
    assert get_all_params(out, regularizable=False) == [hidden.b, out.b]
    assert count_params(out) == 4 * 3 + 3 + 3 * 2 + 2
    values = get_all_param_values(out)
    set_all_param_values(out, [v + 1 for v in values])
    np.testing.assert_allclose(out.b.get_value(), values[3] + 1)
    with pytest.raises(ValueError, match="got 2 values to set 4"):
        set_all_param_values(out, values[:2])
    x = rng.standard_normal((5, 4))
    # Replace the hidden layer's output, or feed an expression to the single input.
    h = pt.matrix("h")
    from_hidden = pytensor.function([h], get_output(out, {hidden: h}), mode=MODE)
    z = np.maximum(x @ hidden.W.get_value() + hidden.b.get_value(), 0)
    expected = z @ out.W.get_value() + out.b.get_value()
    expected = np.exp(expected) / np.exp(expected).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(from_hidden(z), expected, rtol=1e-6)
    x_var = pt.matrix("x")
    both = get_output([hidden, out], x_var)
    np.testing.assert_allclose(
        pytensor.function([x_var], both, mode=MODE)(x)[1], expected, rtol=1e-6
    )


def test_initializers():
    init.set_rng(7)
    w = init.GlorotUniform()((40, 60))
    assert w.dtype == floatX and np.abs(w).max() <= np.sqrt(6 / 100)
    assert np.abs(w).max() > 0.9 * np.sqrt(6 / 100)
    conv = init.HeNormal(gain="relu")((64, 32, 3, 3))
    np.testing.assert_allclose(conv.std(), np.sqrt(2 / (32 * 9)), rtol=0.05)
    np.testing.assert_allclose(init.GlorotNormal()((100, 300)).std(), np.sqrt(2 / 400), rtol=0.05)
    assert np.abs(init.HeUniform()((50, 20))).max() <= np.sqrt(3 / 50)
    np.testing.assert_array_equal(init.Constant(0.5)((2, 3)), np.full((2, 3), 0.5))
    low, high = 2.0, 3.0
    u = init.Uniform((low, high))((1000,))
    assert low <= u.min() and u.max() <= high
    np.testing.assert_allclose(init.Normal(0.1, 1.0)((10000,)).mean(), 1.0, atol=0.01)
    q = init.Orthogonal()((4, 6))
    np.testing.assert_allclose(q @ q.T, np.eye(4), atol=1e-6)
    init.set_rng(7)
    np.testing.assert_array_equal(init.GlorotUniform()((40, 60)), w)
    with pytest.raises(RuntimeError, match="length >= 2"):
        init.GlorotUniform()((5,))
    # c01b: fans are shape[0] and shape[3], the receptive field shape[1] * shape[2].
    c01b = init.GlorotNormal(c01b=True)((16, 5, 5, 48))
    np.testing.assert_allclose(c01b.std(), np.sqrt(2 / ((16 + 48) * 25)), rtol=0.05)
    with pytest.raises(RuntimeError, match="length 4"):
        init.GlorotUniform(c01b=True)((16, 48))
    he = init.HeNormal(c01b=True)((16, 5, 5, 48))
    np.testing.assert_allclose(he.std(), np.sqrt(1 / (16 * 25)), rtol=0.05)


def test_nonlinearities():
    x = np.array([-2.0, -0.5, 0.0, 1.5])
    v = pt.vector("v")
    cases = {
        nonlinearities.sigmoid: 1 / (1 + np.exp(-x)),
        nonlinearities.tanh: np.tanh(x),
        nonlinearities.rectify: np.maximum(x, 0),
        nonlinearities.leaky_rectify: np.where(x > 0, x, 0.01 * x),
        nonlinearities.very_leaky_rectify: np.where(x > 0, x, x / 3),
        nonlinearities.elu: np.where(x > 0, x, np.expm1(x)),
        nonlinearities.softplus: np.log1p(np.exp(x)),
        nonlinearities.linear: x,
        nonlinearities.softmax: [np.exp(x) / np.exp(x).sum()],  # a row, as in Lasagne
    }
    outputs = pytensor.function([v], [f(v) for f in cases], mode=MODE)(x.astype(floatX))
    for out, expected in zip(outputs, cases.values(), strict=True):
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)


def test_objectives():
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.2, 0.5, 0.3]])
    t = np.array([0, 1, 1])
    one_hot = np.eye(3)[t]
    pv, tv, ov = pt.matrix("p"), pt.ivector("t"), pt.matrix("o")
    a, b = pt.vector("a"), pt.vector("b")
    outs = [
        objectives.categorical_crossentropy(pv, tv),
        objectives.categorical_crossentropy(pv, ov),
        objectives.categorical_accuracy(pv, tv),
        objectives.categorical_accuracy(pv, ov, top_k=2),
        objectives.squared_error(a, b),
        objectives.binary_crossentropy(a, b),
        objectives.aggregate(a, mode="sum"),
        objectives.aggregate(a, b, mode="normalized_sum"),
        objectives.aggregate(a, b),
    ]
    fn = pytensor.function([pv, tv, ov, a, b], outs, mode=MODE)
    av, bv = np.array([0.2, 0.9]), np.array([0.0, 1.0])
    got = fn(p, t.astype("int32"), one_hot, av, bv)
    ce = -np.log(p[np.arange(3), t])
    expected = [
        ce,
        ce,
        [1, 0, 1],
        [1, 1, 1],
        (av - bv) ** 2,
        -(bv * np.log(av) + (1 - bv) * np.log(1 - av)),
        av.sum(),
        (av * bv).sum() / bv.sum(),
        (av * bv).mean(),
    ]
    for out, exp in zip(got, expected, strict=True):
        np.testing.assert_allclose(out, exp, rtol=1e-6)
    with pytest.raises(ValueError, match="require weights"):
        objectives.aggregate(a, mode="normalized_sum")


def test_training_step_in_jax_mode_matches_cpu(rng):
    """A CNN with batch norm trains identically in JAX mode: gradients through every
    layer, and the running averages' default updates, work in both backends."""
    pytest.importorskip("jax")
    results = []
    x = rng.standard_normal((4, 2, 6, 6))
    t = np.array([0, 1, 2, 1], dtype="int32")
    for mode in (MODE, "JAX"):
        init.set_rng(5)
        net = InputLayer((None, 2, 6, 6))
        net = batch_norm(Conv2DLayer(net, 3, 3, pad=1))
        net = Pool2DLayer(net, 2, mode="average_exc_pad")
        net = MaxPool2DLayer(Conv2DLayer(net, 4, 2, stride=1), 2)
        out = DenseLayer(GlobalPoolLayer(net), 3, nonlinearity=nonlinearities.softmax)
        targets = pt.ivector("t")
        loss = objectives.categorical_crossentropy(get_output(out), targets).mean()
        params = get_all_params(out, trainable=True)
        updates = [
            (p, p - 0.1 * g) for p, g in zip(params, pytensor.grad(loss, params), strict=True)
        ]
        (input_layer,) = get_all_layers(out)[:1]
        step = pytensor.function([input_layer.input_var, targets], loss, updates=updates, mode=mode)
        losses = [float(step(x.astype(floatX), t)) for _ in range(3)]
        results.append((losses, get_all_param_values(out)))
    (cpu_losses, cpu_values), (jax_losses, jax_values) = results
    np.testing.assert_allclose(jax_losses, cpu_losses, rtol=1e-6)
    assert jax_losses[2] < jax_losses[0]
    for a, b in zip(jax_values, cpu_values, strict=True):
        # float32: XLA's and the C code's sums in another order (values near 0 differ
        # by a few 1e-9, measured under load)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.filterwarnings("ignore:The RandomType SharedVariables")
def test_dropout_in_jax_mode():
    pytest.importorskip("jax")
    drop = DropoutLayer(InputLayer((None, 50)), p=0.5)
    fn = pytensor.function([drop.input_layer.input_var], get_output(drop), mode="JAX")
    first, second = (
        np.asarray(fn(np.ones((4, 50), floatX))),
        np.asarray(fn(np.ones((4, 50), floatX))),
    )
    assert set(np.unique(first)) == {0.0, 2.0} and not np.array_equal(first, second)


@pytest.mark.parametrize("mode", ["lower", "upper", "center"])
def test_merge_layers_crop_to_a_common_shape(rng, mode):
    a, b = InputLayer((None, 2, 7, 6)), InputLayer((None, 3, 4, None))
    crop = [None, None, mode, mode]
    cat = ConcatLayer([a, b], axis=1, cropping=crop)
    assert cat.output_shape == (None, 5, 4, None)
    summed = ElemwiseSumLayer([a, InputLayer((None, 2, 5, 9))], cropping=crop)
    assert summed.output_shape == (None, 2, 5, 6)
    xa = rng.standard_normal((3, 2, 7, 6))
    xb = rng.standard_normal((3, 3, 4, 9))
    xc = rng.standard_normal((3, 2, 5, 9))

    def cut(x, rows, cols):
        starts = {
            "lower": (0, 0),
            "upper": (x.shape[2] - rows, x.shape[3] - cols),
            "center": ((x.shape[2] - rows) // 2, (x.shape[3] - cols) // 2),
        }[mode]
        return x[:, :, starts[0] : starts[0] + rows, starts[1] : starts[1] + cols]

    inputs = [a.input_var, b.input_var, summed.input_layers[1].input_var]
    got_cat, got_sum = pytensor.function(inputs, [get_output(cat), get_output(summed)], mode=MODE)(
        xa, xb, xc
    )
    np.testing.assert_allclose(got_cat, np.concatenate([cut(xa, 4, 6), cut(xb, 4, 6)], axis=1))
    np.testing.assert_allclose(got_sum, cut(xa, 5, 6) + cut(xc, 5, 6))
    with pytest.raises(ValueError, match="cropping mode"):
        _ = ConcatLayer([a, b], cropping=["middle"]).output_shape
