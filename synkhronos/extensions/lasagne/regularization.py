"""Weight penalties (``lasagne.regularization``): add ``lambda * penalty`` to a loss.

Examples
--------
>>> import numpy as np
>>> from synkhronos.extensions.lasagne import layers
>>> net = layers.DenseLayer(layers.InputLayer((None, 3)), 2, W=np.ones((3, 2)))
>>> float(regularize_network_params(net, l2).eval())
6.0
"""

from collections.abc import Callable, Iterable, Mapping

import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.layers.base import Layer
from synkhronos.extensions.lasagne.layers.helper import get_all_params
from synkhronos.theano import tensor as T  # noqa: N812 - Lasagne's name, in its star set

__all__ = [
    "Layer",
    "T",
    "get_all_params",
    "apply_penalty",
    "l1",
    "l2",
    "regularize_layer_params",
    "regularize_layer_params_weighted",
    "regularize_network_params",
]

_REGULARIZABLE = {"regularizable": True}


def l1(x) -> TensorVariable:
    """Sum of absolute values of ``x``.

    Parameters
    ----------
    x
        Tensor.

    Returns
    -------
    TensorVariable
        Scalar ``sum(|x|)``.
    """
    return pt.sum(abs(x))


def l2(x) -> TensorVariable:
    """Sum of squares of ``x`` (no 1/2 factor, as in Lasagne).

    Parameters
    ----------
    x
        Tensor.

    Returns
    -------
    TensorVariable
        Scalar ``sum(x ** 2)``.
    """
    return pt.sum(x**2)


def apply_penalty(tensor_or_tensors, penalty: Callable, **kwargs) -> TensorVariable:
    """``penalty`` summed over one tensor or an iterable of them.

    Parameters
    ----------
    tensor_or_tensors
        Tensor, or any iterable of tensors (a list, a generator, ``dict.values()``).
    penalty
        Function of one tensor, e.g. :func:`l2`.
    **kwargs
        Passed to ``penalty``.

    Returns
    -------
    TensorVariable
        Scalar penalty.
    """
    if isinstance(tensor_or_tensors, Variable):
        return penalty(tensor_or_tensors, **kwargs)
    return sum(penalty(x, **kwargs) for x in tensor_or_tensors)


def regularize_layer_params(
    layer: Layer | Iterable[Layer],
    penalty: Callable,
    tags: Mapping[str, bool] = _REGULARIZABLE,
    **kwargs,
) -> TensorVariable:
    """``penalty`` over the parameters (selected by ``tags``) of one layer or several.

    Parameters
    ----------
    layer
        A layer or any iterable of layers (only their own parameters, not their
        inputs').
    penalty
        Function of one tensor.
    tags
        Parameter tags to select, by default ``{"regularizable": True}`` (weights, not
        biases).
    **kwargs
        Passed to ``penalty``.

    Returns
    -------
    TensorVariable
        Scalar penalty.
    """
    layers = [layer] if isinstance(layer, Layer) else list(layer)
    params = [p for lay in layers for p in lay.get_params(**tags)]
    return apply_penalty(params, penalty, **kwargs)


def regularize_layer_params_weighted(
    layers: Mapping[Layer, float],
    penalty: Callable,
    tags: Mapping[str, bool] = _REGULARIZABLE,
    **kwargs,
) -> TensorVariable:
    """Sum over layers of ``coefficient * penalty(layer's params)``.

    Parameters
    ----------
    layers
        Mapping of layer to its coefficient.
    penalty
        Function of one tensor.
    tags
        Parameter tags to select.
    **kwargs
        Passed to ``penalty``.

    Returns
    -------
    TensorVariable
        Scalar penalty.
    """
    return sum(
        coeff * apply_penalty(layer.get_params(**tags), penalty, **kwargs)
        for layer, coeff in layers.items()
    )


def regularize_network_params(
    layer: Layer | Iterable[Layer],
    penalty: Callable,
    tags: Mapping[str, bool] = _REGULARIZABLE,
    **kwargs,
) -> TensorVariable:
    """``penalty`` over the parameters of every layer of a network.

    Parameters
    ----------
    layer
        Output layer(s) of the network.
    penalty
        Function of one tensor.
    tags
        Parameter tags to select.
    **kwargs
        Passed to ``penalty``.

    Returns
    -------
    TensorVariable
        Scalar penalty.
    """
    return apply_penalty(get_all_params(layer, **tags), penalty, **kwargs)
