"""Numerics of the Lasagne port's layers against independent NumPy/float64 references.

Each layer's output is compared with a direct NumPy computation (loops over windows,
scatter for transposed convolutions); layers with parameters also have their gradient
checked against central finite differences of the NumPy reference.  Graphs compile with
the Python linker (``FAST_COMPILE``): tests/test_ops2d.py covers the kernels per linker.
"""

import itertools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne import nonlinearities

MODE = "FAST_COMPILE"
floatX = pytensor.config.floatX


def run(layer, x, **kwargs):
    """Output of ``layer`` for the value ``x`` of its network's single input."""
    (inp,) = [lay for lay in L.get_all_layers(layer) if isinstance(lay, L.InputLayer)]
    out = L.get_output(layer, **kwargs)
    return pytensor.function([inp.input_var], out, mode=MODE)(np.asarray(x, inp.input_var.dtype))


def check_param_grad(layer, x, param, reference, rng):
    """d sum(out * R) / d param equals the finite-difference gradient of ``reference``."""
    (inp,) = [lay for lay in L.get_all_layers(layer) if isinstance(lay, L.InputLayer)]
    out = L.get_output(layer)
    weights = rng.standard_normal(layer.output_shape[1:])
    r = pt.as_tensor(weights)
    grad = pytensor.grad(pt.sum(out * r), param)
    got = pytensor.function([inp.input_var], grad, mode=MODE)(np.asarray(x, floatX))
    value = param.get_value().astype(np.float64)
    expected = np.zeros_like(value)
    eps = 1e-6
    for idx in itertools.product(*map(range, value.shape)):
        plus, minus = value.copy(), value.copy()
        plus[idx] += eps
        minus[idx] -= eps
        diff = np.sum((reference(x, plus) - reference(x, minus)) * weights)
        expected[idx] = diff / (2 * eps)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def correlate_nd(x, w, stride, pad, dilation=None):
    """Cross-correlation of ``x`` (N, C, *S) with ``w`` (O, C, *K), by loops."""
    n = x.ndim - 2
    dilation = dilation or (1,) * n
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    kernel = w.shape[2:]
    out_sizes = [
        (xp.shape[2 + a] - dilation[a] * (kernel[a] - 1) - 1) // stride[a] + 1 for a in range(n)
    ]
    out = np.zeros((x.shape[0], w.shape[0], *out_sizes))
    for pos in itertools.product(*map(range, out_sizes)):
        for tap in itertools.product(*map(range, kernel)):
            idx = tuple(
                p * s + t * d for p, s, t, d in zip(pos, stride, tap, dilation, strict=False)
            )
            patch = xp[(slice(None), slice(None), *idx)]  # (N, C)
            out[(slice(None), slice(None), *pos)] += patch @ w[(slice(None), slice(None), *tap)].T
    return out


def transposed_nd(x, w, stride, crop):
    """Transposed convolution by scatter: each input element adds ``x * w`` (``w`` as given;
    the layers' default, ``flip_filters=False``, scatters their ``W`` flipped)."""
    n = x.ndim - 2
    kernel = w.shape[2:]
    full = [(x.shape[2 + a] - 1) * stride[a] + kernel[a] for a in range(n)]
    out = np.zeros((x.shape[0], w.shape[1], *full))
    for pos in itertools.product(*map(range, x.shape[2:])):
        for tap in itertools.product(*map(range, kernel)):
            idx = tuple(p * s + t for p, s, t in zip(pos, stride, tap, strict=False))
            out[(slice(None), slice(None), *idx)] += (
                x[(slice(None), slice(None), *pos)] @ w[(slice(None), slice(None), *tap)]
            )
    return out[
        (slice(None), slice(None), *(slice(c, s - c) for c, s in zip(crop, full, strict=False)))
    ]


def pool_nd(x, size, stride, pad, mode, ignore_border=True):
    """Pooling by loops over windows (padding excluded from max and from exc_pad counts)."""
    n = x.ndim - 2
    lengths = x.shape[2:]
    if ignore_border:
        outs = [(lengths[a] + 2 * pad[a] - size[a]) // stride[a] + 1 for a in range(n)]
    else:
        outs = [max(0, (lengths[a] - size[a] + stride[a] - 1) // stride[a]) + 1 for a in range(n)]
    out = np.zeros((*x.shape[:2], *outs))
    for pos in itertools.product(*map(range, outs)):
        starts = [p * s - q for p, s, q in zip(pos, stride, pad, strict=False)]
        box = tuple(
            slice(max(b, 0), min(b + k, length))
            for b, k, length in zip(starts, size, lengths, strict=False)
        )
        window = x[(slice(None), slice(None), *box)].reshape(*x.shape[:2], -1)
        if mode == "max":
            value = window.max(-1)
        elif mode == "average_exc_pad":
            value = window.mean(-1)
        else:
            value = window.sum(-1) / np.prod(size)
        out[(slice(None), slice(None), *pos)] = value
    return out


def test_conv1d_layer(rng):
    layer = L.Conv1DLayer(L.InputLayer((None, 2, 7)), 3, 3, stride=2, pad=1, nonlinearity=None)
    x = rng.standard_normal((2, 2, 7))

    def reference(x, w):
        return correlate_nd(x, w[:, :, ::-1], (2,), (1,)) + layer.b.get_value()[:, None]

    assert layer.output_shape == (None, 3, 4)
    np.testing.assert_allclose(run(layer, x), reference(x, layer.W.get_value()), rtol=1e-6)
    check_param_grad(layer, x, layer.W, reference, rng)


def test_conv3d_layer(rng):
    net = L.InputLayer((None, 2, 4, 5, 3))
    layer = L.Conv3DLayer(net, 2, (2, 3, 2), stride=(1, 2, 1), pad=1, nonlinearity=None)
    layer.b.set_value(rng.standard_normal(2))
    x = rng.standard_normal((2, 2, 4, 5, 3))

    def reference(x, w):
        bias = layer.b.get_value()[:, None, None, None]
        return correlate_nd(x, w[:, :, ::-1, ::-1, ::-1], (1, 2, 1), (1, 1, 1)) + bias

    assert layer.output_shape == (None, 2, 5, 3, 4)
    np.testing.assert_allclose(run(layer, x), reference(x, layer.W.get_value()), rtol=1e-6)
    check_param_grad(layer, x, layer.W, reference, rng)


def test_conv3d_unflipped_strided_depth(rng):
    layer = L.Conv3DLayer(
        L.InputLayer((1, 1, 5, 3, 3)), 1, 2, stride=2, flip_filters=False, nonlinearity=None
    )
    x = rng.standard_normal((1, 1, 5, 3, 3))
    expected = correlate_nd(x, layer.W.get_value(), (2, 2, 2), (0, 0, 0))
    np.testing.assert_allclose(run(layer, x), expected, rtol=1e-6)


@pytest.mark.parametrize(("stride", "crop"), [(1, 0), (2, 1)])
def test_transposed_conv2d_layer(rng, stride, crop):
    net = L.InputLayer((None, 2, 3, 4))
    layer = L.TransposedConv2DLayer(net, 3, (3, 2), stride=stride, crop=crop, nonlinearity=None)
    x = rng.standard_normal((2, 2, 3, 4))

    def reference(x, w):
        return transposed_nd(x, w[:, :, ::-1, ::-1], (stride,) * 2, (crop,) * 2)

    expected = reference(x, layer.W.get_value())
    assert layer.output_shape[1:] == expected.shape[1:]
    np.testing.assert_allclose(run(layer, x), expected, rtol=1e-6)
    check_param_grad(layer, x, layer.W, reference, rng)


def test_transposed_conv2d_output_size_and_flip(rng):
    net = L.InputLayer((None, 1, 3, 3))
    layer = L.Deconv2DLayer(
        net, 1, 3, stride=2, output_size=8, flip_filters=True, b=None, nonlinearity=None
    )
    x = rng.standard_normal((1, 1, 3, 3))
    w = layer.W.get_value()
    expected = np.zeros((1, 1, 8, 8))
    expected[:, :, :7, :7] = transposed_nd(x, w, (2, 2), (0, 0))
    assert layer.output_shape == (None, 1, 8, 8)
    np.testing.assert_allclose(run(layer, x), expected, rtol=1e-6)


def test_transposed_conv_of_unknown_sizes(rng):
    x_var = pt.tensor4("x")
    x = rng.standard_normal((2, 2, 3, 4))
    loose = L.TransposedConv2DLayer(
        (None, 2, None, None),
        3,
        3,
        stride=2,
        crop="same",
        flip_filters=True,
        b=None,
        nonlinearity=None,
    )
    assert loose.output_shape == (None, 3, None, None)
    # output_size asks for one more row than the smallest output (a stride leaves a choice)
    extended = L.TransposedConv2DLayer(
        (None, 2, None, None),
        3,
        (3, 2),
        stride=2,
        output_size=pt.as_tensor(np.array([8, 8])),
        flip_filters=True,
        b=None,
        nonlinearity=None,
    )
    assert extended.output_shape == (None, 3, None, None)
    outputs = [loose.get_output_for(x_var), extended.get_output_for(x_var)]
    got = pytensor.function([x_var], outputs, mode=MODE)(x)
    full = transposed_nd(x, loose.W.get_value(), (2, 2), (0, 0))  # 7 x 9
    np.testing.assert_allclose(got[0], full[:, :, 1:6, 1:8], rtol=1e-6)  # "same": crop 1
    full = transposed_nd(x, extended.W.get_value(), (2, 2), (0, 0))  # 7 x 8
    np.testing.assert_allclose(got[1][:, :, :7], full, rtol=1e-6)
    np.testing.assert_allclose(got[1][:, :, 7], 0)


def test_transposed_conv3d_layer(rng):
    net = L.InputLayer((None, 2, 2, 3, 2))
    layer = L.TransposedConv3DLayer(net, 1, 2, stride=(2, 1, 1), nonlinearity=None)
    x = rng.standard_normal((1, 2, 2, 3, 2))

    def reference(x, w):
        return transposed_nd(x, w[:, :, ::-1, ::-1, ::-1], (2, 1, 1), (0, 0, 0))

    assert layer.output_shape == (None, 1, 4, 4, 3)
    np.testing.assert_allclose(run(layer, x), reference(x, layer.W.get_value()), rtol=1e-6)
    check_param_grad(layer, x, layer.W, reference, rng)


def test_dilated_conv2d_layer(rng):
    net = L.InputLayer((None, 2, 7, 6))
    layer = L.DilatedConv2DLayer(net, 3, 2, dilation=(2, 3), nonlinearity=None)
    x = rng.standard_normal((2, 2, 7, 6))

    def reference(x, w):
        return correlate_nd(x, w.transpose(1, 0, 2, 3), (1, 1), (0, 0), (2, 3))

    assert layer.output_shape == (None, 3, 5, 3)
    np.testing.assert_allclose(run(layer, x), reference(x, layer.W.get_value()), rtol=1e-6)
    check_param_grad(layer, x, layer.W, reference, rng)


@pytest.mark.parametrize(("channelwise", "flip"), [(False, True), (True, False)])
def test_locally_connected_layer(rng, channelwise, flip):
    net = L.InputLayer((None, 2, 3, 4))
    layer = L.LocallyConnected2DLayer(
        net, 2, (3, 1), channelwise=channelwise, flip_filters=flip, nonlinearity=None
    )
    x = rng.standard_normal((2, 2, 3, 4))

    def reference(x, w):
        if channelwise:
            w = np.einsum("kabyx,kc->kcabyx", w, np.eye(2))
        if flip:
            w = w[:, :, ::-1, ::-1]
        xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (0, 0)])
        out = np.zeros((2, 2, 3, 4)) + layer.b.get_value()[:, None, None]
        for y, z, a in itertools.product(range(3), range(4), range(3)):
            out[:, :, y, z] += xp[:, :, y + a, z] @ w[:, :, a, 0, y, z].T
        return out

    np.testing.assert_allclose(run(layer, x), reference(x, layer.W.get_value()), rtol=1e-6)
    check_param_grad(layer, x, layer.W, reference, rng)


def test_convolution_argument_is_called_as_lasagne_calls_it(rng):
    """``convolution=`` gets Lasagne's call: (input, W, input_shape, W_shape, subsample=,
    border_mode=, filter_flip=), with num_groups= only for grouped layers; Theano's
    ``conv2d`` and Lasagne's 1-D functions serve as they are."""
    from synkhronos.extensions.lasagne.theano_extensions import conv as conv1d_functions
    from synkhronos.theano.tensor import nnet

    calls = []

    def recording_conv2d(input, filters, input_shape, filter_shape, **kwargs):
        calls.append((input_shape, filter_shape, kwargs))
        return nnet.conv2d(input, filters, input_shape, filter_shape, **kwargs)

    x2, x1 = rng.standard_normal((2, 4, 7, 6)), rng.standard_normal((2, 2, 9))
    recorded = L.Conv2DLayer(
        L.InputLayer((None, 4, 7, 6)),
        2,
        3,
        stride=(2, 1),
        pad="same",
        num_groups=2,
        nonlinearity=None,
        convolution=recording_conv2d,
    )
    theano_conv = L.Conv2DLayer(
        L.InputLayer((None, 4, 7, 6)),
        3,
        (3, 2),
        pad="full",
        flip_filters=False,
        nonlinearity=None,
        convolution=nnet.conv2d,
    )
    lasagne_1d = L.Conv1DLayer(
        L.InputLayer((None, 2, 9)),
        3,
        4,
        stride=2,
        nonlinearity=None,
        convolution=conv1d_functions.conv1d_sc,
    )

    def grouped_reference(x, w):  # each half of the channels with its own filter
        w = w[:, :, ::-1, ::-1]
        return np.concatenate(
            [correlate_nd(x[:, 2 * g : 2 * g + 2], w[g : g + 1], (2, 1), (1, 1)) for g in range(2)],
            axis=1,
        )

    cases = [
        (recorded, x2, grouped_reference),
        (theano_conv, x2, lambda x, w: correlate_nd(x, w, (1, 1), (2, 1))),
        (lasagne_1d, x1, lambda x, w: correlate_nd(x, w[:, :, ::-1], (2,), (0,))),
    ]
    for layer, x, reference in cases:
        expected = (
            reference(x, layer.W.get_value())
            + layer.b.get_value()[(slice(None),) + (None,) * (x.ndim - 2)]
        )
        assert layer.output_shape == (None, *expected.shape[1:])
        np.testing.assert_allclose(run(layer, x), expected, rtol=1e-6)
    assert calls == [
        (
            (None, 4, 7, 6),
            (2, 2, 3, 3),
            {"subsample": (2, 1), "border_mode": "half", "filter_flip": True, "num_groups": 2},
        )
    ]
    check_param_grad(
        theano_conv, x2, theano_conv.W, lambda x, w: correlate_nd(x, w, (1, 1), (2, 1)), rng
    )
    with pytest.raises(TypeError, match="num_groups"):  # as in Lasagne: no groups there
        L.get_output(
            L.Conv1DLayer(
                L.InputLayer((None, 2, 9)),
                2,
                3,
                num_groups=2,
                convolution=conv1d_functions.conv1d_sc,
            )
        )


@pytest.mark.parametrize("mode", ["max", "average_inc_pad", "average_exc_pad"])
def test_pool1d_and_pool3d_layers(rng, mode):
    x1 = rng.standard_normal((2, 3, 9))
    layer1 = L.Pool1DLayer(L.InputLayer((None, 3, 9)), 3, stride=2, pad=1, mode=mode)
    np.testing.assert_allclose(run(layer1, x1), pool_nd(x1, (3,), (2,), (1,), mode), rtol=1e-6)
    x3 = rng.standard_normal((2, 2, 5, 4, 6))
    net3 = L.InputLayer((None, 2, 5, 4, 6))
    layer3 = L.Pool3DLayer(net3, (3, 2, 3), stride=(2, 1, 2), pad=(1, 0, 1), mode=mode)
    expected = pool_nd(x3, (3, 2, 3), (2, 1, 2), (1, 0, 1), mode)
    assert layer3.output_shape == (None, *expected.shape[1:])
    np.testing.assert_allclose(run(layer3, x3), expected, rtol=1e-6)


def test_max_pool_3d_without_border_and_its_gradient(rng):
    x = rng.standard_normal((1, 2, 5, 5, 3))
    layer = L.MaxPool3DLayer(L.InputLayer((None, 2, 5, 5, 3)), 2, ignore_border=False)
    expected = pool_nd(x, (2, 2, 2), (2, 2, 2), (0, 0, 0), "max", ignore_border=False)
    assert layer.output_shape == (None, 2, 3, 3, 2)
    np.testing.assert_allclose(run(layer, x), expected, rtol=1e-6)
    xv = pt.tensor5()
    grad = pytensor.grad(pt.sum(L.get_output(layer, xv)), xv)
    got = pytensor.function([xv], grad, mode=MODE)(x)
    assert got.sum() == expected.size and set(np.unique(got)) == {0.0, 1.0}
    assert np.all(got[x == x.max()] == 1)


def test_max_pool_1d_layer(rng):
    x = rng.standard_normal((1, 2, 7))
    layer = L.MaxPool1DLayer(L.InputLayer((None, 2, 7)), 2)
    np.testing.assert_allclose(run(layer, x), pool_nd(x, (2,), (2,), (0,), "max"))


def test_upscale_layers(rng):
    x = rng.standard_normal((1, 2, 2, 3))
    net = L.InputLayer((None, 2, 2, 3))
    repeat = run(L.Upscale2DLayer(net, (2, 3)), x)
    np.testing.assert_array_equal(repeat, x.repeat(2, axis=2).repeat(3, axis=3))
    dilate = run(L.Upscale2DLayer(net, 2, mode="dilate"), x)
    expected = np.zeros((1, 2, 4, 6))
    expected[:, :, ::2, ::2] = x
    np.testing.assert_array_equal(dilate, expected)
    x1 = rng.standard_normal((1, 2, 3))
    np.testing.assert_array_equal(
        run(L.Upscale1DLayer(L.InputLayer((None, 2, 3)), 2), x1), x1.repeat(2, axis=2)
    )
    x3 = rng.standard_normal((1, 1, 2, 2, 2))
    up3 = run(L.Upscale3DLayer(L.InputLayer((None, 1, 2, 2, 2)), 2), x3)
    np.testing.assert_array_equal(up3, x3.repeat(2, 2).repeat(2, 3).repeat(2, 4))


def test_feature_pool_and_wta(rng):
    x = rng.standard_normal((3, 6, 2))
    net = L.InputLayer((None, 6, 2))
    np.testing.assert_allclose(
        run(L.FeaturePoolLayer(net, 3), x), x.reshape(3, 2, 3, 2).max(axis=2)
    )
    np.testing.assert_allclose(
        run(L.FeaturePoolLayer(net, 2, pool_function=pt.mean), x),
        x.reshape(3, 3, 2, 2).mean(axis=2),
    )
    groups = x.reshape(3, 2, 3, 2)
    expected = np.where(groups == groups.max(axis=2, keepdims=True), groups, 0).reshape(x.shape)
    np.testing.assert_allclose(run(L.FeatureWTALayer(net, 3), x), expected)
    with pytest.raises(ValueError, match="multiple"):
        L.FeaturePoolLayer(net, 4)


@pytest.mark.parametrize(
    ("implementation", "cols"),
    # kaiming: [floor(i W / 3), ceil((i + 1) W / 3)); fast: windows of ceil(W / 3), floor(W / 3)
    # apart (rows, 7: the same bins both ways)
    [("kaiming", [(0, 2), (1, 4), (3, 5)]), ("fast", [(0, 2), (1, 3), (2, 4)])],
)
def test_spatial_pyramid_pooling(rng, implementation, cols):
    x = rng.standard_normal((2, 3, 7, 5))
    layer = L.SpatialPyramidPoolingLayer(
        L.InputLayer((None, 3, 7, 5)), [3, 1], implementation=implementation
    )
    rows = [(0, 3), (2, 5), (4, 7)]
    expected = [x[:, :, r0:r1, c0:c1].max(axis=(2, 3)) for (r0, r1) in rows for (c0, c1) in cols]
    expected.append(x.max(axis=(2, 3)))
    assert layer.output_shape == (None, 3, 10)
    np.testing.assert_allclose(run(layer, x), np.stack(expected, axis=2))


def test_nin_layer(rng):
    net = L.InputLayer((None, 3, 2, 2))
    layer = L.NINLayer(net, 4, untie_biases=True, nonlinearity=None)
    layer.b.set_value(rng.standard_normal((4, 2, 2)))
    x = rng.standard_normal((2, 3, 2, 2))

    def reference(x, w):
        return np.einsum("nchw,co->nohw", x, w) + layer.b.get_value()

    np.testing.assert_allclose(run(layer, x), reference(x, layer.W.get_value()), rtol=1e-6)
    check_param_grad(layer, x, layer.W, reference, rng)


def test_embedding_layer(rng):
    inp = L.InputLayer((None, 3), input_var=pt.imatrix())
    layer = L.EmbeddingLayer(inp, input_size=5, output_size=2)
    idx = np.array([[0, 4, 4], [1, 2, 0]], dtype="int32")
    table = layer.W.get_value()
    out = L.get_output(layer)
    np.testing.assert_allclose(pytensor.function([inp.input_var], out, mode=MODE)(idx), table[idx])
    weights = rng.standard_normal((2, 3, 2))
    grad = pytensor.grad(pt.sum(out * weights), layer.W)
    got = pytensor.function([inp.input_var], grad, mode=MODE)(idx)
    expected = np.zeros_like(table)
    np.add.at(expected, idx, weights)
    np.testing.assert_allclose(got, expected)


def test_shape_layers(rng):
    x = rng.standard_normal((2, 3, 1, 4))
    net = L.InputLayer((None, 3, 1, 4))
    shuffled = L.dimshuffle(net, (0, 3, "x", 1))
    assert shuffled.output_shape == (None, 4, 1, 3)
    np.testing.assert_array_equal(run(shuffled, x), x[:, :, 0, :].transpose(0, 2, 1)[:, :, None])
    padded = L.pad(net, [(1, 0), 2], val=7)
    assert padded.output_shape == (None, 3, 2, 8)
    np.testing.assert_array_equal(
        run(padded, x), np.pad(x, [(0, 0), (0, 0), (1, 0), (2, 2)], constant_values=7)
    )
    sliced = L.SliceLayer(net, slice(1, None, 2), axis=-1)
    assert sliced.output_shape == (None, 3, 1, 2)
    np.testing.assert_array_equal(run(sliced, x), x[..., 1::2])
    picked = L.SliceLayer(net, 2, axis=1)
    assert picked.output_shape == (None, 1, 4)
    np.testing.assert_array_equal(run(picked, x), x[:, 2])
    assert L.flatten(net).output_shape == (None, 12)
    assert L.reshape(net, ([0], 4, 3)).output_shape == (None, 4, 3)


def test_elemwise_merge_and_concat(rng):
    a, b = L.InputLayer((None, 3)), L.InputLayer((None, 3))
    xa, xb = rng.standard_normal((2, 2, 3))
    merged = L.ElemwiseMergeLayer([a, b], pt.mul)
    fn = pytensor.function([a.input_var, b.input_var], L.get_output(merged), mode=MODE)
    np.testing.assert_allclose(fn(xa, xb), xa * xb)
    summed = L.ElemwiseSumLayer([a, b], coeffs=[2, -1])
    fn = pytensor.function([a.input_var, b.input_var], L.get_output(summed), mode=MODE)
    np.testing.assert_allclose(fn(xa, xb), 2 * xa - xb)
    assert L.concat([a, b]).output_shape == (None, 6)


def test_lrn_layer(rng):
    x = rng.standard_normal((2, 6, 2, 3))
    layer = L.LocalResponseNormalization2DLayer(
        L.InputLayer((None, 6, 2, 3)), alpha=0.3, k=1.5, beta=0.6, n=3
    )
    sq = np.pad(x**2, [(0, 0), (1, 1), (0, 0), (0, 0)])
    window = sq[:, :-2] + sq[:, 1:-1] + sq[:, 2:]
    np.testing.assert_allclose(run(layer, x), x / (1.5 + 0.3 * window) ** 0.6, rtol=1e-6)


def test_standardization_instance_and_layer_norm(rng):
    x = rng.standard_normal((2, 3, 4, 5)) * 3 + 1
    net = L.InputLayer((None, 3, 4, 5))
    mean, var = x.mean(axis=(2, 3), keepdims=True), x.var(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(
        run(L.StandardizationLayer(net), x), (x - mean) / np.sqrt(var + 1e-4), rtol=1e-6
    )
    conv = L.Conv2DLayer(net, 2, 1, nonlinearity=nonlinearities.rectify)
    inst = L.instance_norm(conv)
    assert conv.b is None and conv.nonlinearity is nonlinearities.linear
    y = np.einsum("nchw,oc->nohw", x, conv.W.get_value()[:, :, 0, 0])
    ym, yv = y.mean(axis=(2, 3), keepdims=True), y.var(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(
        run(inst, x), np.maximum((y - ym) / np.sqrt(yv + 1e-4), 0), rtol=1e-5
    )
    dense = L.DenseLayer(L.InputLayer((None, 4)), 3, nonlinearity=None)
    normed = L.layer_norm(dense)
    x2 = rng.standard_normal((5, 4))
    h = x2 @ dense.W.get_value()
    expected = (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + 1e-4)
    np.testing.assert_allclose(run(normed, x2), expected, rtol=1e-5)
    names = [type(lay).__name__ for lay in L.get_all_layers(normed)]
    assert names[-3:] == ["ScaleLayer", "BiasLayer", "NonlinearityLayer"]


def test_bias_scale_prelu(rng):
    net = L.InputLayer((None, 3, 2))
    x = rng.standard_normal((4, 3, 2))
    bias = L.BiasLayer(net, b=rng.standard_normal(3))
    np.testing.assert_allclose(run(bias, x), x + bias.b.get_value()[:, None])
    scale = L.ScaleLayer(net, scales=rng.standard_normal(2), shared_axes=(0, 1))
    np.testing.assert_allclose(run(scale, x), x * scale.scales.get_value())

    def reference(x, s):
        return x * s[:, None]

    per_channel = L.ScaleLayer(net, scales=rng.standard_normal(3))
    check_param_grad(per_channel, x, per_channel.scales, reference, rng)

    prelu = L.ParametricRectifierLayer(net, alpha=rng.uniform(0, 1, 3))

    def prelu_ref(x, a):
        return np.where(x > 0, x, a[:, None] * x)

    np.testing.assert_allclose(run(prelu, x), prelu_ref(x, prelu.alpha.get_value()))
    check_param_grad(prelu, x, prelu.alpha, prelu_ref, rng)
    dense = L.DenseLayer(L.InputLayer((None, 2)), 3)
    assert isinstance(L.prelu(dense), L.ParametricRectifierLayer)
    assert dense.nonlinearity is nonlinearities.identity


def test_standardize_is_fixed(rng):
    x = rng.standard_normal((3, 2))
    offset, scale = np.array([1.0, -2.0]), np.array([2.0, 0.5])
    net = L.standardize(L.InputLayer((None, 2)), offset, scale, shared_axes=0)
    np.testing.assert_allclose(run(net, x), (x - offset) / scale)
    assert L.get_all_params(net, trainable=True) == []


def test_rrelu(rng):
    net = L.InputLayer((None, 3, 4))
    layer = L.RandomizedRectifierLayer(net, lower=0.2, upper=0.4)
    x = -np.abs(rng.standard_normal((5, 3, 4))) - 0.1
    np.testing.assert_allclose(run(layer, x, deterministic=True), 0.3 * x)
    slopes = run(layer, x) / x
    assert np.all((slopes >= 0.2) & (slopes <= 0.4))
    # "auto" shares one slope per channel across batch and positions.
    np.testing.assert_allclose(slopes, np.broadcast_to(slopes[:1, :, :1], slopes.shape))
    dense = L.DenseLayer(L.InputLayer((None, 2)), 3)
    assert isinstance(L.rrelu(dense), L.RandomizedRectifierLayer)


def test_expression_and_inverse_layers(rng):
    net = L.InputLayer((None, 3, 4))
    expr = L.ExpressionLayer(net, lambda v: v.max(axis=-1), output_shape="auto")
    x = rng.standard_normal((2, 3, 4))
    assert expr.output_shape == (None, 3)
    np.testing.assert_allclose(run(expr, x), x.max(axis=-1))
    assert L.ExpressionLayer(net, pt.exp).output_shape == (None, 3, 4)
    assert L.ExpressionLayer(net, pt.sum, output_shape=lambda s: ()).output_shape == ()
    inp = L.InputLayer((None, 4))
    dense = L.DenseLayer(inp, 3, nonlinearity=None)
    inverse = L.InverseLayer(dense, dense)
    x2 = rng.standard_normal((2, 4))
    expected = (x2 @ dense.W.get_value() + dense.b.get_value()) @ dense.W.get_value().T
    np.testing.assert_allclose(run(inverse, x2), expected, rtol=1e-6)


def test_noise_layers(rng):
    net = L.InputLayer((None, 8, 5, 5))
    x = np.ones((50, 8, 5, 5))
    channels = run(L.dropout_channels(net, p=0.5), x)
    per_map = channels.reshape(50, 8, -1)
    assert np.all(per_map.min(-1) == per_map.max(-1))
    assert set(np.unique(channels)) == {0.0, 2.0}
    locations = run(L.dropout_locations(net, p=0.5), x)
    assert np.all(locations.min(axis=1) == locations.max(axis=1))
    noisy = run(L.GaussianNoiseLayer(net, sigma=0.5), x) - x
    assert abs(noisy.mean()) < 0.05 and abs(noisy.std() - 0.5) < 0.05
    np.testing.assert_array_equal(run(L.GaussianNoiseLayer(net), x, deterministic=True), x)
    assert L.dropout is L.DropoutLayer and L.spatial_dropout is L.dropout_channels


def test_noise_layers_draw_from_streams_seeded_when_built():
    """As in Lasagne, each noise layer's ``_srng`` (Theano's RandomStreams) takes its seed
    from ``lasagne.random`` when the layer is built: the same seed, the same noise."""
    from synkhronos.extensions.lasagne import random
    from synkhronos.ops.random_streams import RandomStreams

    net, x = L.InputLayer((None, 6)), np.full((40, 6), -1.0)
    saved = random.get_rng()
    try:
        outputs = []
        for _ in range(2):
            random.set_rng(np.random.RandomState(42))
            layers = [
                L.DropoutLayer(net),
                L.GaussianNoiseLayer(net),
                L.RandomizedRectifierLayer(net, shared_axes=()),
            ]
            random.set_rng(np.random.RandomState(7))  # only the seeds at build time count
            assert all(isinstance(layer._srng, RandomStreams) for layer in layers)
            outputs.append([run(layer, x) for layer in layers])
    finally:
        random.set_rng(saved)
    for first, second in zip(*outputs, strict=True):
        np.testing.assert_array_equal(first, second)
    dropped, noisy, rectified = outputs[0]
    assert set(np.unique(dropped)) == {0.0, -2.0} and noisy.std() > 0.05
    assert len(np.unique(rectified)) > 100 and ((-0.8 <= rectified) & (rectified <= -0.3)).all()


def test_get_output_shape():
    inp = L.InputLayer((None, 1, 8, 8))
    conv = L.Conv2DLayer(inp, 4, 3)
    pool = L.MaxPool2DLayer(conv, 2)
    assert L.get_output_shape(pool) == (None, 4, 3, 3)
    assert L.get_output_shape([conv, pool], (7, 1, 12, 12)) == [(7, 4, 10, 10), (7, 4, 5, 5)]
    assert L.get_output_shape(pool, {conv: (2, 4, 6, 6)}) == (2, 4, 3, 3)


def test_gpu_module_names(rng):
    inp = L.InputLayer((None, 3, 6, 6))
    assert L.dnn.Conv2DDNNLayer(inp, 2, 3).flip_filters is False
    assert L.corrmm.Conv2DMMLayer is L.dnn.Conv2DDNNLayer
    assert isinstance(L.dnn.MaxPool2DDNNLayer(inp, 2), L.Pool2DLayer)
    with pytest.raises(NotImplementedError, match="ignore_border=False"):
        L.dnn.MaxPool3DDNNLayer((1, 2, 4, 4, 4), 2, ignore_border=False)
    pool = L.cuda_convnet.MaxPool2DCCLayer(inp, 4)
    assert pool.output_shape == (None, 3, 2, 2)
    back = L.cuda_convnet.c01b_to_bc01(L.cuda_convnet.bc01_to_c01b(inp))
    assert back.output_shape == inp.output_shape
    with pytest.raises(RuntimeError, match="multiple of 16"):
        L.cuda_convnet.Conv2DCCLayer(inp, 2, 3)


def test_cuda_convnet_c01b_layout(rng):
    """dimshuffle=False: c01b tensors, filters (channels, rows, cols, num_filters)."""
    c01b = L.InputLayer((4, 7, 7, None))
    conv = L.cuda_convnet.Conv2DCCLayer(
        c01b, 16, 3, stride=2, untie_biases=True, nonlinearity=None, dimshuffle=False
    )
    assert conv.W.get_value().shape == (4, 3, 3, 16) and conv.b.get_value().shape == (16, 3, 3)
    assert conv.output_shape == (16, 3, 3, None)
    conv.b.set_value(rng.standard_normal((16, 3, 3)))
    pool = L.cuda_convnet.MaxPool2DCCLayer(c01b, 3, stride=2, dimshuffle=False)
    assert pool.output_shape == (4, 3, 3, None)
    x = rng.standard_normal((4, 7, 7, 2))
    got_conv, got_pool = (run(layer, x) for layer in (conv, pool))
    bc01 = x.transpose(3, 0, 1, 2)
    w = conv.W.get_value().transpose(3, 0, 1, 2)
    expected = correlate_nd(bc01, w, (2, 2), (0, 0)) + conv.b.get_value()
    np.testing.assert_allclose(got_conv, expected.transpose(1, 2, 3, 0), rtol=1e-6)
    expected = pool_nd(bc01, (3, 3), (2, 2), (0, 0), "max", ignore_border=False)
    np.testing.assert_allclose(got_pool, expected.transpose(1, 2, 3, 0))


def test_numpy_ints_are_sizes():
    """Layers and Ops share one int helper: NumPy ints work wherever ints do."""
    inp = L.InputLayer((None, 2, 9, 9))
    conv = L.Conv2DLayer(inp, 3, np.int64(3), stride=np.int64(2), pad=np.int32(1))
    assert conv.output_shape == (None, 3, 5, 5)
    assert L.Pool3DLayer((None, 1, 4, 4, 4), np.int64(2)).output_shape == (None, 1, 2, 2, 2)
    with pytest.raises(ValueError, match="length 3"):
        L.Conv3DLayer(L.InputLayer((None, 1, 4, 4, 4)), 1, (2, 2))
