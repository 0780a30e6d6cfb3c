"""Theano's ``theano.sandbox.rng_mrg``: ``MRG_RandomStreams``, the random streams Lasagne's
dropout and noise layers draw from.

Theano's MRG31k3p generator ran on GPUs too; here it is
:class:`~synkhronos.ops.random_streams.RandomStreams` (NumPy's
generators), with MRG's default seed, 12345: the same methods and distributions, other
numbers.

>>> from synkhronos import theano
>>> srng = MRG_RandomStreams(seed=7)
>>> mask = srng.binomial((4,), p=0.5, dtype="float64")
>>> set(theano.function([], mask)().tolist()) <= {0.0, 1.0}
True
"""

from synkhronos.ops.random_streams import RandomStreams


class MRG_RandomStreams(RandomStreams):  # noqa: N801 - Theano's name
    """Random streams with Theano MRG's defaults; see :class:`RandomStreams`.

    Parameters
    ----------
    seed : int
    """

    def __init__(self, seed: int = 12345):
        super().__init__(seed)


__all__ = ["MRG_RandomStreams"]
