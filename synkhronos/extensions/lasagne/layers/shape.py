"""Reshaping layers (``lasagne.layers.shape``)."""

import math
from collections.abc import Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.layers.base import Layer, Shape

__all__ = [
    "DimshuffleLayer",
    "FlattenLayer",
    "PadLayer",
    "ReshapeLayer",
    "SliceLayer",
    "dimshuffle",
    "flatten",
    "pad",
    "reshape",
]


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


flatten = FlattenLayer
reshape = ReshapeLayer


class DimshuffleLayer(Layer):
    """Permute axes and insert broadcastable ones, as ``TensorVariable.dimshuffle``.

    Parameters
    ----------
    incoming
        Input layer or shape.
    pattern
        Input axis indices in their new order, with ``"x"`` for a new axis of size 1;
        input axes left out must have size 1 and are dropped.
    **kwargs
        ``name``.

    Examples
    --------
    >>> DimshuffleLayer((None, 3, 1, 5), (0, 3, "x", 1)).output_shape
    (None, 5, 1, 3)
    """

    def __init__(self, incoming: Layer | Shape, pattern: Sequence[int | str], **kwargs):
        super().__init__(incoming, **kwargs)
        axes = [a for a in pattern if a != "x"]
        if len(set(axes)) != len(axes) or any(not 0 <= a < len(self.input_shape) for a in axes):
            raise ValueError(f"invalid pattern {pattern!r} for {len(self.input_shape)} dims")
        dropped = [a for a in range(len(self.input_shape)) if a not in axes]
        if any(self.input_shape[a] not in (1, None) for a in dropped):
            raise ValueError(f"pattern {pattern!r} drops axes of size other than 1")
        self.pattern = tuple(pattern)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The input sizes in ``pattern`` order, 1 for ``"x"``."""
        return tuple(1 if a == "x" else input_shape[a] for a in self.pattern)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``input.dimshuffle(pattern)``."""
        dropped = [a for a in range(input.ndim) if a not in self.pattern]
        if dropped:
            input = pt.specify_broadcastable(input, *dropped)
        return input.dimshuffle(*self.pattern)


dimshuffle = DimshuffleLayer


class PadLayer(Layer):
    """Pad the trailing axes (all but the first ``batch_ndim``) with a constant.

    Parameters
    ----------
    incoming
        Input layer or shape.
    width
        Padding per trailing axis: an int (both sides of every axis), a sequence of ints
        (both sides of each axis) or of ``(before, after)`` pairs.
    val
        Padding value.
    batch_ndim
        Number of leading axes left unpadded.
    **kwargs
        ``name``.

    Examples
    --------
    >>> PadLayer((None, 3, 4, 5), [1, (0, 2)]).output_shape
    (None, 3, 6, 7)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        width: int | Sequence,
        val: float = 0,
        batch_ndim: int = 2,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        trailing = len(self.input_shape) - batch_ndim
        widths = [width] * trailing if isinstance(width, int) else list(width)
        if len(widths) != trailing:
            raise ValueError(f"width {width!r} does not give one entry per padded axis")
        self.width = [(w, w) if isinstance(w, int) else tuple(w) for w in widths]
        self.val, self.batch_ndim = val, batch_ndim

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The trailing sizes plus their padding."""
        padded = (
            None if s is None else s + lo + hi
            for s, (lo, hi) in zip(input_shape[self.batch_ndim :], self.width, strict=True)
        )
        return (*input_shape[: self.batch_ndim], *padded)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The input placed inside a block filled with ``val``."""
        shape = [input.shape[a] for a in range(self.batch_ndim)] + [
            input.shape[self.batch_ndim + i] + lo + hi for i, (lo, hi) in enumerate(self.width)
        ]
        inside = (slice(None),) * self.batch_ndim + tuple(
            slice(lo, shape[self.batch_ndim + i] - hi) for i, (lo, hi) in enumerate(self.width)
        )
        block = pt.full(shape, pt.cast(self.val, input.dtype), dtype=input.dtype)
        return block[inside].set(input)


pad = PadLayer


class SliceLayer(Layer):
    """Index or slice the input along one axis.

    Parameters
    ----------
    incoming
        Input layer or shape.
    indices
        An int (the axis is dropped) or a slice.
    axis
        The axis.
    **kwargs
        ``name``.

    Examples
    --------
    >>> SliceLayer((None, 10, 3), slice(2, None, 3), axis=1).output_shape
    (None, 3, 3)
    """

    def __init__(self, incoming: Layer | Shape, indices: int | slice, axis: int = -1, **kwargs):
        super().__init__(incoming, **kwargs)
        self.indices, self.axis = indices, axis % len(self.input_shape)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The input shape with the axis sliced (or removed for an int)."""
        shape = list(input_shape)
        if isinstance(self.indices, slice):
            size = shape[self.axis]
            shape[self.axis] = None if size is None else len(range(size)[self.indices])
        else:
            del shape[self.axis]
        return tuple(shape)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``input[..., indices, ...]`` at ``axis``."""
        return input[(slice(None),) * self.axis + (self.indices,)]
