"""Convolution layers (``lasagne.layers.conv``), on the Ops of :mod:`synkhronos.ops.conv`.

As in Lasagne, the forward layers compute ``convolution(input, W, input_shape,
W_shape, subsample=stride, border_mode=pad, filter_flip=flip_filters)`` (``pad="same"``
passed as ``"half"``, and ``num_groups=`` when above 1): any function with Theano's
``conv2d`` convention serves, such as
:func:`synkhronos.theano.tensor.nnet.conv2d <synkhronos.ops.nnet.conv2d>`
(the default of :class:`Conv2DLayer`), ``conv3d`` (of :class:`Conv3DLayer`) or the 1-D
functions of :mod:`~synkhronos.extensions.lasagne.theano_extensions.conv` (``conv1d_mc0``,
the default of :class:`Conv1DLayer`). The transposed layers are the gradients of those
convolutions with respect to their input (Theano's ``AbstractConv2d_gradInputs``).
"""

from collections.abc import Callable, Sequence

import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import Layer, ParamSpec, Shape, as_nonlinearity
from synkhronos.extensions.lasagne.theano_extensions.conv import conv1d_mc0
from synkhronos.extensions.lasagne.utils import as_tuple, int_types
from synkhronos.ops import conv
from synkhronos.ops.nnet import (
    AbstractConv2d_gradInputs,
    AbstractConv3d_gradInputs,
    conv2d,
    conv3d,
)

__all__ = [
    "Conv1DLayer",
    "Conv2DLayer",
    "Conv3DLayer",
    "Deconv2DLayer",
    "Deconv3DLayer",
    "DilatedConv2DLayer",
    "TransposedConv2DLayer",
    "TransposedConv3DLayer",
]

PadSpec = int | str | Sequence[int]
IntOrTuple = int | Sequence[int]


def conv_output_length(input_length, filter_size: int, stride: int, pad: int | str = 0):
    """Output length of a convolution along one axis, as Lasagne computes it.

    Parameters
    ----------
    input_length
        Input length (int or None).
    filter_size, stride
        Convolution parameters along the axis.
    pad
        Zero padding on each side: an int, ``"valid"`` (0), ``"full"`` (filter size -
        1) or ``"same"`` (the output keeps the input's length at stride 1).

    Returns
    -------
    int or None
        The output length, None if ``input_length`` is None.

    Raises
    ------
    ValueError
        For another ``pad``.

    Examples
    --------
    >>> conv_output_length(13, 5, 3, "full"), conv_output_length(13, 5, 3, 2)
    (6, 5)
    """
    if input_length is None:
        return None
    if pad == "valid":
        length = input_length - filter_size + 1
    elif pad == "full":
        length = input_length + filter_size - 1
    elif pad == "same":
        length = input_length
    elif isinstance(pad, int_types):
        length = input_length + 2 * pad - filter_size + 1
    else:
        raise ValueError(f"Invalid pad: {pad}")
    return (length + stride - 1) // stride  # ceil(length / stride)


def conv_input_length(output_length, filter_size: int, stride: int, pad: int | str = 0):
    """Smallest input length that a convolution maps to ``output_length``.

    This is the output length of the transposed convolution.

    Parameters
    ----------
    output_length
        Output length (int or None).
    filter_size, stride, pad
        Convolution parameters along the axis (``pad`` as for
        :func:`conv_output_length`).

    Returns
    -------
    int or None
        ``(output_length - 1) * stride - 2 * pad + filter_size``; None if
        ``output_length`` is None.

    Raises
    ------
    ValueError
        If ``pad`` is neither an int nor one of the three mode names.

    Examples
    --------
    >>> conv_input_length(3, 3, 2, 1), conv_input_length(3, 3, 2, "same")
    (5, 5)
    """
    if output_length is None:
        return None
    padding = _pad_amount(pad, filter_size)
    return (output_length - 1) * stride - 2 * padding + filter_size


def _pad_amount(pad: int | str, filter_size: int) -> int:
    """Zero padding on each side for one axis's ``pad`` (an int or a mode name)."""
    if pad == "valid":
        return 0
    if pad == "full":
        return filter_size - 1
    if pad == "same":
        return filter_size // 2
    if not isinstance(pad, int_types):
        raise ValueError(f"Invalid pad: {pad}")
    return pad


def _pad_amounts(pad: tuple | str, filter_size: tuple[int, ...]) -> tuple[int, ...]:
    """:func:`_pad_amount` for every axis of a layer's ``pad`` (a mode or a tuple)."""
    pads = pad if isinstance(pad, tuple) else (pad,) * len(filter_size)
    return tuple(_pad_amount(p, k) for p, k in zip(pads, filter_size, strict=True))


class BaseConvLayer(Layer):
    """Shared logic of the ``n``-dimensional convolution layers (``lasagne.layers.BaseConvLayer``).

    Subclasses define :meth:`convolve`.  Parameters are those of :class:`Conv2DLayer`,
    with ``n`` values per tuple and ``n`` the number of spatial dimensions (inferred
    from the input shape when None).

    Raises
    ------
    ValueError
        If the input does not have ``n + 2`` dimensions, or ``num_groups`` does not
        divide the input and output channels.
    TypeError
        If ``pad`` is neither a mode name nor ints.
    NotImplementedError
        For ``pad="same"`` with an even filter size.
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
        num_groups: int = 1,
        n: int | None = None,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        self.nonlinearity = as_nonlinearity(nonlinearity)
        if n is None:
            n = len(self.input_shape) - 2
        elif n != len(self.input_shape) - 2:
            raise ValueError(
                f"Tried to create a {n}D convolution layer with input shape "
                f"{self.input_shape!r}. Expected {n + 2} input dimensions (batchsize, "
                f"channels, {n} spatial dimensions)."
            )
        self.n, self.num_filters, self.flip_filters = n, num_filters, flip_filters
        self.filter_size = as_tuple(filter_size, n, int_types)
        self.stride = as_tuple(stride, n, int_types)
        self.untie_biases = untie_biases
        if pad == "same" and any(k % 2 == 0 for k in self.filter_size):
            raise NotImplementedError("`same` padding requires odd filter size.")
        if pad == "valid":
            self.pad = (0,) * n
        elif pad in ("full", "same"):
            self.pad = pad
        else:
            self.pad = as_tuple(pad, n, int_types)
        channels = self.input_shape[1]
        if num_groups <= 0 or num_filters % num_groups or (channels or 0) % num_groups:
            raise ValueError(
                f"num_groups (here: {num_groups}) must be positive and evenly divide the "
                f"number of input and output channels (here: {channels} and {num_filters})"
            )
        self.num_groups = num_groups
        self.W = self.add_param(W, self.get_W_shape(), name="W")
        self.b = None
        if b is not None:
            b_shape = self._untied_bias_shape() if untie_biases else (num_filters,)
            self.b = self.add_param(b, b_shape, name="b", regularizable=False)

    def _untied_bias_shape(self) -> tuple[int, ...]:
        """One bias per filter and output position: ``(num_filters, *spatial sizes)``."""
        return (self.num_filters, *self.output_shape[2:])

    def get_W_shape(self) -> tuple[int, ...]:  # noqa: N802 (Lasagne's name)
        """Shape of the filters: ``(num_filters, channels / num_groups, *filter_size)``."""
        if self.input_shape[1] is None:
            raise ValueError(f"{type(self).__name__} needs a known number of input channels")
        return (self.num_filters, self.input_shape[1] // self.num_groups, *self.filter_size)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, num_filters, *spatial output sizes)``."""
        pads = self.pad if isinstance(self.pad, tuple) else (self.pad,) * self.n
        spatial = (
            conv_output_length(size, k, s, p)
            for size, k, s, p in zip(
                input_shape[2:], self.filter_size, self.stride, pads, strict=True
            )
        )
        return (input_shape[0], self.num_filters, *spatial)

    def convolve(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The convolution of ``input`` with ``W``, before bias and nonlinearity."""
        raise NotImplementedError(
            "BaseConvLayer does not implement the convolve() method: use a subclass such "
            "as Conv2DLayer."
        )

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``nonlinearity(convolve(input) + b)``."""
        conved = self.convolve(pt.as_tensor_variable(input), **kwargs)
        if self.b is not None:
            spatial = tuple(range(1, self.n + 1)) if self.untie_biases else ("x",) * self.n
            conved = conved + self.b.dimshuffle("x", 0, *spatial)
        return self.nonlinearity(conved)


class _ForwardConvLayer(BaseConvLayer):
    """A convolution layer computing ``convolution(input, W, ...)`` (see the module
    docstring)."""

    def __init__(self, *args, convolution: Callable, **kwargs):
        self.convolution = convolution
        super().__init__(*args, **kwargs)

    def convolve(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``convolution`` of ``input`` with ``W``, called with Lasagne's arguments."""
        border_mode = "half" if self.pad == "same" else self.pad
        # Only grouped convolutions pass num_groups, so that functions without it serve.
        groups = {"num_groups": self.num_groups} if self.num_groups > 1 else {}
        return self.convolution(
            input,
            self.W,
            self.input_shape,
            self.get_W_shape(),
            subsample=self.stride,
            border_mode=border_mode,
            filter_flip=self.flip_filters,
            **groups,
        )


class Conv1DLayer(_ForwardConvLayer):
    """1-D convolution of a ``(batch, channels, length)`` input, then bias and nonlinearity.

    Parameters are those of :class:`Conv2DLayer` with single ints; ``convolution``
    defaults to Lasagne's
    :func:`~synkhronos.extensions.lasagne.theano_extensions.conv.conv1d_mc0`.

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
        convolution: Callable = conv1d_mc0,
        num_groups: int = 1,
        **kwargs,
    ):
        super().__init__(
            incoming, num_filters, filter_size, stride, pad, untie_biases, W, b, nonlinearity,
            flip_filters, num_groups, n=1, convolution=convolution, **kwargs,
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
        Function with Theano's ``conv2d`` convention (see the module docstring); default
        Theano's ``conv2d`` (:func:`synkhronos.ops.nnet.conv2d`).
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
            flip_filters, num_groups, n=2, convolution=convolution, **kwargs,
        )  # fmt: skip


class Conv3DLayer(_ForwardConvLayer):
    """3-D convolution of a ``(batch, channels, depth, rows, cols)`` input.

    Parameters are those of :class:`Conv2DLayer` with triples; ``convolution=None``
    (Lasagne's default) means Theano's ``conv3d``
    (:func:`synkhronos.ops.nnet.conv3d`, a sum of 2-D convolutions).

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
            flip_filters, num_groups, n=3, convolution=convolution or conv3d, **kwargs,
        )  # fmt: skip


class _TransposedConvLayer(BaseConvLayer):
    """The transpose of a convolution (the gradient of one with respect to its input).

    ``W`` is ``(channels, num_filters, *filter_size)``, the filters of the convolution
    being transposed. As in Lasagne, ``flip_filters=False`` (the default) transposes a
    convolution that flips its filters, so each input element scatters ``W`` flipped
    into the output; ``flip_filters=True`` scatters ``W`` as it is.
    """

    def __init__(self, incoming, num_filters, filter_size, stride, crop, untie_biases, W, b,
                 nonlinearity, flip_filters, output_size, n, **kwargs):  # fmt: skip
        if output_size is not None and not isinstance(output_size, Variable):
            output_size = as_tuple(output_size, n, int_types)
        self.output_size = output_size
        super().__init__(
            incoming, num_filters, filter_size, stride, crop, untie_biases, W, b, nonlinearity,
            flip_filters, n=n, **kwargs,
        )  # fmt: skip
        self.crop = self.pad
        del self.pad  # Lasagne's attribute here is crop

    def get_W_shape(self) -> tuple[int, ...]:  # noqa: N802
        """``(channels, num_filters, *filter_size)``."""
        return (self.input_shape[1], self.num_filters, *self.filter_size)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, num_filters, *sizes)``: ``output_size`` if given (None for each size
        when it is symbolic), else the smallest sizes the convolution maps to the input's."""
        if self.output_size is not None:
            sizes = (
                (None,) * self.n if isinstance(self.output_size, Variable) else (self.output_size)
            )
            return (input_shape[0], self.num_filters, *sizes)
        # during __init__ (the untied biases' shape) the mode is still in pad
        crop = getattr(self, "crop", getattr(self, "pad", None))
        crops = crop if isinstance(crop, tuple) else (crop,) * self.n
        spatial = (
            conv_input_length(size, k, s, c)
            for size, k, s, c in zip(
                input_shape[2:], self.filter_size, self.stride, crops, strict=True
            )
        )
        return (input_shape[0], self.num_filters, *spatial)

    def convolve(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The gradient, with respect to its input, of the convolution with ``W`` that
        flips its filters unless ``flip_filters``, at ``input``."""
        gradient = AbstractConv2d_gradInputs if self.n == 2 else AbstractConv3d_gradInputs
        op = gradient(
            imshp=self.output_shape,
            kshp=self.get_W_shape(),
            subsample=self.stride,
            border_mode="half" if self.crop == "same" else self.crop,
            filter_flip=not self.flip_filters,
        )
        if isinstance(self.output_size, Variable):
            sizes = self.output_size
        else:
            sizes = [
                conv_input_length(input.shape[2 + i], k, s, c) if size is None else size
                for i, (size, k, s, c) in enumerate(
                    zip(
                        self.output_shape[2:],
                        self.filter_size,
                        self.stride,
                        self.crop if isinstance(self.crop, tuple) else (self.crop,) * self.n,
                        strict=True,
                    )
                )
            ]
        return op(self.W, input, sizes)


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
        False (default) transposes a convolution that flips its filters (each input
        element scatters ``W`` flipped); True scatters ``W`` as it is. This is the
        opposite of :class:`Conv2DLayer`'s flag, as in Lasagne.
    output_size
        Output rows and cols, to choose among the sizes a stride > 1 allows; may be a
        symbolic vector (the output shape's sizes are then None).
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
    """2-D cross-correlation with dilated filters (taps ``dilation`` apart), stride 1.

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
        0 (or ``"valid"``) only, as in Lasagne: pad with a :class:`~.shape.PadLayer`.
    untie_biases, b, nonlinearity
        As for :class:`Conv2DLayer`.
    W
        Initializer for the ``(channels, num_filters, fh, fw)`` filters (Lasagne's
        layout here).
    flip_filters
        False only, as in Lasagne.
    **kwargs
        ``name``.

    Raises
    ------
    NotImplementedError
        For a nonzero ``pad`` or ``flip_filters=True``.

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
        self.dilation = as_tuple(dilation, 2, int_types)
        super().__init__(
            incoming, num_filters, filter_size, 1, pad, untie_biases, W, b, nonlinearity,
            flip_filters, n=2, **kwargs,
        )  # fmt: skip
        del self.stride  # always 1
        if self.pad != (0, 0):
            raise NotImplementedError(
                f"DilatedConv2DLayer requires pad=0 / (0,0) / 'valid', but got {pad!r}. For "
                "a padded dilated convolution, add a PadLayer."
            )
        if self.flip_filters:
            raise NotImplementedError("DilatedConv2DLayer requires flip_filters=False.")

    def get_W_shape(self) -> tuple[int, ...]:  # noqa: N802
        """``(channels, num_filters, fh, fw)``."""
        return (self.input_shape[1], self.num_filters, *self.filter_size)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, num_filters, rows - dilation (fh - 1), ...)``."""
        spatial = (
            conv_output_length(size, (k - 1) * d + 1, 1, 0)
            for size, k, d in zip(input_shape[2:], self.filter_size, self.dilation, strict=True)
        )
        return (input_shape[0], self.num_filters, *spatial)

    def convolve(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """Dilated cross-correlation."""
        return conv.conv2d(input, self.W.dimshuffle(1, 0, 2, 3), 1, 0, self.dilation)
