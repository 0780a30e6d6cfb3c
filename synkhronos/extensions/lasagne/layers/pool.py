"""Pooling and upscaling layers (``lasagne.layers.pool``), and ``pool_2d`` / ``pool_3d``,
Theano's pooling functions, which Lasagne imports here
(:mod:`synkhronos.extensions.theano_pool`)."""

from collections.abc import Callable, Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions import conv
from synkhronos.extensions.conv import POOL_MODES, pool1d, pool2d, pool3d
from synkhronos.extensions.lasagne.layers.base import Layer, Shape
from synkhronos.extensions.lasagne.utils import as_tuple
from synkhronos.extensions.theano_pool import pool_2d, pool_3d  # noqa: F401 - Lasagne's names

__all__ = [
    "FeaturePoolLayer",
    "FeatureWTALayer",
    "GlobalPoolLayer",
    "MaxPool1DLayer",
    "MaxPool2DLayer",
    "MaxPool3DLayer",
    "Pool1DLayer",
    "Pool2DLayer",
    "Pool3DLayer",
    "SpatialPyramidPoolingLayer",
    "Upscale1DLayer",
    "Upscale2DLayer",
    "Upscale3DLayer",
]

IntOrTuple = int | Sequence[int]
_POOL_FUNCTIONS = {1: pool1d, 2: pool2d, 3: pool3d}


def pool_output_length(input_length, pool_size, stride, pad, ignore_border):
    """Length of a pooling output along one axis (Lasagne's helper).

    Parameters
    ----------
    input_length
        Input length (int, symbolic, or None).
    pool_size, stride, pad
        Pooling parameters along the axis.
    ignore_border
        Only full windows (True), or also a last partial one (False).

    Returns
    -------
    int, TensorVariable or None
        The length (see :func:`synkhronos.extensions.conv.pool_output_length`); None
        if ``input_length`` or ``pool_size`` is None.

    Examples
    --------
    >>> pool_output_length(7, 2, 2, 0, True), pool_output_length(7, 2, 2, 0, False)
    (3, 4)
    """
    if input_length is None or pool_size is None:
        return None
    return conv.pool_output_length(input_length, pool_size, stride, pad, ignore_border)


class _PoolLayer(Layer):
    """Max or average pooling over the last ``n`` axes."""

    def __init__(self, incoming, pool_size, stride, pad, ignore_border, mode, n, **kwargs):
        super().__init__(incoming, **kwargs)
        if len(self.input_shape) != n + 2:
            raise ValueError(
                f"Tried to create a {n}D pooling layer with input shape {self.input_shape!r}. "
                f"Expected {n + 2} input dimensions (batchsize, channels, {n} spatial "
                "dimensions)."
            )
        self.n = n
        self.pool_size = as_tuple(pool_size, n)
        self.stride = self.pool_size if stride is None else as_tuple(stride, n)
        self.pad = as_tuple(pad, n)
        self.ignore_border, self.mode = ignore_border, mode

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, channels, *pooled sizes)``."""
        spatial = (
            pool_output_length(size, k, s, p, self.ignore_border)
            for size, k, s, p in zip(
                input_shape[2:], self.pool_size, self.stride, self.pad, strict=True
            )
        )
        return (*input_shape[:2], *spatial)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The pooled input."""
        ws, stride, pad = self.pool_size, self.stride, self.pad
        if self.n == 1:
            ws, stride, pad = ws[0], stride[0], pad[0]
        pool = _POOL_FUNCTIONS[self.n]
        return pool(pt.as_tensor_variable(input), ws, stride, pad, self.ignore_border, self.mode)


class Pool1DLayer(_PoolLayer):
    """Max or average pooling over the last axis of a ``(batch, channels, length)`` input.

    Parameters are those of :class:`Pool2DLayer`, with single ints.

    Examples
    --------
    >>> Pool1DLayer((None, 2, 9), 2).output_shape
    (None, 2, 4)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size: IntOrTuple,
        stride: IntOrTuple | None = None,
        pad: IntOrTuple = 0,
        ignore_border: bool = True,
        mode: str = "max",
        **kwargs,
    ):
        super().__init__(incoming, pool_size, stride, pad, ignore_border, mode, 1, **kwargs)


class Pool2DLayer(_PoolLayer):
    """Max or average pooling over the last two axes of an NCHW input.

    Parameters
    ----------
    incoming
        Input layer or shape.
    pool_size
        Window size (int or pair).
    stride
        Step between windows; None means ``pool_size``.
    pad
        Symmetric padding (int or pair), smaller than the window.
    ignore_border
        If False, a last partial window covers leftover rows/cols (needs ``pad=0``).
    mode
        ``"max"``, ``"average_inc_pad"`` (padding counts in the divisor) or
        ``"average_exc_pad"``.
    **kwargs
        ``name``.

    Examples
    --------
    >>> Pool2DLayer((None, 2, 9, 8), 3, stride=2).output_shape
    (None, 2, 4, 3)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size: IntOrTuple,
        stride: IntOrTuple | None = None,
        pad: IntOrTuple = (0, 0),
        ignore_border: bool = True,
        mode: str = "max",
        **kwargs,
    ):
        super().__init__(incoming, pool_size, stride, pad, ignore_border, mode, 2, **kwargs)


class Pool3DLayer(_PoolLayer):
    """Max or average pooling over the last three axes of a 5-d input.

    Parameters are those of :class:`Pool2DLayer`, with triples.  Computed as 2-D pooling
    then pooling over depth, which equals 3-D pooling for every mode.

    Examples
    --------
    >>> Pool3DLayer((None, 2, 4, 6, 8), 2).output_shape
    (None, 2, 2, 3, 4)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size: IntOrTuple,
        stride: IntOrTuple | None = None,
        pad: IntOrTuple = (0, 0, 0),
        ignore_border: bool = True,
        mode: str = "max",
        **kwargs,
    ):
        super().__init__(incoming, pool_size, stride, pad, ignore_border, mode, 3, **kwargs)


class MaxPool1DLayer(Pool1DLayer):
    """Max pooling; :class:`Pool1DLayer` with ``mode="max"``.

    Examples
    --------
    >>> MaxPool1DLayer((None, 2, 9), 3).output_shape
    (None, 2, 3)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size: IntOrTuple,
        stride: IntOrTuple | None = None,
        pad: IntOrTuple = 0,
        ignore_border: bool = True,
        **kwargs,
    ):
        super().__init__(incoming, pool_size, stride, pad, ignore_border, mode="max", **kwargs)


class MaxPool2DLayer(Pool2DLayer):
    """Max pooling; :class:`Pool2DLayer` with ``mode="max"``.

    Parameters
    ----------
    incoming
        Input layer or shape.
    pool_size
        Window size (int or pair).
    stride
        Step between windows; None means ``pool_size``.
    pad
        Symmetric padding (int or pair), smaller than the window.
    ignore_border
        If False, a last partial window covers leftover rows/cols (needs ``pad=0``).
    **kwargs
        ``name``.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size: IntOrTuple,
        stride: IntOrTuple | None = None,
        pad: IntOrTuple = (0, 0),
        ignore_border: bool = True,
        **kwargs,
    ):
        super().__init__(incoming, pool_size, stride, pad, ignore_border, mode="max", **kwargs)


class MaxPool3DLayer(Pool3DLayer):
    """Max pooling; :class:`Pool3DLayer` with ``mode="max"``.

    Examples
    --------
    >>> MaxPool3DLayer((None, 2, 4, 4, 4), 2).output_shape
    (None, 2, 2, 2, 2)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size: IntOrTuple,
        stride: IntOrTuple | None = None,
        pad: IntOrTuple = (0, 0, 0),
        ignore_border: bool = True,
        **kwargs,
    ):
        super().__init__(incoming, pool_size, stride, pad, ignore_border, mode="max", **kwargs)


class _UpscaleLayer(Layer):
    """Upscale the last ``n`` axes by integer factors."""

    def __init__(self, incoming, scale_factor, mode, n, **kwargs):
        super().__init__(incoming, **kwargs)
        self.n = n
        self.scale_factor = as_tuple(scale_factor, n)
        if min(self.scale_factor) < 1:
            raise ValueError(f"Scale factor must be >= 1, not {self.scale_factor}")
        if mode not in ("repeat", "dilate"):
            raise ValueError(f"Mode must be either 'repeat' or 'dilate', not {mode}")
        self.mode = mode

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The last ``n`` sizes times the scale factors."""
        lead = len(input_shape) - self.n
        spatial = (
            None if s is None else s * f
            for s, f in zip(input_shape[lead:], self.scale_factor, strict=True)
        )
        return (*input_shape[:lead], *spatial)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """Each element repeated (``"repeat"``), or placed with zeros after it (``"dilate"``)."""
        lead = input.ndim - self.n
        if self.mode == "repeat":
            for axis, factor in enumerate(self.scale_factor, start=lead):
                if factor > 1:
                    input = pt.repeat(input, factor, axis=axis)
            return input
        shape = [input.shape[a] for a in range(lead)] + [
            input.shape[lead + i] * f for i, f in enumerate(self.scale_factor)
        ]
        steps = (slice(None),) * lead + tuple(slice(None, None, f) for f in self.scale_factor)
        return pt.zeros(shape, dtype=input.dtype)[steps].set(input)


class Upscale1DLayer(_UpscaleLayer):
    """Upscale the last axis by an integer factor.

    Parameters
    ----------
    incoming
        Input layer or shape.
    scale_factor
        Integer factor.
    mode
        ``"repeat"`` repeats each element; ``"dilate"`` puts ``factor - 1`` zeros after it.
    **kwargs
        ``name``.

    Examples
    --------
    >>> Upscale1DLayer((None, 2, 3), 2).output_shape
    (None, 2, 6)
    """

    def __init__(
        self, incoming: Layer | Shape, scale_factor: IntOrTuple, mode: str = "repeat", **kwargs
    ):
        super().__init__(incoming, scale_factor, mode, 1, **kwargs)


class Upscale2DLayer(_UpscaleLayer):
    """Upscale the last two axes by integer factors (int or pair); see :class:`Upscale1DLayer`.

    Examples
    --------
    >>> Upscale2DLayer((None, 2, 3, 4), (2, 3)).output_shape
    (None, 2, 6, 12)
    """

    def __init__(
        self, incoming: Layer | Shape, scale_factor: IntOrTuple, mode: str = "repeat", **kwargs
    ):
        super().__init__(incoming, scale_factor, mode, 2, **kwargs)


class Upscale3DLayer(_UpscaleLayer):
    """Upscale the last three axes by integer factors; see :class:`Upscale1DLayer`.

    Examples
    --------
    >>> Upscale3DLayer((None, 2, 1, 2, 3), 2).output_shape
    (None, 2, 2, 4, 6)
    """

    def __init__(
        self, incoming: Layer | Shape, scale_factor: IntOrTuple, mode: str = "repeat", **kwargs
    ):
        super().__init__(incoming, scale_factor, mode, 3, **kwargs)


def _grouped(input: TensorVariable, axis: int, pool_size: int) -> TensorVariable:
    """``input`` with ``axis`` split into ``(size // pool_size, pool_size)``."""
    shape = [input.shape[a] for a in range(input.ndim)]
    shape[axis : axis + 1] = [shape[axis] // pool_size, pool_size]
    return input.reshape(shape, ndim=input.ndim + 1)


class _FeatureGroupLayer(Layer):
    """Base of the layers working on consecutive groups of ``pool_size`` features."""

    def __init__(self, incoming: Layer | Shape, pool_size: int, axis: int, **kwargs):
        super().__init__(incoming, **kwargs)
        self.pool_size, self.axis = pool_size, axis % len(self.input_shape)
        size = self.input_shape[self.axis]
        if size is not None and size % pool_size:
            raise ValueError(
                f"Number of input feature maps ({size}) is not a multiple of the "
                f"pool size (pool_size={pool_size})"
            )


class FeaturePoolLayer(_FeatureGroupLayer):
    """Pool consecutive groups of ``pool_size`` features along ``axis`` (e.g. maxout).

    Parameters
    ----------
    incoming
        Input layer or shape.
    pool_size
        Group size; the axis size must be a multiple of it.
    axis
        Feature axis.
    pool_function
        Reduction called as ``pool_function(x, axis=...)``.
    **kwargs
        ``name``.

    Examples
    --------
    >>> FeaturePoolLayer((None, 6, 5), 3).output_shape
    (None, 2, 5)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size: int,
        axis: int = 1,
        pool_function: Callable = pt.max,
        **kwargs,
    ):
        super().__init__(incoming, pool_size, axis, **kwargs)
        self.pool_function = pool_function

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The input shape with the axis divided by ``pool_size``."""
        shape = list(input_shape)
        if shape[self.axis] is not None:
            shape[self.axis] //= self.pool_size
        return tuple(shape)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The reduction of each group."""
        return self.pool_function(_grouped(input, self.axis, self.pool_size), axis=self.axis + 1)


class FeatureWTALayer(_FeatureGroupLayer):
    """Winner takes all: in each group of ``pool_size`` features, zero all but the largest.

    Parameters
    ----------
    incoming
        Input layer or shape.
    pool_size
        Group size; the axis size must be a multiple of it.
    axis
        Feature axis.
    **kwargs
        ``name``.

    Examples
    --------
    >>> FeatureWTALayer((None, 6), 3).output_shape
    (None, 6)
    """

    def __init__(self, incoming: Layer | Shape, pool_size: int, axis: int = 1, **kwargs):
        super().__init__(incoming, pool_size, axis, **kwargs)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The input with each group's non-maximal elements zeroed (the first maximum wins)."""
        grouped = _grouped(input, self.axis, self.pool_size)
        winner = pt.argmax(grouped, axis=self.axis + 1, keepdims=True)
        position = pt.arange(self.pool_size).reshape(
            [self.pool_size if a == self.axis + 1 else 1 for a in range(grouped.ndim)]
        )
        kept = grouped * pt.eq(winner, position).astype(input.dtype)
        return kept.reshape(input.shape, ndim=input.ndim)


class GlobalPoolLayer(Layer):
    """Pool each channel over all its positions: ``(batch, channels, ...)`` to 2-d.

    Parameters
    ----------
    incoming
        Input layer or shape, at least 3-d.
    pool_function
        Reduction called as ``pool_function(x, axis=(2, 3, ...))`` over the trailing axes
        (equivalent to Lasagne's reduction of the input flattened to 3-d).
    **kwargs
        ``name``.
    """

    def __init__(self, incoming: Layer | Shape, pool_function: Callable = pt.mean, **kwargs):
        super().__init__(incoming, **kwargs)
        self.pool_function = pool_function

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, channels)``."""
        return input_shape[:2]

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The reduction over all trailing axes."""
        # Reducing over the axes rather than a flattened view: PyTensor's JAX backend
        # cannot differentiate through the flatten when the batch size is symbolic.
        input = pt.as_tensor_variable(input)
        return self.pool_function(input, axis=tuple(range(2, input.ndim)))


def _check_mode(mode: str) -> None:
    if mode not in POOL_MODES:
        raise ValueError(
            f"Mode must be either 'max', 'average_inc_pad' or 'average_exc_pad'. Got '{mode}'"
        )


def _grid(input: TensorVariable, sizes, count: int, bounds: Callable, mode: str) -> list:
    """``count x count`` bins over the last two axes, row-major, each pooled to a
    ``(batch, channels, 1)`` tensor; ``bounds(size, i, count)`` gives bin ``i``'s
    ``(start, stop)`` along an axis of length ``size`` (an int or symbolic)."""
    reduce = pt.max if mode == "max" else pt.mean
    rows, cols = ([bounds(size, i, count) for i in range(count)] for size in sizes)
    return [
        reduce(input[:, :, r0:r1, c0:c1], axis=(2, 3)).dimshuffle(0, 1, "x")
        for r0, r1 in rows
        for c0, c1 in cols
    ]


def _kaiming_bounds(size, i: int, count: int):
    """He et al.'s bin ``[floor(i size / count), ceil((i + 1) size / count))``."""
    return i * size // count, ((i + 1) * size + count - 1) // count


def _window_bounds(size, i: int, count: int):
    """Window ``i`` of Lasagne's ``"fast"`` pyramid: ``ceil(size / count)`` long, a stride of
    ``floor(size / count)`` apart."""
    step = size // count
    return i * step, i * step + (size + count - 1) // count


def pool_2d_nxn_regions(inputs, output_size: int, mode: str = "max") -> list[TensorVariable]:
    """Pool a 4-d tensor's last two axes to ``output_size x output_size`` bins of He et
    al.'s spatial pyramid pooling (any input size).

    Parameters
    ----------
    inputs
        Tensor ``(batch, channels, rows, cols)``.
    output_size
        Bins per axis.
    mode
        ``"max"``, or ``"average_inc_pad"`` / ``"average_exc_pad"`` (both average: bins
        have no padding).

    Returns
    -------
    list of TensorVariable
        ``output_size ** 2`` tensors ``(batch, channels, 1)``, row-major.

    Raises
    ------
    ValueError
        For an unknown mode.
    """
    _check_mode(mode)
    sizes = (inputs.shape[2], inputs.shape[3])
    return _grid(inputs, sizes, output_size, _kaiming_bounds, mode)


class SpatialPyramidPoolingLayer(Layer):
    """Pool each channel of an NCHW input over grids of ``d x d`` bins, for each ``d``.

    Parameters
    ----------
    incoming
        Input layer or shape ``(batch, channels, rows, cols)``; any sizes may be unknown.
    pool_dims
        Grid sizes ``d``.
    mode
        ``"max"`` or ``"average_exc_pad"`` / ``"average_inc_pad"`` (the bins have no
        padding, so both average).
    implementation
        ``"kaiming"``: He et al.'s bins ``[floor(i H / d), ceil((i + 1) H / d))``.
        ``"fast"`` (default): windows of ``ceil(H / d)`` a stride of ``floor(H / d)``
        apart, as Lasagne's pooling; here always ``d`` of them per axis (Lasagne's
        pooling adds more, and breaks the output shape, for some sizes).
    **kwargs
        ``name``.

    Raises
    ------
    ValueError
        If the input is not 4-d; an unknown mode when the output is built.

    Examples
    --------
    >>> SpatialPyramidPoolingLayer((None, 3, 7, 7), [2, 1]).output_shape
    (None, 3, 5)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_dims: Sequence[int] = [4, 2, 1],  # noqa: B006 (Lasagne's default, never mutated)
        mode: str = "max",
        implementation: str = "fast",
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        if len(self.input_shape) != 4:
            raise ValueError(
                f"Tried to create a SPP layer with input shape {self.input_shape!r}. Expected "
                "4 input dimensions (batchsize, channels, 2 spatial dimensions)."
            )
        self.pool_dims, self.mode, self.implementation = pool_dims, mode, implementation

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, channels, sum(d * d))``."""
        return (*input_shape[:2], sum(d * d for d in self.pool_dims))

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """Every bin's pooled value, grids in ``pool_dims`` order, bins row-major."""
        _check_mode(self.mode)
        input = pt.as_tensor_variable(input)
        sizes = [
            input.shape[2 + a] if known is None else known
            for a, known in enumerate(self.input_shape[2:])
        ]
        bounds = _kaiming_bounds if self.implementation == "kaiming" else _window_bounds
        pooled = [b for d in self.pool_dims for b in _grid(input, sizes, d, bounds, self.mode)]
        return pt.concatenate(pooled, axis=2)
