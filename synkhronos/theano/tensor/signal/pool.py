"""Theano's ``theano.tensor.signal.pool``: ``pool_2d`` and ``pool_3d`` with Theano's
arguments, defaults and border rules, on :mod:`synkhronos.extensions.conv`'s pooling.

Pooling acts on the last two (three) axes of a tensor of at least that many axes.

>>> import numpy as np, pytensor.tensor as pt
>>> x = pt.matrix("x")
>>> pool_2d(x, (2, 2), ignore_border=True).eval({x: np.arange(16.0).reshape(4, 4)}).tolist()
[[5.0, 7.0], [13.0, 15.0]]
"""

import math
import warnings

import numpy as np
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions import conv as _conv

MODES = ("max", "sum", "average_inc_pad", "average_exc_pad")


def _sum_pool(x, n: int, ws, stride, pad, ignore_border: bool) -> TensorVariable:
    """Sums over windows: zero-padded so that every window is whole, the sum is the
    padding-inclusive average times the window's area."""
    sizes = [x.shape[x.ndim - n + i] for i in range(n)]
    ends = []
    for length, w, s, p in zip(sizes, ws, stride, pad, strict=True):
        n_out = _conv.pool_output_length(length, w, s, p, ignore_border)
        ends.append(pt.maximum(length + p, (n_out - 1) * s + w - p))  # padded end
    padded = pt.zeros((*x.shape[: x.ndim - n], *[p + e for p, e in zip(pad, ends, strict=True)]),
                      dtype=x.dtype)
    inner = tuple(slice(p, p + length) for p, length in zip(pad, sizes, strict=True))
    padded = pt.set_subtensor(padded[(Ellipsis, *inner)], x)
    pool = _conv.pool2d if n == 2 else _conv.pool3d
    return pool(padded, ws, stride, 0, True, "average_inc_pad") * math.prod(ws)


def _renamed(value, old_value, default, name: str, old_name: str, what: str):
    """``value``, or ``old_value`` where the caller used the argument's old name."""
    if old_value is None:
        return value
    if value is not None and tuple(np.atleast_1d(value)) != tuple(np.atleast_1d(default)):
        raise ValueError(f"{what}: give {name} or {old_name}, not both")
    return old_value


def _pool(n: int, input, ws, ignore_border, stride, pad, mode, ds, st, padding,
          what: str) -> TensorVariable:
    ws = _renamed(ws, ds, None, "ws", "ds", what)
    stride = _renamed(stride, st, None, "stride", "st", what)
    pad = _renamed(pad, padding, (0,) * n, "pad", "padding", what)
    if ws is None:
        raise ValueError(f"{what}: ws (the window size) is required")
    if ignore_border is None:
        warnings.warn(f"{what}(): ignore_border defaults to False, as in Theano; give it "
                      f"explicitly", stacklevel=3)
        ignore_border = False
    mode = "max" if mode == "max_deterministic" else mode
    if mode not in MODES:
        raise ValueError(f"{what}: mode must be one of {MODES}, got {mode!r}")
    ws = _conv.int_tuple(ws, n, "ws")
    stride = ws if stride is None else _conv.int_tuple(stride, n, "stride")
    pad = _conv.int_tuple(pad, n, "pad")
    if any(pad) and not ignore_border:
        raise NotImplementedError(f"{what}: padding works only with ignore_border=True")
    x = pt.as_tensor_variable(input)
    if x.ndim < n:
        raise ValueError(f"{what} needs a tensor of at least {n} dimensions")
    # The Ops pool (N, C, *spatial) tensors: the leading axes fold into N.
    batch = x.reshape((-1, 1, *[x.shape[x.ndim - n + i] for i in range(n)]), ndim=n + 2) \
        if x.ndim != n + 2 else x
    if mode == "sum":
        out = _sum_pool(batch, n, ws, stride, pad, ignore_border)
    else:
        pool = _conv.pool2d if n == 2 else _conv.pool3d
        out = pool(batch, ws, stride, pad, ignore_border, mode)
    if x.ndim == n + 2:
        return out
    return out.reshape((*x.shape[: x.ndim - n], *[out.shape[2 + i] for i in range(n)]),
                       ndim=x.ndim)


def pool_2d(input, ws=None, ignore_border=None, stride=None, pad=(0, 0), mode: str = "max",
            ds=None, st=None, padding=None) -> TensorVariable:
    """Pool the last two axes of ``input`` over ``ws`` windows.

    Parameters
    ----------
    input : tensor_like
        At least 2-D.
    ws : (int, int)
        Window size (``ds``, its old name, is accepted).
    ignore_border : bool, optional
        True: only windows inside the padded input; False: a last partial window where
        rows or columns would be left over. Theano's default, None, warns and means False.
    stride : (int, int), optional
        Default ``ws`` (``st``, its old name, is accepted).
    pad : (int, int)
        Symmetric zero padding, only with ``ignore_border=True`` (``padding``, its old
        name, is accepted).
    mode : str
        "max", "sum", "average_inc_pad" (the padding counts in the divisor) or
        "average_exc_pad".

    Returns
    -------
    TensorVariable
    """
    return _pool(2, input, ws, ignore_border, stride, pad, mode, ds, st, padding, "pool_2d")


def pool_3d(input, ws=None, ignore_border=None, stride=None, pad=(0, 0, 0),
            mode: str = "max", ds=None, st=None, padding=None) -> TensorVariable:
    """Pool the last three axes of ``input``; the arguments are :func:`pool_2d`'s with
    three values each."""
    return _pool(3, input, ws, ignore_border, stride, pad, mode, ds, st, padding, "pool_3d")
