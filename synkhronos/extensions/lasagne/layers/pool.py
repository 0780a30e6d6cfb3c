"""Pooling and upscaling layers (``lasagne.layers.pool``)."""

import math
from collections.abc import Callable, Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.conv import int_tuple, pool1d, pool2d, pool3d, pool_output_length
from synkhronos.extensions.lasagne.layers.base import Layer, Shape

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


class _PoolLayer(Layer):
    """Max or average pooling over the last ``n`` axes."""

    def __init__(self, incoming, pool_size, stride, pad, ignore_border, mode, n, **kwargs):
        super().__init__(incoming, **kwargs)
        if len(self.input_shape) != n + 2:
            raise ValueError(
                f"{type(self).__name__} needs a {n + 2}-d input, got shape {self.input_shape}"
            )
        self.n = n
        self.pool_size = int_tuple(pool_size, n, "pool_size")
        self.stride = self.pool_size if stride is None else int_tuple(stride, n, "stride")
        self.pad = int_tuple(pad, n, "pad")
        self.ignore_border, self.mode = ignore_border, mode

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, channels, *pooled sizes)``."""
        spatial = (
            None if size is None else pool_output_length(size, k, s, p, self.ignore_border)
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
        return pool(input, ws, stride, pad, self.ignore_border, self.mode)


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
        self.scale_factor = int_tuple(scale_factor, n, "scale_factor")
        if min(self.scale_factor) < 1:
            raise ValueError(f"scale_factor must be positive, got {scale_factor!r}")
        if mode not in ("repeat", "dilate"):
            raise ValueError(f"mode must be 'repeat' or 'dilate', got {mode!r}")
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
            raise ValueError(f"axis size {size} is not a multiple of pool_size={pool_size}")


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
        if len(self.input_shape) < 3:
            raise ValueError("GlobalPoolLayer needs an input of at least 3 dimensions")
        self.pool_function = pool_function

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, channels)``."""
        return input_shape[:2]

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The reduction over all trailing axes."""
        # Reducing over the axes rather than a flattened view: PyTensor's JAX backend
        # cannot differentiate through the flatten when the batch size is symbolic.
        return self.pool_function(input, axis=tuple(range(2, input.ndim)))


def _bins(size: int, count: int) -> list[tuple[int, int]]:
    """``count`` windows covering ``range(size)``: ``[floor(i s / c), ceil((i + 1) s / c))``."""
    return [(i * size // count, math.ceil((i + 1) * size / count)) for i in range(count)]


class SpatialPyramidPoolingLayer(Layer):
    """Pool each channel of an NCHW input over grids of ``d x d`` bins, for each ``d``.

    Parameters
    ----------
    incoming
        Input layer or shape; rows and cols must be known.
    pool_dims
        Grid sizes ``d``.
    mode
        ``"max"`` or ``"average_exc_pad"`` / ``"average_inc_pad"`` (the bins have no
        padding, so both average).
    implementation
        Accepted for Lasagne compatibility: both ``"fast"`` and ``"kaiming"`` compute He
        et al.'s bins ``[floor(i H / d), ceil((i + 1) H / d))``, which always give ``d``
        bins (Lasagne's ``"fast"`` uses one window size and may not).
    **kwargs
        ``name``.

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
        if len(self.input_shape) != 4 or None in self.input_shape[2:]:
            raise ValueError(f"needs an NCHW input of known rows and cols, got {self.input_shape}")
        if implementation not in ("fast", "kaiming"):
            raise ValueError(f"implementation must be 'fast' or 'kaiming', got {implementation!r}")
        self.pool_dims, self.mode, self.implementation = list(pool_dims), mode, implementation

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, channels, sum(d * d))``."""
        return (*input_shape[:2], sum(d * d for d in self.pool_dims))

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """Every bin's pooled value, grids in ``pool_dims`` order, bins row-major."""
        reduce = pt.max if self.mode == "max" else pt.mean
        rows, cols = self.input_shape[2:]
        pooled = [
            reduce(input[:, :, r0:r1, c0:c1], axis=(2, 3))
            for d in self.pool_dims
            for r0, r1 in _bins(rows, d)
            for c0, c1 in _bins(cols, d)
        ]
        return pt.stack(pooled, axis=2)
