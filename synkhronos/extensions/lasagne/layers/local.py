"""Locally connected layer (``lasagne.layers.local``): a convolution with unshared weights."""

from collections.abc import Callable, Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import Layer, ParamSpec, Shape
from synkhronos.extensions.lasagne.layers.conv import BaseConvLayer, _pad_amounts

__all__ = ["LocallyConnected2DLayer"]


class LocallyConnected2DLayer(BaseConvLayer):
    """2-D "convolution" whose filters differ at every output position.

    Parameters
    ----------
    incoming
        Input layer or shape ``(batch, channels, rows, cols)``, all but the batch known.
    num_filters
        Number of output channels (equal to the input channels if ``channelwise``).
    filter_size
        Odd filter height and width.
    stride
        Must be 1 (as in Lasagne).
    pad
        Must be ``"same"`` (as in Lasagne); the filter sizes must be odd.
    untie_biases, b, nonlinearity, flip_filters
        As for :class:`~.conv.Conv2DLayer`.
    W
        Initializer for the ``(num_filters, channels, fh, fw, rows, cols)`` weights, or
        ``(num_filters, fh, fw, rows, cols)`` if ``channelwise``.
    channelwise
        If True, output channel ``k`` sees input channel ``k`` only.
    **kwargs
        ``name``.

    Examples
    --------
    >>> LocallyConnected2DLayer((None, 2, 4, 5), 3, 3).W.get_value().shape
    (3, 2, 3, 3, 4, 5)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: int | Sequence[int],
        stride: int | Sequence[int] = (1, 1),
        pad: str = "same",
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008 (initializers are stateless)
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        flip_filters: bool = True,
        channelwise: bool = False,
        **kwargs,
    ):
        self.channelwise = channelwise
        super().__init__(
            incoming, num_filters, filter_size, stride, pad, untie_biases, W, b, nonlinearity,
            flip_filters, n=2, **kwargs,
        )  # fmt: skip
        if self.stride != (1, 1):
            raise NotImplementedError(
                f"LocallyConnected2DLayer requires stride=1 / (1, 1), but got {stride!r}."
            )
        if self.pad != "same":
            raise NotImplementedError(
                f"LocallyConnected2DLayer requires pad='same', but got {pad!r}."
            )

    def get_W_shape(self) -> tuple[int, ...]:  # noqa: N802 (Lasagne's name)
        """``(num_filters, [channels,] fh, fw, rows, cols)``."""
        if None in self.input_shape[1:]:
            raise ValueError(
                "A LocallyConnected2DLayer requires a fixed input shape (except for the "
                f"batch size). Got {self.input_shape!r}."
            )
        channels, rows, cols = self.input_shape[1:]
        if self.channelwise:
            if self.num_filters != channels:
                raise ValueError(
                    "num_filters and the number of input channels should match when "
                    f"channelwise is true, but got num_filters={self.num_filters!r} and "
                    f"{channels} input channels"
                )
            return (self.num_filters, *self.filter_size, rows, cols)
        return (self.num_filters, channels, *self.filter_size, rows, cols)

    def convolve(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """Sum over taps of the shifted input times that tap's per-position weights."""
        (fh, fw), (ph, pw) = self.filter_size, _pad_amounts(self.pad, self.filter_size)
        rows, cols = self.input_shape[2:]
        n, c = input.shape[0], input.shape[1]
        padded = pt.zeros((n, c, rows + 2 * ph, cols + 2 * pw), dtype=input.dtype)
        padded = padded[:, :, ph : ph + rows, pw : pw + cols].set(input)
        weights = self.W
        if self.flip_filters:
            # The tap axes sit just before the two position axes.
            weights = weights[(slice(None),) * (weights.ndim - 4) + (slice(None, None, -1),) * 2]
        total = 0
        for a in range(fh):
            for b in range(fw):
                window = padded[:, :, a : a + rows, b : b + cols]
                if self.channelwise:
                    total = total + window * weights[None, :, a, b]
                else:
                    total = total + (window[:, None] * weights[None, :, :, a, b]).sum(axis=2)
        return total
