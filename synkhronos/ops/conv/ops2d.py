"""The 2-D Ops: :class:`Conv2d` and its gradients :class:`Conv2dGradInputs` and
:class:`Conv2dGradWeights`, :class:`Pool2d` and its gradients :class:`Pool2dGrad` and
:class:`MaxPool2dGather`; :func:`conv2d` and :func:`pool2d` build them.

``perform`` runs the kernels of :mod:`synkhronos.ops.conv.kernels`;
:mod:`synkhronos.ops.conv.linkers` makes PyTensor's Numba and JAX linkers run them.
"""

import functools

import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.scalar import upcast
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorVariable

from synkhronos.ops.conv.geometry import (
    IntPair,
    conv_output_length,
    int_tuple,
    padding_pairs,
    pool_output_length,
)
from synkhronos.ops.conv.kernels import (
    conv2d_forward,
    conv2d_grad_inputs,
    conv2d_grad_weights,
    max_pool2d_gather,
    pool2d_forward,
    pool2d_grad,
)

POOL_MODES = ("max", "average_inc_pad", "average_exc_pad")


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


def _shape_rule(rule):
    """``rule(self, node, input_shapes)`` as an ``infer_shape`` for PyTensor 3.0, which
    passes ``fgraph`` first, and for 3.3 and later, which deprecate that parameter."""

    @functools.wraps(rule)
    def infer_shape(self, *args):
        node, input_shapes = args[-2:]
        return rule(self, node, input_shapes)

    return infer_shape


class KernelOp(Op):
    """An Op computed by the Numba kernel ``_kernel(*inputs, self._params)``.

    Subclasses set ``_kernel`` and ``_params`` (a tuple of ints).  ``perform`` calls
    the kernel from Python; the Numba linker calls it from the compiled graph.
    """

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = self._kernel(*inputs, self._params)

    def _similar(self, op_class):
        """An ``op_class`` Op with this Op's parameters (a gradient's partner Op)."""
        return op_class(**self._props_dict())


class ConvOp(KernelOp):
    __props__ = ("stride", "padding", "dilation", "groups")

    def __init__(self, stride: IntPair = 1, padding=0, dilation: IntPair = 1, groups: int = 1):
        self.stride = int_tuple(stride, 2, "stride")
        self.padding = padding_pairs(padding)
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


class Conv2d(ConvOp):
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

    _kernel = staticmethod(conv2d_forward)

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


class Conv2dGrad(ConvOp):
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


class Conv2dGradInputs(Conv2dGrad):
    """Gradient of :class:`Conv2d` with respect to its input (a transposed convolution).

    Inputs are ``(filters, output_grad, input)``; ``input`` only provides the shape.
    Parameters are those of the forward :class:`Conv2d`.
    """

    _kernel = staticmethod(conv2d_grad_inputs)

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


class Conv2dGradWeights(Conv2dGrad):
    """Gradient of :class:`Conv2d` with respect to its filters.

    Inputs are ``(input, output_grad, filters)``; ``filters`` only provides the shape.
    Parameters are those of the forward :class:`Conv2d`.
    """

    _kernel = staticmethod(conv2d_grad_weights)

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


class PoolOp(KernelOp):
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


class Pool2d(PoolOp):
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

    _kernel = staticmethod(pool2d_forward)

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


class Pool2dGrad(PoolOp):
    """Gradient of :class:`Pool2d`: inputs ``(x, output_grad)``, output shaped like ``x``.

    Max mode routes each window's gradient to its first maximal input (row-major), as
    XLA does.  Parameters are those of the forward :class:`Pool2d`.
    """

    _kernel = staticmethod(pool2d_grad)

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


class MaxPool2dGather(PoolOp):
    """For each max-pooling window of ``x``, the value of ``g`` at the window's argmax.

    The forward-mode derivative of max pooling along ``g``, and the gradient of
    :class:`Pool2dGrad` with respect to its output gradient.  Inputs ``(x, g)``, both
    shaped like the pooling input; parameters are those of the forward :class:`Pool2d`.
    """

    _kernel = staticmethod(max_pool2d_gather)

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
