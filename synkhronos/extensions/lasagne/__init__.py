"""Lasagne on PyTensor: a Lasagne script ports by changing ``import lasagne`` to
``from synkhronos.extensions import lasagne``.

The subpackage mirrors Lasagne's module tree (``layers``, ``init``, ``nonlinearities``,
``objectives``, ``regularization``, ``updates``, ``utils``, ``random``); Synkhronos'
own two-phase rules and training steps live beside it in
:mod:`synkhronos.extensions.updates` and :mod:`synkhronos.extensions.train`.
"""

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
    "updates",
    "utils",
]
