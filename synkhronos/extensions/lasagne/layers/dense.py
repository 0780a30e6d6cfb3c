"""Fully connected and elementwise nonlinearity layers (``lasagne.layers.dense``)."""

from collections.abc import Callable

import numpy as np
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import Layer, ParamSpec, Shape, as_nonlinearity

__all__ = ["DenseLayer", "NonlinearityLayer"]


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
        if num_leading_axes < 0:
            num_leading_axes += ndim
        if not 0 <= num_leading_axes < ndim:
            raise ValueError(f"num_leading_axes={num_leading_axes} is invalid for {ndim} dims")
        self.num_leading_axes = num_leading_axes
        trailing = self.input_shape[num_leading_axes:]
        if any(d is None for d in trailing):
            raise ValueError(f"DenseLayer needs known trailing input sizes, got {trailing}")
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
        if input.ndim > self.num_leading_axes + 1:
            input = pt.flatten(input, self.num_leading_axes + 1)
        activation = pt.dot(input, self.W)
        if self.b is not None:
            activation = activation + self.b
        return self.nonlinearity(activation)


class NonlinearityLayer(Layer):
    """Apply an elementwise nonlinearity.

    Parameters
    ----------
    incoming
        Input layer or shape.
    nonlinearity
        Activation; None means linear.
    **kwargs
        ``name``.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        nonlinearity: Callable | None = nonlinearities.rectify,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        self.nonlinearity = as_nonlinearity(nonlinearity)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``nonlinearity(input)``."""
        return self.nonlinearity(input)
