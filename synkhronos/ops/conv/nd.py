"""1-D and 3-D convolution and pooling, computed by the 2-D Ops on views of the input."""

import numpy as np
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.ops.conv.folds import FoldLeading, UnfoldLeading
from synkhronos.ops.conv.geometry import conv_output_length, int_tuple
from synkhronos.ops.conv.ops2d import conv2d, pool2d


def conv1d(x, w, stride: int = 1, padding=0, dilation: int = 1, groups: int = 1) -> TensorVariable:
    """1-D cross-correlation of ``x`` (N, C, L) with filters ``w`` (O, C/groups, k).

    Computed by :func:`conv2d` on a height-1 view, so it has the same kernels and
    gradients.

    Parameters
    ----------
    x
        Input batch ``(N, C, L)``.
    w
        Filters ``(O, C / groups, k)``, not flipped.
    stride, dilation
        Ints (or 1-tuples).
    padding
        ``p``, ``(p,)`` or ``(before, after)``.
    groups
        Number of channel groups.

    Returns
    -------
    TensorVariable
        Output ``(N, O, out_L)``, see :func:`conv_output_length`.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> x = pt.tensor3("x")
    >>> conv1d(x, np.ones((1, 1, 2))).eval({x: np.arange(4.0).reshape(1, 1, 4)})
    array([[[1., 3., 5.]]])
    """
    (stride,), (dilation,) = int_tuple(stride, 1, "stride"), int_tuple(dilation, 1, "dilation")
    if isinstance(padding, int | np.integer) or len(padding) == 1:
        padding = int_tuple(padding, 1, "padding") * 2
    y = conv2d(
        pt.shape_padaxis(x, 2),
        pt.shape_padaxis(pt.as_tensor_variable(w), 2),
        (1, stride),
        ((0, 0), int_tuple(padding, 2, "padding")),
        (1, dilation),
        groups,
    )
    return y[:, :, 0, :]


def conv3d(x, w, stride=1, padding=0, dilation=1, groups: int = 1) -> TensorVariable:
    """3-D cross-correlation of ``x`` (N, C, D, H, W) with filters ``w`` (O, C/groups, kD, kH, kW).

    Computed as a sum over the ``kD`` filter planes of :func:`conv2d` over all output
    depths at once (depth folded into the batch), so it has the 2-D kernels' gradients.

    Parameters
    ----------
    x
        Input batch ``(N, C, D, H, W)``.
    w
        Filters ``(O, C / groups, kD, kH, kW)``, not flipped.
    stride, padding, dilation
        Int or 3 ints each (padding is symmetric per axis).
    groups
        Number of channel groups.

    Returns
    -------
    TensorVariable
        Output ``(N, O, out_D, out_H, out_W)``.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> x = pt.tensor5("x")
    >>> conv3d(x, np.ones((1, 1, 2, 1, 1))).eval({x: np.ones((1, 1, 3, 1, 1))}).ravel()
    array([2., 2.])
    """
    (sd, sh, sw), (pd, ph, pw) = int_tuple(stride, 3, "stride"), int_tuple(padding, 3, "padding")
    dd, dh, dw = int_tuple(dilation, 3, "dilation")
    x, w = pt.as_tensor_variable(x), pt.as_tensor_variable(w)
    n, c, depth, h, wd = (x.shape[i] for i in range(5))
    if pd:
        x = pt.zeros((n, c, depth + 2 * pd, h, wd), dtype=x.dtype)[:, :, pd:-pd].set(x)
    k_depth = w.type.shape[2]
    if k_depth is None:
        raise ValueError("conv3d needs filters of known depth")
    out_depth = conv_output_length(depth, k_depth, sd, pd, pd, dd)
    total = 0
    for k in range(k_depth):
        start = k * dd
        planes = x[:, :, start : start + (out_depth - 1) * sd + 1 : sd].dimshuffle(0, 2, 1, 3, 4)
        batch = FoldLeading(2)(planes)
        total = total + conv2d(batch, w[:, :, k], (sh, sw), (ph, pw), (dh, dw), groups)
    return UnfoldLeading(2)(total, planes).dimshuffle(0, 2, 1, 3, 4)


def pool1d(
    x,
    ws: int,
    stride: int | None = None,
    padding: int = 0,
    ignore_border: bool = True,
    mode: str = "max",
) -> TensorVariable:
    """:func:`pool2d` over the last axis of an ``(N, C, L)`` tensor.

    Parameters
    ----------
    x
        Input batch ``(N, C, L)``.
    ws, stride, padding
        Ints (``stride`` defaults to ``ws``).
    ignore_border, mode
        As for :func:`pool2d`.

    Returns
    -------
    TensorVariable
        Pooled ``(N, C, out_L)``.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> x = pt.tensor3("x")
    >>> pool1d(x, 2).eval({x: np.array([[[1.0, 3.0, 2.0, 0.0]]])})
    array([[[3., 2.]]])
    """
    stride = ws if stride is None else stride
    y = pool2d(pt.shape_padaxis(x, 2), (1, ws), (1, stride), (0, padding), ignore_border, mode)
    return y[:, :, 0, :]


def pool3d(
    x, ws, stride=None, padding=0, ignore_border: bool = True, mode: str = "max"
) -> TensorVariable:
    """Pooling over the last three axes of an ``(N, C, D, H, W)`` tensor.

    Computed as :func:`pool2d` over (H, W), then over D: max, windowed sums and the
    counts that ``average_exc_pad`` divides by all factor over the axes, so this equals
    pooling the 3-D boxes directly.

    Parameters
    ----------
    x
        Input batch ``(N, C, D, H, W)``.
    ws, stride, padding
        Int or 3 ints each (``stride`` defaults to ``ws``).
    ignore_border, mode
        As for :func:`pool2d`.

    Returns
    -------
    TensorVariable
        Pooled ``(N, C, out_D, out_H, out_W)``.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> x = pt.tensor5("x")
    >>> pool3d(x, 2).eval({x: np.arange(8.0).reshape(1, 1, 2, 2, 2)}).ravel()
    array([7.])
    """
    kd, kh, kw = int_tuple(ws, 3, "ws")
    sd, sh, sw = (kd, kh, kw) if stride is None else int_tuple(stride, 3, "stride")
    pd, ph, pw = int_tuple(padding, 3, "padding")
    x = pt.as_tensor_variable(x)
    n, c, depth, h, w = (x.shape[i] for i in range(5))
    planes = pool2d(
        x.reshape((n, c * depth, h, w)), (kh, kw), (sh, sw), (ph, pw), ignore_border, mode
    )
    oh, ow = planes.shape[2], planes.shape[3]
    columns = planes.reshape((n, c, depth, oh * ow))
    pooled = pool2d(columns, (kd, 1), (sd, 1), (pd, 0), ignore_border, mode)
    return pooled.reshape((n, c, pooled.shape[2], oh, ow))
