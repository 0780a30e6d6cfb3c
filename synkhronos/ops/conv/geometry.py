"""The shapes of convolution and pooling: output lengths along one axis, and the
normalising of their int-or-tuple arguments."""

from collections.abc import Sequence

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Variable

IntPair = int | Sequence[int]


def int_tuple(value: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
    """``n`` copies of an int (Python or NumPy), or the ``n`` ints of a sequence.

    Parameters
    ----------
    value
        An int, or a sequence of ``n`` ints.
    n
        Length of the result.
    name
        Argument name, for the error message.

    Returns
    -------
    tuple of int
        The ``n`` ints.

    Examples
    --------
    >>> int_tuple(np.int64(3), 2, "stride")
    (3, 3)
    >>> int_tuple((1, 2, 3), 3, "pad")
    (1, 2, 3)
    """
    if isinstance(value, int | np.integer):
        return (int(value),) * n
    values = tuple(int(v) for v in value)
    if len(values) != n:
        raise ValueError(f"{name} must be an int or {n} ints, got {value!r}")
    return values


def padding_pairs(padding) -> tuple[tuple[int, int], tuple[int, int]]:
    """Normalise ``p``, ``(ph, pw)`` or ``((top, bottom), (left, right))``."""
    if isinstance(padding, int | np.integer):
        return (int(padding),) * 2, (int(padding),) * 2
    rows, cols = padding
    return int_tuple(rows, 2, "padding"), int_tuple(cols, 2, "padding")


def conv_output_length(length, kernel, stride, pad_lo, pad_hi, dilation=1):
    """Length of one spatial axis of a convolution's output.

    Works on Python ints and on symbolic PyTensor scalars.

    Parameters
    ----------
    length
        Input length along the axis.
    kernel
        Filter length along the axis.
    stride
        Step between filter applications.
    pad_lo, pad_hi
        Zero padding added before and after the input.
    dilation
        Spacing between filter taps.

    Returns
    -------
    int or TensorVariable
        ``(length + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1``.
    """
    return (length + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1


def pool_output_length_int(length, pool_size, stride, pad, ignore_border):
    """:func:`pool_output_length` for ints (also compiled by Numba)."""
    if ignore_border:
        return (length + 2 * pad - pool_size) // stride + 1
    if stride >= pool_size:
        return (length + stride - 1) // stride
    return max(0, (length - pool_size + stride - 1) // stride) + 1


def pool_output_length(length, pool_size: int, stride: int, pad: int, ignore_border: bool):
    """Length of one spatial axis of a pooling output, with Lasagne's border rules.

    Parameters
    ----------
    length
        Input length along the axis (Python int or symbolic scalar).
    pool_size
        Window length.
    stride
        Step between windows.
    pad
        Padding on both sides (only allowed with ``ignore_border=True``).
    ignore_border
        If True, only windows lying fully inside the padded input are used; if False,
        a last partial window is added whenever input elements would be left over.

    Returns
    -------
    int or TensorVariable
        Number of windows.
    """
    if ignore_border or stride >= pool_size or not isinstance(length, Variable):
        return pool_output_length_int(length, pool_size, stride, pad, ignore_border)
    return pt.maximum(0, (length - pool_size + stride - 1) // stride) + 1
