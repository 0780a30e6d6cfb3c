"""Theano's ``theano.tensor.shared_randomstreams``: ``RandomStreams``, symbolic random
draws that every call of a compiled function draws anew; it is
:mod:`synkhronos.ops.random_streams`'s, which the Lasagne port's noise layers draw
from too.

>>> from synkhronos import theano
>>> srng = RandomStreams(seed=1)
>>> f = theano.function([], srng.uniform((3,)))
>>> first, second = f(), f()
>>> bool((first != second).all() and (first < 1).all())
True
"""

from synkhronos.ops.random_streams import RandomStreams

__all__ = ["RandomStreams"]
