"""Layers of ``lasagne.layers.special``: nonlinearity, bias, scale, PReLU/RReLU,
expressions, inverses, and (from :mod:`.transformer`, re-exported) the spatial
transformers ``TransformerLayer`` and ``TPSTransformerLayer``.
"""

from collections.abc import Callable, Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import (
    Layer,
    MergeLayer,
    ParamSpec,
    Shape,
    as_nonlinearity,
)
from synkhronos.extensions.lasagne.layers.noise import layer_streams
from synkhronos.extensions.lasagne.layers.transformer import TPSTransformerLayer, TransformerLayer

__all__ = [
    "BiasLayer",
    "ExpressionLayer",
    "InverseLayer",
    "NonlinearityLayer",
    "ParametricRectifierLayer",
    "RandomizedRectifierLayer",
    "ScaleLayer",
    "TPSTransformerLayer",
    "TransformerLayer",
    "prelu",
    "rrelu",
    "standardize",
]

SharedAxes = str | int | Sequence[int]


def _shared_axes(shared_axes: SharedAxes, ndim: int) -> tuple[int, ...]:
    """Lasagne's ``shared_axes``: ``"auto"`` is every axis but 1, ``"all"`` every axis."""
    if shared_axes == "auto":
        return (0, *range(2, ndim))
    if shared_axes == "all":
        return tuple(range(ndim))
    if isinstance(shared_axes, int | np.integer):
        return (int(shared_axes) % ndim,)
    return tuple(a % ndim for a in shared_axes)


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


class _PerAxisParamLayer(Layer):
    """A layer with one parameter broadcast over ``shared_axes``."""

    def __init__(self, incoming, spec, shared_axes, param_name, regularizable=True, **kwargs):
        super().__init__(incoming, **kwargs)
        self.shared_axes = _shared_axes(shared_axes, len(self.input_shape))
        shape = [s for a, s in enumerate(self.input_shape) if a not in self.shared_axes]
        if None in shape:
            raise ValueError(
                f"{type(self).__name__} needs specified input sizes for all axes "
                f"that its {param_name} is not shared over."
            )
        param = self.add_param(spec, shape, name=param_name, regularizable=regularizable)
        setattr(self, param_name, param)

    def _broadcast(self, param: TensorVariable, ndim: int) -> TensorVariable:
        """``param`` dimshuffled to broadcast against the input."""
        kept = iter(range(param.ndim))
        return param.dimshuffle(
            *("x" if a in self.shared_axes else next(kept) for a in range(ndim))
        )


class BiasLayer(_PerAxisParamLayer):
    """Add a learned bias, shared over ``shared_axes``.

    Parameters
    ----------
    incoming
        Input layer or shape.
    b
        Initializer, or None for no bias (the layer passes its input through).
    shared_axes
        Axes sharing one bias value; ``"auto"`` (every axis but 1: one per channel).
    **kwargs
        ``name``.

    Examples
    --------
    >>> BiasLayer((None, 3, 4, 4)).b.get_value().shape
    (3,)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        b: ParamSpec | None = init.Constant(0),  # noqa: B008 (initializers are stateless)
        shared_axes: SharedAxes = "auto",
        **kwargs,
    ):
        if b is None:
            Layer.__init__(self, incoming, **kwargs)
            self.shared_axes, self.b = _shared_axes(shared_axes, len(self.input_shape)), None
            return
        super().__init__(incoming, b, shared_axes, "b", regularizable=False, **kwargs)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``input + b``."""
        return input if self.b is None else input + self._broadcast(self.b, input.ndim)


class ScaleLayer(_PerAxisParamLayer):
    """Multiply by learned scales, shared over ``shared_axes``.

    Parameters
    ----------
    incoming
        Input layer or shape.
    scales
        Initializer.
    shared_axes
        Axes sharing one scale; ``"auto"`` (every axis but 1: one per channel).
    **kwargs
        ``name``.

    Examples
    --------
    >>> ScaleLayer((None, 3, 4), shared_axes=(0, 1)).scales.get_value().shape
    (4,)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        scales: ParamSpec = init.Constant(1),  # noqa: B008
        shared_axes: SharedAxes = "auto",
        **kwargs,
    ):
        super().__init__(incoming, scales, shared_axes, "scales", **kwargs)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``input * scales``."""
        return input * self._broadcast(self.scales, input.ndim)


def standardize(
    layer: Layer, offset: ParamSpec, scale: ParamSpec, shared_axes: SharedAxes = "auto"
) -> ScaleLayer:
    """Append fixed (untrainable) ``(x - offset) / scale`` to ``layer``.

    Parameters
    ----------
    layer
        The layer to standardize the output of.
    offset, scale
        Arrays of the non-shared sizes.
    shared_axes
        As for :class:`BiasLayer`.

    Returns
    -------
    ScaleLayer
        The last of the two added layers.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import InputLayer, get_all_params
    >>> net = standardize(InputLayer((None, 2)), np.zeros(2), np.ones(2), shared_axes=0)
    >>> get_all_params(net, trainable=True)
    []
    """
    layer = BiasLayer(layer, -np.asarray(offset, dtype=pytensor.config.floatX), shared_axes)
    layer.params[layer.b].discard("trainable")
    layer = ScaleLayer(layer, 1 / np.asarray(scale, dtype=pytensor.config.floatX), shared_axes)
    layer.params[layer.scales].discard("trainable")
    return layer


class ExpressionLayer(Layer):
    """Apply any function of one tensor.

    Parameters
    ----------
    incoming
        Input layer or shape.
    function
        Function of the input expression.
    output_shape
        None (same as the input), a shape, a callable of the input shape, or ``"auto"``
        (evaluate ``function`` on zeros of the input shape; unknown sizes count as 0).
    **kwargs
        ``name``.

    Examples
    --------
    >>> ExpressionLayer((None, 3, 4), lambda x: x.mean(-1), output_shape="auto").output_shape
    (None, 3)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        function: Callable,
        output_shape: Shape | Callable | str | None = None,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        self.function = function
        if output_shape is not None and not callable(output_shape) and output_shape != "auto":
            output_shape = tuple(output_shape)
        self._output_shape = output_shape

    def get_output_shape_for(self, input_shape: Shape) -> Shape:
        """The shape chosen by ``output_shape``."""
        if self._output_shape is None:
            return input_shape
        if callable(self._output_shape):
            return tuple(self._output_shape(input_shape))
        if self._output_shape == "auto":
            zeros = pt.zeros([0 if s is None else s for s in input_shape])
            sizes = self.function(zeros).shape.eval()
            return tuple(int(s) if s else None for s in sizes)
        return self._output_shape

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``function(input)``."""
        return self.function(input)


class InverseLayer(MergeLayer):
    """The gradient of ``layer``'s output with respect to its input, applied to ``incoming``.

    For a linear layer this is its transpose (e.g. a dense layer's ``W.T``; a
    convolution's transposed convolution; a max pool's unpooling), as used in
    autoencoders with tied weights.

    Parameters
    ----------
    incoming
        Layer shaped like ``layer``'s output.
    layer
        The layer to invert.
    **kwargs
        ``name``.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import DenseLayer, InputLayer
    >>> dense = DenseLayer(InputLayer((None, 5)), 3)
    >>> InverseLayer(dense, dense).output_shape
    (None, 5)
    """

    def __init__(self, incoming: Layer, layer: Layer, **kwargs):
        super().__init__([incoming, layer, layer.input_layer], **kwargs)

    def get_output_shape_for(self, input_shapes: list[Shape]) -> Shape:
        """The input shape of the inverted layer."""
        return input_shapes[2]

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """``d layer(x) / d x`` contracted with ``incoming``'s output."""
        input, layer_out, layer_in = inputs
        return pytensor.grad(None, wrt=layer_in, known_grads={layer_out: input})


class ParametricRectifierLayer(_PerAxisParamLayer):
    """Leaky rectifier with learned leakiness ``alpha``: ``max(x, 0) + alpha * min(x, 0)``.

    Parameters
    ----------
    incoming
        Input layer or shape.
    alpha
        Initializer for the slopes of the negative part.
    shared_axes
        Axes sharing one slope; ``"auto"`` (every axis but 1), ``"all"`` or axes.
    **kwargs
        ``name``.

    Examples
    --------
    >>> ParametricRectifierLayer((None, 3, 4, 4)).alpha.get_value()
    array([0.25, 0.25, 0.25])
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        alpha: ParamSpec = init.Constant(0.25),  # noqa: B008
        shared_axes: SharedAxes = "auto",
        **kwargs,
    ):
        super().__init__(incoming, alpha, shared_axes, "alpha", regularizable=False, **kwargs)

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """``max(x, 0) + alpha * min(x, 0)``."""
        alpha = self._broadcast(self.alpha, input.ndim)
        return pt.maximum(input, 0) + alpha * pt.minimum(input, 0)


def _without_nonlinearity(layer: Layer) -> Layer:
    """``layer`` with its own nonlinearity replaced by the identity (if it has one)."""
    if getattr(layer, "nonlinearity", None) is not None:
        layer.nonlinearity = nonlinearities.identity
    return layer


def prelu(layer: Layer, **kwargs) -> ParametricRectifierLayer:
    """Replace ``layer``'s nonlinearity by a :class:`ParametricRectifierLayer` on top.

    Parameters
    ----------
    layer
        Layer whose nonlinearity (if any) becomes the identity.
    **kwargs
        Passed to :class:`ParametricRectifierLayer`.

    Returns
    -------
    ParametricRectifierLayer
        The new top layer.
    """
    return ParametricRectifierLayer(_without_nonlinearity(layer), **kwargs)


class RandomizedRectifierLayer(Layer):
    """Leaky rectifier with random slopes in ``[lower, upper]`` while training.

    At inference (``deterministic=True``) the slope is ``(lower + upper) / 2``.

    Parameters
    ----------
    incoming
        Input layer or shape.
    lower, upper
        Range of the random slopes.
    shared_axes
        Axes sharing one slope; ``"auto"`` (every axis but 1), ``"all"`` or axes.
    **kwargs
        ``name``.

    Examples
    --------
    >>> layer = RandomizedRectifierLayer((1, 2))
    >>> layer.get_output_for(pt.as_tensor([[-1.0, 2.0]]), deterministic=True).eval()
    array([[-0.55,  2.  ]])
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        lower: float = 0.3,
        upper: float = 0.8,
        shared_axes: SharedAxes = "auto",
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        if not isinstance(lower > upper, Variable) and lower > upper:
            raise ValueError(
                "Upper bound for RandomizedRectifierLayer needs to be higher than lower bound."
            )
        self.lower, self.upper = lower, upper
        self.shared_axes = _shared_axes(shared_axes, len(self.input_shape))
        self._srng = layer_streams()

    def get_output_for(
        self, input: TensorVariable, deterministic: bool = False, **kwargs
    ) -> TensorVariable:
        """``max(x, 0) + slope * min(x, 0)``, random slopes unless ``deterministic``.

        Parameters
        ----------
        input
            The input expression.
        deterministic
            If True, use the mean slope.
        **kwargs
            Ignored.

        Returns
        -------
        TensorVariable
            The rectified input.
        """
        if deterministic or self.upper == self.lower:
            slope = pt.constant((self.lower + self.upper) / 2, dtype=input.dtype)
        else:
            shape = [1 if a in self.shared_axes else input.shape[a] for a in range(input.ndim)]
            slope = self._srng.uniform(shape, self.lower, self.upper, dtype=input.dtype)
            slope = pt.specify_broadcastable(slope, *self.shared_axes)
        return pt.maximum(input, 0) + slope * pt.minimum(input, 0)


def rrelu(layer: Layer, **kwargs) -> RandomizedRectifierLayer:
    """Replace ``layer``'s nonlinearity by a :class:`RandomizedRectifierLayer` on top.

    Parameters
    ----------
    layer
        Layer whose nonlinearity (if any) becomes the identity.
    **kwargs
        Passed to :class:`RandomizedRectifierLayer`.

    Returns
    -------
    RandomizedRectifierLayer
        The new top layer.
    """
    return RandomizedRectifierLayer(_without_nonlinearity(layer), **kwargs)
