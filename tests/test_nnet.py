"""synkhronos.ops.nnet: Theano's activations, cross-entropies and convolutions (filters
flipped, Theano's border modes) against NumPy, and its gradient Ops as adjoints."""

from __future__ import annotations

import itertools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.ops import nnet

MODE = "FAST_COMPILE"
floatX = pytensor.config.floatX


def function(inputs, outputs):
    return pytensor.function(inputs, outputs, mode=MODE)


def np_correlate(x, w, stride, pad, dilation, groups=1):
    """Cross-correlation over the trailing axes of ``x`` (N, C, *spatial) with ``w``
    (O, C / groups, *kernel); ``pad`` holds (before, after) per axis."""
    n = w.ndim - 2
    x = np.pad(x, [(0, 0), (0, 0), *pad])
    out_len = [
        (x.shape[2 + a] - dilation[a] * (w.shape[2 + a] - 1) - 1) // stride[a] + 1 for a in range(n)
    ]
    out = np.zeros((x.shape[0], w.shape[0], *out_len))
    per_group = w.shape[0] // groups
    for f in range(w.shape[0]):
        chans = slice(f // per_group * w.shape[1], (f // per_group + 1) * w.shape[1])
        for taps in itertools.product(*[range(k) for k in w.shape[2:]]):
            window = tuple(
                slice(t * d, t * d + (o - 1) * s + 1, s)
                for t, d, o, s in zip(taps, dilation, out_len, stride, strict=True)
            )
            out[:, f] += np.einsum(
                "nc...,c->n...", x[(slice(None), chans, *window)], w[(f, slice(None), *taps)]
            )
    return out


def test_activations_and_crossentropies(rng):
    x, t, p = pt.matrix("x"), pt.matrix("t"), pt.matrix("p")
    labels = pt.ivector("labels")
    outs = [
        nnet.sigmoid(x),
        nnet.relu(x),
        nnet.relu(x, 0.1),
        nnet.softplus(x),
        nnet.softmax(x),
        nnet.softmax(x[0]),
        nnet.categorical_crossentropy(p, t),
        nnet.categorical_crossentropy(p, labels),
        nnet.binary_crossentropy(p, t),
    ]
    f = function([x, t, p, labels], outs)
    xv = rng.normal(size=(3, 4))
    pv = rng.uniform(0.05, 0.95, size=(3, 4))
    tv = rng.uniform(size=(3, 4))
    lv = np.array([2, 0, 3], np.int32)
    e = np.exp(xv - xv.max(axis=1, keepdims=True))
    soft = e / e.sum(axis=1, keepdims=True)
    want = [
        1 / (1 + np.exp(-xv)),
        np.maximum(xv, 0),
        np.where(xv > 0, xv, 0.1 * xv),
        np.log1p(np.exp(xv)),
        soft,
        soft[:1],
        -(tv * np.log(pv)).sum(axis=1),
        -np.log(pv[np.arange(3), lv]),
        -(tv * np.log(pv) + (1 - tv) * np.log(1 - pv)),
    ]
    for g, w in zip(f(xv, tv, pv, lv), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(nnet.relu(xv), np.maximum(xv, 0))  # NumPy in, NumPy out
    with pytest.raises(TypeError, match="rank mismatch"):
        nnet.categorical_crossentropy(p, pt.tensor3())


def test_conv2d_flips_filters_with_theano_border_modes(rng):
    x = pt.tensor4("x")
    w = pytensor.shared(rng.normal(size=(4, 2, 3, 2)), name="w")  # sizes known from the value
    wv, wg = w.get_value(), rng.normal(size=(4, 1, 2, 3))
    grouped = pt.constant(wg)
    cases = [  # (filters, their value, kwargs, pad, stride, dilation, flip, groups)
        (w, wv, {}, [(0, 0)] * 2, (1, 1), (1, 1), True, 1),
        (
            w,
            wv,
            {"border_mode": "full", "filter_flip": False},
            [(2, 2), (1, 1)],
            (1, 1),
            (1, 1),
            False,
            1,
        ),
        (
            w,
            wv,
            {"border_mode": "half", "subsample": (2, 1), "filter_dilation": (2, 1)},
            [(2, 2), (1, 1)],
            (2, 1),
            (2, 1),
            True,
            1,
        ),
        (
            grouped,
            wg,
            {"border_mode": (1, 0), "num_groups": 2},
            [(1, 1), (0, 0)],
            (1, 1),
            (1, 1),
            True,
            2,
        ),
        (w, wv, {"border_mode": ((1, 0), (0, 2))}, [(1, 0), (0, 2)], (1, 1), (1, 1), True, 1),
    ]
    f = function([x], [nnet.conv2d(x, c[0], **c[2]) for c in cases])
    xv = rng.normal(size=(2, 2, 7, 6))
    for got, (_, value, _, pad, stride, dilation, flip, groups) in zip(f(xv), cases, strict=True):
        kernel = value[..., ::-1, ::-1] if flip else value
        np.testing.assert_allclose(
            got, np_correlate(xv, kernel, stride, pad, dilation, groups), rtol=1e-9, atol=1e-12
        )
    with pytest.raises(ValueError, match="filter_shape"):
        nnet.conv2d(x, pt.tensor4(), border_mode="half")
    with pytest.raises(NotImplementedError):
        nnet.conv2d(x, w, unshared=True)


def test_conv3d(rng):
    x = pt.tensor5("x")
    wv = rng.normal(size=(3, 2, 2, 3, 2))
    w = pt.constant(wv)
    f = function(
        [x],
        [
            nnet.conv3d(x, w),
            nnet.conv3d(x, w, border_mode="half", subsample=(1, 2, 1), filter_flip=False),
        ],
    )
    xv = rng.normal(size=(2, 2, 4, 5, 3))
    valid, half = f(xv)
    np.testing.assert_allclose(
        valid,
        np_correlate(xv, wv[..., ::-1, ::-1, ::-1], (1, 1, 1), [(0, 0)] * 3, (1, 1, 1)),
        rtol=1e-9,
    )
    np.testing.assert_allclose(
        half, np_correlate(xv, wv, (1, 2, 1), [(1, 1), (1, 1), (1, 1)], (1, 1, 1)), rtol=1e-9
    )


@pytest.mark.parametrize("n", [2, 3])
def test_abstract_conv_gradients_are_adjoints(n, rng):
    """<conv(x, w), g> = <x, gradInputs(w, g)> = <w, gradWeights(x, g)>."""
    ac = nnet
    grad_inputs = ac.AbstractConv2d_gradInputs if n == 2 else ac.AbstractConv3d_gradInputs
    grad_weights = ac.AbstractConv2d_gradWeights if n == 2 else ac.AbstractConv3d_gradWeights
    x_shape, w_shape = (2, 3, *[5, 6, 4][:n]), (4, 3, *[3, 2, 2][:n])
    if n == 2:
        kwargs = {"border_mode": "half", "subsample": (2, 1), "filter_flip": True, "kshp": w_shape}
        pad, stride = [(1, 1), (1, 1)], (2, 1)
    else:
        kwargs = {"filter_flip": False, "kshp": w_shape}
        pad, stride = [(0, 0)] * 3, (1, 1, 1)
    xv, wv = rng.normal(size=x_shape), rng.normal(size=w_shape)
    kernel = wv[(Ellipsis, *[slice(None, None, -1)] * n)] if kwargs["filter_flip"] else wv
    yv = np_correlate(xv, kernel, stride, pad, (1,) * n)
    gv = rng.normal(size=yv.shape)
    kern, img, top = (
        pt.tensor("k", dtype=floatX, shape=(None,) * (n + 2)),
        pt.tensor("i", dtype=floatX, shape=(None,) * (n + 2)),
        pt.tensor("g", dtype=floatX, shape=(None,) * (n + 2)),
    )
    # Lasagne gives the input's sizes as a symbolic vector
    in_sizes = pt.as_tensor_variable(np.array(x_shape[2:])) if n == 2 else x_shape[2:]
    f = function(
        [kern, img, top],
        [grad_inputs(**kwargs)(kern, top, in_sizes), grad_weights(**kwargs)(img, top, w_shape[2:])],
    )
    gi, gw = f(wv, xv, gv)
    assert gi.shape == x_shape and gw.shape == w_shape
    np.testing.assert_allclose((gi * xv).sum(), (yv * gv).sum(), rtol=1e-9)
    np.testing.assert_allclose((gw * wv).sum(), (yv * gv).sum(), rtol=1e-9)


def test_conv_nd_in_one_dimension_and_border_modes(rng):
    x = pt.tensor3("x")
    wv = rng.normal(size=(2, 3, 3))
    w = pytensor.shared(wv, name="w")  # sizes read from the shared value
    f = function(
        [x],
        [
            nnet.conv_nd(x, w, 1, border_mode="full"),
            nnet.conv_nd(x, w, 1, border_mode=2, subsample=2, filter_flip=False),
            nnet.conv_nd(x, w, 1, border_mode="half", filter_dilation=2),
        ],
    )
    xv = rng.normal(size=(2, 3, 8))
    full, padded, half = f(xv)
    flipped = wv[..., ::-1]
    np.testing.assert_allclose(full, np_correlate(xv, flipped, (1,), [(2, 2)], (1,)), atol=1e-12)
    np.testing.assert_allclose(padded, np_correlate(xv, wv, (2,), [(2, 2)], (1,)), atol=1e-12)
    np.testing.assert_allclose(half, np_correlate(xv, flipped, (1,), [(2, 2)], (2,)), atol=1e-12)
    assert half.shape == xv.shape[:1] + (2, 8)  # "half" keeps the length
    for bad in ("same", -1, (1, 2)):
        with pytest.raises(ValueError, match="invalid border_mode"):
            nnet.conv_nd(x, w, 1, border_mode=bad)
    with pytest.raises(ValueError, match="give filter_shape"):
        nnet.conv_nd(pt.tensor5("x"), pt.tensor5("w"), 3)
