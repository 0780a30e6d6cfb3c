"""Numerics of the port's graph functions against NumPy: ``theano_extensions`` (the 1-D
convolutions and ``padding.pad``), ``layers.pool``'s ``pool_2d`` / ``pool_3d`` (Theano's
pooling, also with window sizes known only at run time) and the spatial pyramid with
unknown input sizes, ``nonlinearities.rectify`` on NumPy arrays, ``utils.unroll_scan``.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne import nonlinearities, objectives, utils
from synkhronos.extensions.lasagne.layers import pool
from synkhronos.extensions.lasagne.theano_extensions import conv, padding

MODE = "FAST_COMPILE"


def value(expr, inputs=(), *values):
    return pytensor.function(list(inputs), expr, mode=MODE)(*values)


def convolve_1d(x, w, stride=1, pad=0, flip=True):
    """Batch of 1-D convolutions (``flip``) or correlations, summed over channels."""
    x = np.pad(x, [(0, 0), (0, 0), (pad, pad)])
    w = w[:, :, ::-1] if flip else w
    k = w.shape[2]
    out_len = (x.shape[2] - k) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], out_len))
    for i in range(out_len):
        out[:, :, i] = np.einsum("bck,fck->bf", x[:, :, i * stride : i * stride + k], w)
    return out


@pytest.mark.parametrize(
    "name", ["conv1d_sc", "conv1d_mc0", "conv1d_mc1", "conv1d_unstrided", "conv1d_sd", "conv1d_md"]
)
def test_1d_convolutions(rng, name):
    function = getattr(conv, name)
    x_var, w_var = pt.tensor3("x"), pt.tensor3("w")
    x, w = rng.standard_normal((2, 3, 11)), rng.standard_normal((4, 3, 4))
    outputs = [
        function(x_var, w_var, x.shape, w.shape, subsample=(s,), filter_flip=flip)
        for s, flip in ((1, True), (2, False))
    ]
    got = value(outputs, [x_var, w_var], x, w)
    np.testing.assert_allclose(got[0], convolve_1d(x, w), rtol=1e-6)
    np.testing.assert_allclose(got[1], convolve_1d(x, w, stride=2, flip=False), rtol=1e-6)
    with pytest.raises((ValueError, RuntimeError)):
        function(x_var, w_var, x.shape, w.shape, border_mode=None)
    if name in ("conv1d_unstrided", "conv1d_sd", "conv1d_md"):
        with pytest.raises(RuntimeError, match="not a multiple of the stride"):
            function(x_var, w_var, x.shape, (4, 3, 3), subsample=(2,))


def test_1d_convolution_border_modes(rng):
    x_var, w_var = pt.tensor3("x"), pt.tensor3("w")
    x, w = rng.standard_normal((1, 2, 9)), rng.standard_normal((3, 2, 3))
    modes = {1: 1, (2,): 2, "full": 2, "half": 1, "valid": 0}
    # "full" and "half" take the filter length from filter_shape (w_var's is unknown)
    outputs = [conv.conv1d_mc0(x_var, w_var, None, w.shape, border_mode=m) for m in modes]
    outputs.append(conv.conv1d_mc1(x_var, w_var, border_mode=(2,)))
    got = value(outputs, [x_var, w_var], x, w)
    for out, pad in zip(got, [*modes.values(), 2], strict=True):
        np.testing.assert_allclose(out, convolve_1d(x, w, pad=pad), rtol=1e-6)
    with pytest.raises(RuntimeError, match="Unsupported border_mode"):
        conv.conv1d_sc(x_var, w_var, border_mode="full")


def test_pad(rng):
    x_var = pt.tensor4("x")
    x = rng.standard_normal((2, 3, 4, 5))
    cases = [  # (width, val, batch_ndim) and np.pad's widths for the padded axes
        ((3, 7, 1), [(3, 3)] * 3),
        (((1, 2), 0, 2), [(1, 1), (2, 2)]),
        (([(1, 2), (3, 0)], 0.5, 2), [(1, 2), (3, 0)]),
        (([2], 0, 1), [(2, 2), (0, 0), (0, 0)]),  # fewer widths: the first axes only
    ]
    got = value([padding.pad(x_var, *args) for args, _ in cases], [x_var], x)
    for out, ((_, val, batch_ndim), widths) in zip(got, cases, strict=True):
        expected = np.pad(x, [(0, 0)] * batch_ndim + widths, constant_values=val)
        np.testing.assert_array_equal(out, expected)
    layer = L.PadLayer(L.InputLayer((None, 3, 4, 5)), width=[1])
    assert layer.output_shape == (None, 3, 6, 5)


def windows_max(x, ws, stride):
    """Max over full windows of the last two axes (no padding)."""
    rows = (x.shape[-2] - ws[0]) // stride[0] + 1
    cols = (x.shape[-1] - ws[1]) // stride[1] + 1
    out = np.empty(x.shape[:-2] + (rows, cols))
    for i in range(rows):
        for j in range(cols):
            r, c = i * stride[0], j * stride[1]
            out[..., i, j] = x[..., r : r + ws[0], c : c + ws[1]].max(axis=(-2, -1))
    return out


def test_pool_2d_and_3d(rng):
    x_var, ws, st = pt.tensor4("x"), pt.ivector("ws"), pt.ivector("st")
    x = rng.standard_normal((2, 3, 9, 8))
    outputs = [
        pool.pool_2d(x_var, ws=ws, stride=st, ignore_border=True, pad=None),  # run-time sizes
        pool.pool_2d(x_var, ws=(3, 2), stride=(2, 3), ignore_border=True),
        pool.pool_2d(x_var[0], ws=(3, 2), stride=(2, 3), ignore_border=True),  # 3-d input
        pool.pool_2d(x_var, ws=(2, 2), mode="average_exc_pad", ignore_border=True),
        pool.pool_2d(x_var, ds=(4, 4), ignore_border=False),  # Theano's old names
        pool.pool_3d(x_var[None], ws=(1, 3, 2), stride=(1, 2, 3), ignore_border=True),
    ]
    got = value(outputs, [x_var, ws, st], x, [3, 2], [2, 3])
    expected = windows_max(x, (3, 2), (2, 3))
    for out in (got[0], got[1], got[5][0]):
        np.testing.assert_allclose(out, expected)
    np.testing.assert_allclose(got[2], expected[0])
    np.testing.assert_allclose(got[3], x[:, :, :8].reshape(2, 3, 4, 2, 4, 2).mean(axis=(3, 5)))
    partial = np.pad(x, [(0, 0), (0, 0), (0, 3), (0, 0)], constant_values=-np.inf)
    np.testing.assert_allclose(got[4], windows_max(partial, (4, 4), (4, 4)))
    with pytest.raises(ValueError):
        pool.pool_2d(x_var, ws=ws, ignore_border=False)


@pytest.mark.parametrize("implementation", ["fast", "kaiming"])
def test_spatial_pyramid_of_unknown_sizes(rng, implementation):
    x_var = pt.tensor4("x")
    x = rng.standard_normal((2, 3, 17, 13))
    layer = L.SpatialPyramidPoolingLayer(
        (None, None, None, None), [1, 2, 3], implementation=implementation
    )
    got = value(layer.get_output_for(x_var), [x_var], x)
    expected = []
    for d in (1, 2, 3):
        bins = []
        for size in x.shape[2:]:
            if implementation == "kaiming":
                bins.append([(i * size // d, -(-(i + 1) * size // d)) for i in range(d)])
            else:
                step, width = size // d, -(-size // d)
                bins.append([(i * step, i * step + width) for i in range(d)])
        expected += [
            x[:, :, r0:r1, c0:c1].max(axis=(2, 3)) for r0, r1 in bins[0] for c0, c1 in bins[1]
        ]
    np.testing.assert_allclose(got, np.stack(expected, axis=2))
    assert got.shape[2] == layer.output_shape[2] == 14
    regions = pool.pool_2d_nxn_regions(x_var, 2, mode="average_inc_pad")
    assert len(regions) == 4 and regions[0].ndim == 3


def test_rectify_takes_numpy_arrays_and_targets_align(rng):
    x = rng.standard_normal(7)
    np.testing.assert_array_equal(nonlinearities.rectify(x), np.maximum(x, 0))
    p_var, t_var = pt.vector("p"), pt.vector("t")
    p, t = rng.uniform(0.1, 0.9, 5), rng.integers(0, 2, 5).astype(float)
    column = p_var.dimshuffle(0, "x")  # a (batch, 1) output against (batch,) targets
    outputs = [
        objectives.binary_crossentropy(column, t_var)[:, 0],
        objectives.huber_loss(column, t_var, delta=0.3)[:, 0],
        objectives.binary_accuracy(column, t_var)[:, 0],
    ]
    ce, huber, accuracy = value(outputs, [p_var, t_var], p, t)
    np.testing.assert_allclose(ce, -(t * np.log(p) + (1 - t) * np.log(1 - p)))
    d = np.abs(p - t)
    np.testing.assert_allclose(huber, np.where(d <= 0.3, d**2 / 2, 0.3 * (d - 0.15)))
    np.testing.assert_array_equal(accuracy, (p >= 0.5) == t)


def test_unroll_scan_takes_one_sequence_and_numbers():
    a = pt.scalar("a")
    (powers,) = utils.unroll_scan(lambda step, prev, a: [prev * a], pt.arange(3), [1.0], [a], 3)
    np.testing.assert_allclose(value(powers, [a], 2.0), [2.0, 4.0, 8.0])
