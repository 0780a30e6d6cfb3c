"""Theano's ``theano.tensor.signal.pool``: ``pool_2d`` and ``pool_3d`` with Theano's
arguments, defaults and border rules; they are :mod:`synkhronos.ops.pool`'s,
which the Lasagne port's pooling imports too.

>>> import numpy as np, pytensor.tensor as pt
>>> x = pt.matrix("x")
>>> pool_2d(x, (2, 2), ignore_border=True).eval({x: np.arange(16.0).reshape(4, 4)}).tolist()
[[5.0, 7.0], [13.0, 15.0]]
"""

from synkhronos.ops.pool import MODES, pool_2d, pool_3d

__all__ = ["MODES", "pool_2d", "pool_3d"]
