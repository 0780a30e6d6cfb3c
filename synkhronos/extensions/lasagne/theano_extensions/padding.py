"""Constant padding of a tensor (``lasagne.theano_extensions.padding``)."""

from collections.abc import Iterable

import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.utils import int_types
from synkhronos.theano import tensor as T  # noqa: N812 - Lasagne's name, in its star set

__all__ = ["T", "int_types", "pad"]


def pad_widths(width, ndim: int) -> list[tuple[int, int]]:
    """``(before, after)`` for each padded axis, from Lasagne's ``width`` forms.

    Parameters
    ----------
    width
        An int (every one of the ``ndim`` axes, both sides), or an iterable with one
        entry per axis from the first padded one: an int (both sides) or a pair.
    ndim
        Number of axes an int ``width`` applies to.

    Returns
    -------
    list of (int, int)
        One pair per padded axis (fewer than ``ndim`` when ``width`` lists fewer).

    Examples
    --------
    >>> pad_widths(2, 2), pad_widths([1, (0, 3)], 2)
    ([(2, 2), (2, 2)], [(1, 1), (0, 3)])
    """
    widths = [width] * ndim if isinstance(width, int_types) else list(width)
    return [(w, w) if isinstance(w, int_types) else tuple(w) for w in widths]


def pad(x, width: int | Iterable, val: float = 0, batch_ndim: int = 1) -> TensorVariable:
    """``x`` padded with the constant ``val`` on the axes after the first ``batch_ndim``.

    Parameters
    ----------
    x
        The tensor.
    width
        See :func:`pad_widths`: an int pads every axis after ``batch_ndim``; an
        iterable gives the axes from ``batch_ndim`` on, one entry each.
    val
        Padding value.
    batch_ndim
        Number of leading axes left as they are.

    Returns
    -------
    TensorVariable
        The padded tensor.

    Examples
    --------
    >>> pad(pt.ones((1, 2)), 1, batch_ndim=0).eval()
    array([[0., 0., 0., 0.],
           [0., 1., 1., 0.],
           [0., 0., 0., 0.]])
    """
    x = pt.as_tensor_variable(x)
    widths = pad_widths(width, x.ndim - batch_ndim)
    shape = [x.shape[axis] for axis in range(x.ndim)]
    inside = [slice(None)] * x.ndim
    for k, (lo, hi) in enumerate(widths):
        axis = batch_ndim + k
        inside[axis] = slice(lo, lo + shape[axis])
        shape[axis] = shape[axis] + lo + hi
    block = pt.full(shape, pt.cast(val, x.dtype), dtype=x.dtype)
    return block[tuple(inside)].set(x)
