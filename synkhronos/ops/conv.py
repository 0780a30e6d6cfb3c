"""2-D convolution and pooling Ops for PyTensor.

PyTensor 3 has no CNN convolution or pooling, so this module provides them as Ops,
in NCHW layout with OIHW filters:

- :func:`conv2d` (:class:`Conv2d`) with stride, padding, dilation and groups, whose
  gradients are the Ops :class:`Conv2dGradInputs` and :class:`Conv2dGradWeights`;
  every gradient of these three is again one of them, so gradients of gradients work.
- :func:`pool2d` (:class:`Pool2d`), max or average pooling, with gradient
  :class:`Pool2dGrad`, whose max-mode gradient is :class:`MaxPool2dGather`.

Implementations:

- CPU: Numba kernels, run directly by ``perform`` (Python linker) and called from the
  default Numba linker's compiled graph (with a cache key, so PyTensor caches graphs
  that contain them).  Convolution is im2col + BLAS GEMM, image by image (1x1
  convolutions skip the im2col); pooling loops over windows.
- JAX: ``jax.lax.conv_general_dilated`` and ``jax.lax.reduce_window`` (cuDNN on
  GPUs); gradient Ops use ``jax.linear_transpose`` / ``jax.vjp`` / ``jax.jvp`` of those.
"""

import functools
import zlib
from collections.abc import Sequence
from pathlib import Path

import numba
import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply, Variable
from pytensor.graph.op import Op
from pytensor.scalar import upcast
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorVariable

__all__ = [
    "Conv2d",
    "Conv2dGradInputs",
    "Conv2dGradWeights",
    "FoldLeading",
    "MaxPool2dGather",
    "Pool2d",
    "Pool2dGrad",
    "UnfoldLeading",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_output_length",
    "int_tuple",
    "pool1d",
    "pool2d",
    "pool3d",
    "pool_output_length",
]

IntPair = int | Sequence[int]
POOL_MODES = ("max", "average_inc_pad", "average_exc_pad")


# --------------------------------------------------------------------------- geometry


def int_tuple(value: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
    """``n`` copies of an int (Python or NumPy), or the ``n`` ints of a sequence.

    Parameters
    ----------
    value
        An int, or a sequence of ``n`` ints.
    n
        Length of the result.
    name
        Argument name, for the error message.

    Returns
    -------
    tuple of int
        The ``n`` ints.

    Examples
    --------
    >>> int_tuple(np.int64(3), 2, "stride")
    (3, 3)
    >>> int_tuple((1, 2, 3), 3, "pad")
    (1, 2, 3)
    """
    if isinstance(value, int | np.integer):
        return (int(value),) * n
    values = tuple(int(v) for v in value)
    if len(values) != n:
        raise ValueError(f"{name} must be an int or {n} ints, got {value!r}")
    return values


def _padding_pairs(padding) -> tuple[tuple[int, int], tuple[int, int]]:
    """Normalise ``p``, ``(ph, pw)`` or ``((top, bottom), (left, right))``."""
    if isinstance(padding, int | np.integer):
        return (int(padding),) * 2, (int(padding),) * 2
    rows, cols = padding
    return int_tuple(rows, 2, "padding"), int_tuple(cols, 2, "padding")


def conv_output_length(length, kernel, stride, pad_lo, pad_hi, dilation=1):
    """Length of one spatial axis of a convolution's output.

    Works on Python ints and on symbolic PyTensor scalars.

    Parameters
    ----------
    length
        Input length along the axis.
    kernel
        Filter length along the axis.
    stride
        Step between filter applications.
    pad_lo, pad_hi
        Zero padding added before and after the input.
    dilation
        Spacing between filter taps.

    Returns
    -------
    int or TensorVariable
        ``(length + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1``.
    """
    return (length + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1


def _pool_output_length_int(length, pool_size, stride, pad, ignore_border):
    """:func:`pool_output_length` for ints (also compiled by Numba)."""
    if ignore_border:
        return (length + 2 * pad - pool_size) // stride + 1
    if stride >= pool_size:
        return (length + stride - 1) // stride
    return max(0, (length - pool_size + stride - 1) // stride) + 1


def pool_output_length(length, pool_size: int, stride: int, pad: int, ignore_border: bool):
    """Length of one spatial axis of a pooling output, with Lasagne's border rules.

    Parameters
    ----------
    length
        Input length along the axis (Python int or symbolic scalar).
    pool_size
        Window length.
    stride
        Step between windows.
    pad
        Padding on both sides (only allowed with ``ignore_border=True``).
    ignore_border
        If True, only windows lying fully inside the padded input are used; if False,
        a last partial window is added whenever input elements would be left over.

    Returns
    -------
    int or TensorVariable
        Number of windows.
    """
    if ignore_border or stride >= pool_size or not isinstance(length, Variable):
        return _pool_output_length_int(length, pool_size, stride, pad, ignore_border)
    return pt.maximum(0, (length - pool_size + stride - 1) // stride) + 1


def _cast_inputs(dtype: str, *values) -> list[TensorVariable]:
    """Cast to ``dtype`` so the kernels see one dtype (a no-op when it already is)."""
    return [pt.cast(v, dtype) for v in values]


def _float_dtype(*variables: TensorVariable) -> str:
    dtype = upcast(*(v.dtype for v in variables))
    if not dtype.startswith("float"):
        raise TypeError(f"convolution and pooling need float inputs, got {dtype}")
    return dtype


def _as_4d(value) -> TensorVariable:
    var = pt.as_tensor_variable(value)
    if var.ndim != 4:
        raise ValueError(f"expected a 4-d tensor, got {var.ndim} dimensions")
    return var


# ------------------------------------------------------------------- Numba kernels

_jit = numba.njit(cache=True, nogil=True)
_conv_len = _jit(conv_output_length)
_pool_len = _jit(_pool_output_length_int)


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
def _conv2d_forward(x, w, geom):
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
def _conv2d_grad_inputs(w, gy, x, geom):
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
def _conv2d_grad_weights(x, gy, w, geom):
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
def _pool2d_forward(x, params):
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
def _pool2d_grad(x, gout, params):
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
def _max_pool2d_gather(x, g, params):
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


# ------------------------------------------------------------------------------- Ops


def _shape_rule(rule):
    """``rule(self, node, input_shapes)`` as an ``infer_shape`` for PyTensor 3.0, which
    passes ``fgraph`` first, and for 3.3 and later, which deprecate that parameter."""

    @functools.wraps(rule)
    def infer_shape(self, *args):
        node, input_shapes = args[-2:]
        return rule(self, node, input_shapes)

    return infer_shape


class _KernelOp(Op):
    """An Op computed by the Numba kernel ``_kernel(*inputs, self._params)``.

    Subclasses set ``_kernel`` and ``_params`` (a tuple of ints).  ``perform`` calls
    the kernel from Python; the Numba linker calls it from the compiled graph.
    """

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = self._kernel(*inputs, self._params)

    def _similar(self, op_class):
        """An ``op_class`` Op with this Op's parameters (a gradient's partner Op)."""
        return op_class(**self._props_dict())


class _ConvOp(_KernelOp):
    __props__ = ("stride", "padding", "dilation", "groups")

    def __init__(self, stride: IntPair = 1, padding=0, dilation: IntPair = 1, groups: int = 1):
        self.stride = int_tuple(stride, 2, "stride")
        self.padding = _padding_pairs(padding)
        self.dilation = int_tuple(dilation, 2, "dilation")
        self.groups = int(groups)
        if min(self.stride + self.dilation) < 1 or self.groups < 1:
            raise ValueError("stride, dilation and groups must be positive")
        if min(self.padding[0] + self.padding[1]) < 0:
            raise ValueError("padding must be non-negative")

    @property
    def _params(self) -> tuple[int, ...]:
        (pad_t, pad_b), (pad_l, pad_r) = self.padding
        return (*self.stride, *self.dilation, pad_t, pad_b, pad_l, pad_r, self.groups)

    def _out_len(self, axis: int, length, kernel):
        """Output length along spatial ``axis`` (0 rows, 1 columns); None if unknown."""
        if length is None or kernel is None:
            return None
        lo, hi = self.padding[axis]
        return conv_output_length(length, kernel, self.stride[axis], lo, hi, self.dilation[axis])

    def _out_hw(self, in_h, in_w, k_h, k_w):
        return self._out_len(0, in_h, k_h), self._out_len(1, in_w, k_w)


class Conv2d(_ConvOp):
    """2-D cross-correlation of NCHW inputs with OIHW filters (no filter flip).

    Parameters
    ----------
    stride
        Step between filter applications, int or ``(sh, sw)``.
    padding
        Zero padding: ``p``, ``(ph, pw)`` or ``((top, bottom), (left, right))``.
    dilation
        Spacing between filter taps, int or ``(dh, dw)``.
    groups
        Number of channel groups; input channels = ``groups * filters.shape[1]``.
    """

    _kernel = staticmethod(_conv2d_forward)

    def make_node(self, x, w) -> Apply:
        x, w = _as_4d(x), _as_4d(w)
        dtype = _float_dtype(x, w)
        (n, c, h, wd), (o, cg, kh, kw) = x.type.shape, w.type.shape
        if (None not in (c, cg) and c != cg * self.groups) or (o or 0) % self.groups:
            raise ValueError(
                f"input {x.type.shape} and filters {w.type.shape} do not match "
                f"with groups={self.groups}"
            )
        out = TensorType(dtype, shape=(n, o, *self._out_hw(h, wd, kh, kw)))()
        return Apply(self, _cast_inputs(dtype, x, w), [out])

    @_shape_rule
    def infer_shape(self, node, input_shapes):
        (n, _, h, w), (o, _, kh, kw) = input_shapes
        return [(n, o, *self._out_hw(h, w, kh, kw))]

    def pullback(self, inputs, outputs, output_grads):
        x, w = inputs
        (gy,) = output_grads
        return [
            self._similar(Conv2dGradInputs)(w, gy, x),
            self._similar(Conv2dGradWeights)(x, gy, w),
        ]


class _Conv2dGrad(_ConvOp):
    """Base of the two gradient Ops of :class:`Conv2d`.

    Both take ``(operand, output_grad, like)``: the forward operand the gradient is
    not taken with respect to, the output gradient, and the variable whose gradient is
    computed, which only provides the output's shape (hence no connection from it).
    Subclasses keep their own ``make_node`` so that its argument names say which is which.
    """

    def _grad_node(self, operand, gy, like) -> Apply:
        operand, gy, like = _as_4d(operand), _as_4d(gy), _as_4d(like)
        dtype = _float_dtype(operand, gy)
        out = TensorType(dtype, shape=like.type.shape)()
        return Apply(self, [*_cast_inputs(dtype, operand, gy), like], [out])

    @_shape_rule
    def infer_shape(self, node, input_shapes):
        return [input_shapes[2]]

    def connection_pattern(self, node):
        return [[True], [True], [False]]


class Conv2dGradInputs(_Conv2dGrad):
    """Gradient of :class:`Conv2d` with respect to its input (a transposed convolution).

    Inputs are ``(filters, output_grad, input)``; ``input`` only provides the shape.
    Parameters are those of the forward :class:`Conv2d`.
    """

    _kernel = staticmethod(_conv2d_grad_inputs)

    def make_node(self, w, gy, x) -> Apply:
        return self._grad_node(w, gy, x)

    def pullback(self, inputs, outputs, output_grads):
        w, gy, x = inputs
        (g,) = output_grads
        # <grad_inputs(w, gy), g> = <gy, conv(g, w)>: both partials are conv Ops.
        return [
            self._similar(Conv2dGradWeights)(g, gy, w),
            self._similar(Conv2d)(g, w),
            DisconnectedType()(),
        ]


class Conv2dGradWeights(_Conv2dGrad):
    """Gradient of :class:`Conv2d` with respect to its filters.

    Inputs are ``(input, output_grad, filters)``; ``filters`` only provides the shape.
    Parameters are those of the forward :class:`Conv2d`.
    """

    _kernel = staticmethod(_conv2d_grad_weights)

    def make_node(self, x, gy, w) -> Apply:
        return self._grad_node(x, gy, w)

    def pullback(self, inputs, outputs, output_grads):
        x, gy, w = inputs
        (h,) = output_grads
        # <grad_weights(x, gy), h> = <gy, conv(x, h)>.
        return [
            self._similar(Conv2dGradInputs)(h, gy, x),
            self._similar(Conv2d)(x, h),
            DisconnectedType()(),
        ]


def conv2d(
    x,
    w,
    stride: IntPair = 1,
    padding=0,
    dilation: IntPair = 1,
    groups: int = 1,
) -> TensorVariable:
    """2-D cross-correlation of ``x`` (N, C, H, W) with filters ``w`` (O, C/groups, kH, kW).

    Parameters
    ----------
    x
        Input batch, NCHW.
    w
        Filters, OIHW.  Not flipped (cross-correlation, as cuDNN and PyTorch do).
    stride
        Step between filter applications, int or ``(sh, sw)``.
    padding
        Zero padding: ``p``, ``(ph, pw)`` or ``((top, bottom), (left, right))``.
    dilation
        Spacing between filter taps, int or ``(dh, dw)``.
    groups
        Number of channel groups.

    Returns
    -------
    TensorVariable
        Output of shape ``(N, O, out_h, out_w)``, see :func:`conv_output_length`.
    """
    return Conv2d(stride, padding, dilation, groups)(x, w)


class _PoolOp(_KernelOp):
    __props__ = ("ws", "stride", "padding", "ignore_border", "mode")

    def __init__(
        self,
        ws: IntPair,
        stride: IntPair | None = None,
        padding: IntPair = 0,
        ignore_border: bool = True,
        mode: str = "max",
    ):
        self.ws = int_tuple(ws, 2, "ws")
        self.stride = self.ws if stride is None else int_tuple(stride, 2, "stride")
        self.padding = int_tuple(padding, 2, "padding")
        self.ignore_border = bool(ignore_border)
        self.mode = mode
        if mode not in POOL_MODES:
            raise ValueError(f"mode must be one of {POOL_MODES}, got {mode!r}")
        if min(self.ws + self.stride) < 1:
            raise ValueError("pool size and stride must be positive")
        if not all(0 <= p < k for p, k in zip(self.padding, self.ws, strict=True)):
            raise ValueError("padding must be non-negative and smaller than the pool size")
        if not self.ignore_border and any(self.padding):
            raise ValueError("padding requires ignore_border=True")

    @property
    def _params(self) -> tuple[int, ...]:
        mode = POOL_MODES.index(self.mode)
        return (*self.ws, *self.stride, *self.padding, int(self.ignore_border), mode)

    def _out_hw(self, h, w):
        """Output height and width (ints or symbolic); None where the input's is unknown."""
        return tuple(
            None if n is None else pool_output_length(n, k, s, p, self.ignore_border)
            for n, k, s, p in zip((h, w), self.ws, self.stride, self.padding, strict=True)
        )

    def _pooled_type(self, x: TensorVariable, dtype: str) -> TensorType:
        n, c, h, w = x.type.shape
        return TensorType(dtype, shape=(n, c, *self._out_hw(h, w)))


class Pool2d(_PoolOp):
    """Max or average pooling over the last two axes of an NCHW tensor.

    Parameters
    ----------
    ws
        Window size, int or ``(kh, kw)``.
    stride
        Step between windows; defaults to ``ws``.
    padding
        Symmetric padding ``(ph, pw)``, each smaller than the window; padded cells never
        win a max and count only for ``"average_inc_pad"``.
    ignore_border
        See :func:`pool_output_length`.
    mode
        ``"max"``, ``"average_inc_pad"`` or ``"average_exc_pad"``.
    """

    _kernel = staticmethod(_pool2d_forward)

    def make_node(self, x) -> Apply:
        x = _as_4d(x)
        return Apply(self, [x], [self._pooled_type(x, _float_dtype(x))()])

    @_shape_rule
    def infer_shape(self, node, input_shapes):
        n, c, h, w = input_shapes[0]
        return [(n, c, *self._out_hw(h, w))]

    def pullback(self, inputs, outputs, output_grads):
        (x,) = inputs
        return [self._similar(Pool2dGrad)(x, output_grads[0])]


class Pool2dGrad(_PoolOp):
    """Gradient of :class:`Pool2d`: inputs ``(x, output_grad)``, output shaped like ``x``.

    Max mode routes each window's gradient to its first maximal input (row-major), as
    XLA does.  Parameters are those of the forward :class:`Pool2d`.
    """

    _kernel = staticmethod(_pool2d_grad)

    def make_node(self, x, gout) -> Apply:
        x, gout = _as_4d(x), _as_4d(gout)
        dtype = _float_dtype(x, gout)
        out = TensorType(dtype, shape=x.type.shape)()
        return Apply(self, [x, *_cast_inputs(dtype, gout)], [out])

    @_shape_rule
    def infer_shape(self, node, input_shapes):
        return [input_shapes[0]]

    def connection_pattern(self, node):
        # Average pooling's gradient depends on x only through its shape.
        return [[self.mode == "max"], [True]]

    def pullback(self, inputs, outputs, output_grads):
        x, _ = inputs
        (g,) = output_grads
        if self.mode == "max":
            # The routing is piecewise constant in x and linear in the output gradient.
            return [pt.zeros_like(x), self._similar(MaxPool2dGather)(x, g)]
        return [DisconnectedType()(), self._similar(Pool2d)(g)]


class MaxPool2dGather(_PoolOp):
    """For each max-pooling window of ``x``, the value of ``g`` at the window's argmax.

    The forward-mode derivative of max pooling along ``g``, and the gradient of
    :class:`Pool2dGrad` with respect to its output gradient.  Inputs ``(x, g)``, both
    shaped like the pooling input; parameters are those of the forward :class:`Pool2d`.
    """

    _kernel = staticmethod(_max_pool2d_gather)

    def make_node(self, x, g) -> Apply:
        x, g = _as_4d(x), _as_4d(g)
        dtype = _float_dtype(x, g)
        return Apply(self, [x, *_cast_inputs(dtype, g)], [self._pooled_type(x, dtype)()])

    @_shape_rule
    def infer_shape(self, node, input_shapes):
        n, c, h, w = input_shapes[0]
        return [(n, c, *self._out_hw(h, w))]

    def pullback(self, inputs, outputs, output_grads):
        x, _ = inputs
        return [pt.zeros_like(x), self._similar(Pool2dGrad)(x, output_grads[0])]


def pool2d(
    x,
    ws: IntPair,
    stride: IntPair | None = None,
    padding: IntPair = 0,
    ignore_border: bool = True,
    mode: str = "max",
) -> TensorVariable:
    """Max or average pooling over the last two axes of an NCHW tensor.

    Parameters
    ----------
    x
        Input batch, NCHW.
    ws
        Window size, int or ``(kh, kw)``.
    stride
        Step between windows; defaults to ``ws``.
    padding
        Symmetric padding ``(ph, pw)``, each smaller than the window.
    ignore_border
        See :func:`pool_output_length`.
    mode
        ``"max"``, ``"average_inc_pad"`` (padding counts in the divisor) or
        ``"average_exc_pad"``.

    Returns
    -------
    TensorVariable
        Pooled tensor of shape ``(N, C, out_h, out_w)``.
    """
    return Pool2d(ws, stride, padding, ignore_border, mode)(x)


# ------------------------------------------------------------------ batch folding


class FoldLeading(Op):
    """Merges the first ``k`` axes of a tensor into one, row-major.

    A ``Reshape`` does this with a target computed from the input's shape, which JAX
    cannot trace when a folded size (the batch's) is unknown as the graph is built.
    This Op, its inverse :class:`UnfoldLeading` and their gradients (each other) take
    their sizes from arrays instead, which are concrete when JAX traces.  Neither
    infers its output's shape, for the same reason: a later Op that needs it (a
    gradient's zeros, a reshape back) reads it from the output array.

    Parameters
    ----------
    k
        Number of leading axes to merge (at least 1).
    """

    __props__ = ("k",)

    def __init__(self, k: int):
        self.k = int(k)
        if self.k < 1:
            raise ValueError("k must be positive")

    def make_node(self, x) -> Apply:
        x = pt.as_tensor_variable(x)
        if x.type.ndim < self.k:
            raise ValueError(f"cannot fold {self.k} axes of a {x.type.ndim}-d tensor")
        lead = x.type.shape[: self.k]
        size = None if None in lead else int(np.prod(lead))
        out = TensorType(x.type.dtype, shape=(size, *x.type.shape[self.k :]))()
        return Apply(self, [x], [out])

    def perform(self, node, inputs, output_storage):
        (x,) = inputs
        output_storage[0][0] = x.reshape((int(np.prod(x.shape[: self.k])), *x.shape[self.k :]))

    def pullback(self, inputs, outputs, output_grads):
        return [UnfoldLeading(self.k)(output_grads[0], inputs[0])]


class UnfoldLeading(Op):
    """Splits axis 0 of ``x`` into the first ``k`` axes of ``like``: the inverse of
    :class:`FoldLeading`. ``like`` only provides those sizes.

    Parameters
    ----------
    k
        Number of axes axis 0 splits into (at least 1).
    """

    __props__ = ("k",)

    def __init__(self, k: int):
        self.k = int(k)
        if self.k < 1:
            raise ValueError("k must be positive")

    def make_node(self, x, like) -> Apply:
        x, like = pt.as_tensor_variable(x), pt.as_tensor_variable(like)
        out = TensorType(x.type.dtype, shape=(*like.type.shape[: self.k], *x.type.shape[1:]))()
        return Apply(self, [x, like], [out])

    def perform(self, node, inputs, output_storage):
        x, like = inputs
        output_storage[0][0] = x.reshape((*like.shape[: self.k], *x.shape[1:]))

    def connection_pattern(self, node):
        return [[True], [False]]

    def pullback(self, inputs, outputs, output_grads):
        return [FoldLeading(self.k)(output_grads[0]), DisconnectedType()()]


# ------------------------------------------------------------ 1-D and 3-D, from the 2-D Ops


def conv1d(x, w, stride: int = 1, padding=0, dilation: int = 1, groups: int = 1) -> TensorVariable:
    """1-D cross-correlation of ``x`` (N, C, L) with filters ``w`` (O, C/groups, k).

    Computed by :func:`conv2d` on a height-1 view, so it has the same kernels and
    gradients.

    Parameters
    ----------
    x
        Input batch ``(N, C, L)``.
    w
        Filters ``(O, C / groups, k)``, not flipped.
    stride, dilation
        Ints (or 1-tuples).
    padding
        ``p``, ``(p,)`` or ``(before, after)``.
    groups
        Number of channel groups.

    Returns
    -------
    TensorVariable
        Output ``(N, O, out_L)``, see :func:`conv_output_length`.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> x = pt.tensor3("x")
    >>> conv1d(x, np.ones((1, 1, 2))).eval({x: np.arange(4.0).reshape(1, 1, 4)})
    array([[[1., 3., 5.]]])
    """
    (stride,), (dilation,) = int_tuple(stride, 1, "stride"), int_tuple(dilation, 1, "dilation")
    if isinstance(padding, int | np.integer) or len(padding) == 1:
        padding = int_tuple(padding, 1, "padding") * 2
    y = conv2d(
        pt.shape_padaxis(x, 2),
        pt.shape_padaxis(pt.as_tensor_variable(w), 2),
        (1, stride),
        ((0, 0), int_tuple(padding, 2, "padding")),
        (1, dilation),
        groups,
    )
    return y[:, :, 0, :]


def conv3d(x, w, stride=1, padding=0, dilation=1, groups: int = 1) -> TensorVariable:
    """3-D cross-correlation of ``x`` (N, C, D, H, W) with filters ``w`` (O, C/groups, kD, kH, kW).

    Computed as a sum over the ``kD`` filter planes of :func:`conv2d` over all output
    depths at once (depth folded into the batch), so it has the 2-D kernels' gradients.

    Parameters
    ----------
    x
        Input batch ``(N, C, D, H, W)``.
    w
        Filters ``(O, C / groups, kD, kH, kW)``, not flipped.
    stride, padding, dilation
        Int or 3 ints each (padding is symmetric per axis).
    groups
        Number of channel groups.

    Returns
    -------
    TensorVariable
        Output ``(N, O, out_D, out_H, out_W)``.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> x = pt.tensor5("x")
    >>> conv3d(x, np.ones((1, 1, 2, 1, 1))).eval({x: np.ones((1, 1, 3, 1, 1))}).ravel()
    array([2., 2.])
    """
    (sd, sh, sw), (pd, ph, pw) = int_tuple(stride, 3, "stride"), int_tuple(padding, 3, "padding")
    dd, dh, dw = int_tuple(dilation, 3, "dilation")
    x, w = pt.as_tensor_variable(x), pt.as_tensor_variable(w)
    n, c, depth, h, wd = (x.shape[i] for i in range(5))
    if pd:
        x = pt.zeros((n, c, depth + 2 * pd, h, wd), dtype=x.dtype)[:, :, pd:-pd].set(x)
    k_depth = w.type.shape[2]
    if k_depth is None:
        raise ValueError("conv3d needs filters of known depth")
    out_depth = conv_output_length(depth, k_depth, sd, pd, pd, dd)
    total = 0
    for k in range(k_depth):
        start = k * dd
        planes = x[:, :, start : start + (out_depth - 1) * sd + 1 : sd].dimshuffle(0, 2, 1, 3, 4)
        batch = FoldLeading(2)(planes)
        total = total + conv2d(batch, w[:, :, k], (sh, sw), (ph, pw), (dh, dw), groups)
    return UnfoldLeading(2)(total, planes).dimshuffle(0, 2, 1, 3, 4)


def pool1d(
    x,
    ws: int,
    stride: int | None = None,
    padding: int = 0,
    ignore_border: bool = True,
    mode: str = "max",
) -> TensorVariable:
    """:func:`pool2d` over the last axis of an ``(N, C, L)`` tensor.

    Parameters
    ----------
    x
        Input batch ``(N, C, L)``.
    ws, stride, padding
        Ints (``stride`` defaults to ``ws``).
    ignore_border, mode
        As for :func:`pool2d`.

    Returns
    -------
    TensorVariable
        Pooled ``(N, C, out_L)``.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> x = pt.tensor3("x")
    >>> pool1d(x, 2).eval({x: np.array([[[1.0, 3.0, 2.0, 0.0]]])})
    array([[[3., 2.]]])
    """
    stride = ws if stride is None else stride
    y = pool2d(pt.shape_padaxis(x, 2), (1, ws), (1, stride), (0, padding), ignore_border, mode)
    return y[:, :, 0, :]


def pool3d(
    x, ws, stride=None, padding=0, ignore_border: bool = True, mode: str = "max"
) -> TensorVariable:
    """Pooling over the last three axes of an ``(N, C, D, H, W)`` tensor.

    Computed as :func:`pool2d` over (H, W), then over D: max, windowed sums and the
    counts that ``average_exc_pad`` divides by all factor over the axes, so this equals
    pooling the 3-D boxes directly.

    Parameters
    ----------
    x
        Input batch ``(N, C, D, H, W)``.
    ws, stride, padding
        Int or 3 ints each (``stride`` defaults to ``ws``).
    ignore_border, mode
        As for :func:`pool2d`.

    Returns
    -------
    TensorVariable
        Pooled ``(N, C, out_D, out_H, out_W)``.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> x = pt.tensor5("x")
    >>> pool3d(x, 2).eval({x: np.arange(8.0).reshape(1, 1, 2, 2, 2)}).ravel()
    array([7.])
    """
    kd, kh, kw = int_tuple(ws, 3, "ws")
    sd, sh, sw = (kd, kh, kw) if stride is None else int_tuple(stride, 3, "stride")
    pd, ph, pw = int_tuple(padding, 3, "padding")
    x = pt.as_tensor_variable(x)
    n, c, depth, h, w = (x.shape[i] for i in range(5))
    planes = pool2d(
        x.reshape((n, c * depth, h, w)), (kh, kw), (sh, sw), (ph, pw), ignore_border, mode
    )
    oh, ow = planes.shape[2], planes.shape[3]
    columns = planes.reshape((n, c, depth, oh * ow))
    pooled = pool2d(columns, (kd, 1), (sd, 1), (pd, 0), ignore_border, mode)
    return pooled.reshape((n, c, pooled.shape[2], oh, ow))


# ------------------------------------------------------------------ Numba linker


def _register_numba() -> None:
    """Make the Numba linker call the kernels, with a props-based cache key."""
    from pytensor.link.numba.dispatch import basic

    register = basic.register_funcify_default_op_cache_key

    # PyTensor keys its on-disk cache of compiled graphs on the Op's props and this
    # number, not on the kernels' code: hash the code so edits invalidate the cache.
    code_version = zlib.crc32(Path(__file__).read_bytes())

    @register(_KernelOp)
    def _numba_funcify_kernel_op(op: _KernelOp, node=None, **kwargs):
        kernel, params = op._kernel, op._params

        @numba.njit
        def kernel_op(*inputs):
            return kernel(*inputs, params)

        return kernel_op, code_version

    # The folds as reshapes in machine code (without these, Numba runs their Python
    # ``perform`` in object mode, warning once per Op).
    @register(FoldLeading)
    def _numba_fold_leading(op: FoldLeading, node=None, **kwargs):
        k = op.k

        @numba.njit
        def fold_leading(x):
            lead = 1
            for n in x.shape[:k]:
                lead *= n
            return np.ascontiguousarray(x).reshape((lead,) + x.shape[k:])

        return fold_leading, code_version

    @register(UnfoldLeading)
    def _numba_unfold_leading(op: UnfoldLeading, node=None, **kwargs):
        k = op.k

        @numba.njit
        def unfold_leading(x, like):
            return np.ascontiguousarray(x).reshape(like.shape[:k] + x.shape[1:])

        return unfold_leading, code_version


# ---------------------------------------------------------------------- JAX linker


def _register_jax() -> None:
    """Register JAX implementations, when JAX is installed."""
    try:
        import jax
        from pytensor.link.jax.dispatch import jax_funcify
    except ImportError:
        return
    _register_jax_conv(jax, jax_funcify)
    _register_jax_pool(jax, jax_funcify)
    _register_jax_folds(jax_funcify)


def _register_jax_conv(jax, jax_funcify) -> None:
    """Register the convolution and its two gradients (transposes of one ``conv``)."""
    from jax import lax

    def conv_fn(op: _ConvOp, dtype: str):
        def conv(x, w):
            # The node's dtype: an input made float64 by PyTensor's JAX reductions (which
            # keep a float32 sum's float64 accumulator) would make XLA refuse the pair.
            return lax.conv_general_dilated(
                x.astype(dtype),
                w.astype(dtype),
                window_strides=op.stride,
                padding=op.padding,
                rhs_dilation=op.dilation,
                dimension_numbers=("NCHW", "OIHW", "NCHW"),
                feature_group_count=op.groups,
            )

        return conv

    @jax_funcify.register(Conv2d)
    def _jax_conv2d(op, node, **kwargs):
        return conv_fn(op, node.outputs[0].dtype)

    def conv_grad_fn(op: _Conv2dGrad, dtype: str, wrt_input: bool):
        """A gradient Op as the transpose of ``conv``, which is linear in either argument.

        Takes the Ops' ``(operand, gy, like)``; ``wrt_input`` says whether ``like`` is
        conv's input (``operand`` the filters) or its filters (``operand`` the input).
        """
        conv = conv_fn(op, dtype)

        def conv_grad(operand, gy, like):
            def linear(v):
                return conv(v, operand) if wrt_input else conv(operand, v)

            spec = jax.ShapeDtypeStruct(like.shape, dtype)
            return jax.linear_transpose(linear, spec)(gy.astype(dtype))[0]

        return conv_grad

    @jax_funcify.register(Conv2dGradInputs)
    def _jax_conv2d_grad_inputs(op, node, **kwargs):
        return conv_grad_fn(op, node.outputs[0].dtype, wrt_input=True)

    @jax_funcify.register(Conv2dGradWeights)
    def _jax_conv2d_grad_weights(op, node, **kwargs):
        return conv_grad_fn(op, node.outputs[0].dtype, wrt_input=False)


def _jax_pool_fn(op: _PoolOp):
    """The JAX function of a pooling Op (its gradients are this function's vjp/jvp)."""
    from jax import lax

    (kh, kw), (sh, sw), (ph, pw) = op.ws, op.stride, op.padding
    is_max, include_pad = op.mode == "max", op.mode == "average_inc_pad"

    def pool(x):
        h, w = x.shape[2:]
        out_h, out_w = op._out_hw(h, w)
        ext_h, ext_w = (out_h - 1) * sh + kh, (out_w - 1) * sw + kw
        # Pad to exactly the windows' extent; a negative high pad crops rows/cols
        # that no window reaches (ignore_border=True).
        config = ((0, 0, 0), (0, 0, 0), (ph, ext_h - h - ph, 0), (pw, ext_w - w - pw, 0))
        fill = np.array(-np.inf if is_max else 0, dtype=x.dtype)
        xp = lax.pad(x, fill, config)
        reducer = lax.max if is_max else lax.add
        total = lax.reduce_window(xp, fill, reducer, (1, 1, kh, kw), (1, 1, sh, sw), "VALID")
        if is_max:
            return total
        counts = [
            np.minimum(s * np.arange(out) - p + k, n + p * include_pad)
            - np.maximum(s * np.arange(out) - p, -p * include_pad)
            for n, k, s, p, out in ((h, kh, sh, ph, out_h), (w, kw, sw, pw, out_w))
        ]
        return total / np.outer(*counts).astype(x.dtype)

    return pool


def _register_jax_pool(jax, jax_funcify) -> None:
    """Register pooling and its two gradient Ops."""

    @jax_funcify.register(Pool2d)
    def _jax_pool2d(op, **kwargs):
        return _jax_pool_fn(op)

    @jax_funcify.register(Pool2dGrad)
    def _jax_pool2d_grad(op, node, **kwargs):
        pool, dtype = _jax_pool_fn(op), node.outputs[0].dtype

        def pool2d_grad(x, gout):
            _, pullback = jax.vjp(pool, x.astype(dtype))
            return pullback(gout.astype(dtype))[0]

        return pool2d_grad

    @jax_funcify.register(MaxPool2dGather)
    def _jax_max_pool2d_gather(op, node, **kwargs):
        pool, dtype = _jax_pool_fn(op), node.outputs[0].dtype

        def max_pool2d_gather(x, g):
            return jax.jvp(pool, (x.astype(dtype),), (g.astype(dtype),))[1]

        return max_pool2d_gather


def _register_jax_folds(jax_funcify) -> None:
    """Register FoldLeading and UnfoldLeading as reshapes."""

    @jax_funcify.register(FoldLeading)
    def _jax_fold_leading(op, **kwargs):
        def fold_leading(x):
            return x.reshape((int(np.prod(x.shape[: op.k])), *x.shape[op.k :]))

        return fold_leading

    @jax_funcify.register(UnfoldLeading)
    def _jax_unfold_leading(op, **kwargs):
        def unfold_leading(x, like):
            return x.reshape((*like.shape[: op.k], *x.shape[1:]))

        return unfold_leading


_register_numba()
_register_jax()
