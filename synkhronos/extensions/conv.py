"""2-D convolution and pooling Ops for PyTensor.

PyTensor 3 has no CNN convolution or pooling, so this module provides them as Ops,
in NCHW layout with OIHW filters:

- :func:`conv2d` (:class:`Conv2d`) with stride, padding, dilation and groups, whose
  gradients are the Ops :class:`Conv2dGradInputs` and :class:`Conv2dGradWeights`;
  every gradient of these three is again one of them, so gradients of gradients work.
- :func:`pool2d` (:class:`Pool2d`), max or average pooling, with gradient
  :class:`Pool2dGrad`, whose max-mode gradient is :class:`MaxPool2dGather`.

Each Op runs in three ways:

- ``perform`` (Python linker) and the default Numba linker share one NumPy
  implementation: convolution is im2col + one BLAS GEMM per group, with the im2col /
  col2im copies compiled by Numba; pooling is vectorised over window taps.  The Numba
  linker calls it in object mode, which costs microseconds per call, negligible next to
  the GEMM.
- The JAX linker uses ``jax.lax.conv_general_dilated`` and ``jax.lax.reduce_window``
  (cuDNN on GPUs); gradient Ops use ``jax.linear_transpose`` / ``jax.vjp`` of those.
"""

import functools
from collections.abc import Sequence

import numba
import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.link.numba.dispatch import numba_funcify
from pytensor.scalar import upcast
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorVariable

__all__ = [
    "Conv2d",
    "Conv2dGradInputs",
    "Conv2dGradWeights",
    "MaxPool2dGather",
    "Pool2d",
    "Pool2dGrad",
    "conv2d",
    "conv_output_length",
    "pool2d",
    "pool_output_length",
]

IntPair = int | Sequence[int]
POOL_MODES = ("max", "average_inc_pad", "average_exc_pad")


# --------------------------------------------------------------------------- geometry


def _int_pair(value: IntPair, name: str) -> tuple[int, int]:
    if isinstance(value, int | np.integer):
        return int(value), int(value)
    pair = tuple(int(v) for v in value)
    if len(pair) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    return pair


def _padding_pairs(padding) -> tuple[tuple[int, int], tuple[int, int]]:
    """Normalise ``p``, ``(ph, pw)`` or ``((top, bottom), (left, right))``."""
    if isinstance(padding, int | np.integer):
        return (int(padding),) * 2, (int(padding),) * 2
    rows, cols = padding
    return tuple(_int_pair(rows, "padding")), tuple(_int_pair(cols, "padding"))


def conv_output_length(
    length: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dilation: int = 1
) -> int:
    """Length of one spatial axis of a convolution's output.

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
    int
        ``(length + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1``.
    """
    return (length + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1


def pool_output_length(
    length: int, pool_size: int, stride: int, pad: int, ignore_border: bool
) -> int:
    """Length of one spatial axis of a pooling output, with Lasagne's border rules.

    Parameters
    ----------
    length
        Input length along the axis.
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
    int
        Number of windows.
    """
    if ignore_border:
        return (length + 2 * pad - pool_size) // stride + 1
    if stride >= pool_size:
        return (length + stride - 1) // stride
    return max(0, (length - pool_size + stride - 1) // stride) + 1


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


# ------------------------------------------------------------- im2col / col2im kernels


@numba.njit(cache=True, nogil=True)
def _valid_range(out_len, in_len, offset, stride):
    """Range of output positions ``o`` with ``0 <= o * stride + offset < in_len``."""
    lo = 0 if offset >= 0 else (stride - 1 - offset) // stride
    last = in_len - 1 - offset
    hi = 0 if last < 0 else min(out_len, last // stride + 1)
    return min(lo, hi), hi


@numba.njit(cache=True, nogil=True)
def _im2col(x, cols, sh, sw, dh, dw, pad_top, pad_left):
    """Fill ``cols[c, i, j, n, y, x]`` with padded input taps; zero where padding."""
    n_img, chans, height, width = x.shape
    _, kh, kw, _, out_h, out_w = cols.shape
    for c in range(chans):
        for i in range(kh):
            for j in range(kw):
                offset = j * dw - pad_left
                lo, hi = _valid_range(out_w, width, offset, sw)
                for n in range(n_img):
                    for y in range(out_h):
                        row = cols[c, i, j, n, y]
                        src = y * sh + i * dh - pad_top
                        if src < 0 or src >= height:
                            row[:] = 0
                            continue
                        row[:lo] = 0
                        row[hi:] = 0
                        for xo in range(lo, hi):
                            row[xo] = x[n, c, src, xo * sw + offset]


@numba.njit(cache=True, nogil=True)
def _col2im(cols, gx, sh, sw, dh, dw, pad_top, pad_left):
    """Scatter-add ``cols[c, i, j, n, y, x]`` back onto the (unpadded) input grid."""
    n_img, chans, height, width = gx.shape
    _, kh, kw, _, out_h, out_w = cols.shape
    gx[:] = 0
    for c in range(chans):
        for i in range(kh):
            for j in range(kw):
                offset = j * dw - pad_left
                lo, hi = _valid_range(out_w, width, offset, sw)
                for n in range(n_img):
                    for y in range(out_h):
                        src = y * sh + i * dh - pad_top
                        if src < 0 or src >= height:
                            continue
                        for xo in range(lo, hi):
                            gx[n, c, src, xo * sw + offset] += cols[c, i, j, n, y, xo]


# ------------------------------------------------------------------ convolution Ops


class _KernelOp(Op):
    """An Op whose subclass computes its one output in NumPy with ``_compute(inputs, dtype)``.

    Both the Python linker (``perform``) and the Numba linker run that method.
    """

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = self._compute(inputs, node.outputs[0].dtype)


class _ConvOp(_KernelOp):
    __props__ = ("stride", "padding", "dilation", "groups")

    def __init__(
        self, stride: IntPair = 1, padding=0, dilation: IntPair = 1, groups: int = 1
    ):
        self.stride = _int_pair(stride, "stride")
        self.padding = _padding_pairs(padding)
        self.dilation = _int_pair(dilation, "dilation")
        self.groups = int(groups)
        if min(self.stride + self.dilation) < 1 or self.groups < 1:
            raise ValueError("stride, dilation and groups must be positive")
        if min(self.padding[0] + self.padding[1]) < 0:
            raise ValueError("padding must be non-negative")

    def _out_len(self, axis: int, length, kernel):
        """Output length along spatial ``axis`` (0 rows, 1 columns); None if unknown."""
        if length is None or kernel is None:
            return None
        lo, hi = self.padding[axis]
        return conv_output_length(
            length, kernel, self.stride[axis], lo, hi, self.dilation[axis]
        )

    def _out_hw(self, in_h, in_w, k_h, k_w):
        return self._out_len(0, in_h, k_h), self._out_len(1, in_w, k_w)

    def _columns(self, x: np.ndarray, k_h: int, k_w: int) -> np.ndarray:
        """im2col of ``x`` as ``(groups, C / groups * k_h * k_w, N * out_h * out_w)``."""
        n, c, h, w = x.shape
        out_h, out_w = self._out_hw(h, w, k_h, k_w)
        if out_h < 1 or out_w < 1:
            raise ValueError(f"filter {k_h}x{k_w} does not fit the padded {h}x{w} input")
        cols = np.empty((c, k_h, k_w, n, out_h, out_w), dtype=x.dtype)
        _im2col(x, cols, *self.stride, *self.dilation, self.padding[0][0], self.padding[1][0])
        return cols.reshape(self.groups, -1, n * out_h * out_w)

    def _check_channels(self, x_shape, w_shape):
        if x_shape[1] != w_shape[1] * self.groups or w_shape[0] % self.groups:
            raise ValueError(
                f"input {tuple(x_shape)} and filters {tuple(w_shape)} do not match "
                f"with groups={self.groups}"
            )

    def _grouped_output(self, gy: np.ndarray) -> np.ndarray:
        """``gy`` (N, O, H, W) as ``(groups, O / groups, N * H * W)``, the GEMM layout."""
        n, o, h, w = gy.shape
        return np.ascontiguousarray(gy.transpose(1, 0, 2, 3)).reshape(self.groups, -1, n * h * w)


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
        return Apply(self, [x, w], [out])

    def infer_shape(self, fgraph, node, input_shapes):
        (n, _, h, w), (o, _, kh, kw) = input_shapes
        return [(n, o, *self._out_hw(h, w, kh, kw))]

    def _compute(self, inputs, dtype):
        x, w = (np.ascontiguousarray(a, dtype=dtype) for a in inputs)
        self._check_channels(x.shape, w.shape)
        o, _, kh, kw = w.shape
        n, _, h, wd = x.shape
        out_h, out_w = self._out_hw(h, wd, kh, kw)
        cols = self._columns(x, kh, kw)
        y = np.matmul(w.reshape(self.groups, o // self.groups, -1), cols)
        return np.ascontiguousarray(y.reshape(o, n, out_h, out_w).transpose(1, 0, 2, 3))

    def pullback(self, inputs, outputs, output_grads):
        x, w = inputs
        (gy,) = output_grads
        grad_inputs = Conv2dGradInputs(**self._props_dict())(w, gy, x)
        grad_weights = Conv2dGradWeights(**self._props_dict())(x, gy, w)
        return [grad_inputs, grad_weights]


class Conv2dGradInputs(_ConvOp):
    """Gradient of :class:`Conv2d` with respect to its input (a transposed convolution).

    Inputs are ``(filters, output_grad, input)``; ``input`` only provides the shape.
    Parameters are those of the forward :class:`Conv2d`.
    """

    def make_node(self, w, gy, x) -> Apply:
        w, gy, x = _as_4d(w), _as_4d(gy), _as_4d(x)
        out = TensorType(_float_dtype(w, gy), shape=x.type.shape)()
        return Apply(self, [w, gy, x], [out])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[2]]

    def connection_pattern(self, node):
        return [[True], [True], [False]]

    def _compute(self, inputs, dtype):
        w, gy = (np.ascontiguousarray(a, dtype=dtype) for a in inputs[:2])
        x_shape = inputs[2].shape
        self._check_channels(x_shape, w.shape)
        o, cg, kh, kw = w.shape
        w_t = w.reshape(self.groups, o // self.groups, cg * kh * kw).transpose(0, 2, 1)
        cols = np.matmul(w_t, self._grouped_output(gy))
        n, c, h, wd = x_shape
        cols = cols.reshape(c, kh, kw, n, gy.shape[2], gy.shape[3])
        gx = np.empty(x_shape, dtype=dtype)
        _col2im(cols, gx, *self.stride, *self.dilation, self.padding[0][0], self.padding[1][0])
        return gx

    def pullback(self, inputs, outputs, output_grads):
        w, gy, x = inputs
        (g,) = output_grads
        # <conv_grad_inputs(w, gy), g> = <gy, conv(g, w)>: both partials are conv Ops.
        grad_w = Conv2dGradWeights(**self._props_dict())(g, gy, w)
        grad_gy = Conv2d(**self._props_dict())(g, w)
        return [grad_w, grad_gy, DisconnectedType()()]


class Conv2dGradWeights(_ConvOp):
    """Gradient of :class:`Conv2d` with respect to its filters.

    Inputs are ``(input, output_grad, filters)``; ``filters`` only provides the shape.
    Parameters are those of the forward :class:`Conv2d`.
    """

    def make_node(self, x, gy, w) -> Apply:
        x, gy, w = _as_4d(x), _as_4d(gy), _as_4d(w)
        out = TensorType(_float_dtype(x, gy), shape=w.type.shape)()
        return Apply(self, [x, gy, w], [out])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[2]]

    def connection_pattern(self, node):
        return [[True], [True], [False]]

    def _compute(self, inputs, dtype):
        x, gy = (np.ascontiguousarray(a, dtype=dtype) for a in inputs[:2])
        w_shape = inputs[2].shape
        self._check_channels(x.shape, w_shape)
        cols = self._columns(x, *w_shape[2:])
        gw = np.matmul(self._grouped_output(gy), cols.transpose(0, 2, 1))
        return gw.reshape(w_shape)

    def pullback(self, inputs, outputs, output_grads):
        x, gy, w = inputs
        (h,) = output_grads
        # <conv_grad_weights(x, gy), h> = <gy, conv(x, h)>.
        grad_x = Conv2dGradInputs(**self._props_dict())(h, gy, x)
        grad_gy = Conv2d(**self._props_dict())(x, h)
        return [grad_x, grad_gy, DisconnectedType()()]


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


# ---------------------------------------------------------------------- pooling Ops


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
        self.ws = _int_pair(ws, "ws")
        self.stride = self.ws if stride is None else _int_pair(stride, "stride")
        self.padding = _int_pair(padding, "padding")
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

    def _out_hw(self, h, w):
        """Output height and width; None where the input's is unknown."""
        return tuple(
            None if n is None else pool_output_length(n, k, s, p, self.ignore_border)
            for n, k, s, p in zip((h, w), self.ws, self.stride, self.padding, strict=True)
        )

    def _extent(self, h: int, w: int) -> tuple[int, int]:
        """Height and width of the padded grid that the windows exactly cover."""
        return tuple(
            (out - 1) * s + k
            for out, s, k in zip(self._out_hw(h, w), self.stride, self.ws, strict=True)
        )

    def _pooled_type(self, x: TensorVariable) -> TensorType:
        n, c, h, w = x.type.shape
        return TensorType(x.dtype, shape=(n, c, *self._out_hw(h, w)))

    def _padded(self, x: np.ndarray, fill: float) -> np.ndarray:
        """``x`` inside a ``fill`` border, cut to the rows/cols the windows cover."""
        n, c, h, w = x.shape
        (ext_h, ext_w), (ph, pw) = self._extent(h, w), self.padding
        xp = np.full((n, c, ext_h, ext_w), fill, dtype=x.dtype)
        keep_h, keep_w = min(h, ext_h - ph), min(w, ext_w - pw)
        xp[:, :, ph : ph + keep_h, pw : pw + keep_w] = x[:, :, :keep_h, :keep_w]
        return xp

    def _unpadded(self, gxp: np.ndarray, shape) -> np.ndarray:
        """Adjoint of :meth:`_padded`: crop the border, zero where windows never reach."""
        h, w = shape[2:]
        ph, pw = self.padding
        keep_h, keep_w = min(h, gxp.shape[2] - ph), min(w, gxp.shape[3] - pw)
        gx = np.zeros(shape, dtype=gxp.dtype)
        gx[:, :, :keep_h, :keep_w] = gxp[:, :, ph : ph + keep_h, pw : pw + keep_w]
        return gx

    def _taps(self, xp: np.ndarray, out_hw):
        """Views of ``xp``, one per window offset, each shaped like the output."""
        (sh, sw), (out_h, out_w) = self.stride, out_hw
        for i in range(self.ws[0]):
            for j in range(self.ws[1]):
                yield xp[:, :, i : i + (out_h - 1) * sh + 1 : sh, j : j + (out_w - 1) * sw + 1 : sw]

    def _window_counts(self, h: int, w: int) -> np.ndarray:
        """Divisor of average pooling per output position, shape ``(out_h, out_w)``."""
        counts = []
        for n, k, s, p, out in zip(
            (h, w), self.ws, self.stride, self.padding, self._out_hw(h, w), strict=True
        ):
            starts = np.arange(out) * s - p
            lo, hi = (-p, n + p) if self.mode == "average_inc_pad" else (0, n)
            counts.append(np.minimum(starts + k, hi) - np.maximum(starts, lo))
        return np.outer(*counts)

    def _argmax_taps(self, x: np.ndarray) -> np.ndarray:
        """Index of the first maximal tap of each window."""
        xp = self._padded(x, -np.inf)
        out_hw = self._out_hw(*x.shape[2:])
        taps = self._taps(xp, out_hw)
        best = next(taps).copy()
        index = np.zeros(best.shape, dtype=np.intp)
        for t, tap in enumerate(taps, start=1):
            greater = tap > best
            np.copyto(best, tap, where=greater)
            index[greater] = t
        return index


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

    def make_node(self, x) -> Apply:
        x = _as_4d(x)
        _float_dtype(x)
        return Apply(self, [x], [self._pooled_type(x)()])

    def infer_shape(self, fgraph, node, input_shapes):
        n, c, h, w = input_shapes[0]
        return [(n, c, *self._out_hw(h, w))]

    def _compute(self, inputs, dtype):
        (x,) = inputs
        out_hw = self._out_hw(*x.shape[2:])
        if self.mode == "max":
            taps = self._taps(self._padded(x, -np.inf), out_hw)
            out = next(taps).copy()
            for tap in taps:
                np.maximum(out, tap, out=out)
            return out
        out = sum(self._taps(self._padded(x, 0), out_hw))
        out /= self._window_counts(*x.shape[2:])
        return np.ascontiguousarray(out, dtype=dtype)

    def pullback(self, inputs, outputs, output_grads):
        (x,) = inputs
        return [Pool2dGrad(**self._props_dict())(x, output_grads[0])]


class Pool2dGrad(_PoolOp):
    """Gradient of :class:`Pool2d`: inputs ``(x, output_grad)``, output shaped like ``x``.

    Max mode routes each window's gradient to its first maximal input.  Parameters are
    those of the forward :class:`Pool2d`.
    """

    def make_node(self, x, gout) -> Apply:
        x, gout = _as_4d(x), _as_4d(gout)
        out = TensorType(_float_dtype(x, gout), shape=x.type.shape)()
        return Apply(self, [x, gout], [out])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def connection_pattern(self, node):
        # Average pooling's gradient depends on x only through its shape.
        return [[self.mode == "max"], [True]]

    def _compute(self, inputs, dtype):
        x, gout = inputs
        out_hw = gout.shape[2:]
        gxp = np.zeros((*x.shape[:2], *self._extent(*x.shape[2:])), dtype=dtype)
        if self.mode == "max":
            index = self._argmax_taps(x)
            for t, tap in enumerate(self._taps(gxp, out_hw)):
                tap += np.where(index == t, gout, 0)
        else:
            share = gout / self._window_counts(*x.shape[2:])
            for tap in self._taps(gxp, out_hw):
                tap += share
        return self._unpadded(gxp, x.shape)

    def pullback(self, inputs, outputs, output_grads):
        x, _ = inputs
        (g,) = output_grads
        if self.mode == "max":
            # The routing is piecewise constant in x, and linear in the output gradient.
            return [pt.zeros_like(x), MaxPool2dGather(**self._props_dict())(x, g)]
        return [DisconnectedType()(), Pool2d(**self._props_dict())(g)]


class MaxPool2dGather(_PoolOp):
    """For each max-pooling window of ``x``, the value of ``g`` at the window's argmax.

    This is the forward-mode derivative of max pooling along ``g`` and the gradient of
    :class:`Pool2dGrad` with respect to its output gradient.  Inputs ``(x, g)``, both
    shaped like the pooling input; parameters are those of the forward :class:`Pool2d`.
    """

    def make_node(self, x, g) -> Apply:
        x, g = _as_4d(x), _as_4d(g)
        out = self._pooled_type(x).clone(dtype=_float_dtype(x, g))()
        return Apply(self, [x, g], [out])

    def infer_shape(self, fgraph, node, input_shapes):
        n, c, h, w = input_shapes[0]
        return [(n, c, *self._out_hw(h, w))]

    def _compute(self, inputs, dtype):
        x, g = inputs
        out_hw = self._out_hw(*x.shape[2:])
        index = self._argmax_taps(x)
        out = np.zeros(index.shape, dtype=dtype)
        for t, tap in enumerate(self._taps(self._padded(g.astype(dtype), 0), out_hw)):
            np.copyto(out, tap, where=index == t)
        return out

    def pullback(self, inputs, outputs, output_grads):
        x, _ = inputs
        return [pt.zeros_like(x), Pool2dGrad(**self._props_dict())(x, output_grads[0])]


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


# ------------------------------------------------------------------ Numba linker


@functools.cache
def _objmode_kernel(op: _KernelOp, dtype: str, ndim: int):
    """Numba function running ``op._compute`` in object mode.

    Memoised per (op, dtype, rank) so that all nodes of a graph with equal Ops share
    one dispatcher: Numba then compiles the object-mode call once, not once per node.
    """
    ret_type = numba.types.Array(numba.from_dtype(np.dtype(dtype)), ndim, "C")

    def compute(inputs):
        return np.ascontiguousarray(op._compute(inputs, dtype))

    @numba.njit
    def kernel_op(*inputs):
        with numba.objmode(out=ret_type):
            out = compute(inputs)
        return out

    return kernel_op


@numba_funcify.register(_KernelOp)
def _numba_funcify_kernel_op(op: _KernelOp, node: Apply, **kwargs):
    """Call the Op's NumPy implementation from Numba in object mode.

    The work is BLAS GEMMs plus Numba-compiled copies, so a nopython re-implementation
    would gain nothing; object mode keeps one code path for all linkers.
    """
    out_type = node.outputs[0].type
    return _objmode_kernel(op, out_type.dtype, out_type.ndim)


# ---------------------------------------------------------------------- JAX linker


def _register_jax() -> None:
    """Register JAX implementations, when JAX is installed."""
    try:
        import jax
        from pytensor.link.jax.dispatch import jax_funcify
    except ImportError:
        return
    from jax import lax

    def conv_fn(op: _ConvOp, dtype: str):
        def conv(x, w):
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

    @jax_funcify.register(Conv2dGradInputs)
    def _jax_conv2d_grad_inputs(op, node, **kwargs):
        dtype = node.outputs[0].dtype
        conv = conv_fn(op, dtype)

        def conv2d_grad_inputs(w, gy, x):
            spec = jax.ShapeDtypeStruct(x.shape, dtype)
            return jax.linear_transpose(lambda x_: conv(x_, w), spec)(gy.astype(dtype))[0]

        return conv2d_grad_inputs

    @jax_funcify.register(Conv2dGradWeights)
    def _jax_conv2d_grad_weights(op, node, **kwargs):
        dtype = node.outputs[0].dtype
        conv = conv_fn(op, dtype)

        def conv2d_grad_weights(x, gy, w):
            spec = jax.ShapeDtypeStruct(w.shape, dtype)
            return jax.linear_transpose(lambda w_: conv(x, w_), spec)(gy.astype(dtype))[0]

        return conv2d_grad_weights

    def pool_fn(op: _PoolOp, dtype: str):
        def pool(x):
            h, w = x.shape[2:]
            (ext_h, ext_w), (ph, pw), is_max = op._extent(h, w), op.padding, op.mode == "max"
            # Negative high padding crops rows/cols that no window reaches.
            config = ((0, 0, 0), (0, 0, 0), (ph, ext_h - h - ph, 0), (pw, ext_w - w - pw, 0))
            fill = np.array(-np.inf if is_max else 0, dtype)
            xp = lax.pad(x.astype(dtype), fill, config)
            window, strides = (1, 1, *op.ws), (1, 1, *op.stride)
            reducer = lax.max if is_max else lax.add
            total = lax.reduce_window(xp, fill, reducer, window, strides, "VALID")
            if is_max:
                return total
            return total / op._window_counts(h, w).astype(dtype)

        return pool

    @jax_funcify.register(Pool2d)
    def _jax_pool2d(op, node, **kwargs):
        return pool_fn(op, node.outputs[0].dtype)

    @jax_funcify.register(Pool2dGrad)
    def _jax_pool2d_grad(op, node, **kwargs):
        dtype = node.outputs[0].dtype
        pool = pool_fn(op, dtype)

        def pool2d_grad(x, gout):
            _, pullback = jax.vjp(pool, x.astype(dtype))
            return pullback(gout.astype(dtype))[0]

        return pool2d_grad

    @jax_funcify.register(MaxPool2dGather)
    def _jax_max_pool2d_gather(op, node, **kwargs):
        dtype = node.outputs[0].dtype
        pool = pool_fn(op, dtype)

        def max_pool2d_gather(x, g):
            return jax.jvp(pool, (x.astype(dtype),), (g.astype(dtype),))[1]

        return max_pool2d_gather


_register_jax()
