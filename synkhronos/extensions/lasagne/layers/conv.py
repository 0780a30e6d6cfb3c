"""Convolution layers (``lasagne.layers.conv``), on the Ops of :mod:`synkhronos.extensions.conv`.

``convolution=`` takes a function called as ``convolution(input, filters, stride,
padding, dilation, groups)`` with this project's conventions (cross-correlation, filters
already flipped when ``flip_filters``): by default :func:`~synkhronos.extensions.conv.conv1d`,
:func:`~synkhronos.extensions.conv.conv2d` or :func:`~synkhronos.extensions.conv.conv3d`.
Lasagne passed Theano's own ``conv2d`` signature instead.
"""

from collections.abc import Callable, Sequence

import pytensor
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.conv import (
    conv1d,
    conv2d,
    conv2d_transpose,
    conv3d,
    conv_output_length,
    int_tuple,
)
from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import Layer, ParamSpec, Shape, as_nonlinearity

__all__ = [
    "BaseConvLayer",
    "Conv1DLayer",
    "Conv2DLayer",
    "Conv3DLayer",
    "Deconv2DLayer",
    "Deconv3DLayer",
    "DilatedConv2DLayer",
    "TransposedConv2DLayer",
    "TransposedConv3DLayer",
    "conv_input_length",
]

PadSpec = int | str | Sequence[int]
IntOrTuple = int | Sequence[int]


def _padding(pad: PadSpec, filter_size: tuple[int, ...]) -> tuple[int, ...]:
    """Symmetric padding per axis for Lasagne's ``pad`` (or ``crop``) argument."""
    if pad == "valid":
        return (0,) * len(filter_size)
    if pad == "full":
        return tuple(k - 1 for k in filter_size)
    if pad == "same":
        if any(k % 2 == 0 for k in filter_size):
            raise NotImplementedError("pad='same' needs odd filter sizes")
        return tuple(k // 2 for k in filter_size)
    if isinstance(pad, str):
        raise ValueError(f"pad must be an int, a tuple, 'valid', 'full' or 'same', got {pad!r}")
    return int_tuple(pad, len(filter_size), "pad")


def conv_input_length(output_length, filter_size: int, stride: int, pad: int):
    """Largest input length that a convolution maps to ``output_length`` (None if unknown).

    Parameters
    ----------
    output_length
        Output length (int or None).
    filter_size, stride, pad
        Convolution parameters along the axis.

    Returns
    -------
    int or None
        ``(output_length - 1) * stride - 2 * pad + filter_size``.

    Examples
    --------
    >>> conv_input_length(3, 3, 2, 1)
    5
    """
    if output_length is None:
        return None
    return (output_length - 1) * stride - 2 * pad + filter_size


def _flipped(filters: TensorVariable, n: int) -> TensorVariable:
    """``filters`` reversed along their last ``n`` (spatial) axes."""
    return filters[(slice(None),) * (filters.ndim - n) + (slice(None, None, -1),) * n]


class BaseConvLayer(Layer):
    """Shared logic of the ``n``-dimensional convolution layers (``lasagne.layers.BaseConvLayer``).

    Subclasses define :meth:`convolve`.  Parameters are those of :class:`Conv2DLayer`,
    with ``n`` values per tuple and ``n`` the number of spatial dimensions.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: IntOrTuple,
        stride: IntOrTuple = 1,
        pad: PadSpec = 0,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008 (initializers are stateless)
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        flip_filters: bool = True,
        n: int | None = None,
        num_groups: int = 1,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        n = len(self.input_shape) - 2 if n is None else n
        if n < 1 or len(self.input_shape) != n + 2:
            raise ValueError(
                f"{type(self).__name__} needs a {n + 2}-d input, got shape {self.input_shape}"
            )
        channels = self.input_shape[1]
        if channels is None or channels % num_groups or num_filters % num_groups:
            raise ValueError(
                f"{channels} input channels and {num_filters} filters do not fit "
                f"num_groups={num_groups}"
            )
        self.n, self.num_filters, self.num_groups = n, num_filters, num_groups
        self.filter_size = int_tuple(filter_size, n, "filter_size")
        self.stride = int_tuple(stride, n, "stride")
        self.pad = _padding(pad, self.filter_size)
        self.untie_biases, self.flip_filters = untie_biases, flip_filters
        self.nonlinearity = as_nonlinearity(nonlinearity)
        self.W = self.add_param(W, self.get_W_shape(), name="W")
        self.b = None
        if b is not None:
            b_shape = (num_filters, *self.output_shape[2:]) if untie_biases else (num_filters,)
            self.b = self.add_param(b, b_shape, name="b", regularizable=False)

    def get_W_shape(self) -> tuple[int, ...]:  # noqa: N802 (Lasagne's name)
        """Shape of the filters: ``(num_filters, channels / num_groups, *filter_size)``."""
        return (self.num_filters, self.input_shape[1] // self.num_groups, *self.filter_size)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, num_filters, *spatial output sizes)``."""
        spatial = (
            None if size is None else conv_output_length(size, k, s, p, p)
            for size, k, s, p in zip(
                input_shape[2:], self.filter_size, self.stride, self.pad, strict=True
            )
        )
        return (input_shape[0], self.num_filters, *spatial)

    def convolve(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The convolution of ``input`` with ``W``, before bias and nonlinearity."""
        raise NotImplementedError(f"{type(self).__name__} does not define convolve")

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``nonlinearity(convolve(input) + b)``."""
        conved = self.convolve(input, **kwargs)
        if self.b is not None:
            spatial = tuple(range(1, self.n + 1)) if self.untie_biases else ("x",) * self.n
            conved = conved + self.b.dimshuffle("x", 0, *spatial)
        return self.nonlinearity(conved)


class _ForwardConvLayer(BaseConvLayer):
    """A convolution layer computing ``convolution(input, W)``."""

    def __init__(self, *args, convolution: Callable, **kwargs):
        self.convolution = convolution
        super().__init__(*args, **kwargs)

    def convolve(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``convolution(input, W)``, with ``W`` flipped if ``flip_filters``."""
        filters = _flipped(self.W, self.n) if self.flip_filters else self.W
        return self.convolution(input, filters, self.stride, self.pad, 1, self.num_groups)


class Conv1DLayer(_ForwardConvLayer):
    """1-D convolution of a ``(batch, channels, length)`` input, then bias and nonlinearity.

    Parameters are those of :class:`Conv2DLayer` with single ints; ``convolution``
    defaults to :func:`~synkhronos.extensions.conv.conv1d`.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import InputLayer
    >>> Conv1DLayer(InputLayer((None, 2, 9)), 4, 3, stride=2).output_shape
    (None, 4, 4)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: IntOrTuple,
        stride: IntOrTuple = 1,
        pad: PadSpec = 0,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        flip_filters: bool = True,
        convolution: Callable = conv1d,
        num_groups: int = 1,
        **kwargs,
    ):
        super().__init__(
            incoming, num_filters, filter_size, stride, pad, untie_biases, W, b, nonlinearity,
            flip_filters, n=1, num_groups=num_groups, convolution=convolution, **kwargs,
        )  # fmt: skip


class Conv2DLayer(_ForwardConvLayer):
    """2-D convolution of an NCHW input, then bias and nonlinearity.

    Parameters
    ----------
    incoming
        Input layer or shape ``(batch, channels, rows, cols)``.
    num_filters
        Number of output channels.
    filter_size
        Filter height and width (int or pair).
    stride
        Step between filter applications (int or pair).
    pad
        Zero padding: an int or pair, ``"valid"`` (0), ``"full"`` (filter size - 1) or
        ``"same"`` (filter size // 2, keeping the size for odd filters and stride 1).
    untie_biases
        If True, one bias per output channel *and position* ``(num_filters, rows,
        cols)``; else one per channel.
    W
        Initializer for the ``(num_filters, channels / num_groups, fh, fw)`` filters.
    b
        Initializer for the biases, or None for no biases.
    nonlinearity
        Activation; None means linear.
    flip_filters
        If True (Lasagne's default), flip the filters to compute a true convolution;
        False gives cross-correlation, as in cuDNN-style pretrained weights.
    convolution
        Function computing the cross-correlation (see the module docstring); default
        :func:`~synkhronos.extensions.conv.conv2d`.
    num_groups
        Number of channel groups.
    **kwargs
        ``name``.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import InputLayer
    >>> Conv2DLayer(InputLayer((None, 3, 8, 8)), 4, 3, pad="same").output_shape
    (None, 4, 8, 8)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: IntOrTuple,
        stride: IntOrTuple = (1, 1),
        pad: PadSpec = 0,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        flip_filters: bool = True,
        convolution: Callable = conv2d,
        num_groups: int = 1,
        **kwargs,
    ):
        super().__init__(
            incoming, num_filters, filter_size, stride, pad, untie_biases, W, b, nonlinearity,
            flip_filters, n=2, num_groups=num_groups, convolution=convolution, **kwargs,
        )  # fmt: skip


class Conv3DLayer(_ForwardConvLayer):
    """3-D convolution of a ``(batch, channels, depth, rows, cols)`` input.

    Parameters are those of :class:`Conv2DLayer` with triples; ``convolution=None``
    (Lasagne's default) means :func:`~synkhronos.extensions.conv.conv3d` (a sum of 2-D
    convolutions).

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import InputLayer
    >>> Conv3DLayer(InputLayer((None, 2, 5, 6, 7)), 4, 3).output_shape
    (None, 4, 3, 4, 5)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: IntOrTuple,
        stride: IntOrTuple = (1, 1, 1),
        pad: PadSpec = 0,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        flip_filters: bool = True,
        convolution: Callable | None = None,
        num_groups: int = 1,
        **kwargs,
    ):
        super().__init__(
            incoming, num_filters, filter_size, stride, pad, untie_biases, W, b, nonlinearity,
            flip_filters, n=3, num_groups=num_groups, convolution=convolution or conv3d,
            **kwargs,
        )  # fmt: skip


class _TransposedConvLayer(BaseConvLayer):
    """The transpose of a convolution (the gradient of one with respect to its input).

    ``W`` is ``(channels, num_filters, *filter_size)``, the filters of the convolution
    being transposed; with ``flip_filters=False`` (Lasagne's default here) each input
    element scatters ``W`` unflipped into the output.
    """

    def __init__(self, incoming, num_filters, filter_size, stride, crop, untie_biases, W, b,
                 nonlinearity, flip_filters, output_size, n, **kwargs):  # fmt: skip
        self.crop = crop
        self.output_size = None if output_size is None else int_tuple(output_size, n, "output_size")
        super().__init__(
            incoming, num_filters, filter_size, stride, crop, untie_biases, W, b, nonlinearity,
            flip_filters, n=n, **kwargs,
        )  # fmt: skip

    def get_W_shape(self) -> tuple[int, ...]:  # noqa: N802
        """``(channels, num_filters, *filter_size)``."""
        return (self.input_shape[1], self.num_filters, *self.filter_size)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, num_filters, *sizes)``, ``output_size`` if given."""
        if self.output_size is not None:
            return (input_shape[0], self.num_filters, *self.output_size)
        spatial = (
            conv_input_length(size, k, s, p)
            for size, k, s, p in zip(
                input_shape[2:], self.filter_size, self.stride, self.pad, strict=True
            )
        )
        return (input_shape[0], self.num_filters, *spatial)

    def convolve(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The transposed convolution of ``input`` with ``W``."""
        # Transposing a correlation with W scatters W itself (unflipped).
        filters = _flipped(self.W, self.n) if self.flip_filters else self.W
        shape = self.output_shape
        out_shape = [input.shape[0], self.num_filters] + [
            size if size is not None else conv_input_length(input.shape[2 + i], *geom)
            for i, (size, geom) in enumerate(
                zip(shape[2:], zip(self.filter_size, self.stride, self.pad, strict=True),
                    strict=True)
            )
        ]  # fmt: skip
        if self.n == 2:
            return conv2d_transpose(input, filters, out_shape, self.stride, self.pad)
        # 3-D: differentiate the forward convolution with respect to its input.
        like = pt.zeros(out_shape, dtype=pytensor.config.floatX)
        forward = conv3d(like, filters, self.stride, self.pad)
        return pytensor.grad(None, like, known_grads={forward: input})


class TransposedConv2DLayer(_TransposedConvLayer):
    """Transposed 2-D convolution ("deconvolution"), then bias and nonlinearity.

    Parameters
    ----------
    incoming
        Input layer or shape ``(batch, channels, rows, cols)``.
    num_filters
        Number of output channels.
    filter_size
        Filter height and width.
    stride
        Upsampling factor (the stride of the transposed convolution).
    crop
        Cropping of the full output: int, pair, ``"valid"``, ``"full"`` or ``"same"``.
    untie_biases, W, b, nonlinearity
        As for :class:`Conv2DLayer`; ``W`` is ``(channels, num_filters, fh, fw)``.
    flip_filters
        False (default) scatters ``W`` as is.
    output_size
        Output rows and cols, to choose among the sizes a stride > 1 allows.
    **kwargs
        ``name``.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import InputLayer
    >>> TransposedConv2DLayer(InputLayer((None, 3, 4, 4)), 2, 3, stride=2).output_shape
    (None, 2, 9, 9)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: IntOrTuple,
        stride: IntOrTuple = (1, 1),
        crop: PadSpec = 0,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        flip_filters: bool = False,
        output_size: IntOrTuple | None = None,
        **kwargs,
    ):
        super().__init__(
            incoming, num_filters, filter_size, stride, crop, untie_biases, W, b, nonlinearity,
            flip_filters, output_size, n=2, **kwargs,
        )  # fmt: skip


class TransposedConv3DLayer(_TransposedConvLayer):
    """Transposed 3-D convolution; parameters as :class:`TransposedConv2DLayer`, with triples.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import InputLayer
    >>> TransposedConv3DLayer(InputLayer((None, 3, 2, 3, 4)), 2, 2).output_shape
    (None, 2, 3, 4, 5)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: IntOrTuple,
        stride: IntOrTuple = (1, 1, 1),
        crop: PadSpec = 0,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        flip_filters: bool = False,
        output_size: IntOrTuple | None = None,
        **kwargs,
    ):
        super().__init__(
            incoming, num_filters, filter_size, stride, crop, untie_biases, W, b, nonlinearity,
            flip_filters, output_size, n=3, **kwargs,
        )  # fmt: skip


Deconv2DLayer = TransposedConv2DLayer
Deconv3DLayer = TransposedConv3DLayer


class DilatedConv2DLayer(BaseConvLayer):
    """2-D convolution with dilated filters (taps ``dilation`` apart), stride 1.

    Parameters
    ----------
    incoming
        Input layer or shape ``(batch, channels, rows, cols)``.
    num_filters
        Number of output channels.
    filter_size
        Filter height and width (before dilation).
    dilation
        Spacing between filter taps (int or pair).
    pad
        Zero padding: int, pair or ``"valid"``.
    untie_biases, b, nonlinearity
        As for :class:`Conv2DLayer`.
    W
        Initializer for the ``(channels, num_filters, fh, fw)`` filters (Lasagne's
        layout here).
    flip_filters
        False (default) computes cross-correlation.
    **kwargs
        ``name``.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import InputLayer
    >>> DilatedConv2DLayer(InputLayer((None, 3, 9, 9)), 2, 3, dilation=2).output_shape
    (None, 2, 5, 5)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: IntOrTuple,
        dilation: IntOrTuple = (1, 1),
        pad: PadSpec = 0,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        flip_filters: bool = False,
        **kwargs,
    ):
        self.dilation = int_tuple(dilation, 2, "dilation")
        super().__init__(
            incoming, num_filters, filter_size, 1, pad, untie_biases, W, b, nonlinearity,
            flip_filters, n=2, **kwargs,
        )  # fmt: skip

    def get_W_shape(self) -> tuple[int, ...]:  # noqa: N802
        """``(channels, num_filters, fh, fw)``."""
        return (self.input_shape[1], self.num_filters, *self.filter_size)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, num_filters, rows + 2 pad - dilation (fh - 1), ...)``."""
        spatial = (
            None if size is None else conv_output_length(size, k, 1, p, p, d)
            for size, k, p, d in zip(
                input_shape[2:], self.filter_size, self.pad, self.dilation, strict=True
            )
        )
        return (input_shape[0], self.num_filters, *spatial)

    def convolve(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """Dilated cross-correlation (convolution if ``flip_filters``)."""
        filters = self.W.dimshuffle(1, 0, 2, 3)
        if self.flip_filters:
            filters = _flipped(filters, 2)
        return conv2d(input, filters, 1, self.pad, self.dilation)
