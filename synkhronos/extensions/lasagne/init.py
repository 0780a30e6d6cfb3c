"""Parameter initializers, with the names and defaults of Lasagne's ``lasagne.init``.

An initializer is called with a shape and returns a NumPy array of
``pytensor.config.floatX``.  Random initializers draw from the generator returned by
:func:`~synkhronos.extensions.lasagne.random.get_rng` (re-exported here): NumPy's global
generator, so ``np.random.seed(123)`` seeds them as in Lasagne, until
:func:`~synkhronos.extensions.lasagne.random.set_rng` replaces it.
"""

from collections.abc import Sequence

import numpy as np

from synkhronos.extensions.lasagne.random import get_rng, set_rng  # noqa: F401 - set_rng: the port's
from synkhronos.extensions.lasagne.utils import floatX

__all__ = [
    "Constant",
    "Glorot",
    "GlorotNormal",
    "GlorotUniform",
    "He",
    "HeNormal",
    "HeUniform",
    "Initializer",
    "Normal",
    "Orthogonal",
    "Sparse",
    "Uniform",
    "floatX",
    "get_rng",
    "np",
]

Shape = Sequence[int]


def _gain_value(gain: float | str) -> float:
    """Numeric gain; ``"relu"`` means sqrt(2), as in Lasagne."""
    if gain == "relu":
        return float(np.sqrt(2))
    return float(gain)


def _check_2d(shape: Shape) -> None:
    if len(shape) < 2:
        raise RuntimeError("This initializer only works with shapes of length >= 2")


class Initializer:
    """Base class: ``init(shape)`` returns a new array of that shape."""

    def __call__(self, shape: Shape) -> np.ndarray:
        """Same as :meth:`sample`."""
        return self.sample(shape)

    def sample(self, shape: Shape) -> np.ndarray:
        """Draw an array of ``shape`` (dtype ``floatX``); subclasses define it.

        Parameters
        ----------
        shape
            Shape of the parameter.

        Returns
        -------
        numpy.ndarray
            The initial values.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define sample")


class Normal(Initializer):
    """Gaussian values.

    Parameters
    ----------
    std
        Standard deviation.
    mean
        Mean.
    """

    def __init__(self, std: float = 0.01, mean: float = 0.0):
        self.std, self.mean = std, mean

    def sample(self, shape: Shape) -> np.ndarray:
        """Draw ``shape`` values from N(mean, std**2)."""
        return floatX(get_rng().normal(self.mean, self.std, size=tuple(shape)))


class Uniform(Initializer):
    """Uniform values.

    Parameters
    ----------
    range
        ``r`` for U(-r, r), or a pair ``(low, high)``; ignored when ``std`` is given.
    std
        If given, sample U(mean - a, mean + a) with ``a = sqrt(3) * std``.
    mean
        Centre of the interval when ``std`` is given.
    """

    def __init__(
        self,
        range: float | tuple[float, float] = 0.01,  # shadows the builtin: Lasagne's name
        std: float | None = None,
        mean: float = 0.0,
    ):
        if std is not None:
            half = np.sqrt(3) * std
            self.range = (mean - half, mean + half)
        elif isinstance(range, Sequence):
            self.range = tuple(range)
        else:
            self.range = (-range, range)

    def sample(self, shape: Shape) -> np.ndarray:
        """Draw ``shape`` values from U(low, high)."""
        return floatX(get_rng().uniform(*self.range, size=tuple(shape)))


class _FanScaled:
    """What :class:`Glorot` and :class:`He` share: ``initializer`` with a std from the
    fans. A mixin, not an :class:`Initializer`: as in Lasagne, those two are direct
    subclasses of :class:`Initializer`.

    Subclasses document and implement ``sample`` (their own fan formula), each calling
    :meth:`_draw`; keeping ``sample`` there keeps it in their rendered documentation.
    """

    def __init__(self, initializer: type[Initializer], gain: float | str = 1.0, c01b: bool = False):
        self.initializer, self.gain, self.c01b = initializer, _gain_value(gain), c01b

    @staticmethod
    def _check_c01b(shape: Shape) -> None:
        if len(shape) != 4:
            raise RuntimeError("If c01b is True, only shapes of length 4 are accepted")

    def _draw(self, shape: Shape, variance: float) -> np.ndarray:
        """Draw ``shape`` values with std ``gain * sqrt(variance)``."""
        return self.initializer(std=self.gain * np.sqrt(variance)).sample(shape)


class Glorot(_FanScaled, Initializer):
    """Glorot (Xavier) scaling: std = gain * sqrt(2 / ((fan_in + fan_out) * receptive)).

    ``fan_in, fan_out = shape[:2]`` (symmetric, so dense ``(in, out)`` and conv
    ``(out, in, h, w)`` shapes both work) and ``receptive = prod(shape[2:])``; with
    ``c01b``, the fans are ``shape[0]`` and ``shape[3]`` and ``receptive`` is
    ``shape[1] * shape[2]``.

    Parameters
    ----------
    initializer
        Class called with ``std=...``, e.g. :class:`Normal` or :class:`Uniform`.
    gain
        Scale factor, or ``"relu"`` for sqrt(2).
    c01b
        Shapes are 4-d filters in the channels-rows-columns-batch layout of cuda-convnet.
    """

    def sample(self, shape: Shape) -> np.ndarray:
        """Draw with the Glorot standard deviation for ``shape`` (at least 2-d)."""
        if self.c01b:
            self._check_c01b(shape)
            fan_sum = (shape[0] + shape[3]) * shape[1] * shape[2]
        else:
            _check_2d(shape)
            fan_sum = (shape[0] + shape[1]) * int(np.prod(shape[2:]))
        return self._draw(shape, 2.0 / fan_sum)


class GlorotNormal(Glorot):
    """:class:`Glorot` with Gaussian values.

    Parameters
    ----------
    gain
        Scale factor, or ``"relu"`` for sqrt(2).
    c01b
        As for :class:`Glorot`.
    """

    def __init__(self, gain: float | str = 1.0, c01b: bool = False):
        super().__init__(Normal, gain, c01b)


class GlorotUniform(Glorot):
    """:class:`Glorot` with uniform values.

    Parameters
    ----------
    gain
        Scale factor, or ``"relu"`` for sqrt(2).
    c01b
        As for :class:`Glorot`.
    """

    def __init__(self, gain: float | str = 1.0, c01b: bool = False):
        super().__init__(Uniform, gain, c01b)


class He(_FanScaled, Initializer):
    """He (Kaiming) scaling: std = gain * sqrt(1 / fan_in).

    ``fan_in`` is ``shape[0]`` for 2-d (dense ``(in, out)``) shapes and
    ``prod(shape[1:])`` for conv ``(out, in, h, w)`` shapes; with ``c01b``, it is
    ``prod(shape[:3])``.

    Parameters
    ----------
    initializer
        Class called with ``std=...``, e.g. :class:`Normal` or :class:`Uniform`.
    gain
        Scale factor, or ``"relu"`` for sqrt(2).
    c01b
        Shapes are 4-d filters in the channels-rows-columns-batch layout of cuda-convnet.
    """

    def sample(self, shape: Shape) -> np.ndarray:
        """Draw with the He standard deviation for ``shape`` (at least 2-d)."""
        if self.c01b:
            self._check_c01b(shape)
            fan_in = int(np.prod(shape[:3]))
        else:
            _check_2d(shape)
            fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
        return self._draw(shape, 1.0 / fan_in)


class HeNormal(He):
    """:class:`He` with Gaussian values.

    Parameters
    ----------
    gain
        Scale factor, or ``"relu"`` for sqrt(2).
    c01b
        As for :class:`He`.
    """

    def __init__(self, gain: float | str = 1.0, c01b: bool = False):
        super().__init__(Normal, gain, c01b)


class HeUniform(He):
    """:class:`He` with uniform values.

    Parameters
    ----------
    gain
        Scale factor, or ``"relu"`` for sqrt(2).
    c01b
        As for :class:`He`.
    """

    def __init__(self, gain: float | str = 1.0, c01b: bool = False):
        super().__init__(Uniform, gain, c01b)


class Constant(Initializer):
    """Every value equal to ``val``.

    Parameters
    ----------
    val
        The constant.
    """

    def __init__(self, val: float = 0.0):
        self.val = val

    def sample(self, shape: Shape) -> np.ndarray:
        """An array of ``shape`` filled with ``val``."""
        return floatX(np.full(tuple(shape), self.val))


class Orthogonal(Initializer):
    """Orthogonal matrix (of ``shape[0]`` by ``prod(shape[1:])``), times ``gain``.

    Parameters
    ----------
    gain
        Scale factor, or ``"relu"`` for sqrt(2).
    """

    def __init__(self, gain: float | str = 1.0):
        self.gain = _gain_value(gain)

    def sample(self, shape: Shape) -> np.ndarray:
        """Orthogonal rows or columns from the SVD of a Gaussian matrix."""
        if len(shape) < 2:
            raise RuntimeError("Only shapes of length 2 or more are supported.")
        flat = (shape[0], int(np.prod(shape[1:])))
        u, _, vt = np.linalg.svd(get_rng().normal(size=flat), full_matrices=False)
        q = u if u.shape == flat else vt
        return floatX(self.gain * q.reshape(tuple(shape)))


class Sparse(Initializer):
    """Matrix whose columns each hold ``sparsity * rows`` nonzero Gaussian entries.

    Parameters
    ----------
    sparsity
        Fraction of nonzero entries per column.
    std
        Standard deviation of the nonzero entries.

    Examples
    --------
    >>> w = Sparse(sparsity=0.5)((4, 3))
    >>> [int(n) for n in (w != 0).sum(axis=0)]
    [2, 2, 2]
    """

    def __init__(self, sparsity: float = 0.1, std: float = 0.01):
        self.sparsity, self.std = sparsity, std

    def sample(self, shape: Shape) -> np.ndarray:
        """Zeros, with ``int(sparsity * rows)`` random rows of each column drawn."""
        if len(shape) != 2:
            raise RuntimeError("sparse initializer only works with shapes of length 2")
        rows, cols = shape
        values = np.zeros(tuple(shape))
        per_column = int(self.sparsity * rows)
        for col in range(cols):
            picked = get_rng().permutation(rows)[:per_column]
            values[picked, col] = get_rng().normal(0.0, self.std, size=per_column)
        return floatX(values)
