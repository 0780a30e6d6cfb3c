"""Lasagne's cuDNN layer names (``lasagne.layers.dnn``), on this port's layers.

The project's convolution and pooling Ops run on every backend (Numba on CPU, JAX with
cuDNN on GPU), so these are the portable layers under the names scripts import.  As in
Lasagne, the convolutions here default to ``flip_filters=False`` (cross-correlation) and
the pooling layers refuse ``ignore_border=False`` (cuDNN has no partial windows).

Examples
--------
>>> from synkhronos.extensions.lasagne.layers import InputLayer
>>> Conv2DDNNLayer(InputLayer((None, 3, 8, 8)), 4, 3).flip_filters
False
"""

from collections.abc import Callable, Sequence

from synkhronos.extensions.lasagne import init, nonlinearities
from synkhronos.extensions.lasagne.layers.base import Layer, ParamSpec, Shape
from synkhronos.extensions.lasagne.layers.conv import Conv2DLayer, Conv3DLayer, PadSpec
from synkhronos.extensions.lasagne.layers.normalization import BatchNormLayer, batch_norm
from synkhronos.extensions.lasagne.layers.pool import (
    Pool2DLayer,
    Pool3DLayer,
    SpatialPyramidPoolingLayer,
)

__all__ = [
    "BatchNormDNNLayer",
    "Conv2DDNNLayer",
    "Conv3DDNNLayer",
    "MaxPool2DDNNLayer",
    "MaxPool3DDNNLayer",
    "Pool2DDNNLayer",
    "Pool3DDNNLayer",
    "SpatialPyramidPoolingDNNLayer",
    "batch_norm_dnn",
]

BatchNormDNNLayer = BatchNormLayer
batch_norm_dnn = batch_norm


class Conv2DDNNLayer(Conv2DLayer):
    """:class:`~.conv.Conv2DLayer` with cuDNN's default ``flip_filters=False``.

    Parameters are those of :class:`~.conv.Conv2DLayer` (no ``convolution``).
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: int | Sequence[int],
        stride: int | Sequence[int] = (1, 1),
        pad: PadSpec = 0,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008 (initializers are stateless)
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        flip_filters: bool = False,
        num_groups: int = 1,
        **kwargs,
    ):
        super().__init__(
            incoming, num_filters, filter_size, stride, pad, untie_biases, W, b, nonlinearity,
            flip_filters, num_groups=num_groups, **kwargs,
        )  # fmt: skip


class Conv3DDNNLayer(Conv3DLayer):
    """:class:`~.conv.Conv3DLayer` with cuDNN's default ``flip_filters=False``.

    Parameters are those of :class:`~.conv.Conv3DLayer` (no ``convolution``).
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        num_filters: int,
        filter_size: int | Sequence[int],
        stride: int | Sequence[int] = (1, 1, 1),
        pad: PadSpec = 0,
        untie_biases: bool = False,
        W: ParamSpec = init.GlorotUniform(),  # noqa: B008
        b: ParamSpec | None = init.Constant(0.0),  # noqa: B008
        nonlinearity: Callable | None = nonlinearities.rectify,
        flip_filters: bool = False,
        num_groups: int = 1,
        **kwargs,
    ):
        super().__init__(
            incoming, num_filters, filter_size, stride, pad, untie_biases, W, b, nonlinearity,
            flip_filters, num_groups=num_groups, **kwargs,
        )  # fmt: skip


def _full_windows_only(ignore_border: bool, name: str) -> None:
    if not ignore_border:
        raise NotImplementedError(f"{name} does not support ignore_border=False.")


class Pool2DDNNLayer(Pool2DLayer):
    """:class:`~.pool.Pool2DLayer` under its cuDNN name: full windows only.

    Parameters are those of :class:`~.pool.Pool2DLayer`.

    Raises
    ------
    NotImplementedError
        For ``ignore_border=False``.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size,
        stride=None,
        pad=(0, 0),
        ignore_border: bool = True,
        mode: str = "max",
        **kwargs,
    ):
        _full_windows_only(ignore_border, "Pool2DDNNLayer")
        super().__init__(incoming, pool_size, stride, pad, ignore_border, mode, **kwargs)


class MaxPool2DDNNLayer(Pool2DDNNLayer):
    """:class:`Pool2DDNNLayer` with ``mode="max"``; parameters those of
    :class:`~.pool.MaxPool2DLayer`."""

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size,
        stride=None,
        pad=(0, 0),
        ignore_border: bool = True,
        **kwargs,
    ):
        super().__init__(incoming, pool_size, stride, pad, ignore_border, "max", **kwargs)


class Pool3DDNNLayer(Pool3DLayer):
    """:class:`~.pool.Pool3DLayer` under its cuDNN name: full windows only.

    Parameters are those of :class:`~.pool.Pool3DLayer`.

    Raises
    ------
    NotImplementedError
        For ``ignore_border=False``.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size,
        stride=None,
        pad=(0, 0, 0),
        ignore_border: bool = True,
        mode: str = "max",
        **kwargs,
    ):
        _full_windows_only(ignore_border, "Pool3DDNNLayer")
        super().__init__(incoming, pool_size, stride, pad, ignore_border, mode, **kwargs)


class MaxPool3DDNNLayer(Pool3DDNNLayer):
    """:class:`Pool3DDNNLayer` with ``mode="max"``; parameters those of
    :class:`~.pool.MaxPool3DLayer`."""

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_size,
        stride=None,
        pad=(0, 0, 0),
        ignore_border: bool = True,
        **kwargs,
    ):
        super().__init__(incoming, pool_size, stride, pad, ignore_border, "max", **kwargs)


class SpatialPyramidPoolingDNNLayer(SpatialPyramidPoolingLayer):
    """:class:`~.pool.SpatialPyramidPoolingLayer` under its cuDNN name (no ``implementation``).

    Parameters
    ----------
    incoming
        Input layer or shape (any sizes may be unknown).
    pool_dims
        Grid sizes.
    mode
        ``"max"`` or an average mode.
    **kwargs
        ``name``.
    """

    def __init__(
        self,
        incoming: Layer | Shape,
        pool_dims: Sequence[int] = [4, 2, 1],  # noqa: B006 (Lasagne's default, never mutated)
        mode: str = "max",
        **kwargs,
    ):
        super().__init__(incoming, pool_dims, mode, **kwargs)
