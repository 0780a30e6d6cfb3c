"""Theano's ``theano.tensor.nnet``, which PyTensor dropped: activations, cross-entropies
and convolutions with Theano's arguments and meaning.

Lasagne calls these where it calls Theano, and so does the port here
(:mod:`synkhronos.extensions.lasagne`: its nonlinearities, objectives and convolution
layers); :mod:`synkhronos.theano` publishes them at their Theano paths
(``theano.tensor.nnet`` and ``theano.tensor.nnet.abstract_conv``).

The convolutions run on :mod:`synkhronos.ops.conv`'s Ops (NCHW, OIHW filters),
which compute cross-correlations: with ``filter_flip=True`` (Theano's default, a true
convolution) the filters are flipped first. ``AbstractConv2d_gradInputs(...)(kern,
topgrad, shape)`` and its kin are the gradients of that convolution with respect to its
input or its filters, taken by :func:`pytensor.grad`.

>>> import numpy as np, pytensor.tensor as pt
>>> x = pt.tensor4("x")
>>> w = np.array([[[[1.0, 2.0]]]])  # flipped: the taps are 2, 1
>>> conv2d(x, w).eval({x: [[[[1.0, 10.0, 100.0]]]]}).ravel().tolist()
[12.0, 120.0]
>>> p = pt.matrix("p")
>>> categorical_crossentropy(p, np.array([1])).eval({p: [[0.5, 0.5]]}).round(4).tolist()
[0.6931]
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.tensor.special import softmax as _softmax
from pytensor.tensor.variable import TensorVariable

from synkhronos.ops import conv

__all__ = [
    "AbstractConv2d_gradInputs",
    "AbstractConv2d_gradWeights",
    "AbstractConv3d_gradInputs",
    "AbstractConv3d_gradWeights",
    "binary_crossentropy",
    "categorical_crossentropy",
    "conv2d",
    "conv3d",
    "conv_nd",
    "crossentropy_categorical_1hot",
    "relu",
    "sigmoid",
    "softmax",
    "softplus",
]

sigmoid = pt.sigmoid
softplus = pt.softplus


# ------------------------------------------------------------------ activations, losses


def relu(x, alpha=0) -> TensorVariable:
    """Rectifier ``max(x, 0)``; with ``alpha``, the leaky rectifier of slope ``alpha``
    below 0 (Theano's formula ``0.5 (1 + alpha) x + 0.5 (1 - alpha) |x|``, gradient
    included). As Theano's, it computes on NumPy arrays too.

    Examples
    --------
    >>> relu(np.array([-2.0, 3.0])).tolist(), relu(np.array([-2.0, 3.0]), 0.5).tolist()
    ([0.0, 3.0], [-1.0, 3.0])
    """
    if isinstance(alpha, int | float) and alpha == 0:
        # max(x, 0) equals Theano's 0.5 (x + |x|) for every finite x. One maximum in the
        # graph: that formula's gradient is a multiply of three inputs, which NumPy has no
        # ufunc for (PyTensor's Python mode then loops over its elements in Python).
        return np.maximum(x, 0) if isinstance(x, np.ndarray) else pt.maximum(x, 0)
    if not isinstance(alpha, int | float):
        alpha = pt.as_tensor_variable(alpha)
    return 0.5 * (1 + alpha) * x + 0.5 * (1 - alpha) * abs(x)


def softmax(c) -> TensorVariable:
    """Softmax over the last axis; a vector becomes a one-row matrix, as in Theano 1.0.

    Examples
    --------
    >>> softmax(pt.as_tensor_variable([0.0, 0.0])).eval().tolist()
    [[0.5, 0.5]]
    """
    c = pt.as_tensor_variable(c)
    if c.ndim == 1:
        c = pt.shape_padleft(c)
    return _softmax(c, axis=-1)


def crossentropy_categorical_1hot(coding_dist, true_one_of_n) -> TensorVariable:
    """``-log(coding_dist[i, true_one_of_n[i]])`` for each row ``i``."""
    coding_dist = pt.as_tensor_variable(coding_dist)
    true_one_of_n = pt.as_tensor_variable(true_one_of_n)
    # log is taken of the whole matrix so PyTensor can rewrite log(softmax) stably.
    return -pt.log(coding_dist)[pt.arange(true_one_of_n.shape[0]), true_one_of_n]


def categorical_crossentropy(coding_dist, true_dist) -> TensorVariable:
    """Cross-entropy of each row of ``coding_dist`` against ``true_dist``: a matrix of
    distributions (``-sum(true_dist * log(coding_dist), axis=-1)``) or a vector of class
    indices (``-log`` of each row's entry at its index).

    Raises
    ------
    TypeError
        If ``true_dist`` has neither ``coding_dist``'s number of dimensions nor one less.
    """
    coding_dist, true_dist = pt.as_tensor_variable(coding_dist), pt.as_tensor_variable(true_dist)
    if true_dist.ndim == coding_dist.ndim:
        return -pt.sum(true_dist * pt.log(coding_dist), axis=coding_dist.ndim - 1)
    if true_dist.ndim == coding_dist.ndim - 1:
        return crossentropy_categorical_1hot(coding_dist, true_dist)
    raise TypeError("rank mismatch between coding and true distributions")


def binary_crossentropy(output, target) -> TensorVariable:
    """``-(target log(output) + (1 - target) log(1 - output))``, element by element."""
    output, target = pt.as_tensor_variable(output), pt.as_tensor_variable(target)
    return -(target * pt.log(output) + (1 - target) * pt.log1p(-output))


# ------------------------------------------------------------------ convolutions


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
    if border_mode in ("full", "half"):
        if kernel is None:
            raise ValueError(
                f"border_mode {border_mode!r} needs the filter sizes: give "
                f"filter_shape, or filters of a known static shape"
            )
        spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
        return tuple(s - 1 if border_mode == "full" else s // 2 for s in spans)
    if isinstance(border_mode, str) and border_mode == "valid":
        return (0,) * n
    if isinstance(border_mode, int | np.integer) and border_mode >= 0:
        return (int(border_mode),) * n
    if isinstance(border_mode, tuple | list) and len(border_mode) == n:
        return tuple(border_mode)
    raise ValueError(
        f"invalid border_mode {border_mode!r}: expected 'valid', 'full', "
        f"'half', an int or {n} of them"
    )


def conv_nd(
    input,
    filters,
    n: int,
    filter_shape=None,
    border_mode="valid",
    subsample=None,
    filter_flip: bool = True,
    filter_dilation=None,
    num_groups: int = 1,
) -> TensorVariable:
    """Theano's convolution over the last ``n`` (1, 2 or 3) axes of ``input``:
    :func:`conv2d` with ``n`` values per tuple.

    Parameters
    ----------
    input, filters : tensor_like
        ``(N, C, *spatial)`` and ``(O, C / num_groups, *kernel)``.
    n : int
        Number of spatial axes.
    filter_shape, border_mode, subsample, filter_flip, filter_dilation, num_groups
        As for :func:`conv2d` (``subsample`` and ``filter_dilation`` default to ones).

    Returns
    -------
    TensorVariable
        ``(N, O, *output sizes)``.
    """
    input, filters = pt.as_tensor_variable(input), pt.as_tensor_variable(filters)
    kernel = _kernel_sizes(filters, filter_shape, n)
    dilation = conv.int_tuple(
        1 if filter_dilation is None else filter_dilation, n, "filter_dilation"
    )
    stride = conv.int_tuple(1 if subsample is None else subsample, n, "subsample")
    padding = _padding(border_mode, kernel, dilation, n)
    if n == 3:  # conv3d loops over the filters' depth, which it must know
        if kernel is None:
            raise ValueError("conv3d needs the filter sizes: give filter_shape (kshp)")
        filters = pt.specify_shape(filters, (None, None, *kernel))
    if filter_flip:
        filters = filters[(Ellipsis,) + (slice(None, None, -1),) * n]
    compute = {1: conv.conv1d, 2: conv.conv2d, 3: conv.conv3d}[n]
    return compute(input, filters, stride, padding, dilation, num_groups)


def conv2d(
    input,
    filters,
    input_shape=None,
    filter_shape=None,
    border_mode="valid",
    subsample=(1, 1),
    filter_flip: bool = True,
    image_shape=None,
    filter_dilation=(1, 1),
    num_groups: int = 1,
    unshared: bool = False,
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
    if unshared:
        raise NotImplementedError("unshared convolution (unshared=True) has no PyTensor equivalent")
    return conv_nd(
        input,
        filters,
        2,
        filter_shape,
        border_mode,
        subsample,
        filter_flip,
        filter_dilation,
        num_groups,
    )


def conv3d(
    input,
    filters,
    input_shape=None,
    filter_shape=None,
    border_mode="valid",
    subsample=(1, 1, 1),
    filter_flip: bool = True,
    filter_dilation=(1, 1, 1),
    num_groups: int = 1,
) -> TensorVariable:
    """Theano's 3-D convolution of ``input`` (N, C, D, H, W) with ``filters``
    (O, C / num_groups, kD, kH, kW); the arguments are :func:`conv2d`'s with three values
    per axis (padding symmetric)."""
    return conv_nd(
        input,
        filters,
        3,
        filter_shape,
        border_mode,
        subsample,
        filter_flip,
        filter_dilation,
        num_groups,
    )


class _ConvGradient:
    """Theano's abstract convolution gradients: the gradient of :func:`conv2d` (or
    :func:`conv3d`) with the given parameters with respect to its input (``_of =
    "inputs"``) or its filters (``"weights"``), given the gradient ``topgrad`` of its
    output; ``shape`` is the spatial shape of what it returns."""

    _n: int
    _of: str

    def __init__(
        self,
        imshp=None,
        kshp=None,
        border_mode="valid",
        subsample=None,
        filter_flip: bool = True,
        filter_dilation=None,
        num_groups: int = 1,
        unshared: bool = False,
    ):
        if unshared:
            raise NotImplementedError(
                "unshared convolution (unshared=True) has no PyTensor equivalent"
            )
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
            unknown = pt.zeros(
                (topgrad.shape[1], known.shape[1] // self.num_groups, *shape), dtype=topgrad.dtype
            )
            image, filters = known, unknown
            filter_shape = (
                (None, None, *shape)
                if all(isinstance(s, int | np.integer) for s in shape)
                else self.kshp
            )
        output = conv_nd(
            image,
            filters,
            self._n,
            filter_shape,
            self.border_mode,
            self.subsample,
            self.filter_flip,
            self.filter_dilation,
            self.num_groups,
        )
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
