"""Theano's ``theano.misc``: :mod:`~synkhronos.theano.misc.pkl_utils` (saving shared
variables' values in a zip file)."""

from synkhronos.theano.misc import pkl_utils

__all__ = ["pkl_utils"]
