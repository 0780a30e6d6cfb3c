"""Spatial transformer layers of ``lasagne.layers.special``: affine and thin-plate-spline warps.

Both layers map a regular output grid in normalized coordinates ([-1, 1] on each axis)
to source coordinates given by a localization network, and read the input there with
bilinear interpolation (plain PyTensor ops: floor, border handling, a gather per sample).
"""

from collections.abc import Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.layers.base import Layer, MergeLayer, Shape
from synkhronos.extensions.lasagne.utils import as_tuple

__all__ = ["TPSTransformerLayer", "TransformerLayer"]

BORDER_MODES = ("nearest", "mirror", "wrap")


def _grid(xp, height, width):
    """Output grid ``(2, height * width)``: rows x then y, each in [-1, 1], row-major.

    ``xp`` is ``numpy`` (precomputed grids) or ``pytensor.tensor`` (run-time sizes).
    """
    x = xp.linspace(-1.0, 1.0, width)
    y = xp.linspace(-1.0, 1.0, height)
    xs = (x[None, :] + xp.zeros_like(y)[:, None]).flatten()
    ys = (y[:, None] + xp.zeros_like(x)[None, :]).flatten()
    return xp.stack([xs, ys])


def _tps_basis(xp, points, source):
    """Rows ``1, x, y, U(|p - s_k|)`` for each point ``p``: shape ``(K + 3, P)``.

    ``U(r) = r^2 log r^2`` with ``U(0) = 0`` (Bookstein's thin-plate kernel).
    """
    r2 = ((points[:, None, :] - source[:, :, None]) ** 2).sum(axis=0)
    kernel = r2 * xp.log(xp.where(r2 > 0, r2, 1.0))  # log(1) = 0 where r2 == 0
    return xp.concatenate([xp.ones_like(points[:1]), points, kernel], axis=0)


def _source_index(index: TensorVariable, size: TensorVariable, border_mode: str):
    """Integer pixel index inside ``[0, size)`` for a possibly outside one."""
    if border_mode == "nearest":
        return pt.clip(index, 0, size - 1)
    if border_mode == "mirror":
        period = pt.maximum(2 * (size - 1), 1)  # a single pixel mirrors onto itself
        return pt.minimum(index % period, -index % period)
    return index % size


def _bilinear_sample(
    image: TensorVariable, x: TensorVariable, y: TensorVariable, border_mode: str
) -> TensorVariable:
    """Read ``image`` (batch, channels, rows, cols) at normalized points, bilinearly.

    Parameters
    ----------
    image
        4-D input.
    x, y
        ``(batch, P)`` coordinates in [-1, 1] (-1 the first column/row, 1 the last).
    border_mode
        ``"nearest"``, ``"mirror"`` or ``"wrap"``: which pixel a point outside reads.

    Returns
    -------
    TensorVariable
        ``(batch, channels, P)``.
    """
    batch, channels, height, width = (image.shape[a] for a in range(4))
    x = (x + 1) / 2 * pt.cast(width - 1, x.dtype)
    y = (y + 1) / 2 * pt.cast(height - 1, y.dtype)
    x0, y0 = pt.floor(x), pt.floor(y)
    cols = [_source_index(pt.cast(c, "int64"), width, border_mode) for c in (x0, x0 + 1)]
    rows = [_source_index(pt.cast(r, "int64"), height, border_mode) for r in (y0, y0 + 1)]
    pixels = image.dimshuffle(0, 2, 3, 1)  # (batch, rows, cols, channels)
    # Each sample reads its own image, indexed by its position in the batch: a gather
    # that keeps the samples apart as such (synk.function's split knows it), where
    # offsets into the batch flattened would hide it.
    own = pt.arange(batch, dtype="int64")[:, None]
    wx = [x0 + 1 - x, x - x0]
    wy = [y0 + 1 - y, y - y0]
    out = 0
    for i in range(2):
        for j in range(2):
            out = out + (wy[i] * wx[j])[:, :, None] * pixels[own, rows[i], cols[j]]
    return out.dimshuffle(0, 2, 1)


class _SpatialTransformer(MergeLayer):
    """Shared checks, output shape and sampling of the two transformer layers."""

    def __init__(self, incoming, localization_network, downsample_factor, border_mode,
                 params_per_sample, **kwargs):  # fmt: skip
        super().__init__([incoming, localization_network], **kwargs)
        if border_mode not in BORDER_MODES:
            raise ValueError(f"border_mode must be one of {BORDER_MODES}, got {border_mode!r}")
        self.border_mode = border_mode
        self.downsample_factor = as_tuple(downsample_factor, 2)
        input_shape, loc_shape = self.input_shapes
        if len(loc_shape) != 2 or loc_shape[-1] != params_per_sample:
            raise ValueError(
                f"the localization network must output (batch_size, {params_per_sample})"
            )
        if len(input_shape) != 4:
            raise ValueError("the input must be 4-D: (batch, channels, rows, columns)")

    def get_output_shape_for(self, input_shapes: list[Shape]) -> Shape:
        """``(batch, channels, rows // factor, columns // factor)``."""
        shape = input_shapes[0]
        return shape[:2] + tuple(
            None if s is None else int(s // f)
            for s, f in zip(shape[2:], self.downsample_factor, strict=True)
        )

    def _output_sizes(self, input: TensorVariable):
        # Known sizes as ints: JAX needs the grid's linspace bounds concrete.
        return tuple(
            pt.cast(input.shape[2 + a] // f, "int64") if known is None else known
            for a, (f, known) in enumerate(
                zip(self.downsample_factor, self.output_shape[2:], strict=True)
            )
        )

    def _warp(self, input, points, out_height, out_width):
        """``input`` read at ``points`` (batch, 2, P), shaped as the output."""
        out = _bilinear_sample(input, points[:, 0], points[:, 1], self.border_mode)
        return out.reshape((input.shape[0], input.shape[1], out_height, out_width))


class TransformerLayer(_SpatialTransformer):
    """Spatial transformer with an affine warp (Jaderberg et al., 2015).

    The localization network outputs six numbers per sample, the 2x3 matrix ``A`` with
    ``(x_s, y_s) = A (x_t, y_t, 1)``, mapping each output point (normalized to [-1, 1])
    to the source point read, with bilinear interpolation.

    Parameters
    ----------
    incoming
        Input layer or shape ``(batch, channels, rows, columns)``.
    localization_network
        Layer with output shape ``(batch, 6)``; use a linear output.
    downsample_factor
        A float or two: the output has ``rows // f0`` rows and ``columns // f1`` columns.
    border_mode
        ``"nearest"`` (clip to the edge), ``"mirror"`` or ``"wrap"``.
    **kwargs
        ``name``.

    Examples
    --------
    >>> import numpy as np
    >>> from synkhronos.extensions.lasagne import init, layers
    >>> l_in = layers.InputLayer((None, 3, 28, 28))
    >>> identity = np.array([1, 0, 0, 0, 1, 0], dtype="float64")
    >>> l_loc = layers.DenseLayer(l_in, 6, W=init.Constant(0.0), b=identity, nonlinearity=None)
    >>> TransformerLayer(l_in, l_loc, downsample_factor=2).output_shape
    (None, 3, 14, 14)
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        localization_network: Layer,
        downsample_factor: float | Sequence[float] = 1,
        border_mode: str = "nearest",
        **kwargs,
    ):
        super().__init__(incoming, localization_network, downsample_factor, border_mode, 6,
                         **kwargs)  # fmt: skip

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """The input warped by the affine transforms ``inputs[1]``."""
        input, theta = inputs
        out_height, out_width = self._output_sizes(input)
        grid = _grid(pt, out_height, out_width).astype(theta.dtype)
        homogeneous = pt.concatenate([grid, pt.ones_like(grid[:1])], axis=0)
        # The batch's own size, not -1: a gradient's reshape back to a size computed
        # from -1 cannot be traced by JAX.
        points = theta.reshape((theta.shape[0], 2, 3)) @ homogeneous
        return self._warp(input, points, out_height, out_width)


class TPSTransformerLayer(_SpatialTransformer):
    """Spatial transformer with a thin-plate-spline warp (Bookstein, 1989).

    ``control_points`` source points lie on a square grid over [-1, 1]^2; the
    localization network outputs their offsets (all x offsets, then all y offsets), and
    the spline through the moved points maps each output point to the source point read.

    Parameters
    ----------
    incoming
        Input layer or shape ``(batch, channels, rows, columns)``.
    localization_network
        Layer with output shape ``(batch, 2 * control_points)``.
    downsample_factor
        A float or two: the output has ``rows // f0`` rows and ``columns // f1`` columns.
    control_points
        Number of control points, a perfect square.
    precompute_grid
        True: compute the spline basis on the output grid once, here (needs known rows
        and columns); False: in the graph; ``"auto"``: True when the sizes are known.
    border_mode
        ``"nearest"`` (clip to the edge), ``"mirror"`` or ``"wrap"``.
    **kwargs
        ``name``.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne import init, layers
    >>> l_in = layers.InputLayer((None, 3, 28, 28))
    >>> zero = init.Constant(0.0)
    >>> l_loc = layers.DenseLayer(l_in, 2 * 16, W=zero, b=zero, nonlinearity=None)
    >>> TPSTransformerLayer(l_in, l_loc, control_points=16).precompute_grid
    True
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        localization_network: Layer,
        downsample_factor: float | Sequence[float] = 1,
        control_points: int = 16,
        precompute_grid: bool | str = "auto",
        border_mode: str = "nearest",
        **kwargs,
    ):
        super().__init__(incoming, localization_network, downsample_factor, border_mode,
                         2 * control_points, **kwargs)  # fmt: skip
        side = round(np.sqrt(control_points))
        if side * side != control_points:
            raise ValueError("the number of control points must be a perfect square")
        self.control_points = control_points
        known = all(s is not None for s in self.input_shapes[0][2:])
        if precompute_grid == "auto":
            precompute_grid = known
        elif precompute_grid and not known:
            raise ValueError("precompute_grid needs the input's rows and columns known")
        self.precompute_grid = bool(precompute_grid)
        self.source_points = _grid(np, side, side)
        # The spline's coefficients are (dest_points) @ solve_matrix: L^-1's columns for
        # the control-point equations (the 3 affine side conditions have right side 0).
        basis = _tps_basis(np, self.source_points, self.source_points)
        system = np.zeros((control_points + 3, control_points + 3))
        system[:3, 3:] = basis[:3]
        system[3:, :3] = basis[:3].T
        system[3:, 3:] = basis[3:]
        self.solve_matrix = np.linalg.inv(system)[:, 3:].T
        self.warp_matrix = None
        if self.precompute_grid:
            out_height, out_width = self.output_shape[2:]
            grid_basis = _tps_basis(np, _grid(np, out_height, out_width), self.source_points)
            self.warp_matrix = (self.solve_matrix @ grid_basis).astype(pytensor.config.floatX)

    def get_output_for(self, inputs: list[TensorVariable], **kwargs) -> TensorVariable:
        """The input warped by the splines through the moved control points ``inputs[1]``."""
        input, offsets = inputs
        moves = offsets.reshape((offsets.shape[0], 2, self.control_points))  # no -1: see above
        dest = self.source_points.astype(offsets.dtype) + moves  # float64 would upcast
        if self.precompute_grid:
            out_height, out_width = self.output_shape[2:]
            warp = pt.as_tensor(self.warp_matrix)
        else:
            out_height, out_width = self._output_sizes(input)
            grid = _grid(pt, out_height, out_width)
            warp = pt.as_tensor(self.solve_matrix) @ _tps_basis(pt, grid, self.source_points)
        points = dest @ warp.astype(offsets.dtype)
        return self._warp(input, points, out_height, out_width)
