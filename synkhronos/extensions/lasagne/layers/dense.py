"""Fully connected layers (``lasagne.layers.dense``)."""

from collections.abc import Callable

import numpy as np
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import Layer, ParamSpec, Shape, as_nonlinearity

__all__ = ["DenseLayer", "NINLayer"]


class DenseLayer(Layer):
    """Fully connected layer ``nonlinearity(input @ W + b)``.

    Parameters
    ----------
    incoming
        Input layer or shape.
    num_units
        Number of output units.
    W
        Initializer (or array / shared variable) for the ``(num_inputs, num_units)``
        weights.
    b
        Initializer for the ``(num_units,)`` biases, or None for no biases.
    nonlinearity
        Activation; None means linear.
    num_leading_axes
        Number of leading axes kept (the rest are flattened into the inputs); negative
        values count from the end.
    **kwargs
        ``name``.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_units: int,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008 (initializers are stateless)
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        num_leading_axes: int = 1,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        self.nonlinearity = as_nonlinearity(nonlinearity)
        self.num_units = num_units
        ndim = len(self.input_shape)
        if num_leading_axes >= ndim:
            raise ValueError(
                f"Got num_leading_axes={num_leading_axes} for a {ndim}-dimensional input, "
                "leaving no trailing axes for the dot product."
            )
        if num_leading_axes < -ndim:
            raise ValueError(
                f"Got num_leading_axes={num_leading_axes} for a {ndim}-dimensional input, "
                "requesting more trailing axes than there are input dimensions."
            )
        self.num_leading_axes = num_leading_axes
        trailing = self.input_shape[num_leading_axes:]
        if any(d is None for d in trailing):
            raise ValueError(
                "A DenseLayer requires a fixed input shape (except for the leading axes). "
                f"Got {self.input_shape!r} for num_leading_axes={num_leading_axes}."
            )
        num_inputs = int(np.prod(trailing))
        self.W = self.add_param(W, (num_inputs, num_units), name="W")
        self.b = None
        if b is not None:
            self.b = self.add_param(b, (num_units,), name="b", regularizable=False)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """Leading axes followed by ``num_units``."""
        return (*input_shape[: self.num_leading_axes], self.num_units)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``nonlinearity(flatten(input) @ W + b)``."""
        input = pt.as_tensor_variable(input)
        leading = self.num_leading_axes % input.ndim
        if input.ndim > leading + 1:
            input = pt.flatten(input, leading + 1)
        # matmul, not dot: PyTensor folds its leading axes with a -1 and unfolds them
        # with the input's own sizes, which JAX can trace; dot's fold computes them.
        activation = pt.matmul(input, self.W)
        if self.b is not None:
            activation = activation + self.b
        return self.nonlinearity(activation)


class NINLayer(Layer):
    """Network-in-network: a dense layer applied at every position (a 1x1 convolution).

    Parameters
    ----------
    incoming
        Input layer or shape ``(batch, channels, ...)``.
    num_units
        Number of output channels.
    untie_biases
        If True, one bias per unit *and position*; else one per unit.
    W
        Initializer for the ``(channels, num_units)`` weights.
    b
        Initializer for the biases, or None for no biases.
    nonlinearity
        Activation; None means linear.
    **kwargs
        ``name``.

    Examples
    --------
    >>> NINLayer((None, 3, 4, 5), 6).output_shape
    (None, 6, 4, 5)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_units: int,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        self.nonlinearity = as_nonlinearity(nonlinearity)
        self.num_units, self.untie_biases = num_units, untie_biases
        channels = self.input_shape[1]
        if channels is None:
            raise ValueError("NINLayer needs a known number of input channels")
        self.W = self.add_param(W, (channels, num_units), name="W")
        self.b = None
        if b is not None:
            b_shape = (num_units, *self.input_shape[2:]) if untie_biases else (num_units,)
            self.b = self.add_param(b, b_shape, name="b", regularizable=False)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(batch, num_units, ...)``."""
        return (input_shape[0], self.num_units, *input_shape[2:])

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``nonlinearity(W^T input + b)`` at every position."""
        spatial = tuple(range(2, input.ndim))
        channels_last = input.dimshuffle(0, *range(2, input.ndim), 1)
        out = pt.matmul(channels_last, self.W).dimshuffle(
            0, input.ndim - 1, *range(1, input.ndim - 1)
        )
        if self.b is not None:
            pattern = (
                ("x", *range(self.b.ndim))
                if self.untie_biases
                else ("x", 0, *("x" for _ in spatial))
            )
            out = out + self.b.dimshuffle(*pattern)
        return self.nonlinearity(out)
