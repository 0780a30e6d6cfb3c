"""Theano's pooling functions, ``pool_2d`` and ``pool_3d``, with Theano's arguments,
defaults and border rules, on :mod:`synkhronos.extensions.conv`'s pooling Ops.

Lasagne's ``lasagne.layers.pool`` imports them from Theano, and so does the port here
(:mod:`synkhronos.extensions.lasagne.layers.pool`); :mod:`synkhronos.theano` publishes
them at their Theano path, ``theano.tensor.signal.pool``.

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
from pytensor.graph.basic import Variable
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions import conv

__all__ = ["MODES", "pool_2d", "pool_3d"]

MODES = ("max", "sum", "average_inc_pad", "average_exc_pad")
_REDUCTIONS = {"max": pt.max, "sum": pt.sum, "average_inc_pad": pt.mean, "average_exc_pad": pt.mean}


def _sum_pool(x, n: int, ws, stride, pad, ignore_border: bool) -> TensorVariable:
    """Sums over windows: zero-padded so that every window is whole, the sum is the
    padding-inclusive average times the window's area."""
    sizes = [x.shape[x.ndim - n + i] for i in range(n)]
    ends = []
    for length, w, s, p in zip(sizes, ws, stride, pad, strict=True):
        n_out = conv.pool_output_length(length, w, s, p, ignore_border)
        ends.append(pt.maximum(length + p, (n_out - 1) * s + w - p))  # padded end
    padded = pt.zeros(
        (*x.shape[: x.ndim - n], *[p + e for p, e in zip(pad, ends, strict=True)]), dtype=x.dtype
    )
    inner = tuple(slice(p, p + length) for p, length in zip(pad, sizes, strict=True))
    padded = pt.set_subtensor(padded[(Ellipsis, *inner)], x)
    pool = conv.pool2d if n == 2 else conv.pool3d
    return pool(padded, ws, stride, 0, True, "average_inc_pad") * math.prod(ws)


def _pool_symbolic(x, ws, stride, mode: str) -> TensorVariable:
    """2-D pooling with window sizes and strides known only when the graph runs: each
    axis's windows gathered into a new axis and reduced (no padding, full windows)."""
    reduce = _REDUCTIONS[mode]
    for k in range(2):
        axis = x.ndim - 2 + k
        count = (x.shape[axis] - ws[k]) // stride[k] + 1
        taps = pt.arange(count)[:, None] * stride[k] + pt.arange(ws[k])[None, :]
        x = reduce(pt.take(x, taps, axis=axis), axis=axis + 1)
    return x


def _symbolic(value) -> bool:
    """Whether a size argument (a value or a sequence of them) is known only at run time."""
    if isinstance(value, tuple | list):
        return any(isinstance(v, Variable) for v in value)
    return isinstance(value, Variable)


def _renamed(value, old_value, default, name: str, old_name: str, what: str):
    """``value``, or ``old_value`` where the caller used the argument's old name."""
    if old_value is None:
        return value
    if value is not None and tuple(np.atleast_1d(value)) != tuple(np.atleast_1d(default)):
        raise ValueError(f"{what}: give {name} or {old_name}, not both")
    return old_value


def _pool(
    n: int, input, ws, ignore_border, stride, pad, mode, ds, st, padding, what: str
) -> TensorVariable:
    ws = _renamed(ws, ds, None, "ws", "ds", what)
    stride = _renamed(stride, st, None, "stride", "st", what)
    pad = _renamed(pad, padding, (0,) * n, "pad", "padding", what)
    if ws is None:
        raise ValueError(f"{what}: ws (the window size) is required")
    if ignore_border is None:
        warnings.warn(
            f"{what}(): ignore_border defaults to False, as in Theano; give it explicitly",
            stacklevel=3,
        )
        ignore_border = False
    mode = "max" if mode == "max_deterministic" else mode
    if mode not in MODES:
        raise ValueError(f"{what}: mode must be one of {MODES}, got {mode!r}")
    stride = ws if stride is None else stride
    pad = (0,) * n if pad is None else pad
    x = pt.as_tensor_variable(input)
    if x.ndim < n:
        raise ValueError(f"{what} needs a tensor of at least {n} dimensions")
    if any(_symbolic(v) for v in (ws, stride, pad)):
        if n != 2 or not ignore_border or isinstance(pad, Variable) or any(pad):
            raise ValueError(
                f"{what}: window sizes and strides known only at run time "
                "need pool_2d with ignore_border=True and no padding"
            )
        return _pool_symbolic(x, ws, stride, mode)
    ws, stride, pad = (
        conv.int_tuple(v, n, name) for v, name in ((ws, "ws"), (stride, "stride"), (pad, "pad"))
    )
    if any(pad) and not ignore_border:
        raise NotImplementedError(f"{what}: padding works only with ignore_border=True")
    # The Ops pool (N, C, *spatial) tensors: the leading axes fold into N.
    batch = (
        x.reshape((-1, 1, *[x.shape[x.ndim - n + i] for i in range(n)]), ndim=n + 2)
        if x.ndim != n + 2
        else x
    )
    if mode == "sum":
        out = _sum_pool(batch, n, ws, stride, pad, ignore_border)
    else:
        pool = conv.pool2d if n == 2 else conv.pool3d
        out = pool(batch, ws, stride, pad, ignore_border, mode)
    if x.ndim == n + 2:
        return out
    return out.reshape((*x.shape[: x.ndim - n], *[out.shape[2 + i] for i in range(n)]), ndim=x.ndim)


def pool_2d(
    input,
    ws=None,
    ignore_border=None,
    stride=None,
    pad=(0, 0),
    mode: str = "max",
    ds=None,
    st=None,
    padding=None,
) -> TensorVariable:
    """Pool the last two axes of ``input`` over ``ws`` windows.

    Parameters
    ----------
    input : tensor_like
        At least 2-D.
    ws : (int, int) or symbolic vector
        Window size (``ds``, its old name, is accepted). Sizes known only at run time
        (symbolic ``ws`` or ``stride``) need ``ignore_border=True`` and no padding.
    ignore_border : bool, optional
        True: only windows inside the padded input; False: a last partial window where
        rows or columns would be left over. Theano's default, None, warns and means False.
    stride : (int, int) or symbolic vector, optional
        Default ``ws`` (``st``, its old name, is accepted).
    pad : (int, int) or None
        Symmetric zero padding, only with ``ignore_border=True`` (``padding``, its old
        name, is accepted); None means none.
    mode : str
        "max", "sum", "average_inc_pad" (the padding counts in the divisor) or
        "average_exc_pad".

    Returns
    -------
    TensorVariable

    Raises
    ------
    ValueError
        Without ``ws``, with both an argument and its old name, for an unknown mode, or
        run-time sizes with padding or partial windows.
    NotImplementedError
        For padding with ``ignore_border=False``.
    """
    return _pool(2, input, ws, ignore_border, stride, pad, mode, ds, st, padding, "pool_2d")


def pool_3d(
    input,
    ws=None,
    ignore_border=None,
    stride=None,
    pad=(0, 0, 0),
    mode: str = "max",
    ds=None,
    st=None,
    padding=None,
) -> TensorVariable:
    """Pool the last three axes of ``input``; the arguments are :func:`pool_2d`'s with
    three values each (sizes known when the graph is built).

    Returns
    -------
    TensorVariable
    """
    return _pool(3, input, ws, ignore_border, stride, pad, mode, ds, st, padding, "pool_3d")
