"""Every layer of the Lasagne port compiles in PyTensor's JAX mode (what GPU ranks run).

Each case builds a small network around one layer class, with input variables whose
types know no sizes (as a script's ``pt.tensor4("x")``: only the InputLayer's shape
says them), and compiles its output and the gradient of a scalar loss with respect to
every parameter and float input, once in JAX mode and once with the Python linker; both
must agree on random data.  The graphs are built under ``floatX=float32``, so a float64
anywhere in JAX (which refuses mixed dtypes in a convolution) fails the case too.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne.layers import corrmm, cuda_convnet, dnn

jax = pytest.importorskip("jax")

BATCH = 5  # the batch axis stays unknown (None) to Lasagne in every case


def _input(shape, dtype="float32", name="x"):
    """An InputLayer of ``shape`` over a variable whose type knows no size."""
    var = pt.tensor(name=name, dtype=dtype, shape=(None,) * len(shape))
    return L.InputLayer(shape, var)


def _conv_net(layer_class, ndim, **kwargs):
    def build():
        return layer_class(_input((None, 2) + (5,) * ndim), 3, 3, **kwargs)

    return build


def _pool_net(layer_class, ndim, *args, **kwargs):
    def build():
        return layer_class(_input((None, 2) + (6,) * ndim), *args, **kwargs)

    return build


def _cnn():
    """Conv -> max pool -> dense, which flattens (issue #48's first reproducer)."""
    net = L.Conv2DLayer(_input((None, 1, 8, 8)), 4, 3)
    net = L.MaxPool2DLayer(net, 2)
    return L.DenseLayer(net, 10, nonlinearity=lasagne.nonlinearities.softmax)


def _unet():
    """Conv, pool, a stride-2 transposed convolution back up, and a skip concat."""
    inp = _input((None, 2, 8, 8))
    down = L.Conv2DLayer(inp, 3, 3, pad="same")
    up = L.TransposedConv2DLayer(L.MaxPool2DLayer(down, 2), 3, 2, stride=2)
    return L.Conv2DLayer(L.ConcatLayer([down, up]), 2, 1)


def _recurrent(kind, **kwargs):
    def build():
        inp = _input((None, 4, 3))
        mask = _input((None, 4), name="mask")
        if kind is L.CustomRecurrentLayer:
            in_to_hid = L.DenseLayer(L.InputLayer((None, 3)), 5)
            hid_to_hid = L.DenseLayer(L.InputLayer((None, 5)), 5)
            return kind(inp, in_to_hid, hid_to_hid, mask_input=mask, **kwargs)
        return kind(inp, 5, mask_input=mask, **kwargs)

    return build


def _transformer(kind, **kwargs):
    def build():
        inp = _input((None, 2, 6, 6))
        # Fixed transforms, whatever the input: a sample point near a pixel boundary
        # would let float32 rounding pick another pixel (and gradient) in each mode.
        if kind is L.TransformerLayer:
            b = np.array([0.9, 0.07, 0.031, -0.05, 0.83, 0.017])
        else:
            b = 0.013 * np.arange(2 * kwargs["control_points"]) - 0.05
        b = b.astype(pytensor.config.floatX)
        loc = L.DenseLayer(inp, len(b), W=lasagne.init.Constant(0.0), b=b, nonlinearity=None)
        return kind(inp, loc, **kwargs)

    return build


def _inverse():
    conv = L.Conv2DLayer(_input((None, 2, 5, 5)), 3, 3)
    return L.InverseLayer(L.NonlinearityLayer(conv), conv)


def _merge(kind, **kwargs):
    def build():
        a = L.DenseLayer(_input((None, 4)), 3)
        b = L.DenseLayer(_input((None, 5), name="y"), 3)
        return kind([a, b], **kwargs)

    return build


def _embedding():
    return L.EmbeddingLayer(_input((None, 4), dtype="int32"), 7, 3)


CASES = {
    "Conv1DLayer": _conv_net(L.Conv1DLayer, 1, pad="same"),
    "Conv2DLayer": _conv_net(L.Conv2DLayer, 2, stride=2, pad=1),
    "Conv3DLayer": _conv_net(L.Conv3DLayer, 3),
    "Conv2DLayer-untied": _conv_net(L.Conv2DLayer, 2, untie_biases=True),
    "TransposedConv2DLayer": _conv_net(L.TransposedConv2DLayer, 2, stride=2, crop=1),
    "TransposedConv3DLayer": _conv_net(L.TransposedConv3DLayer, 3, stride=2),
    "DilatedConv2DLayer": _conv_net(L.DilatedConv2DLayer, 2, dilation=2),
    "cnn": _cnn,
    "unet": _unet,
    "DenseLayer": lambda: L.DenseLayer(_input((None, 2, 3)), 4),
    "DenseLayer-leading": lambda: L.DenseLayer(_input((None, 2, 3)), 4, num_leading_axes=2),
    "NINLayer": lambda: L.NINLayer(_input((None, 2, 3, 3)), 4, untie_biases=True),
    "EmbeddingLayer": _embedding,
    "LocallyConnected2DLayer": lambda: L.LocallyConnected2DLayer(_input((None, 2, 4, 4)), 3, 3),
    "ConcatLayer": _merge(L.ConcatLayer),
    "ConcatLayer-cropped": lambda: L.ConcatLayer(
        [_input((None, 2, 5)), _input((None, 1, 4), name="y")], cropping=[None, None, "center"]
    ),
    "ElemwiseSumLayer": _merge(L.ElemwiseSumLayer, coeffs=[1.0, -2.0]),
    "ElemwiseMergeLayer": _merge(L.ElemwiseMergeLayer, merge_function=pt.mul),
    "DropoutLayer": lambda: L.DropoutLayer(_input((None, 6))),
    "spatial_dropout": lambda: L.spatial_dropout(_input((None, 2, 3, 3))),
    "GaussianNoiseLayer": lambda: L.GaussianNoiseLayer(_input((None, 6))),
    "BatchNormLayer": lambda: L.BatchNormLayer(_input((None, 3, 4, 4))),
    "batch_norm": lambda: L.batch_norm(L.Conv2DLayer(_input((None, 2, 5, 5)), 3, 3)),
    "instance_norm": lambda: L.instance_norm(L.Conv2DLayer(_input((None, 2, 5, 5)), 3, 3)),
    "layer_norm": lambda: L.layer_norm(L.DenseLayer(_input((None, 6)), 4)),
    "StandardizationLayer": lambda: L.StandardizationLayer(_input((None, 3, 4))),
    "LocalResponseNormalization2DLayer": lambda: L.LocalResponseNormalization2DLayer(
        _input((None, 6, 3, 3)), n=3
    ),
    "MaxPool1DLayer": _pool_net(L.MaxPool1DLayer, 1, 2),
    "MaxPool2DLayer": _pool_net(L.MaxPool2DLayer, 2, 3, stride=2, pad=1),
    "MaxPool3DLayer": _pool_net(L.MaxPool3DLayer, 3, 2),
    "Pool1DLayer": _pool_net(L.Pool1DLayer, 1, 3, mode="average_inc_pad", ignore_border=False),
    "Pool2DLayer-inc": _pool_net(L.Pool2DLayer, 2, 3, stride=2, pad=1, mode="average_inc_pad"),
    "Pool2DLayer-exc": _pool_net(L.Pool2DLayer, 2, 3, stride=2, pad=1, mode="average_exc_pad"),
    "Pool2DLayer-no-border": _pool_net(L.Pool2DLayer, 2, 4, ignore_border=False),
    "Pool3DLayer": _pool_net(L.Pool3DLayer, 3, 2, mode="average_exc_pad"),
    "Upscale1DLayer": _pool_net(L.Upscale1DLayer, 1, 2),
    "Upscale2DLayer": _pool_net(L.Upscale2DLayer, 2, 2, mode="dilate"),
    "Upscale3DLayer": _pool_net(L.Upscale3DLayer, 3, 2),
    "GlobalPoolLayer": _pool_net(L.GlobalPoolLayer, 2),
    "GlobalPoolLayer-max": _pool_net(L.GlobalPoolLayer, 2, pt.max),
    "FeaturePoolLayer": lambda: L.FeaturePoolLayer(_input((None, 6, 3)), 2),
    "FeatureWTALayer": lambda: L.FeatureWTALayer(_input((None, 6, 3)), 3),
    "SpatialPyramidPoolingLayer": _pool_net(L.SpatialPyramidPoolingLayer, 2, [3, 2, 1]),
    "CustomRecurrentLayer": _recurrent(L.CustomRecurrentLayer, only_return_final=True),
    "RecurrentLayer": _recurrent(L.RecurrentLayer, backwards=True, learn_init=True),
    "LSTMLayer": _recurrent(L.LSTMLayer, only_return_final=True, grad_clipping=5.0),
    "LSTMLayer-unrolled": _recurrent(L.LSTMLayer, unroll_scan=True, precompute_input=False),
    "GRULayer": _recurrent(L.GRULayer, hid_init=lasagne.init.Normal(0.1), learn_init=True),
    "GRULayer-truncated": _recurrent(L.GRULayer, gradient_steps=2),
    "FlattenLayer": lambda: L.FlattenLayer(_input((None, 2, 3, 2))),
    "ReshapeLayer": lambda: L.ReshapeLayer(_input((None, 2, 6)), ([0], 3, -1)),
    "DimshuffleLayer": lambda: L.DimshuffleLayer(_input((None, 2, 3)), (2, "x", 0, 1)),
    "PadLayer": lambda: L.PadLayer(_input((None, 2, 3, 3)), (1, 2)),
    "SliceLayer": lambda: L.SliceLayer(_input((None, 5, 3)), slice(1, 4), axis=1),
    "SliceLayer-index": lambda: L.SliceLayer(_input((None, 5, 3)), -1, axis=-1),
    "NonlinearityLayer": lambda: L.NonlinearityLayer(_input((None, 6))),
    "BiasLayer": lambda: L.BiasLayer(_input((None, 3, 2))),
    "ScaleLayer": lambda: L.ScaleLayer(_input((None, 3, 2))),
    "standardize": lambda: L.standardize(_input((None, 3)), np.ones(3), 2 * np.ones(3)),
    "ExpressionLayer": lambda: L.ExpressionLayer(_input((None, 3, 2)), lambda x: x.sum(2)),
    "InverseLayer": _inverse,
    "ParametricRectifierLayer": lambda: L.prelu(L.DenseLayer(_input((None, 6)), 4)),
    "RandomizedRectifierLayer": lambda: L.rrelu(L.DenseLayer(_input((None, 6)), 4)),
    "TransformerLayer": _transformer(L.TransformerLayer),
    # The GPU-named submodules' layers, which run on the same Ops.
    "Conv2DDNNLayer": _conv_net(dnn.Conv2DDNNLayer, 2, pad="full"),
    "Conv3DDNNLayer": _conv_net(dnn.Conv3DDNNLayer, 3, stride=2),
    "MaxPool2DDNNLayer": _pool_net(dnn.MaxPool2DDNNLayer, 2, 2),
    "MaxPool3DDNNLayer": _pool_net(dnn.MaxPool3DDNNLayer, 3, 2),
    "Pool2DDNNLayer": _pool_net(dnn.Pool2DDNNLayer, 2, 3, stride=2, pad=1, mode="average_exc_pad"),
    "Pool3DDNNLayer": _pool_net(dnn.Pool3DDNNLayer, 3, 2, mode="average_inc_pad"),
    "SpatialPyramidPoolingDNNLayer": _pool_net(dnn.SpatialPyramidPoolingDNNLayer, 2, [2, 1]),
    "batch_norm_dnn": lambda: dnn.batch_norm_dnn(L.Conv2DLayer(_input((None, 2, 5, 5)), 3, 3)),
    "Conv2DMMLayer": _conv_net(corrmm.Conv2DMMLayer, 2, pad=1),
    "Conv2DCCLayer": lambda: cuda_convnet.Conv2DCCLayer(_input((None, 3, 6, 6)), 16, 3),
    "MaxPool2DCCLayer": _pool_net(cuda_convnet.MaxPool2DCCLayer, 2, 2),
    "NINLayer_c01b": lambda: cuda_convnet.NINLayer_c01b(_input((4, 3, 3, None)), 5),
    "ShuffleBC01ToC01BLayer": lambda: cuda_convnet.ShuffleC01BToBC01Layer(
        cuda_convnet.ShuffleBC01ToC01BLayer(_input((None, 2, 3, 3)))
    ),
    "TPSTransformerLayer": _transformer(L.TPSTransformerLayer, control_points=4),
}


def _value(layer, rng):
    """Random data for an InputLayer: indices, a mask, or normal floats."""
    shape = tuple(BATCH if d is None else d for d in layer.shape)
    dtype = layer.input_var.dtype
    if dtype.startswith("int"):
        return rng.integers(0, 7, shape).astype(dtype)
    if layer.input_var.name == "mask":
        mask = rng.random(shape) < 0.7
        mask[:, 0] = True  # every sequence has at least one step
        return mask.astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _compile(net, inputs, mode, deterministic):
    """Output and the gradient of a scalar loss w.r.t. params and float inputs."""
    out = L.get_output(net, deterministic=deterministic)
    loss = pt.sum(pt.sin(3 * out) + out)
    wrt = L.get_all_params(net, trainable=True)
    wrt += [v for v in inputs if v.dtype.startswith("float") and v.name != "mask"]
    return pytensor.function(inputs, [out, *pytensor.grad(loss, wrt)], mode=mode)


# Their noise is drawn by each mode's own generator: compared without it.
NOISY = {"DropoutLayer", "spatial_dropout", "GaussianNoiseLayer", "RandomizedRectifierLayer"}


# Cases PyTensor's JAX backend cannot express, by the Op that it lacks.
UNSUPPORTED = {
    "GRULayer-truncated": "PyTensor's JAX Scan has no truncate_gradient (gradient_steps): "
    "the truncated backward scan's trace fails its buffer-length assertion",
}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            name,
            marks=pytest.mark.xfail(reason=UNSUPPORTED[name], raises=AssertionError, strict=True),
        )
        if name in UNSUPPORTED
        else name
        for name in sorted(CASES)
    ],
)
def test_layer_in_jax_mode(case, rng):
    # Without 64-bit types, as GPU ranks run JAX under floatX=float32.
    with pytensor.config.change_flags(floatX="float32"), jax.enable_x64(False):
        net = CASES[case]()
        inputs = [lay for lay in L.get_all_layers(net) if isinstance(lay, L.InputLayer)]
        variables = [lay.input_var for lay in inputs]
        jax_fn = _compile(net, variables, "JAX", case in NOISY)
        ref_fn = _compile(net, variables, "FAST_COMPILE", case in NOISY)
        values = [_value(lay, rng) for lay in inputs]
        got, expected = jax_fn(*values), ref_fn(*values)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert np.asarray(g).dtype == e.dtype != np.float64
        # Float32 rounds a gradient's entry to the scale of the terms it sums, the largest
        # entry's (~600 for TransformerLayer's W, whose entry ~0.1 both modes, on
        # PyTensor 3.3, miss float64's by 4e-4): absolute error up to ~8 of its ulps.
        atol = max(2e-5, 1e-6 * float(np.abs(e).max(initial=0.0)))
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=atol)
