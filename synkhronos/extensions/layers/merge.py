"""Layers combining several inputs (``lasagne.layers.merge``)."""

from collections.abc import Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.layers.base import Layer, MergeLayer, Shape

__all__ = ["ConcatLayer", "ElemwiseSumLayer"]


def _merged_size(sizes: Sequence[int | None], what: str) -> int | None:
    """The common known size of one axis, or None if none is known."""
    known = {s for s in sizes if s is not None}
    if len(known) > 1:
        raise ValueError(f"{what}: mismatched input sizes {sorted(known)}")
    return known.pop() if known else None


class ElemwiseSumLayer(MergeLayer):
    """Weighted elementwise sum ``sum(coeff_i * input_i)`` of same-shaped inputs.

    Parameters
    ----------
    incomings
        Input layers or shapes.
    coeffs
        One coefficient for all inputs, or one per input.
    **kwargs
        ``name``.
    """

    def __init__(
        self,
        incomings: Sequence[Layer | Shape],
        coeffs: float | Sequence[float] = 1,
        **kwargs,
    ):
        super().__init__(incomings, **kwargs)
        if isinstance(coeffs, Sequence):
            if len(coeffs) != len(incomings):
                raise ValueError("ElemwiseSumLayer needs one coefficient per input")
            self.coeffs = list(coeffs)
        else:
            self.coeffs = [coeffs] * len(incomings)

    def get_output_shape_for(self, input_shapes: list[Shape]) -> Shape:
        """The common input shape."""
        if len({len(s) for s in input_shapes}) != 1:
            raise ValueError("ElemwiseSumLayer inputs must have the same number of dimensions")
        return tuple(
            _merged_size(sizes, "ElemwiseSumLayer") for sizes in zip(*input_shapes, strict=True)
        )

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """The weighted sum."""
        terms = [x if c == 1 else c * x for c, x in zip(self.coeffs, inputs, strict=True)]
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total


class ConcatLayer(MergeLayer):
    """Concatenate inputs along one axis.

    Parameters
    ----------
    incomings
        Input layers or shapes, equal off ``axis``.
    axis
        Axis to join along.
    **kwargs
        ``name``.
    """

    def __init__(self, incomings: Sequence[Layer | Shape], axis: int = 1, **kwargs):
        super().__init__(incomings, **kwargs)
        self.axis = axis

    def get_output_shape_for(self, input_shapes: list[Shape]) -> Shape:
        """Input shape with the sizes along ``axis`` summed."""
        ndim = len(input_shapes[0])
        axis = self.axis % ndim
        if any(len(s) != ndim for s in input_shapes):
            raise ValueError("ConcatLayer inputs must have the same number of dimensions")
        shape = []
        for i, sizes in enumerate(zip(*input_shapes, strict=True)):
            if i == axis:
                shape.append(None if None in sizes else sum(sizes))
            else:
                shape.append(_merged_size(sizes, "ConcatLayer"))
        return tuple(shape)

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """The concatenation."""
        return pt.concatenate(inputs, axis=self.axis)
