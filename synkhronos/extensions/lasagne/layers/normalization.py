"""Normalization layers (``lasagne.layers.normalization``): batch, instance, layer, LRN."""

from collections.abc import Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import Layer, ParamSpec, Shape
from synkhronos.extensions.lasagne.layers.special import BiasLayer, NonlinearityLayer, ScaleLayer
from synkhronos.extensions.lasagne.utils import int_types
from synkhronos.ops.random_streams import add_default_update

__all__ = [
    "BatchNormLayer",
    "LocalResponseNormalization2DLayer",
    "StandardizationLayer",
    "batch_norm",
    "instance_norm",
    "layer_norm",
]


class BatchNormLayer(Layer):
    """Batch normalization: ``(x - mean) * inv_std * gamma + beta``.

    In training (``deterministic=False``) the statistics are those of the batch, and
    each compiled function that computes this output also moves the running
    averages ``mean`` and ``inv_std`` towards them, ``avg = (1 - alpha) * avg + alpha *
    batch``, through a default update on (a clone of) their shared variables.  With
    ``deterministic=True`` the running averages are used and left unchanged.

    Parameters
    ----------
    incoming
        Input layer or shape.
    axes
        Axes to normalize over; ``"auto"`` means all but the second (channel) axis.
    epsilon
        Added to the variance for numerical stability.
    alpha
        Weight of the current batch in the running averages.
    beta, gamma
        Initializers of the shift (trainable) and scale (trainable, regularizable), or
        None to leave them out.
    mean, inv_std
        Initializers of the running mean and inverse standard deviation (tagged
        ``batch_norm_stat``, not trainable).
    **kwargs
        ``name``.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        axes: str | int | Sequence[int] = "auto",
        epsilon: float = 1e-4,
        alpha: float = 0.1,
        beta: ParamSpec | None = init.Constant(0),  # noqa: B008 (initializers are stateless)
        gamma: ParamSpec | None = init.Constant(1),  # noqa: B008
        mean: ParamSpec = init.Constant(0),  # noqa: B008
        inv_std: ParamSpec = init.Constant(1),  # noqa: B008
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        ndim = len(self.input_shape)
        if axes == "auto":
            axes = (0, *range(2, ndim))
        self.axes = (axes,) if isinstance(axes, int_types) else tuple(axes)
        self.epsilon, self.alpha = epsilon, alpha
        shape = [size for axis, size in enumerate(self.input_shape) if axis not in self.axes]
        if any(size is None for size in shape):
            raise ValueError(
                "BatchNormLayer needs specified input sizes for all axes not normalized over."
            )
        stats = {"trainable": False, "regularizable": False, "batch_norm_stat": True}
        self.beta = (
            None if beta is None else self.add_param(beta, shape, "beta", regularizable=False)
        )
        self.gamma = None if gamma is None else self.add_param(gamma, shape, "gamma")
        self.mean = self.add_param(mean, shape, "mean", **stats)
        self.inv_std = self.add_param(inv_std, shape, "inv_std", **stats)

    def get_output_for(
        self,
        input: TensorVariable,
        deterministic: bool = False,
        batch_norm_use_averages: bool | None = None,
        batch_norm_update_averages: bool | None = None,
        **kwargs,
    ) -> TensorVariable:
        """Normalized input.

        Parameters
        ----------
        input
            The input expression.
        deterministic
            Default for both options below: use, and do not update, the averages.
        batch_norm_use_averages
            Normalize with the running averages instead of the batch statistics.
        batch_norm_update_averages
            Attach the running-average updates to this output.
        **kwargs
            Ignored.

        Returns
        -------
        TensorVariable
            The normalized, scaled and shifted input.
        """
        use_averages = deterministic if batch_norm_use_averages is None else batch_norm_use_averages
        update_averages = (
            not deterministic if batch_norm_update_averages is None else batch_norm_update_averages
        )
        batch_mean = input.mean(axis=self.axes)
        batch_inv_std = pt.reciprocal(pt.sqrt(input.var(axis=self.axes) + self.epsilon))
        if use_averages:
            mean, inv_std = self.mean, self.inv_std
        else:
            mean, inv_std = batch_mean, batch_inv_std
        if update_averages:
            # Clones share the storage but carry the default update, so only functions
            # using this (training) output update the averages; "+ 0 * clone" puts the
            # clone in the graph and is rewritten away when compiling.
            running_mean, running_inv_std = self.mean.clone(), self.inv_std.clone()
            keep = 1 - self.alpha
            add_default_update(running_mean, keep * running_mean + self.alpha * batch_mean)
            add_default_update(running_inv_std, keep * running_inv_std + self.alpha * batch_inv_std)
            mean = mean + 0 * running_mean
            inv_std = inv_std + 0 * running_inv_std
        pattern = []
        param_axis = iter(range(input.ndim - len(self.axes)))
        for axis in range(input.ndim):
            pattern.append("x" if axis in self.axes else next(param_axis))
        scale = inv_std if self.gamma is None else inv_std * self.gamma
        shift = -mean * scale if self.beta is None else self.beta - mean * scale
        return input * scale.dimshuffle(pattern) + shift.dimshuffle(pattern)


def _normalized(layer: Layer, suffix: str, name: str | None, stack) -> Layer:
    """``layer`` without bias and nonlinearity, ``stack(layer, name)`` on top, then the
    nonlinearity in a :class:`NonlinearityLayer` (the shared recipe of ``batch_norm``,
    ``instance_norm`` and ``layer_norm``)."""
    nonlinearity = getattr(layer, "nonlinearity", None)
    if nonlinearity is not None:
        layer.nonlinearity = nonlinearities.linear
    if getattr(layer, "b", None) is not None:
        del layer.params[layer.b]
        layer.b = None
    own_name = getattr(layer, "name", None)  # a protocol-only layer may have none
    name = name or (own_name and f"{own_name}_{suffix}")
    layer = stack(layer, name)
    if nonlinearity is not None:
        layer = NonlinearityLayer(layer, nonlinearity, name=name and f"{name}_nonlin")
    return layer


def batch_norm(layer: Layer, **kwargs) -> Layer:
    """Insert batch normalization after ``layer``, before its nonlinearity.

    Removes the layer's bias (redundant with the normalization's shift) and moves its
    nonlinearity into a :class:`NonlinearityLayer` after the new
    :class:`BatchNormLayer`, as ``lasagne.layers.batch_norm`` does.

    Parameters
    ----------
    layer
        A layer, typically a convolution or dense layer.
    **kwargs
        Passed to :class:`BatchNormLayer`.

    Returns
    -------
    Layer
        The last added layer.
    """
    name = kwargs.pop("name", None)
    return _normalized(layer, "bn", name, lambda lay, n: BatchNormLayer(lay, name=n, **kwargs))


class StandardizationLayer(Layer):
    """Standardize each example: ``(x - mean) / sqrt(var + epsilon)`` over ``axes``.

    Parameters
    ----------
    incoming
        Input layer or shape.
    axes
        ``"auto"`` (axis 1 for 2-d inputs, else the axes after the second),
        ``"spatial"`` (axes after the second), ``"features"`` (all but the first), or
        axes.
    epsilon
        Added to the variance.
    **kwargs
        ``name``.

    Examples
    --------
    >>> StandardizationLayer((None, 3, 4, 4)).axes
    (2, 3)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        axes: str | int | Sequence[int] = "auto",
        epsilon: float = 1e-4,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        ndim = len(self.input_shape)
        if axes == "auto":
            axes = (1,) if ndim == 2 else tuple(range(2, ndim))
        elif axes == "spatial":
            axes = tuple(range(2, ndim))
        elif axes == "features":
            axes = tuple(range(1, ndim))
        self.axes = (axes,) if isinstance(axes, int_types) else tuple(axes)
        self.epsilon = epsilon

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The standardized input."""
        mean = input.mean(self.axes, keepdims=True)
        std = pt.sqrt(input.var(self.axes, keepdims=True) + self.epsilon)
        return (input - mean) / std


def instance_norm(
    layer: Layer, learn_scale: bool = True, learn_bias: bool = True, **kwargs
) -> Layer:
    """Instance normalization after ``layer``: standardize each channel of each example.

    Like :func:`batch_norm`, removes ``layer``'s bias and moves its nonlinearity on top.

    Parameters
    ----------
    layer
        A layer with an input of at least 3 dimensions.
    learn_scale, learn_bias
        Add a per-channel :class:`~.special.ScaleLayer` / :class:`~.special.BiasLayer`.
    **kwargs
        Passed to :class:`StandardizationLayer`.

    Returns
    -------
    Layer
        The last added layer.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import Conv2DLayer, InputLayer, get_all_layers
    >>> net = instance_norm(Conv2DLayer(InputLayer((None, 3, 6, 6)), 4, 3))
    >>> [type(lay).__name__ for lay in get_all_layers(net)][2:]
    ['StandardizationLayer', 'ScaleLayer', 'BiasLayer', 'NonlinearityLayer']
    """
    name = kwargs.pop("name", None)

    def stack(lay: Layer, n: str | None) -> Layer:
        lay = StandardizationLayer(lay, axes="spatial", name=n, **kwargs)
        if learn_scale:
            lay = ScaleLayer(lay, shared_axes="auto", name=n and f"{n}_scale")
        if learn_bias:
            lay = BiasLayer(lay, shared_axes="auto", name=n and f"{n}_bias")
        return lay

    return _normalized(layer, "in", name, stack)


def layer_norm(layer: Layer, **kwargs) -> Layer:
    """Layer normalization after ``layer``: standardize each example over all its features.

    Adds a per-feature :class:`~.special.ScaleLayer` and :class:`~.special.BiasLayer`;
    like :func:`batch_norm`, removes ``layer``'s bias and moves its nonlinearity on top.

    Parameters
    ----------
    layer
        A layer.
    **kwargs
        Passed to :class:`StandardizationLayer`.

    Returns
    -------
    Layer
        The last added layer.
    """
    name = kwargs.pop("name", None)

    def stack(lay: Layer, n: str | None) -> Layer:
        lay = StandardizationLayer(lay, axes="features", name=n, **kwargs)
        lay = ScaleLayer(lay, shared_axes="auto", name=n and f"{n}_scale")
        return BiasLayer(lay, shared_axes="auto", name=n and f"{n}_bias")

    return _normalized(layer, "ln", name, stack)


class LocalResponseNormalization2DLayer(Layer):
    """Cross-channel local response normalization (Krizhevsky et al., 2012).

    ``x / (k + alpha * sum of x**2 over the n channels centred on x) ** beta``.

    Parameters
    ----------
    incoming
        Input layer or shape ``(batch, channels, rows, cols)``.
    alpha, k, beta
        Coefficients of the formula (``alpha`` is not divided by ``n``, as in Lasagne).
    n
        Odd number of channels in each window.
    **kwargs
        ``name``.

    Examples
    --------
    >>> LocalResponseNormalization2DLayer((None, 8, 4, 4)).n
    5
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        alpha: float = 1e-4,
        k: float = 2,
        beta: float = 0.75,
        n: int = 5,
        **kwargs,
    ):
        super().__init__(incoming, **kwargs)
        if n % 2 == 0:
            raise NotImplementedError("Only works with odd n")
        if len(self.input_shape) != 4:
            raise ValueError(f"needs a 4-d input, got shape {self.input_shape}")
        self.alpha, self.k, self.beta, self.n = alpha, k, beta, n

    def get_output_for(self, input: TensorVariable, **kwargs) -> TensorVariable:
        """The normalized input."""
        half = self.n // 2
        channels = input.shape[1]
        squares = pt.sqr(input)
        padded_shape = (input.shape[0], channels + 2 * half, input.shape[2], input.shape[3])
        padded = pt.zeros(padded_shape, dtype=input.dtype)[:, half : half + channels].set(squares)
        total = sum(padded[:, i : i + channels] for i in range(self.n))
        return input / (self.k + self.alpha * total) ** self.beta
