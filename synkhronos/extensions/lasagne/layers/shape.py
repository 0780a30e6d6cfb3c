"""Reshaping layers (``lasagne.layers.shape``)."""

import math
from collections.abc import Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.layers.base import Layer, Shape

__all__ = ["FlattenLayer", "ReshapeLayer"]


class FlattenLayer(Layer):
    """Flatten trailing axes so that the output has ``outdim`` dimensions.

    Parameters
    ----------
    incoming
        Input layer or shape.
    outdim
        Number of output dimensions; the last one collects all remaining axes.
    **kwargs
        ``name``.
    """

    def __init__(self, incoming: Layer | Shape, outdim: int = 2, **kwargs):
        super().__init__(incoming, **kwargs)
        if outdim < 1:
            raise ValueError("outdim must be at least 1")
        self.outdim = outdim

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """Leading ``outdim - 1`` sizes, then the product of the rest."""
        rest = input_shape[self.outdim - 1 :]
        flat = None if None in rest else math.prod(rest)
        return (*input_shape[: self.outdim - 1], flat)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The flattened input."""
        return pt.flatten(input, self.outdim)


class ReshapeLayer(Layer):
    """Reshape to ``shape``, whose entries are sizes, ``-1`` or ``[i]`` (input axis i's size).

    Parameters
    ----------
    incoming
        Input layer or shape.
    shape
        Target shape: ints, at most one ``-1`` (inferred), and one-element lists
        ``[i]`` meaning "the size of input axis i" (useful for the batch axis).
    **kwargs
        ``name``.
    """

    def __init__(self, incoming: Layer | Shape, shape: Sequence[int | list[int]], **kwargs):
        super().__init__(incoming, **kwargs)
        for s in shape:
            if isinstance(s, list):
                if (
                    len(s) != 1
                    or not isinstance(s[0], int)
                    or not 0 <= s[0] < len(self.input_shape)
                ):
                    raise ValueError(f"[i] entries must name an input axis, got {s}")
            elif not isinstance(s, int) or s < -1:
                raise ValueError(f"shape entries must be ints >= -1 or [i], got {s!r}")
        if list(shape).count(-1) > 1:
            raise ValueError("shape may contain at most one -1")
        self.shape = tuple(shape)
        self.get_output_shape_for(self.input_shape)  # fail early on incompatible sizes

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The target shape with references resolved and ``-1`` inferred when possible."""
        shape = [input_shape[s[0]] if isinstance(s, list) else s for s in self.shape]
        # A size copied from input axis i cancels that axis in the size balance, so -1
        # can be inferred even when such sizes (typically the batch) are unknown.
        cancelled, out_sizes = set(), []
        for spec, size in zip(self.shape, shape, strict=True):
            if isinstance(spec, list) and spec[0] not in cancelled:
                cancelled.add(spec[0])
            elif size != -1:
                out_sizes.append(size)
        in_sizes = [size for axis, size in enumerate(input_shape) if axis not in cancelled]
        known_in = None if None in in_sizes else math.prod(in_sizes)
        known_out = None if None in out_sizes else math.prod(out_sizes)
        if -1 in shape:
            inferred = None
            if known_in is not None and known_out:
                if known_in % known_out:
                    raise ValueError(f"cannot reshape {input_shape} to {self.shape}")
                inferred = known_in // known_out
            shape[shape.index(-1)] = inferred
        elif None not in (known_in, known_out) and known_in != known_out:
            raise ValueError(f"cannot reshape {input_shape} to {self.shape}")
        return tuple(shape)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The reshaped input."""
        shape = [input.shape[s[0]] if isinstance(s, list) else s for s in self.shape]
        return pt.reshape(input, shape, ndim=len(shape))
