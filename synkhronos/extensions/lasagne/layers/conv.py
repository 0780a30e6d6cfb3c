"""2-D convolution layer (``lasagne.layers.Conv2DLayer``)."""

from collections.abc import Callable, Sequence

from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.conv import conv2d, conv_output_length
from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import (
    Layer,
    ParamSpec,
    Shape,
    as_nonlinearity,
    as_pair,
)

__all__ = ["Conv2DLayer"]

PadSpec = int | str | Sequence[int]


def _padding(pad: PadSpec, filter_size: tuple[int, int]) -> tuple[int, int]:
    """Symmetric padding per axis for Lasagne's ``pad`` argument."""
    if pad == "valid":
        return 0, 0
    if pad == "full":
        return filter_size[0] - 1, filter_size[1] - 1
    if pad == "same":
        if any(k % 2 == 0 for k in filter_size):
            raise NotImplementedError("pad='same' needs odd filter sizes")
        return filter_size[0] // 2, filter_size[1] // 2
    if isinstance(pad, str):
        raise ValueError(f"pad must be an int, a pair, 'valid', 'full' or 'same', got {pad!r}")
    return as_pair(pad, "pad")


class Conv2DLayer(Layer):
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
    num_groups
        Number of channel groups.
    **kwargs
        ``name``.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: int | Sequence[int],
        stride: int | Sequence[int] = (1, 1),
        pad: PadSpec = 0,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008 (initializers are stateless)
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        flip_filters: bool = True,
        num_groups: int = 1,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        if len(self.input_shape) != 4:
            raise ValueError(f"Conv2DLayer needs a 4-d input, got shape {self.input_shape}")
        channels = self.input_shape[1]
        if channels is None or channels % num_groups or num_filters % num_groups:
            raise ValueError(
                f"{channels} input channels and {num_filters} filters do not fit "
                f"num_groups={num_groups}"
            )
        self.num_filters, self.num_groups = num_filters, num_groups
        self.filter_size = as_pair(filter_size, "filter_size")
        self.stride = as_pair(stride, "stride")
        self.pad = _padding(pad, self.filter_size)
        self.untie_biases, self.flip_filters = untie_biases, flip_filters
        self.nonlinearity = as_nonlinearity(nonlinearity)
        w_shape = (num_filters, channels // num_groups, *self.filter_size)
        self.W = self.add_param(W, w_shape, name="W")
        self.b = None
        if b is not None:
            b_shape = (num_filters, *self.output_shape[2:]) if untie_biases else (num_filters,)
            self.b = self.add_param(b, b_shape, name="b", regularizable=False)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, num_filters, out_rows, out_cols)``."""
        spatial = (
            None if size is None else conv_output_length(size, k, s, p, p)
            for size, k, s, p in zip(
                input_shape[2:], self.filter_size, self.stride, self.pad, strict=True
            )
        )
        return (input_shape[0], self.num_filters, *spatial)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``nonlinearity(conv(input, W) + b)``."""
        filters = self.W[:, :, ::-1, ::-1] if self.flip_filters else self.W
        conved = conv2d(input, filters, self.stride, self.pad, groups=self.num_groups)
        if self.b is not None:
            pattern = ("x", 0, 1, 2) if self.untie_biases else ("x", 0, "x", "x")
            conved = conved + self.b.dimshuffle(*pattern)
        return self.nonlinearity(conved)
