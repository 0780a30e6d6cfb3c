"""Pooling layers (``lasagne.layers.pool``)."""

from collections.abc import Callable, Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.conv import pool2d, pool_output_length
from synkhronos.extensions.lasagne.layers.base import Layer, Shape, as_pair

__all__ = ["GlobalPoolLayer", "MaxPool2DLayer", "Pool2DLayer"]


class Pool2DLayer(Layer):
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
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        pad: int | Sequence[int] = (0, 0),
        ignore_border: bool = True,
        mode: str = "max",
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        if len(self.input_shape) != 4:
            raise ValueError(f"Pool2DLayer needs a 4-d input, got shape {self.input_shape}")
        self.pool_size = as_pair(pool_size, "pool_size")
        self.stride = self.pool_size if stride is None else as_pair(stride, "stride")
        self.pad = as_pair(pad, "pad")
        self.ignore_border, self.mode = ignore_border, mode

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, channels, out_rows, out_cols)``."""
        spatial = (
            None if size is None else pool_output_length(size, k, s, p, self.ignore_border)
            for size, k, s, p in zip(
                input_shape[2:], self.pool_size, self.stride, self.pad, strict=True
            )
        )
        return (*input_shape[:2], *spatial)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The pooled input."""
        return pool2d(input, self.pool_size, self.stride, self.pad, self.ignore_border, self.mode)


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
        pool_size: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        pad: int | Sequence[int] = (0, 0),
        ignore_border: bool = True,
        **kwargs,
    ):
        super().__init__(incoming, pool_size, stride, pad, ignore_border, mode="max", **kwargs)


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
