"""Lasagne on PyTensor: a Lasagne script ports by changing ``import lasagne`` to
``from synkhronos.extensions import lasagne``.

The subpackage mirrors Lasagne's module tree file for file (``layers`` with its
modules, ``init``, ``nonlinearities``, ``objectives``, ``regularization``, ``updates``,
``utils``, ``random``, ``theano_extensions``); Synkhronos' own two-phase rules and
training steps live beside it in :mod:`synkhronos.extensions.updates` and
:mod:`synkhronos.extensions.train`.
"""

from synkhronos import theano

from . import (
    init,
    layers,
    nonlinearities,
    objectives,
    random,
    regularization,
    updates,
    utils,
)

__all__ = [
    "init",
    "layers",
    "nonlinearities",
    "objectives",
    "random",
    "regularization",
    "theano",
    "updates",
    "utils",
]

__version__ = "0.2.dev1"  # the Lasagne version this port follows (GitHub master)
