"""Reshaping layers (``lasagne.layers.shape``)."""

import math
from collections.abc import Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.layers.base import Layer, Shape
from synkhronos.extensions.lasagne.theano_extensions import padding
from synkhronos.extensions.lasagne.theano_extensions.padding import pad_widths
from synkhronos.extensions.lasagne.utils import int_types

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
    """Reshape to ``shape``, whose entries are sizes, ``-1``, ``[i]`` (input axis i's
    size) or symbolic scalars.

    Parameters
    ----------
    incoming
        Input layer or shape.
    shape
        Target shape: positive ints, at most one ``-1`` (inferred), one-element lists
        ``[i]`` meaning "the size of input axis i" (useful for the batch axis), and
        scalar expressions (their sizes are unknown in ``output_shape``).
    **kwargs
        ``name``.

    Raises
    ------
    ValueError
        For an invalid entry, or a total size that cannot match the input's.

    Examples
    --------
    >>> ReshapeLayer((None, 3, 4), ([0], -1)).output_shape
    (None, 12)
    """

    def __init__(self, incoming: Layer | Shape, shape: Sequence, **kwargs):
        super().__init__(incoming, **kwargs)
        shape = tuple(shape)
        for s in shape:
            if isinstance(s, list):
                if len(s) != 1 or not isinstance(s[0], int_types) or s[0] < 0:
                    raise ValueError(
                        "`shape` input references must be single-element lists of int >= 0"
                    )
            elif isinstance(s, TensorVariable):
                if s.ndim != 0:
                    raise ValueError(
                        "A symbolic variable in a shape specification must be a "
                        f"scalar, but had {s.ndim} dimensions"
                    )
            elif not isinstance(s, int_types):
                raise ValueError("`shape` must be a tuple of int and/or [int]")
            elif s == 0 or s < -1:
                raise ValueError("`shape` integers must be positive or -1")
        if sum(isinstance(s, int_types) and s == -1 for s in shape) > 1:
            raise ValueError("`shape` cannot contain multiple -1")
        self.shape = shape
        self.get_output_shape_for(self.input_shape)  # fail early on incompatible sizes

    def get_output_shape_for(self, input_shape: Shape, **kwargs) -> Shape:
        """The target shape with references resolved and ``-1`` inferred when possible
        (symbolic sizes, in ``input_shape`` or the specification, count as unknown)."""
        input_shape = [None if isinstance(s, TensorVariable) else s for s in input_shape]
        out = []
        in_sizes, out_sizes = list(input_shape), []
        copied: set[int] = set()
        for spec in self.shape:
            if isinstance(spec, list):
                axis = spec[0]
                if axis >= len(input_shape):
                    raise ValueError(
                        f"specification contains [{axis}], but input shape has "
                        f"{len(input_shape)} dimensions only"
                    )
                size = input_shape[axis]
                out.append(size)
                if size is None and axis not in copied:
                    # an unknown size copied once matches its input axis one to one, so
                    # both drop out of the balance that infers -1
                    copied.add(axis)
                    in_sizes[axis] = 1
                    size = 1
                out_sizes.append(size)
            elif isinstance(spec, TensorVariable):
                out.append(None)
                out_sizes.append(None)
            else:
                out.append(spec)
                if spec != -1:
                    out_sizes.append(spec)
        known_in = None if None in in_sizes else math.prod(in_sizes)
        known_out = None if None in out_sizes else math.prod(out_sizes)
        if -1 in (s for s in out if isinstance(s, int_types)):
            inferred = None if None in (known_in, known_out) else known_in // known_out
            out[[isinstance(s, int_types) and s == -1 for s in out].index(True)] = inferred
            known_out = None if inferred is None else known_out * inferred
        if None not in (known_in, known_out) and known_in != known_out:
            raise ValueError(
                f"{input_shape} cannot be reshaped to specification {self.shape}. "
                "The total size mismatches."
            )
        return tuple(out)

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
        used: set[int] = set()
        for p in pattern:
            if isinstance(p, int_types):
                if p in used:
                    raise ValueError(f"pattern contains dimension {p} more than once")
                used.add(p)
            elif p != "x":
                raise ValueError(f"pattern should only contain dimension indices or 'x', not {p}")
        self.pattern = pattern
        self.get_output_shape_for(self.input_shape)  # fail early on a bad pattern

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The input sizes in ``pattern`` order, 1 for ``"x"``.

        Raises
        ------
        ValueError
            If the pattern names a missing axis or drops one whose size is not 1 or None.
        """
        for p in self.pattern:
            if p != "x" and not 0 <= p < len(input_shape):
                raise ValueError(
                    f"pattern contains {p}, but input shape has {len(input_shape)} dimensions only"
                )
        for axis, size in enumerate(input_shape):
            if axis not in self.pattern and size not in (1, None):
                raise ValueError(
                    f"pattern attempted to collapse dimension {axis} of size "
                    f"{size}; dimensions with size != 1/None are not "
                    "broadcastable and cannot be collapsed"
                )
        return tuple(1 if p == "x" else input_shape[p] for p in self.pattern)

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
        An int (both sides of every trailing axis), or an iterable with one entry per
        axis from ``batch_ndim`` on: an int (both sides) or a ``(before, after)`` pair.
        See :func:`~synkhronos.extensions.lasagne.theano_extensions.padding.pad`.
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
        self.width, self.val, self.batch_ndim = width, val, batch_ndim

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The padded sizes (None stays None)."""
        shape = list(input_shape)
        widths = pad_widths(self.width, len(input_shape) - self.batch_ndim)
        for k, (lo, hi) in enumerate(widths, start=self.batch_ndim):
            if shape[k] is not None:
                shape[k] += lo + hi
        return tuple(shape)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The input placed inside a block filled with ``val``."""
        return padding.pad(input, self.width, self.val, self.batch_ndim)


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
