"""Batch normalization (``lasagne.layers.BatchNormLayer`` and ``batch_norm``)."""

from collections.abc import Sequence

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import Layer, ParamSpec, Shape, add_default_update
from synkhronos.extensions.lasagne.layers.dense import NonlinearityLayer

__all__ = ["BatchNormLayer", "batch_norm"]


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
        Initializers of the shift and scale (trainable, not regularizable), or None to
        leave them out.
    mean, inv_std
        Initializers of the running mean and inverse standard deviation (not trainable).
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
        self.axes = (axes,) if isinstance(axes, int) else tuple(axes)
        self.epsilon, self.alpha = epsilon, alpha
        shape = [size for axis, size in enumerate(self.input_shape) if axis not in self.axes]
        if any(size is None for size in shape):
            raise ValueError(f"BatchNormLayer needs known sizes off the axes {self.axes}")
        stats = {"trainable": False, "regularizable": False}
        self.beta = (
            None if beta is None else self.add_param(beta, shape, "beta", regularizable=False)
        )
        self.gamma = (
            None if gamma is None else self.add_param(gamma, shape, "gamma", regularizable=False)
        )
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
    nonlinearity = getattr(layer, "nonlinearity", None)
    if nonlinearity is not None:
        layer.nonlinearity = nonlinearities.linear
    if getattr(layer, "b", None) is not None:
        del layer.params[layer.b]
        layer.b = None
    name = kwargs.pop("name", None) or (layer.name and f"{layer.name}_bn")
    layer = BatchNormLayer(layer, name=name, **kwargs)
    if nonlinearity is not None:
        layer = NonlinearityLayer(layer, nonlinearity, name=name and f"{name}_nonlin")
    return layer
