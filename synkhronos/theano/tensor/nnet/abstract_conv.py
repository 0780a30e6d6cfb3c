"""Theano's ``theano.tensor.nnet.abstract_conv``: ``conv2d``/``conv3d`` and the
gradient operators that Lasagne's transposed convolutions call.

Everything runs on :mod:`synkhronos.extensions.conv`'s Ops (NCHW, OIHW filters), which
compute cross-correlations: with ``filter_flip=True`` (Theano's default, a true
convolution) the filters are flipped first. ``AbstractConv2d_gradInputs(...)(kern,
topgrad, shape)`` and its kin are the gradients of that convolution with respect to its
input or its filters, taken by :func:`pytensor.grad`.

>>> import numpy as np, pytensor.tensor as pt
>>> x = pt.tensor4("x")
>>> w = np.array([[[[1.0, 2.0]]]])  # flipped: the taps are 2, 1
>>> conv2d(x, w).eval({x: [[[[1.0, 10.0, 100.0]]]]}).ravel().tolist()
[12.0, 120.0]
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions import conv as _conv


def _kernel_sizes(filters, filter_shape, n: int) -> tuple[int, ...] | None:
    """The filters' ``n`` spatial sizes, from ``filter_shape``, the static type or a
    shared variable's value; None where unknown."""
    known = list(filters.type.shape[-n:])
    if filter_shape is not None:
        known = [k if k is not None else s for k, s in zip(filter_shape[-n:], known, strict=True)]
    if None in known and hasattr(filters, "get_value"):
        known = list(np.shape(filters.get_value(borrow=True))[-n:])
    return None if None in known else tuple(int(k) for k in known)


def _padding(border_mode, kernel: tuple[int, ...] | None, dilation: tuple[int, ...], n: int):
    """Theano's ``border_mode`` as the Ops' padding."""
    if isinstance(border_mode, str):
        if border_mode == "valid":
            return (0,) * n
        if border_mode not in ("full", "half"):
            raise ValueError(f"invalid border_mode {border_mode!r}")
        if kernel is None:
            raise ValueError(f"border_mode {border_mode!r} needs the filter sizes: give "
                             f"filter_shape (kshp)")
        spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
        return tuple(s - 1 if border_mode == "full" else s // 2 for s in spans)
    if isinstance(border_mode, (int, np.integer)):
        return (int(border_mode),) * n
    if len(border_mode) != n:
        raise ValueError(f"border_mode must be a string, an int or {n} values, got "
                         f"{border_mode!r}")
    return tuple(border_mode)


def _convolution(n, input, filters, filter_shape, border_mode, subsample, filter_flip,
                 filter_dilation, num_groups, unshared):
    if unshared:
        raise NotImplementedError("unshared convolution (unshared=True) has no PyTensor "
                                  "equivalent")
    input, filters = pt.as_tensor_variable(input), pt.as_tensor_variable(filters)
    kernel = _kernel_sizes(filters, filter_shape, n)
    dilation = _conv.int_tuple(filter_dilation, n, "filter_dilation")
    padding = _padding(border_mode, kernel, dilation, n)
    if n == 3:  # conv3d loops over the filters' depth, which it must know
        if kernel is None:
            raise ValueError("conv3d needs the filter sizes: give filter_shape (kshp)")
        filters = pt.specify_shape(filters, (None, None, *kernel))
    if filter_flip:
        filters = filters[(Ellipsis,) + (slice(None, None, -1),) * n]
    compute = _conv.conv2d if n == 2 else _conv.conv3d
    return compute(input, filters, _conv.int_tuple(subsample, n, "subsample"), padding,
                   dilation, num_groups)


def conv2d(input, filters, input_shape=None, filter_shape=None, border_mode="valid",
           subsample=(1, 1), filter_flip: bool = True, image_shape=None,
           filter_dilation=(1, 1), num_groups: int = 1, unshared: bool = False
           ) -> TensorVariable:
    """Theano's 2-D convolution of ``input`` (N, C, H, W) with ``filters``
    (O, C / num_groups, kH, kW).

    Parameters
    ----------
    input, filters : tensor_like
    input_shape, image_shape : sequence, optional
        Shape hints; unused.
    filter_shape : sequence, optional
        The filters' shape; where ``border_mode`` is "full" or "half" and the filters'
        sizes are not known otherwise (static shape, a shared variable's value), it must
        give them.
    border_mode : str, int, (int, int) or ((int, int), (int, int))
        "valid" (no padding), "full" (kernel span - 1), "half" (kernel span // 2), or
        padding per axis (symmetric, or (before, after) per axis).
    subsample : (int, int)
        Strides.
    filter_flip : bool
        True: flip the filters (a convolution); False: cross-correlation.
    filter_dilation : (int, int)
    num_groups : int
    unshared : bool
        Not supported (``NotImplementedError``).

    Returns
    -------
    TensorVariable
        (N, O, out_h, out_w).
    """
    return _convolution(2, input, filters, filter_shape, border_mode, subsample, filter_flip,
                        filter_dilation, num_groups, unshared)


def conv3d(input, filters, input_shape=None, filter_shape=None, border_mode="valid",
           subsample=(1, 1, 1), filter_flip: bool = True, filter_dilation=(1, 1, 1),
           num_groups: int = 1) -> TensorVariable:
    """Theano's 3-D convolution of ``input`` (N, C, D, H, W) with ``filters``
    (O, C / num_groups, kD, kH, kW); the arguments are :func:`conv2d`'s with three values
    per axis (padding symmetric)."""
    return _convolution(3, input, filters, filter_shape, border_mode, subsample, filter_flip,
                        filter_dilation, num_groups, False)


class _ConvGradient:
    """Theano's abstract convolution gradients: the gradient of :func:`conv2d` (or
    :func:`conv3d`) with the given parameters with respect to its input (``_of =
    "inputs"``) or its filters (``"weights"``), given the gradient ``topgrad`` of its
    output; ``shape`` is the spatial shape of what it returns."""

    _n: int
    _of: str

    def __init__(self, imshp=None, kshp=None, border_mode="valid", subsample=None,
                 filter_flip: bool = True, filter_dilation=None, num_groups: int = 1,
                 unshared: bool = False):
        self.imshp, self.kshp = imshp, kshp
        self.border_mode, self.filter_flip = border_mode, filter_flip
        self.subsample = subsample if subsample is not None else (1,) * self._n
        self.filter_dilation = filter_dilation if filter_dilation is not None else (1,) * self._n
        self.num_groups, self.unshared = num_groups, unshared

    def __call__(self, known, topgrad, shape) -> TensorVariable:
        """``known``: the filters (gradient of the input) or the input (of the filters);
        ``shape``: the spatial sizes (ints, symbolic scalars, or a symbolic vector)."""
        known, topgrad = pt.as_tensor_variable(known), pt.as_tensor_variable(topgrad)
        if isinstance(shape, Variable):  # a symbolic shape vector
            shape = [shape[i] for i in range(self._n)]
        shape = tuple(shape)
        if len(shape) != self._n:
            raise ValueError(f"shape must give {self._n} spatial sizes, got {shape!r}")
        if self._of == "inputs":
            channels = known.shape[1] * self.num_groups
            unknown = pt.zeros((topgrad.shape[0], channels, *shape), dtype=topgrad.dtype)
            image, filters, filter_shape = unknown, known, self.kshp
        else:
            unknown = pt.zeros((topgrad.shape[1], known.shape[1] // self.num_groups, *shape),
                               dtype=topgrad.dtype)
            image, filters = known, unknown
            filter_shape = (None, None, *shape) if all(
                isinstance(s, (int, np.integer)) for s in shape) else self.kshp
        output = _convolution(self._n, image, filters, filter_shape, self.border_mode,
                              self.subsample, self.filter_flip, self.filter_dilation,
                              self.num_groups, self.unshared)
        # The convolution is linear in the unknown: its gradient depends on topgrad alone.
        return pytensor.grad(None, unknown, known_grads={output: topgrad})


class AbstractConv2d_gradInputs(_ConvGradient):  # noqa: N801 - Theano's name
    """Gradient of :func:`conv2d` with respect to its input: ``op(kern, topgrad, (H, W))``
    (a transposed convolution)."""

    _n, _of = 2, "inputs"


class AbstractConv2d_gradWeights(_ConvGradient):  # noqa: N801
    """Gradient of :func:`conv2d` with respect to its filters: ``op(img, topgrad, (kH,
    kW))``."""

    _n, _of = 2, "weights"


class AbstractConv3d_gradInputs(_ConvGradient):  # noqa: N801
    """Gradient of :func:`conv3d` with respect to its input: ``op(kern, topgrad, (D, H,
    W))``."""

    _n, _of = 3, "inputs"


class AbstractConv3d_gradWeights(_ConvGradient):  # noqa: N801
    """Gradient of :func:`conv3d` with respect to its filters: ``op(img, topgrad, (kD, kH,
    kW))``."""

    _n, _of = 3, "weights"
