"""The Numba kernels that compute the Ops of :mod:`synkhronos.ops.conv.ops2d`, on NCHW arrays.

Convolution is im2col + BLAS GEMM, image by image (1x1 convolutions skip the im2col);
pooling loops over windows. Each kernel takes its Op's parameters as one tuple of ints.
"""

import numba
import numpy as np

from synkhronos.ops.conv.geometry import conv_output_length, pool_output_length_int

_jit = numba.njit(cache=True, nogil=True)
_conv_len = _jit(conv_output_length)
_pool_len = _jit(pool_output_length_int)


@_jit
def _valid_range(out_len, in_len, offset, stride):
    """Range of output positions ``o`` with ``0 <= o * stride + offset < in_len``."""
    lo = 0 if offset >= 0 else (stride - 1 - offset) // stride
    last = in_len - 1 - offset
    hi = 0 if last < 0 else min(out_len, last // stride + 1)
    return min(lo, hi), hi


@_jit
def _conv_geometry(x_shape, w_shape, geom):
    """Output height and width, after checking that input and filters fit together."""
    sh, sw, dh, dw, pad_t, pad_b, pad_l, pad_r, groups = geom
    if x_shape[1] != w_shape[1] * groups or w_shape[0] % groups != 0:
        raise ValueError("conv2d: input channels and filters do not match the groups")
    out_h = _conv_len(x_shape[2], w_shape[2], sh, pad_t, pad_b, dh)
    out_w = _conv_len(x_shape[3], w_shape[3], sw, pad_l, pad_r, dw)
    if out_h < 1 or out_w < 1:
        raise ValueError("conv2d: the filters do not fit the padded input")
    return out_h, out_w


@_jit
def _im2col(image, cols, kh, kw, out_h, out_w, geom):
    """Fill ``cols`` (C * kh * kw, out_h * out_w) with the padded taps of one image."""
    sh, sw, dh, dw, pad_t, _, pad_l, _, _ = geom
    chans, height, width = image.shape
    taps = cols.reshape((chans, kh, kw, out_h, out_w))
    for c in range(chans):
        for i in range(kh):
            for j in range(kw):
                offset = j * dw - pad_l
                lo, hi = _valid_range(out_w, width, offset, sw)
                for y in range(out_h):
                    row = taps[c, i, j, y]
                    src = y * sh + i * dh - pad_t
                    if src < 0 or src >= height:
                        row[:] = 0
                        continue
                    row[:lo] = 0
                    row[hi:] = 0
                    if sw == 1:  # contiguous: a vectorised copy
                        row[lo:hi] = image[c, src, lo + offset : hi + offset]
                    else:
                        for xo in range(lo, hi):
                            row[xo] = image[c, src, xo * sw + offset]


@_jit
def _col2im(cols, image, kh, kw, out_h, out_w, geom):
    """Adjoint of :func:`_im2col`: ``image`` = the taps in ``cols`` summed in place."""
    sh, sw, dh, dw, pad_t, _, pad_l, _, _ = geom
    chans, height, width = image.shape
    taps = cols.reshape((chans, kh, kw, out_h, out_w))
    image[:] = 0
    for c in range(chans):
        for i in range(kh):
            for j in range(kw):
                offset = j * dw - pad_l
                lo, hi = _valid_range(out_w, width, offset, sw)
                for y in range(out_h):
                    src = y * sh + i * dh - pad_t
                    if src < 0 or src >= height:
                        continue
                    if sw == 1:
                        image[c, src, lo + offset : hi + offset] += taps[c, i, j, y, lo:hi]
                    else:
                        for xo in range(lo, hi):
                            image[c, src, xo * sw + offset] += taps[c, i, j, y, xo]


# The convolutions below run image by image: the im2col matrix of one image stays in
# cache between its construction and the GEMM that reads it, and each GEMM writes
# straight into the NCHW output without a transpose.  For 1x1 filters with unit stride
# and no padding, the image itself is the im2col matrix.


@_jit
def _pointwise(w_shape, geom):
    """Whether the im2col matrix of an image equals the image (a 1x1 convolution)."""
    sh, sw, _, _, pad_t, pad_b, pad_l, pad_r, _ = geom
    unpadded = pad_t == pad_b == pad_l == pad_r == 0
    return w_shape[2] == 1 and w_shape[3] == 1 and sh == sw == 1 and unpadded


@_jit
def _image_matrices(x):
    """Contiguous ``x`` as (N, C, H * W): the im2col matrices of a 1x1 convolution."""
    return np.ascontiguousarray(x).reshape((x.shape[0], x.shape[1], x.shape[2] * x.shape[3]))


@_jit
def _forward_gemm(w2, cols, out, groups):
    """``out = w2 @ cols`` per group: one image's output (O, out_h * out_w)."""
    og, kg = w2.shape[0] // groups, w2.shape[1]
    for g in range(groups):
        o_rows, k_rows = slice(g * og, (g + 1) * og), slice(g * kg, (g + 1) * kg)
        np.dot(w2[o_rows], cols[k_rows], out[o_rows])


@_jit
def _grad_cols_gemm(w2, gy2, cols, groups):
    """``cols = w2.T @ gy2`` per group: one image's gradient w.r.t. its im2col matrix."""
    og, kg = w2.shape[0] // groups, w2.shape[1]
    for g in range(groups):
        o_rows, k_rows = slice(g * og, (g + 1) * og), slice(g * kg, (g + 1) * kg)
        np.dot(w2[o_rows].T, gy2[o_rows], cols[k_rows])


@_jit
def _grad_weights_gemm(gy2, cols, gw2, part, groups):
    """``gw2 += gy2 @ cols.T`` per group: one image's contribution to the filter gradient."""
    og, kg = gw2.shape[0] // groups, gw2.shape[1]
    for g in range(groups):
        o_rows, k_rows = slice(g * og, (g + 1) * og), slice(g * kg, (g + 1) * kg)
        np.dot(gy2[o_rows], cols[k_rows].T, part)
        gw2[o_rows] += part


@_jit
def conv2d_forward(x, w, geom):
    out_h, out_w = _conv_geometry(x.shape, w.shape, geom)
    n_img, groups = x.shape[0], geom[8]
    n_out, _, kh, kw = w.shape
    w2 = np.ascontiguousarray(w).reshape((n_out, -1))
    y = np.empty((n_img, n_out, out_h * out_w), dtype=x.dtype)
    if _pointwise(w.shape, geom):
        images = _image_matrices(x)
        for n in range(n_img):
            _forward_gemm(w2, images[n], y[n], groups)
    else:
        cols = np.empty((groups * w2.shape[1], out_h * out_w), dtype=x.dtype)
        for n in range(n_img):
            _im2col(x[n], cols, kh, kw, out_h, out_w, geom)
            _forward_gemm(w2, cols, y[n], groups)
    return y.reshape((n_img, n_out, out_h, out_w))


@_jit
def _output_grad_matrices(gy, x_shape, w_shape, geom):
    """``gy`` as contiguous (N, O, out_h * out_w), after checking its shape."""
    out_h, out_w = _conv_geometry(x_shape, w_shape, geom)
    if gy.shape != (x_shape[0], w_shape[0], out_h, out_w):
        raise ValueError("conv2d gradient: output gradient has the wrong shape")
    return np.ascontiguousarray(gy).reshape((gy.shape[0], gy.shape[1], out_h * out_w))


@_jit
def conv2d_grad_inputs(w, gy, x, geom):
    gy3 = _output_grad_matrices(gy, x.shape, w.shape, geom)
    n_img, groups = x.shape[0], geom[8]
    n_out, _, kh, kw = w.shape
    w2 = np.ascontiguousarray(w).reshape((n_out, -1))
    gx = np.empty(x.shape, dtype=gy.dtype)
    if _pointwise(w.shape, geom):
        gx3 = gx.reshape((n_img, x.shape[1], -1))
        for n in range(n_img):
            _grad_cols_gemm(w2, gy3[n], gx3[n], groups)
    else:
        cols = np.empty((groups * w2.shape[1], gy3.shape[2]), dtype=gy.dtype)
        for n in range(n_img):
            _grad_cols_gemm(w2, gy3[n], cols, groups)
            _col2im(cols, gx[n], kh, kw, gy.shape[2], gy.shape[3], geom)
    return gx


@_jit
def conv2d_grad_weights(x, gy, w, geom):
    gy3 = _output_grad_matrices(gy, x.shape, w.shape, geom)
    n_img, groups = x.shape[0], geom[8]
    n_out, _, kh, kw = w.shape
    gw2 = np.zeros((n_out, w.shape[1] * kh * kw), dtype=gy.dtype)
    part = np.empty((n_out // groups, gw2.shape[1]), dtype=gy.dtype)
    if _pointwise(w.shape, geom):
        images = _image_matrices(x)
        for n in range(n_img):
            _grad_weights_gemm(gy3[n], images[n], gw2, part, groups)
    else:
        cols = np.empty((groups * gw2.shape[1], gy3.shape[2]), dtype=gy.dtype)
        for n in range(n_img):
            _im2col(x[n], cols, kh, kw, gy.shape[2], gy.shape[3], geom)
            _grad_weights_gemm(gy3[n], cols, gw2, part, groups)
    return gw2.reshape(w.shape)


@_jit
def _pool_geometry(x_shape, params):
    kh, kw, sh, sw, ph, pw, ignore_border, _ = params
    out_h = _pool_len(x_shape[2], kh, sh, ph, ignore_border)
    out_w = _pool_len(x_shape[3], kw, sw, pw, ignore_border)
    if out_h < 1 or out_w < 1:
        raise ValueError("pool2d: the window does not fit the padded input")
    return out_h, out_w


@_jit
def _window(o, stride, pad, size, length):
    """Input range ``[lo, hi)`` of window ``o``, clipped to the input."""
    start = o * stride - pad
    return max(start, 0), min(start + size, length)


@_jit
def _window_count(o, stride, pad, size, length, include_pad):
    """Divisor of average pooling along one axis."""
    start = o * stride - pad
    if include_pad:
        return min(start + size, length + pad) - max(start, -pad)
    return min(start + size, length) - max(start, 0)


@_jit
def _argmax(plane, y_lo, y_hi, x_lo, x_hi):
    """Row-major position of the first maximum of ``plane[y_lo:y_hi, x_lo:x_hi]``."""
    best, best_y, best_x = -np.inf, y_lo, x_lo
    for yy in range(y_lo, y_hi):
        for xx in range(x_lo, x_hi):
            if plane[yy, xx] > best:
                best, best_y, best_x = plane[yy, xx], yy, xx
    return best_y, best_x


@_jit
def pool2d_forward(x, params):
    kh, kw, sh, sw, ph, pw, _, mode = params
    out_h, out_w = _pool_geometry(x.shape, params)
    height, width = x.shape[2], x.shape[3]
    out = np.empty((x.shape[0], x.shape[1], out_h, out_w), dtype=x.dtype)
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            plane = x[n, c]
            for oy in range(out_h):
                y_lo, y_hi = _window(oy, sh, ph, kh, height)
                for ox in range(out_w):
                    x_lo, x_hi = _window(ox, sw, pw, kw, width)
                    if mode == 0:
                        by, bx = _argmax(plane, y_lo, y_hi, x_lo, x_hi)
                        out[n, c, oy, ox] = plane[by, bx]
                    else:
                        count = _window_count(oy, sh, ph, kh, height, mode == 1)
                        count *= _window_count(ox, sw, pw, kw, width, mode == 1)
                        out[n, c, oy, ox] = plane[y_lo:y_hi, x_lo:x_hi].sum() / count
    return out


@_jit
def pool2d_grad(x, gout, params):
    kh, kw, sh, sw, ph, pw, _, mode = params
    out_h, out_w = _pool_geometry(x.shape, params)
    if gout.shape != (x.shape[0], x.shape[1], out_h, out_w):
        raise ValueError("pool2d gradient: output gradient has the wrong shape")
    height, width = x.shape[2], x.shape[3]
    gx = np.zeros(x.shape, dtype=gout.dtype)
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            for oy in range(out_h):
                y_lo, y_hi = _window(oy, sh, ph, kh, height)
                for ox in range(out_w):
                    x_lo, x_hi = _window(ox, sw, pw, kw, width)
                    if mode == 0:
                        by, bx = _argmax(x[n, c], y_lo, y_hi, x_lo, x_hi)
                        gx[n, c, by, bx] += gout[n, c, oy, ox]
                    else:
                        count = _window_count(oy, sh, ph, kh, height, mode == 1)
                        count *= _window_count(ox, sw, pw, kw, width, mode == 1)
                        gx[n, c, y_lo:y_hi, x_lo:x_hi] += gout[n, c, oy, ox] / count
    return gx


@_jit
def max_pool2d_gather(x, g, params):
    kh, kw, sh, sw, ph, pw, _, _ = params
    out_h, out_w = _pool_geometry(x.shape, params)
    if g.shape != x.shape:
        raise ValueError("max_pool2d_gather: g must have the input's shape")
    out = np.empty((x.shape[0], x.shape[1], out_h, out_w), dtype=g.dtype)
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            for oy in range(out_h):
                y_lo, y_hi = _window(oy, sh, ph, kh, x.shape[2])
                for ox in range(out_w):
                    x_lo, x_hi = _window(ox, sw, pw, kw, x.shape[3])
                    by, bx = _argmax(x[n, c], y_lo, y_hi, x_lo, x_hi)
                    out[n, c, oy, ox] = g[n, c, by, bx]
    return out
