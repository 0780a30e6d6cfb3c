"""Activation functions, with the names and defaults of ``lasagne.nonlinearities``."""

from collections.abc import Callable

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

_F = Callable[..., TensorVariable]


def _with_tensor_doc(returns: str) -> Callable[[_F], _F]:
    """Complete a one-line docstring with the numpy sections shared by every ``f(x)`` here.

    Every function of this module takes one input tensor; only the summary and the
    description of the result differ, so the Parameters/Returns boilerplate is
    written once.  The function itself is returned unchanged (same object, name and
    module), so autodoc documents it as an ordinary function.
    """

    def document(function: _F) -> _F:
        if function.__doc__ is not None:  # None under ``python -OO``
            function.__doc__ += (
                "\n\nParameters\n----------\nx\n    Input tensor.\n\n"
                f"Returns\n-------\nTensorVariable\n    {returns}\n"
            )
        return function

    return document


@_with_tensor_doc("Elementwise sigmoid of ``x``.")
def sigmoid(x) -> TensorVariable:
    """Logistic sigmoid ``1 / (1 + exp(-x))``."""
    return pt.sigmoid(x)


@_with_tensor_doc("Rows that are positive and sum to one.")
def softmax(x) -> TensorVariable:
    """Softmax over the last axis (the class axis of a ``(batch, classes)`` matrix)."""
    return _softmax(x, axis=-1)


@_with_tensor_doc("Elementwise tanh of ``x``.")
def tanh(x) -> TensorVariable:
    """Hyperbolic tangent."""
    return pt.tanh(x)


@_with_tensor_doc("Elementwise ReLU of ``x``.")
def rectify(x) -> TensorVariable:
    """Rectified linear unit ``max(x, 0)``."""
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


@_with_tensor_doc("Elementwise ELU of ``x``.")
def elu(x) -> TensorVariable:
    """Exponential linear unit ``x if x > 0 else exp(x) - 1``."""
    return pt.switch(pt.gt(x, 0), x, pt.expm1(x))


@_with_tensor_doc("Elementwise softplus of ``x``.")
def softplus(x) -> TensorVariable:
    """Softplus ``log(1 + exp(x))``."""
    return pt.softplus(x)


@_with_tensor_doc("``x`` itself.")
def linear(x):
    """Identity: return ``x`` unchanged."""
    return x


identity = linear
"""Alias of :func:`linear`."""
