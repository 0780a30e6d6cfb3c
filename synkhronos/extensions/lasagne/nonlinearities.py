"""Activation functions, with the names and defaults of ``lasagne.nonlinearities``.

Where Lasagne calls Theano's ``theano.tensor.nnet``, these call
:mod:`synkhronos.ops.nnet`.
"""

from collections.abc import Callable

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos import theano
from synkhronos.ops import nnet as theano_nnet

__all__ = [
    "SELU",
    "LeakyRectify",
    "ScaledTanH",
    "ScaledTanh",
    "elu",
    "identity",
    "leaky_rectify",
    "linear",
    "rectify",
    "selu",
    "sigmoid",
    "softmax",
    "softplus",
    "tanh",
    "theano",
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
    return theano_nnet.sigmoid(x)


@_with_tensor_doc("Rows that are positive and sum to one.")
def softmax(x) -> TensorVariable:
    """Softmax over the last axis (the class axis of a ``(batch, classes)`` matrix); a
    vector becomes a one-row matrix, as with Lasagne on Theano."""
    return theano_nnet.softmax(x)


@_with_tensor_doc("Elementwise tanh of ``x``.")
def tanh(x) -> TensorVariable:
    """Hyperbolic tangent."""
    return pt.tanh(x)


class ScaledTanH:
    """Scaled hyperbolic tangent ``scale_out * tanh(scale_in * x)``, as a callable.

    Parameters
    ----------
    scale_in
        Factor applied to the input.
    scale_out
        Factor applied to the output.

    Examples
    --------
    >>> float(ScaledTanH(scale_in=0.5, scale_out=2.0)(0.0).eval())
    0.0
    """

    def __init__(self, scale_in: float = 1, scale_out: float = 1):
        self.scale_in, self.scale_out = scale_in, scale_out

    def __call__(self, x) -> TensorVariable:
        """Apply the scaled tanh to ``x``."""
        return self.scale_out * pt.tanh(self.scale_in * x)


ScaledTanh = ScaledTanH
"""Alias of :class:`ScaledTanH` (both spellings are Lasagne's)."""


@_with_tensor_doc("Elementwise ReLU of ``x`` (a NumPy array for a NumPy ``x``).")
def rectify(x) -> TensorVariable:
    """Rectified linear unit ``max(x, 0)``: Theano's ``relu``, which also applies to NumPy
    arrays."""
    return theano_nnet.relu(x)


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
        """Apply the leaky rectifier to ``x`` (Theano's ``relu`` with ``alpha``)."""
        return theano_nnet.relu(x, self.leakiness)


leaky_rectify = LeakyRectify()
"""Leaky ReLU with leakiness 0.01."""

very_leaky_rectify = LeakyRectify(1.0 / 3)
"""Leaky ReLU with leakiness 1/3."""


@_with_tensor_doc("Elementwise ELU of ``x``.")
def elu(x) -> TensorVariable:
    """Exponential linear unit ``x if x > 0 else exp(x) - 1``."""
    return pt.switch(pt.gt(x, 0), x, pt.expm1(x))


class SELU:
    """Scaled exponential linear unit ``scale * (x if x > 0 else scale_neg * (exp(x) - 1))``.

    Parameters
    ----------
    scale
        Factor applied to both parts.
    scale_neg
        Factor applied to the negative part.

    Examples
    --------
    >>> round(float(selu(1.0).eval()), 4)
    1.0507
    """

    def __init__(self, scale: float = 1, scale_neg: float = 1):
        self.scale, self.scale_neg = scale, scale_neg

    def __call__(self, x) -> TensorVariable:
        """Apply the SELU to ``x``."""
        x = pt.as_tensor_variable(x)
        return self.scale * pt.switch(pt.gt(x, 0), x, self.scale_neg * pt.expm1(x))


selu = SELU(scale=1.0507009873554805, scale_neg=1.6732632423543772)
"""SELU with the self-normalizing constants of Klambauer et al. (2017)."""


@_with_tensor_doc("Elementwise softplus of ``x``.")
def softplus(x) -> TensorVariable:
    """Softplus ``log(1 + exp(x))``."""
    return theano_nnet.softplus(x)


@_with_tensor_doc("``x`` itself.")
def linear(x):
    """Identity: return ``x`` unchanged."""
    return x


identity = linear
"""Alias of :func:`linear`."""
