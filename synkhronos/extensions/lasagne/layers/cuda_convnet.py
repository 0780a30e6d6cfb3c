"""Lasagne's ``lasagne.layers.cuda_convnet`` names, on this port's layers.

cuda-convnet kept tensors in c01b order (channels, rows, cols, batch).  The shuffle
layers convert between the two orders.  :class:`Conv2DCCLayer` and
:class:`MaxPool2DCCLayer` take bc01 inputs (Lasagne's default ``dimshuffle=True``) and
compute what Lasagne's do: cross-correlation, and pooling with ``ignore_border=False``.

Examples
--------
>>> bc01_to_c01b((None, 3, 5, 6)).output_shape
(3, 5, 6, None)
"""

from collections.abc import Callable, Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import Layer, ParamSpec, Shape, as_nonlinearity
from synkhronos.extensions.lasagne.layers.dnn import Conv2DDNNLayer
from synkhronos.extensions.lasagne.layers.pool import MaxPool2DLayer
from synkhronos.extensions.lasagne.layers.shape import DimshuffleLayer

__all__ = [
    "Conv2DCCLayer",
    "MaxPool2DCCLayer",
    "NINLayer_c01b",
    "ShuffleBC01ToC01BLayer",
    "ShuffleC01BToBC01Layer",
    "bc01_to_c01b",
    "c01b_to_bc01",
]


def _bc01_only(dimshuffle: bool, name: str) -> None:
    if not dimshuffle:
        raise ValueError(f"{name} here takes bc01 inputs only (dimshuffle=True)")


class Conv2DCCLayer(Conv2DDNNLayer):
    """cuda-convnet's convolution layer name, for bc01 inputs.

    Parameters are Lasagne's; ``W=None`` means Glorot-uniform filters, ``dimshuffle``
    must be True, ``partial_sum`` (a cuda-convnet tuning knob) is ignored.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: int | Sequence[int],
        stride: int | Sequence[int] = (1, 1),
        pad: int | str | Sequence[int] = 0,
        untie_biases: bool = False,
        W: ParamSpec | None = None,
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008 (initializers are stateless)
        nonlinearity: Callable | None = nonlinearities.rectify,
        dimshuffle: bool = True,
        flip_filters: bool = False,
        partial_sum: int = 1,
        **kwargs,
    ):
        _bc01_only(dimshuffle, "Conv2DCCLayer")
        super().__init__(
            incoming, num_filters, filter_size, stride, pad, untie_biases,
            init.GlorotUniform() if W is None else W, b, nonlinearity, flip_filters, **kwargs,
        )  # fmt: skip


class MaxPool2DCCLayer(MaxPool2DLayer):
    """cuda-convnet's max-pooling layer name, for bc01 inputs (``dimshuffle=True``).

    Parameters
    ----------
    incoming
        Input layer or shape.
    pool_size
        Window size.
    stride
        Step between windows; None means ``pool_size``.
    ignore_border
        Lasagne's default here is False (partial windows kept).
    dimshuffle
        Must be True.
    **kwargs
        ``name``.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        ignore_border: bool = False,
        dimshuffle: bool = True,
        **kwargs,
    ):
        _bc01_only(dimshuffle, "MaxPool2DCCLayer")
        super().__init__(incoming, pool_size, stride, 0, ignore_border, **kwargs)


class NINLayer_c01b(Layer):  # noqa: N801 (Lasagne's name)
    """Network-in-network (a 1x1 convolution) on c01b input: channels first, batch last.

    Parameters
    ----------
    incoming
        Input layer or shape ``(channels, rows, columns, batch)``.
    num_units
        Number of output channels.
    untie_biases
        If True, one bias per unit *and position* ``(num_units, rows, columns)``.
    W
        Initializer for the ``(num_units, channels)`` weights (the transpose of
        :class:`~synkhronos.extensions.lasagne.layers.NINLayer`'s, as in Lasagne).
    b
        Initializer for the biases, or None for no biases.
    nonlinearity
        Activation; None means linear.
    **kwargs
        ``name``.

    Examples
    --------
    >>> NINLayer_c01b((3, 4, 5, None), 6).output_shape
    (6, 4, 5, None)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_units: int,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008 (initializers are stateless)
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        self.nonlinearity = as_nonlinearity(nonlinearity)
        self.num_units, self.untie_biases = num_units, untie_biases
        channels = self.input_shape[0]
        if channels is None:
            raise ValueError("NINLayer_c01b needs a known number of input channels")
        self.W = self.add_param(W, (num_units, channels), name="W")
        self.b = None
        if b is not None:
            b_shape = (num_units, *self.input_shape[1:-1]) if untie_biases else (num_units,)
            self.b = self.add_param(b, b_shape, name="b", regularizable=False)

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """``(num_units, rows, columns, batch)``."""
        return (self.num_units, *input_shape[1:])

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``nonlinearity(W input + b)`` at every position."""
        out = pt.tensordot(self.W, input, axes=[[1], [0]])
        if self.b is not None:
            # The batch axis (last) is broadcast; tied biases also over rows and columns.
            kept = self.b.ndim if self.untie_biases else 1
            pattern = (*range(kept), *("x" for _ in range(input.ndim - kept)))
            out = out + self.b.dimshuffle(*pattern)
        return self.nonlinearity(out)


class ShuffleBC01ToC01BLayer(DimshuffleLayer):
    """Reorder a bc01 tensor to c01b.

    Parameters
    ----------
    incoming
        Input layer or shape.
    **kwargs
        ``name``.
    """

    def __init__(self, incoming: Layer | Shape, **kwargs):
        super().__init__(incoming, (1, 2, 3, 0), **kwargs)


class ShuffleC01BToBC01Layer(DimshuffleLayer):
    """Reorder a c01b tensor to bc01.

    Parameters
    ----------
    incoming
        Input layer or shape.
    **kwargs
        ``name``.
    """

    def __init__(self, incoming: Layer | Shape, **kwargs):
        super().__init__(incoming, (3, 0, 1, 2), **kwargs)


bc01_to_c01b = ShuffleBC01ToC01BLayer
c01b_to_bc01 = ShuffleC01BToBC01Layer
