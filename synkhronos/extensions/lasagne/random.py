"""The random generator shared by Lasagne's initializers and noise layers (``lasagne.random``).

As in Lasagne, it is NumPy's global generator, the module :mod:`numpy.random` itself,
until :func:`set_rng` replaces it, so ``np.random.seed(123)`` at the top of a script makes
its weight initialisation and its noise layers' seeds reproducible.
"""

from types import ModuleType

import numpy as np

__all__ = ["get_rng", "np", "set_rng"]

_rng: ModuleType | np.random.RandomState = np.random


def get_rng() -> ModuleType | np.random.RandomState:
    """The generator that random initializers draw from and noise layers take seeds from.

    Returns
    -------
    numpy.random or numpy.random.RandomState
        The generator given to the last :func:`set_rng`, or the module
        :mod:`numpy.random` (NumPy's global generator) if it was never called.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne import random
    >>> random.set_rng(np.random.RandomState(0))
    >>> int(random.get_rng().randint(10))
    5
    >>> random.set_rng(np.random)
    """
    return _rng


def set_rng(new_rng: ModuleType | np.random.RandomState | int) -> None:
    """Replace the module-wide generator.

    Parameters
    ----------
    new_rng
        The module :mod:`numpy.random`, a :class:`numpy.random.RandomState`, or a seed
        for a new one.
    """
    global _rng
    generator = isinstance(new_rng, ModuleType | np.random.RandomState)
    _rng = new_rng if generator else np.random.RandomState(new_rng)
