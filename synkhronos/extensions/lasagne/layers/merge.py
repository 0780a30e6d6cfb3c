"""Layers combining several inputs (``lasagne.layers.merge``)."""

import functools
import operator
from collections.abc import Callable, Iterable, Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.layers.base import Layer, MergeLayer, Shape

__all__ = [
    "ConcatLayer",
    "ElemwiseMergeLayer",
    "ElemwiseSumLayer",
    "autocrop",
    "autocrop_array_shapes",
    "concat",
]

Cropping = Sequence[str | None] | None
_CROP_MODES = (None, "lower", "upper", "center")


def _check_cropping(cropping: Cropping, ndim: int) -> list[str | None]:
    modes = list(cropping) + [None] * (ndim - len(cropping))
    if len(modes) > ndim:
        raise ValueError(f"cropping has {len(cropping)} entries for inputs of {ndim} dimensions")
    for mode in modes:
        if mode not in _CROP_MODES:
            raise ValueError(f"unknown cropping mode {mode!r}; use one of {_CROP_MODES}")
    return modes


def autocrop(inputs: list[TensorVariable], cropping: Cropping) -> list[TensorVariable]:
    """Crop ``inputs`` to the smallest size along each axis that ``cropping`` names.

    Parameters
    ----------
    inputs
        Tensors with the same number of dimensions.
    cropping
        None (no cropping), or one entry per leading axis: None (leave this axis), "lower"
        (keep the first elements), "upper" (keep the last) or "center" (keep the middle,
        the extra element of an odd difference cut from the end). Axes past the list are
        left alone.

    Examples
    --------
    >>> import numpy as np
    >>> a, b = pt.matrix("a"), pt.matrix("b")
    >>> ca, cb = autocrop([a, b], [None, "center"])
    >>> cb.eval({b: np.arange(10.0).reshape(2, 5), a: np.zeros((2, 3))}).tolist()
    [[1.0, 2.0, 3.0], [6.0, 7.0, 8.0]]
    """
    if cropping is None:
        return list(inputs)
    ndim = inputs[0].ndim
    if any(x.ndim != ndim for x in inputs):
        raise ValueError("autocrop needs inputs with the same number of dimensions")
    slices = [[] for _ in inputs]
    for axis, mode in enumerate(_check_cropping(cropping, ndim)):
        if mode is None:
            for s in slices:
                s.append(slice(None))
            continue
        sizes = [x.shape[axis] for x in inputs]
        smallest = pt.min(pt.stack(sizes))
        for s, size in zip(slices, sizes, strict=True):
            start = {"lower": 0, "upper": size - smallest, "center": (size - smallest) // 2}[mode]
            s.append(slice(start, start + smallest))
    return [x[tuple(s)] for x, s in zip(inputs, slices, strict=True)]


def autocrop_array_shapes(input_shapes: list[Shape], cropping: Cropping) -> list[Shape]:
    """The shapes :func:`autocrop` gives inputs of ``input_shapes`` (None: unknown)."""
    if cropping is None:
        return [tuple(s) for s in input_shapes]
    ndim = len(input_shapes[0])
    if any(len(s) != ndim for s in input_shapes):
        raise ValueError("autocrop needs inputs with the same number of dimensions")
    columns = []
    for mode, sizes in zip(
        _check_cropping(cropping, ndim), zip(*input_shapes, strict=True), strict=True
    ):
        if mode is None:
            columns.append(sizes)
        else:
            smallest = None if None in sizes else min(sizes)
            columns.append((smallest,) * len(sizes))
    return [tuple(shape) for shape in zip(*columns, strict=True)]


def _merged_size(sizes: Sequence[int | None], what: str) -> int | None:
    """The common known size of one axis, or None if none is known."""
    known = {s for s in sizes if s is not None}
    if len(known) > 1:
        raise ValueError(f"{what}: mismatched input sizes {sorted(known)}")
    return known.pop() if known else None


class ElemwiseMergeLayer(MergeLayer):
    """Combine same-shaped inputs elementwise with a binary function, left to right.

    Parameters
    ----------
    incomings
        Input layers or shapes.
    merge_function
        Binary elementwise function, e.g. ``pytensor.tensor.maximum`` or ``mul``.
    cropping
        Crop the inputs to a common shape first (see :func:`autocrop`).
    **kwargs
        ``name``.

    Examples
    --------
    >>> ElemwiseMergeLayer([(None, 3), (None, 3)], pt.maximum).output_shape
    (None, 3)
    """

    def __init__(
        self,
        incomings: Iterable[Layer | Shape],
        merge_function: Callable,
        cropping: Cropping = None,
        **kwargs,
    ):
        super().__init__(incomings, **kwargs)
        self.merge_function, self.cropping = merge_function, cropping

    def get_output_shape_for(self, input_shapes: list[Shape]) -> Shape:
        """The common input shape (after cropping)."""
        if len({len(s) for s in input_shapes}) != 1:
            raise ValueError(f"{type(self).__name__} inputs must have the same number of dims")
        input_shapes = autocrop_array_shapes(input_shapes, self.cropping)
        return tuple(
            _merged_size(sizes, type(self).__name__) for sizes in zip(*input_shapes, strict=True)
        )

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """``merge_function`` folded over the inputs."""
        inputs = autocrop(inputs, self.cropping)
        return functools.reduce(self.merge_function, inputs)


class ElemwiseSumLayer(ElemwiseMergeLayer):
    """Weighted elementwise sum ``sum(coeff_i * input_i)`` of same-shaped inputs.

    Parameters
    ----------
    incomings
        Input layers or shapes.
    coeffs
        One coefficient for all inputs, or one per input.
    cropping
        Crop the inputs to a common shape first (see :func:`autocrop`).
    **kwargs
        ``name``.
    """

    def __init__(
        self,
        incomings: Iterable[Layer | Shape],
        coeffs: float | Sequence[float] = 1,
        cropping: Cropping = None,
        **kwargs,
    ):
        super().__init__(incomings, operator.add, cropping, **kwargs)
        if isinstance(coeffs, Sequence):
            if len(coeffs) != len(self.input_layers):
                raise ValueError("ElemwiseSumLayer needs one coefficient per input")
            self.coeffs = list(coeffs)
        else:
            self.coeffs = [coeffs] * len(self.input_layers)

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """The weighted sum."""
        terms = [x if c == 1 else c * x for c, x in zip(self.coeffs, inputs, strict=True)]
        return super().get_output_for(terms, **kwargs)


class ConcatLayer(MergeLayer):
    """Concatenate inputs along one axis.

    Parameters
    ----------
    incomings
        Input layers or shapes, equal off ``axis``.
    axis
        Axis to join along.
    cropping
        Crop the inputs to a common shape off ``axis`` first (see :func:`autocrop`); the
        entry for ``axis`` itself is ignored.
    **kwargs
        ``name``.
    """

    def __init__(
        self, incomings: Iterable[Layer | Shape], axis: int = 1, cropping: Cropping = None, **kwargs
    ):
        super().__init__(incomings, **kwargs)
        self.axis = axis
        self.cropping = cropping

    def _cropping(self, ndim: int) -> list[str | None] | None:
        """The cropping for inputs of ``ndim`` dimensions, never along ``axis`` (sizes
        there may differ, as in Lasagne)."""
        if self.cropping is None:
            return None
        modes = _check_cropping(self.cropping, ndim)
        modes[self.axis % ndim] = None
        return modes

    def get_output_shape_for(self, input_shapes: list[Shape]) -> Shape:
        """Input shape with the sizes along ``axis`` summed."""
        ndim = len(input_shapes[0])
        axis = self.axis % ndim
        if any(len(s) != ndim for s in input_shapes):
            raise ValueError("ConcatLayer inputs must have the same number of dimensions")
        input_shapes = autocrop_array_shapes(input_shapes, self._cropping(ndim))
        shape = []
        for i, sizes in enumerate(zip(*input_shapes, strict=True)):
            if i == axis:
                shape.append(None if None in sizes else sum(sizes))
            else:
                shape.append(_merged_size(sizes, "ConcatLayer"))
        return tuple(shape)

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """The concatenation."""
        return pt.concatenate(autocrop(inputs, self._cropping(inputs[0].ndim)), axis=self.axis)


concat = ConcatLayer
