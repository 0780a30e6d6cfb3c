"""2-D convolution and pooling Ops for PyTensor.

PyTensor 3 has no CNN convolution or pooling, so this module provides them as Ops,
in NCHW layout with OIHW filters:

- :func:`conv2d` (:class:`Conv2d`) with stride, padding, dilation and groups, whose
  gradients are the Ops :class:`Conv2dGradInputs` and :class:`Conv2dGradWeights`;
  every gradient of these three is again one of them, so gradients of gradients work.
- :func:`pool2d` (:class:`Pool2d`), max or average pooling, with gradient
  :class:`Pool2dGrad`, whose max-mode gradient is :class:`MaxPool2dGather`.

Implementations:

- CPU: Numba kernels, run directly by ``perform`` (Python linker) and called from the
  default Numba linker's compiled graph (with a cache key, so PyTensor caches graphs
  that contain them).  Convolution is im2col + BLAS GEMM, image by image (1x1
  convolutions skip the im2col); pooling loops over windows.
- JAX: ``jax.lax.conv_general_dilated`` and ``jax.lax.reduce_window`` (cuDNN on
  GPUs); gradient Ops use ``jax.linear_transpose`` / ``jax.vjp`` / ``jax.jvp`` of those.

The modules: :mod:`~synkhronos.ops.conv.geometry` (output lengths),
:mod:`~synkhronos.ops.conv.kernels` (the Numba kernels), :mod:`~synkhronos.ops.conv.ops2d`
(the 2-D Ops), :mod:`~synkhronos.ops.conv.folds` (folding leading axes),
:mod:`~synkhronos.ops.conv.nd` (1-D and 3-D), :mod:`~synkhronos.ops.conv.linkers` (the
Numba and JAX implementations).
"""

from synkhronos.ops.conv import linkers  # noqa: F401 - registers the Ops with PyTensor's linkers
from synkhronos.ops.conv.folds import FoldLeading, UnfoldLeading
from synkhronos.ops.conv.geometry import conv_output_length, int_tuple, pool_output_length
from synkhronos.ops.conv.nd import conv1d, conv3d, pool1d, pool3d
from synkhronos.ops.conv.ops2d import POOL_MODES as POOL_MODES  # Lasagne's pool layers'
from synkhronos.ops.conv.ops2d import (
    Conv2d,
    Conv2dGradInputs,
    Conv2dGradWeights,
    MaxPool2dGather,
    Pool2d,
    Pool2dGrad,
    conv2d,
    pool2d,
)

__all__ = [
    "Conv2d",
    "Conv2dGradInputs",
    "Conv2dGradWeights",
    "FoldLeading",
    "MaxPool2dGather",
    "Pool2d",
    "Pool2dGrad",
    "UnfoldLeading",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_output_length",
    "int_tuple",
    "pool1d",
    "pool2d",
    "pool3d",
    "pool_output_length",
]
