"""Theano's ``theano.tensor.nnet.abstract_conv``: ``conv2d``/``conv3d`` (with Theano's
filter flip) and the gradient operators that Lasagne's transposed convolutions call.
They are :mod:`synkhronos.ops.nnet`'s, which the Lasagne port's
convolution layers call too.

>>> import numpy as np, pytensor.tensor as pt
>>> x = pt.tensor4("x")
>>> w = np.array([[[[1.0, 2.0]]]])  # flipped: the taps are 2, 1
>>> conv2d(x, w).eval({x: [[[[1.0, 10.0, 100.0]]]]}).ravel().tolist()
[12.0, 120.0]
"""

from synkhronos.ops.nnet import (
    AbstractConv2d_gradInputs,
    AbstractConv2d_gradWeights,
    AbstractConv3d_gradInputs,
    AbstractConv3d_gradWeights,
    conv2d,
    conv3d,
)

__all__ = [
    "AbstractConv2d_gradInputs",
    "AbstractConv2d_gradWeights",
    "AbstractConv3d_gradInputs",
    "AbstractConv3d_gradWeights",
    "conv2d",
    "conv3d",
]
