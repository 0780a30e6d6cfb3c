"""Theano's ``theano.tensor``: everything in ``pytensor.tensor``, plus the names Theano
had there that PyTensor renamed, dropped or gave another signature.

``nnet``, ``signal`` and ``shared_randomstreams`` are the subpackages and module of
Theano's paths; ``extra_ops`` and ``basic`` are PyTensor's modules of those names.

>>> import numpy as np
>>> from synkhronos.theano import tensor as T
>>> x = T.tensor3("x")
>>> T.flatten(x, outdim=2).eval({x: np.zeros((2, 3, 4))}).shape
(2, 12)
>>> x.transfer(None) is x, x.transfer("cpu") is x
(True, True)
"""

import importlib
import sys
from collections.abc import Sequence

import pytensor.tensor as pt
from pytensor.graph.replace import vectorize_graph
from pytensor.tensor import *  # noqa: F403 - theano.tensor is a superset of pytensor.tensor
from pytensor.tensor import basic, extra_ops
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise  # noqa: F401 - Theano's T.Elemwise, ...
from pytensor.tensor.variable import TensorVariable

for _name, _module in {"basic": basic, "extra_ops": extra_ops}.items():
    sys.modules[f"{__name__}.{_name}"] = _module

from synkhronos.theano.tensor import nnet, shared_randomstreams  # noqa: E402, F401

# Not "from ... import signal": the star import bound pytensor.tensor.signal to that name.
signal = importlib.import_module(f"{__name__}.signal")

abs_ = pt.abs
inv = pt.reciprocal


def _stay_where_it_is(var, target):
    """Theano's ``var.transfer(None)``: the variable as it is (PyTensor's ``transfer``
    takes "cpu", which Theano's took too, and the targets registered with it)."""
    return var if target is None else None


# PyTensor's hook for transfer targets, not a patch of its function: importing Theano's
# names adds Theano's None target, in this process.
basic.register_transfer(_stay_where_it_is)


def batched_dot(a, b) -> TensorVariable:
    """Theano's ``batched_dot``: ``batched_dot(a, b)[i] == dot(a[i], b[i])`` (written here:
    PyTensor 3.3 dropped its own).

    Examples
    --------
    >>> import numpy as np
    >>> a, b = np.ones((4, 2, 3)), np.ones((4, 3, 5))
    >>> batched_dot(a, b).eval().shape
    (4, 2, 5)
    """
    a, b = pt.as_tensor_variable(a), pt.as_tensor_variable(b)
    if a.ndim == 0 or b.ndim == 0:
        raise TypeError("batched_dot: a and b need a batch axis each")
    core_a, core_b = a[0].type(), b[0].type()
    return vectorize_graph(pt.dot(core_a, core_b), replace={core_a: a, core_b: b})


def addbroadcast(x, *axes: int) -> TensorVariable:
    """``x``, broadcastable along ``axes`` (each must have length 1 when run).

    Examples
    --------
    >>> x = matrix("x")
    >>> addbroadcast(x, 0).type.shape
    (1, None)
    """
    return pt.specify_broadcastable(x, *axes)


def patternbroadcast(x, broadcastable: Sequence[bool]) -> TensorVariable:
    """``x``, broadcastable along the axes where ``broadcastable`` is True.

    PyTensor's types keep an axis known to have length 1 broadcastable, so a False
    there leaves it as it is (Theano made such an axis non-broadcastable).

    Examples
    --------
    >>> x = matrix("x")
    >>> patternbroadcast(x, (False, True)).type.shape
    (None, 1)
    """
    if len(broadcastable) != x.ndim:
        raise ValueError(
            f"patternbroadcast: {len(broadcastable)} flags for a tensor of {x.ndim} dimensions"
        )
    return pt.specify_broadcastable(x, *[i for i, b in enumerate(broadcastable) if b])


def stack(*tensors, axis: int = 0) -> TensorVariable:
    """Stack tensors along a new axis: ``stack([a, b], axis=0)``, or Theano's older
    ``stack(a, b, ...)``.

    Examples
    --------
    >>> stack(1.0, 2.0).eval().tolist()
    [1.0, 2.0]
    """
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tensors[0]
    return pt.stack(list(tensors), axis=axis)


def flatten(x, outdim: int = 1) -> TensorVariable:
    """``x`` with its trailing axes merged so that ``outdim`` axes remain (Theano's
    ``outdim`` is PyTensor's ``ndim``)."""
    return pt.flatten(x, ndim=outdim)


def tile(x, reps, ndim: int | None = None) -> TensorVariable:
    """``x`` repeated ``reps`` times along each axis, as ``numpy.tile``; ``ndim``, when
    larger, gives the result that many axes (``x`` gains leading axes of length 1).

    Examples
    --------
    >>> tile(as_tensor_variable([1, 2]), (2,), ndim=2).eval().tolist()
    [[1, 2, 1, 2]]
    """
    x = pt.as_tensor_variable(x)
    if ndim is not None and ndim > x.ndim:
        x = pt.shape_padleft(x, ndim - x.ndim)
    return pt.tile(x, reps)
