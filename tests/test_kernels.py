"""synkhronos.ops.conv.kernels called directly: each gradient kernel is the adjoint of its
forward kernel (<f(x), g> = <x, f'(g)>), the forward convolution matches direct sums, and
the kernels refuse shapes that do not fit."""

from __future__ import annotations

import numpy as np
import pytest

from synkhronos.ops.conv import kernels

# (x shape, w shape, geom = strides, dilations, paddings top/bottom/left/right, groups)
CONV = [
    ((2, 4, 7, 6), (6, 2, 3, 2), (2, 1, 1, 2, 1, 0, 2, 1, 2)),
    ((1, 3, 5, 4), (2, 3, 1, 1), (1, 1, 1, 1, 0, 0, 0, 0, 1)),  # 1x1: no im2col
]


def _direct(x, w, geom):
    sh, sw, dh, dw, pt_, pb, pl, pr, groups = geom
    xp = np.pad(x, ((0, 0), (0, 0), (pt_, pb), (pl, pr)))
    o, cg, kh, kw = w.shape
    out_h = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    out_w = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((x.shape[0], o, out_h, out_w))
    for f in range(o):
        g = f // (o // groups)
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg : (g + 1) * cg, i * dh :: sh, j * dw :: sw]
                y[:, f] += np.einsum("nchw,c->nhw", patch[:, :, :out_h, :out_w], w[f, :, i, j])
    return y


@pytest.mark.parametrize("x_shape, w_shape, geom", CONV)
def test_convolution_and_its_adjoints(x_shape, w_shape, geom, rng):
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    y = kernels.conv2d_forward(x, w, geom)
    np.testing.assert_allclose(y, _direct(x, w, geom), atol=1e-12)
    gy = rng.standard_normal(y.shape)
    gx = kernels.conv2d_grad_inputs(w, gy, x, geom)
    gw = kernels.conv2d_grad_weights(x, gy, w, geom)
    assert gx.shape == x.shape and gw.shape == w.shape
    np.testing.assert_allclose(np.vdot(gx, x), np.vdot(gy, y), rtol=1e-10)
    np.testing.assert_allclose(np.vdot(gw, w), np.vdot(gy, y), rtol=1e-10)


def test_convolution_refuses_what_does_not_fit(rng):
    x, w = rng.standard_normal((1, 4, 5, 5)), rng.standard_normal((3, 2, 3, 3))
    geom = (1, 1, 1, 1, 0, 0, 0, 0, 2)
    with pytest.raises(ValueError, match="groups"):
        kernels.conv2d_forward(x, w, geom)  # 3 filters in 2 groups
    with pytest.raises(ValueError, match="do not fit"):
        kernels.conv2d_forward(x, w[:2, :, :, :], (1, 1, 3, 3, 0, 0, 0, 0, 2))
    with pytest.raises(ValueError, match="wrong shape"):
        kernels.conv2d_grad_inputs(w[:2], np.zeros((1, 2, 2, 3)), x, geom)


# (kh, kw, sh, sw, ph, pw, ignore_border); modes 0 max, 1 average with the padding, 2 without
POOLS = [(3, 2, 2, 1, 1, 0, 1), (2, 3, 3, 2, 0, 0, 0)]


@pytest.mark.parametrize("window", POOLS)
def test_pooling_gradients_are_adjoints(window, rng):
    x = rng.standard_normal((2, 3, 7, 6))
    for mode in (1, 2):  # average pooling is linear: its gradient is its adjoint
        params = (*window, mode)
        y = kernels.pool2d_forward(x, params)
        g = rng.standard_normal(y.shape)
        np.testing.assert_allclose(
            np.vdot(kernels.pool2d_grad(x, g, params), x), np.vdot(g, y), rtol=1e-10
        )
    params = (*window, 0)
    y = kernels.pool2d_forward(x, params)
    gout, g = rng.standard_normal(y.shape), rng.standard_normal(x.shape)
    gx = kernels.pool2d_grad(x, gout, params)  # to each window's maximum
    np.testing.assert_allclose(np.vdot(gx, x), np.vdot(gout, y), rtol=1e-10)
    gathered = kernels.max_pool2d_gather(x, g, params)  # the adjoint of that routing
    np.testing.assert_allclose(np.vdot(gathered, gout), np.vdot(g, gx), rtol=1e-10)
    np.testing.assert_array_equal(kernels.max_pool2d_gather(x, x, params), y)


def test_pooling_refuses_what_does_not_fit():
    x = np.zeros((1, 1, 2, 2))
    with pytest.raises(ValueError, match="does not fit"):
        kernels.pool2d_forward(x, (3, 3, 1, 1, 0, 0, 1, 0))
    with pytest.raises(ValueError, match="wrong shape"):
        kernels.pool2d_grad(x, np.zeros((1, 1, 2, 2)), (2, 2, 2, 2, 0, 0, 1, 0))
    with pytest.raises(ValueError, match="input's shape"):
        kernels.max_pool2d_gather(x, np.zeros((1, 1, 3, 3)), (2, 2, 2, 2, 0, 0, 1, 0))


def test_valid_range_is_where_the_input_index_falls_inside():
    for out_len in range(0, 6):
        for in_len in range(0, 6):
            for offset in range(-4, 5):
                for stride in range(1, 4):
                    inside = [o for o in range(out_len) if 0 <= o * stride + offset < in_len]
                    lo, hi = kernels._valid_range(out_len, in_len, offset, stride)
                    assert list(range(lo, hi)) == inside
