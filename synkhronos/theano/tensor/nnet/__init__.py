"""Theano's ``theano.tensor.nnet``, which PyTensor dropped: activations,
cross-entropies and CNN convolutions with Theano's arguments and meaning.

``conv2d`` and ``conv3d`` are :mod:`~synkhronos.theano.tensor.nnet.abstract_conv`'s.

>>> import numpy as np
>>> from synkhronos.theano.tensor import matrix
>>> p = matrix("p")
>>> categorical_crossentropy(p, np.array([1])).eval({p: [[0.5, 0.5]]}).round(4).tolist()
[0.6931]
"""

import pytensor.tensor as pt
from pytensor.tensor.special import softmax as _softmax
from pytensor.tensor.variable import TensorVariable

from synkhronos.theano.tensor.nnet import abstract_conv
from synkhronos.theano.tensor.nnet.abstract_conv import conv2d, conv3d

sigmoid = pt.sigmoid
softplus = pt.softplus


def relu(x, alpha=0) -> TensorVariable:
    """Rectifier ``max(x, 0)``; with ``alpha``, the leaky rectifier of slope ``alpha``
    below 0 (Theano's formula ``0.5 (1 + alpha) x + 0.5 (1 - alpha) |x|``, gradient
    included). As Theano's, it computes on NumPy arrays too."""
    if isinstance(alpha, (int, float)) and alpha == 0:
        return 0.5 * (x + abs(x))
    alpha = pt.as_tensor_variable(alpha)
    return 0.5 * (1 + alpha) * x + 0.5 * (1 - alpha) * abs(x)


def softmax(c) -> TensorVariable:
    """Softmax over the last axis; a vector becomes a one-row matrix, as in Theano 1.0.

    Examples
    --------
    >>> softmax(pt.as_tensor_variable([0.0, 0.0])).eval().tolist()
    [[0.5, 0.5]]
    """
    c = pt.as_tensor_variable(c)
    if c.ndim == 1:
        c = pt.shape_padleft(c)
    return _softmax(c, axis=-1)


def crossentropy_categorical_1hot(coding_dist, true_one_of_n) -> TensorVariable:
    """``-log(coding_dist[i, true_one_of_n[i]])`` for each row ``i``."""
    coding_dist = pt.as_tensor_variable(coding_dist)
    true_one_of_n = pt.as_tensor_variable(true_one_of_n)
    return -pt.log(coding_dist[pt.arange(coding_dist.shape[0]), true_one_of_n])


def categorical_crossentropy(coding_dist, true_dist) -> TensorVariable:
    """Cross-entropy of each row of ``coding_dist`` against ``true_dist``: a matrix of
    distributions (``-sum(true_dist * log(coding_dist), axis=-1)``) or a vector of class
    indices (``-log`` of each row's entry at its index)."""
    coding_dist, true_dist = pt.as_tensor_variable(coding_dist), pt.as_tensor_variable(true_dist)
    if true_dist.ndim == coding_dist.ndim:
        return -pt.sum(true_dist * pt.log(coding_dist), axis=coding_dist.ndim - 1)
    if true_dist.ndim == coding_dist.ndim - 1:
        return crossentropy_categorical_1hot(coding_dist, true_dist)
    raise TypeError("rank mismatch between coding and true distributions")


def binary_crossentropy(output, target) -> TensorVariable:
    """``-(target log(output) + (1 - target) log(1 - output))``, element by element."""
    return -(target * pt.log(output) + (1.0 - target) * pt.log(1.0 - output))


__all__ = [
    "abstract_conv", "binary_crossentropy", "categorical_crossentropy", "conv2d", "conv3d",
    "crossentropy_categorical_1hot", "relu", "sigmoid", "softmax", "softplus",
]
