"""The random generator shared by Lasagne's initializers and noise layers (``lasagne.random``).

As in Lasagne, it is a :class:`numpy.random.RandomState`, so code that calls
``lasagne.random.get_rng().randint(...)`` keeps working.
"""

import numpy as np

__all__ = ["get_rng", "set_rng"]

_rng = np.random.RandomState()


def get_rng() -> np.random.RandomState:
    """The generator that random initializers draw from and noise layers take seeds from.

    Returns
    -------
    numpy.random.RandomState
        The current module-wide generator.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne import random
    >>> random.set_rng(np.random.RandomState(0))
    >>> int(random.get_rng().randint(10))
    5
    """
    return _rng


def set_rng(new_rng: np.random.RandomState | int) -> None:
    """Replace the module-wide generator.

    Parameters
    ----------
    new_rng
        A :class:`numpy.random.RandomState`, or a seed for a new one.
    """
    global _rng
    _rng = new_rng if isinstance(new_rng, np.random.RandomState) else np.random.RandomState(new_rng)
