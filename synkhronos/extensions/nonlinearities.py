"""Activation functions, with the names and defaults of ``lasagne.nonlinearities``."""

import pytensor.tensor as pt
from pytensor.tensor.special import softmax as _softmax
from pytensor.tensor.variable import TensorVariable

__all__ = [
    "LeakyRectify",
    "elu",
    "identity",
    "leaky_rectify",
    "linear",
    "rectify",
    "sigmoid",
    "softmax",
    "softplus",
    "tanh",
    "very_leaky_rectify",
]


def sigmoid(x) -> TensorVariable:
    """Logistic sigmoid ``1 / (1 + exp(-x))``.

    Parameters
    ----------
    x
        Input tensor.

    Returns
    -------
    TensorVariable
        Elementwise sigmoid of ``x``.
    """
    return pt.sigmoid(x)


def softmax(x) -> TensorVariable:
    """Softmax over the last axis (the class axis of a ``(batch, classes)`` matrix).

    Parameters
    ----------
    x
        Input tensor.

    Returns
    -------
    TensorVariable
        Rows that are positive and sum to one.
    """
    return _softmax(x, axis=-1)


def tanh(x) -> TensorVariable:
    """Hyperbolic tangent.

    Parameters
    ----------
    x
        Input tensor.

    Returns
    -------
    TensorVariable
        Elementwise tanh of ``x``.
    """
    return pt.tanh(x)


def rectify(x) -> TensorVariable:
    """Rectified linear unit ``max(x, 0)``.

    Parameters
    ----------
    x
        Input tensor.

    Returns
    -------
    TensorVariable
        Elementwise ReLU of ``x``.
    """
    return pt.maximum(x, 0)


class LeakyRectify:
    """Leaky ReLU ``x if x > 0 else leakiness * x``, as a callable.

    Parameters
    ----------
    leakiness
        Slope for negative inputs.
    """

    def __init__(self, leakiness: float = 0.01):
        self.leakiness = leakiness

    def __call__(self, x) -> TensorVariable:
        """Apply the leaky rectifier to ``x``."""
        return pt.switch(pt.gt(x, 0), x, self.leakiness * x)


leaky_rectify = LeakyRectify()
"""Leaky ReLU with leakiness 0.01."""

very_leaky_rectify = LeakyRectify(1.0 / 3)
"""Leaky ReLU with leakiness 1/3."""


def elu(x) -> TensorVariable:
    """Exponential linear unit ``x if x > 0 else exp(x) - 1``.

    Parameters
    ----------
    x
        Input tensor.

    Returns
    -------
    TensorVariable
        Elementwise ELU of ``x``.
    """
    return pt.switch(pt.gt(x, 0), x, pt.expm1(x))


def softplus(x) -> TensorVariable:
    """Softplus ``log(1 + exp(x))``.

    Parameters
    ----------
    x
        Input tensor.

    Returns
    -------
    TensorVariable
        Elementwise softplus of ``x``.
    """
    return pt.softplus(x)


def linear(x):
    """Identity: return ``x`` unchanged.

    Parameters
    ----------
    x
        Input tensor.

    Returns
    -------
    TensorVariable
        ``x`` itself.
    """
    return x


identity = linear
"""Alias of :func:`linear`."""
