"""Theano's ``theano.tensor.signal``: the :mod:`~synkhronos.theano.tensor.signal.pool`
module."""

from synkhronos.theano.tensor.signal import pool

__all__ = ["pool"]
