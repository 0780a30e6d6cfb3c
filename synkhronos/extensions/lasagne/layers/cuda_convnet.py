"""Lasagne's ``lasagne.layers.cuda_convnet`` names, on this port's layers.

cuda-convnet kept tensors in c01b order (channels, rows, cols, batch).  The shuffle
layers convert between the two orders.  :class:`Conv2DCCLayer` and
:class:`MaxPool2DCCLayer` take bc01 inputs (Lasagne's default ``dimshuffle=True``) or
c01b ones (``dimshuffle=False``), compute what Lasagne's do (cross-correlation, and
pooling with ``ignore_border=False``) on this project's Ops, and refuse the settings
Lasagne's refuse.

Examples
--------
>>> bc01_to_c01b((None, 3, 5, 6)).output_shape
(3, 5, 6, None)
"""

from collections.abc import Callable, Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import Layer, ParamSpec, Shape, as_nonlinearity
from synkhronos.extensions.lasagne.layers.dnn import Conv2DDNNLayer
from synkhronos.extensions.lasagne.layers.pool import pool_output_length
from synkhronos.extensions.lasagne.layers.shape import DimshuffleLayer
from synkhronos.extensions.lasagne.utils import as_tuple
from synkhronos.ops.conv import pool2d
from synkhronos.ops.nnet import conv2d

__all__ = [
    "Conv2DCCLayer",
    "MaxPool2DCCLayer",
    "NINLayer_c01b",
    "ShuffleBC01ToC01BLayer",
    "ShuffleC01BToBC01Layer",
    "bc01_to_c01b",
    "c01b_to_bc01",
]


def _square(values: tuple, what: str, name: str, kind: type[Exception]) -> int:
    """The one value of a pair that cuda-convnet needs square (equal)."""
    if values[0] != values[1]:
        raise kind(f"{name} only supports {what}, but got {values!r}")
    return values[0]


class Conv2DCCLayer(Conv2DDNNLayer):
    """cuda-convnet's convolution layer: cross-correlation by default, and Lasagne's
    restrictions on cuda-convnet's kernels (square filters, strides and padding;
    ``num_filters`` a multiple of 16; 1, 2, 3 or a multiple of 4 input channels).

    Parameters are Lasagne's. ``dimshuffle=False`` takes and returns c01b tensors
    (channels, rows, columns, batch) with filters ``(channels, rows, columns,
    num_filters)``; ``W=None`` means Glorot-uniform filters (with the c01b fans when
    ``dimshuffle=False``); ``partial_sum`` (a cuda-convnet tuning knob) is kept but has
    no effect.

    Raises
    ------
    RuntimeError
        For a setting cuda-convnet does not support.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: int | Sequence[int],
        stride: int | Sequence[int] = (1, 1),
        pad: int | str | Sequence[int] = 0,
        untie_biases: bool = False,
        W: ParamSpec | None = None,
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008 (initializers are stateless)
        nonlinearity: Callable | None = nonlinearities.rectify,
        dimshuffle: bool = True,
        flip_filters: bool = False,
        partial_sum: int = 1,
        **kwargs,
    ):
        if W is None:
            W = init.GlorotUniform(c01b=not dimshuffle)
        self.dimshuffle, self.partial_sum = dimshuffle, partial_sum
        super().__init__(
            incoming, num_filters, filter_size, stride, pad, untie_biases, W, b, nonlinearity,
            flip_filters, **kwargs,
        )  # fmt: skip
        _square(self.filter_size, "square filters", "Conv2DCCLayer", RuntimeError)
        _square(self.stride, "square strides", "Conv2DCCLayer", RuntimeError)
        if isinstance(self.pad, tuple):
            _square(self.pad, "square padding", "Conv2DCCLayer", RuntimeError)
        if num_filters % 16:
            raise RuntimeError(
                "Conv2DCCLayer requires num_filters to be a multiple of 16, "
                f"but num_filters is {num_filters}"
            )
        channels = self.num_input_channels
        if not (channels < 4 or channels % 4 == 0):
            raise RuntimeError(
                "Conv2DCCLayer requires the number of input channels to be 1, "
                f"2, 3 or a multiple of 4, but it is {channels}"
            )

    @property
    def num_input_channels(self) -> int:
        """The input's channels (axis 0 in c01b, 1 in bc01)."""
        return self.input_shape[1 if self.dimshuffle else 0]

    def _bc01_shape(self, input_shape: Shape) -> Shape:
        return input_shape if self.dimshuffle else tuple(input_shape[i] for i in (3, 0, 1, 2))

    def _untied_bias_shape(self) -> tuple[int, ...]:
        """``(num_filters, rows, cols)`` of the output, in either layout."""
        rows_cols = self.output_shape[2:] if self.dimshuffle else self.output_shape[1:3]
        return (self.num_filters, *rows_cols)

    def get_W_shape(self) -> tuple[int, ...]:  # noqa: N802 (Lasagne's name)
        """bc01: ``(num_filters, channels, rows, cols)``; c01b: ``(channels, rows, cols,
        num_filters)``."""
        if self.dimshuffle:
            return super().get_W_shape()
        return (self.num_input_channels, *self.filter_size, self.num_filters)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The convolution's output shape, in the input's layout."""
        shape = super().get_output_shape_for(self._bc01_shape(input_shape))
        return shape if self.dimshuffle else (*shape[1:], shape[0])

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``nonlinearity(correlation + b)`` (convolution if ``flip_filters``)."""
        if self.dimshuffle:
            return super().get_output_for(input, **kwargs)
        input = pt.as_tensor_variable(input).dimshuffle(3, 0, 1, 2)  # c01b to bc01
        conved = conv2d(
            input,
            self.W.dimshuffle(3, 0, 1, 2),
            subsample=self.stride,
            border_mode="half" if self.pad == "same" else self.pad,
            filter_flip=self.flip_filters,
        )
        if self.b is not None:
            conved = conved + (
                self.b.dimshuffle("x", 0, 1, 2)
                if self.untie_biases
                else self.b.dimshuffle("x", 0, "x", "x")
            )
        return self.nonlinearity(conved).dimshuffle(1, 2, 3, 0)  # bc01 to c01b


class MaxPool2DCCLayer(Layer):
    """cuda-convnet's max pooling: square windows and strides, stride at most the
    window, no padding, partial windows kept at the borders (``ignore_border=False``).

    Parameters
    ----------
    incoming
        Input layer or shape.
    pool_size
        Window size (int or a square pair).
    stride
        Step between windows (int or a square pair), at most ``pool_size``; None means
        ``pool_size``.
    ignore_border
        Must be False (Lasagne's default here).
    dimshuffle
        True for bc01 tensors, False for c01b (channels, rows, columns, batch).
    **kwargs
        ``name``; ``pad`` is accepted if zero.

    Raises
    ------
    NotImplementedError
        For a setting cuda-convnet does not support.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        ignore_border: bool = False,
        dimshuffle: bool = True,
        **kwargs,
    ):
        if as_tuple(kwargs.pop("pad", 0), 2) != (0, 0):
            raise NotImplementedError("MaxPool2DCCLayer does not support padding")
        super().__init__(incoming, **kwargs)
        name = "MaxPool2DCCLayer"
        self.pool_size = _square(
            as_tuple(pool_size, 2), "square pooling regions", name, NotImplementedError
        )
        self.stride = (
            self.pool_size
            if stride is None
            else _square(
                as_tuple(stride, 2),
                "using the same stride in both directions",
                name,
                NotImplementedError,
            )
        )
        if self.stride > self.pool_size:
            raise NotImplementedError("MaxPool2DCCLayer only supports stride <= pool_size.")
        if ignore_border:
            raise NotImplementedError("MaxPool2DCCLayer does not support ignore_border=True.")
        self.dimshuffle = dimshuffle

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The pooled shape, in the input's layout."""
        axes = (2, 3) if self.dimshuffle else (1, 2)
        shape = list(input_shape)
        for axis in axes:
            shape[axis] = pool_output_length(shape[axis], self.pool_size, self.stride, 0, False)
        return tuple(shape)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """Max over every window (partial ones at the borders included)."""
        input = pt.as_tensor_variable(input)
        if not self.dimshuffle:
            input = input.dimshuffle(3, 0, 1, 2)  # c01b to bc01
        pooled = pool2d(input, self.pool_size, self.stride, 0, False, "max")
        return pooled if self.dimshuffle else pooled.dimshuffle(1, 2, 3, 0)


class NINLayer_c01b(Layer):  # noqa: N801 (Lasagne's name)
    """Network-in-network (a 1x1 convolution) on c01b input: channels first, batch last.

    Parameters
    ----------
    incoming
        Input layer or shape ``(channels, rows, columns, batch)``.
    num_units
        Number of output channels.
    untie_biases
        If True, one bias per unit *and position* ``(num_units, rows, columns)``.
    W
        Initializer for the ``(num_units, channels)`` weights (the transpose of
        :class:`~synkhronos.extensions.lasagne.layers.NINLayer`'s, as in Lasagne).
    b
        Initializer for the biases, or None for no biases.
    nonlinearity
        Activation; None means linear.
    **kwargs
        ``name``.

    Examples
    --------
    >>> NINLayer_c01b((3, 4, 5, None), 6).output_shape
    (6, 4, 5, None)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_units: int,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008 (initializers are stateless)
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        self.nonlinearity = as_nonlinearity(nonlinearity)
        self.num_units, self.untie_biases = num_units, untie_biases
        channels = self.input_shape[0]
        if channels is None:
            raise ValueError("NINLayer_c01b needs a known number of input channels")
        self.W = self.add_param(W, (num_units, channels), name="W")
        self.b = None
        if b is not None:
            b_shape = (num_units, *self.input_shape[1:-1]) if untie_biases else (num_units,)
            self.b = self.add_param(b, b_shape, name="b", regularizable=False)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(num_units, rows, columns, batch)``."""
        return (self.num_units, *input_shape[1:])

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``nonlinearity(W input + b)`` at every position."""
        # matmul with the channels last, not tensordot, whose fold of the other axes
        # JAX cannot trace (see DenseLayer).
        channels_last = input.dimshuffle(*range(1, input.ndim), 0)
        out = pt.matmul(channels_last, self.W.T).dimshuffle(input.ndim - 1, *range(input.ndim - 1))
        if self.b is not None:
            # The batch axis (last) is broadcast; tied biases also over rows and columns.
            kept = self.b.ndim if self.untie_biases else 1
            pattern = (*range(kept), *("x" for _ in range(input.ndim - kept)))
            out = out + self.b.dimshuffle(*pattern)
        return self.nonlinearity(out)


class ShuffleBC01ToC01BLayer(DimshuffleLayer):
    """Reorder a bc01 tensor to c01b.

    Parameters
    ----------
    incoming
        Input layer or shape.
    **kwargs
        ``name``.
    """

    def __init__(self, incoming: Layer | Shape, **kwargs):
        super().__init__(incoming, (1, 2, 3, 0), **kwargs)


class ShuffleC01BToBC01Layer(DimshuffleLayer):
    """Reorder a c01b tensor to bc01.

    Parameters
    ----------
    incoming
        Input layer or shape.
    **kwargs
        ``name``.
    """

    def __init__(self, incoming: Layer | Shape, **kwargs):
        super().__init__(incoming, (3, 0, 1, 2), **kwargs)


bc01_to_c01b = ShuffleBC01ToC01BLayer
c01b_to_bc01 = ShuffleC01BToBC01Layer
