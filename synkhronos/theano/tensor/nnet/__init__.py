"""Theano's ``theano.tensor.nnet``, which PyTensor dropped: activations,
cross-entropies and CNN convolutions with Theano's arguments and meaning. They are
:mod:`synkhronos.ops.nnet`'s, which the Lasagne port calls too.

``conv2d`` and ``conv3d`` are :mod:`~synkhronos.theano.tensor.nnet.abstract_conv`'s.

>>> import numpy as np
>>> from synkhronos.theano.tensor import matrix
>>> p = matrix("p")
>>> categorical_crossentropy(p, np.array([1])).eval({p: [[0.5, 0.5]]}).round(4).tolist()
[0.6931]
"""

from synkhronos.ops.nnet import (
    binary_crossentropy,
    categorical_crossentropy,
    crossentropy_categorical_1hot,
    relu,
    sigmoid,
    softmax,
    softplus,
)
from synkhronos.theano.tensor.nnet import abstract_conv
from synkhronos.theano.tensor.nnet.abstract_conv import conv2d, conv3d

__all__ = [
    "abstract_conv",
    "binary_crossentropy",
    "categorical_crossentropy",
    "conv2d",
    "conv3d",
    "crossentropy_categorical_1hot",
    "relu",
    "sigmoid",
    "softmax",
    "softplus",
]
