"""Embedding layer (``lasagne.layers.embedding``)."""

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init
from synkhronos.extensions.lasagne.layers.base import Layer, ParamSpec, Shape
from synkhronos.ops.conv import FoldLeading, UnfoldLeading

__all__ = ["EmbeddingLayer"]


class EmbeddingLayer(Layer):
    """Look up a learned vector for each integer index of the input.

    Parameters
    ----------
    incoming
        Input layer or shape; its values are integer indices in ``[0, input_size)``.
    input_size
        Number of distinct indices (rows of ``W``).
    output_size
        Length of each vector.
    W
        Initializer for the ``(input_size, output_size)`` table.
    **kwargs
        ``name``.

    Examples
    --------
    >>> EmbeddingLayer((None, 7), input_size=10, output_size=4).output_shape
    (None, 7, 4)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        input_size: int,
        output_size: int,
        W: ParamSpec = init.Normal(),  # noqa: B008 (initializers are stateless)
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        self.input_size, self.output_size = input_size, output_size
        self.W = self.add_param(W, (input_size, output_size), name="W")

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The input shape plus ``output_size``."""
        return (*input_shape, self.output_size)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``W[input]``."""
        index = pt.cast(input, "int64")
        if index.ndim < 2:
            return self.W[index]
        # Rows for the flattened indices, unfolded to the indices' shape: PyTensor's own
        # rewrite of W[index] reshapes with a computed target, which JAX cannot trace.
        return UnfoldLeading(index.ndim)(self.W[FoldLeading(index.ndim)(index)], index)
