"""How PyTensor's Numba and JAX linkers run the Ops (registered when :mod:`synkhronos.ops.conv` is
imported).

- Numba: the kernels of :mod:`synkhronos.ops.conv.kernels`, called from the compiled
  graph, with a cache key, so PyTensor caches graphs that contain them.
- JAX: ``jax.lax.conv_general_dilated`` and ``jax.lax.reduce_window`` (cuDNN on GPUs);
  gradient Ops use ``jax.linear_transpose`` / ``jax.vjp`` / ``jax.jvp`` of those.
"""

import zlib
from pathlib import Path

import numba
import numpy as np

from synkhronos.ops.conv.folds import FoldLeading, UnfoldLeading
from synkhronos.ops.conv.ops2d import (
    Conv2d,
    Conv2dGrad,
    Conv2dGradInputs,
    Conv2dGradWeights,
    ConvOp,
    KernelOp,
    MaxPool2dGather,
    Pool2d,
    Pool2dGrad,
    PoolOp,
)


def _register_numba() -> None:
    """Make the Numba linker call the kernels, with a props-based cache key."""
    from pytensor.link.numba.dispatch import basic

    register = basic.register_funcify_default_op_cache_key

    # PyTensor keys its on-disk cache of compiled graphs on the Op's props and this
    # number, not on the kernels' code: hash the code (the package's modules) so edits
    # invalidate the cache.
    code_version = zlib.crc32(
        b"".join(path.read_bytes() for path in sorted(Path(__file__).parent.glob("*.py")))
    )

    @register(KernelOp)
    def _numba_funcify_kernel_op(op: KernelOp, node=None, **kwargs):
        kernel, params = op._kernel, op._params

        @numba.njit
        def kernel_op(*inputs):
            return kernel(*inputs, params)

        return kernel_op, code_version

    # The folds as reshapes in machine code (without these, Numba runs their Python
    # ``perform`` in object mode, warning once per Op).
    @register(FoldLeading)
    def _numba_fold_leading(op: FoldLeading, node=None, **kwargs):
        k = op.k

        @numba.njit
        def fold_leading(x):
            lead = 1
            for n in x.shape[:k]:
                lead *= n
            return np.ascontiguousarray(x).reshape((lead,) + x.shape[k:])

        return fold_leading, code_version

    @register(UnfoldLeading)
    def _numba_unfold_leading(op: UnfoldLeading, node=None, **kwargs):
        k = op.k

        @numba.njit
        def unfold_leading(x, like):
            return np.ascontiguousarray(x).reshape(like.shape[:k] + x.shape[1:])

        return unfold_leading, code_version


# ---------------------------------------------------------------------- JAX linker


def _register_jax() -> None:
    """Register JAX implementations, when JAX is installed."""
    try:
        import jax
        from pytensor.link.jax.dispatch import jax_funcify
    except ImportError:
        return
    _register_jax_conv(jax, jax_funcify)
    _register_jax_pool(jax, jax_funcify)
    _register_jax_folds(jax_funcify)


def _register_jax_conv(jax, jax_funcify) -> None:
    """Register the convolution and its two gradients (transposes of one ``conv``)."""
    from jax import lax

    def conv_fn(op: ConvOp, dtype: str):
        def conv(x, w):
            # The node's dtype: an input made float64 by PyTensor's JAX reductions (which
            # keep a float32 sum's float64 accumulator) would make XLA refuse the pair.
            return lax.conv_general_dilated(
                x.astype(dtype),
                w.astype(dtype),
                window_strides=op.stride,
                padding=op.padding,
                rhs_dilation=op.dilation,
                dimension_numbers=("NCHW", "OIHW", "NCHW"),
                feature_group_count=op.groups,
            )

        return conv

    @jax_funcify.register(Conv2d)
    def _jax_conv2d(op, node, **kwargs):
        return conv_fn(op, node.outputs[0].dtype)

    def conv_grad_fn(op: Conv2dGrad, dtype: str, wrt_input: bool):
        """A gradient Op as the transpose of ``conv``, which is linear in either argument.

        Takes the Ops' ``(operand, gy, like)``; ``wrt_input`` says whether ``like`` is
        conv's input (``operand`` the filters) or its filters (``operand`` the input).
        """
        conv = conv_fn(op, dtype)

        def conv_grad(operand, gy, like):
            def linear(v):
                return conv(v, operand) if wrt_input else conv(operand, v)

            spec = jax.ShapeDtypeStruct(like.shape, dtype)
            return jax.linear_transpose(linear, spec)(gy.astype(dtype))[0]

        return conv_grad

    @jax_funcify.register(Conv2dGradInputs)
    def _jax_conv2d_grad_inputs(op, node, **kwargs):
        return conv_grad_fn(op, node.outputs[0].dtype, wrt_input=True)

    @jax_funcify.register(Conv2dGradWeights)
    def _jax_conv2d_grad_weights(op, node, **kwargs):
        return conv_grad_fn(op, node.outputs[0].dtype, wrt_input=False)


def _jax_pool_fn(op: PoolOp):
    """The JAX function of a pooling Op (its gradients are this function's vjp/jvp)."""
    from jax import lax

    (kh, kw), (sh, sw), (ph, pw) = op.ws, op.stride, op.padding
    is_max, include_pad = op.mode == "max", op.mode == "average_inc_pad"

    def pool(x):
        h, w = x.shape[2:]
        out_h, out_w = op._out_hw(h, w)
        ext_h, ext_w = (out_h - 1) * sh + kh, (out_w - 1) * sw + kw
        # Pad to exactly the windows' extent; a negative high pad crops rows/cols
        # that no window reaches (ignore_border=True).
        config = ((0, 0, 0), (0, 0, 0), (ph, ext_h - h - ph, 0), (pw, ext_w - w - pw, 0))
        fill = np.array(-np.inf if is_max else 0, dtype=x.dtype)
        xp = lax.pad(x, fill, config)
        reducer = lax.max if is_max else lax.add
        total = lax.reduce_window(xp, fill, reducer, (1, 1, kh, kw), (1, 1, sh, sw), "VALID")
        if is_max:
            return total
        counts = [
            np.minimum(s * np.arange(out) - p + k, n + p * include_pad)
            - np.maximum(s * np.arange(out) - p, -p * include_pad)
            for n, k, s, p, out in ((h, kh, sh, ph, out_h), (w, kw, sw, pw, out_w))
        ]
        return total / np.outer(*counts).astype(x.dtype)

    return pool


def _register_jax_pool(jax, jax_funcify) -> None:
    """Register pooling and its two gradient Ops."""

    @jax_funcify.register(Pool2d)
    def _jax_pool2d(op, **kwargs):
        return _jax_pool_fn(op)

    @jax_funcify.register(Pool2dGrad)
    def _jax_pool2d_grad(op, node, **kwargs):
        pool, dtype = _jax_pool_fn(op), node.outputs[0].dtype

        def pool2d_grad(x, gout):
            _, pullback = jax.vjp(pool, x.astype(dtype))
            return pullback(gout.astype(dtype))[0]

        return pool2d_grad

    @jax_funcify.register(MaxPool2dGather)
    def _jax_max_pool2d_gather(op, node, **kwargs):
        pool, dtype = _jax_pool_fn(op), node.outputs[0].dtype

        def max_pool2d_gather(x, g):
            return jax.jvp(pool, (x.astype(dtype),), (g.astype(dtype),))[1]

        return max_pool2d_gather


def _register_jax_folds(jax_funcify) -> None:
    """Register FoldLeading and UnfoldLeading as reshapes."""

    @jax_funcify.register(FoldLeading)
    def _jax_fold_leading(op, **kwargs):
        def fold_leading(x):
            return x.reshape((int(np.prod(x.shape[: op.k])), *x.shape[op.k :]))

        return fold_leading

    @jax_funcify.register(UnfoldLeading)
    def _jax_unfold_leading(op, **kwargs):
        def unfold_leading(x, like):
            return x.reshape((*like.shape[: op.k], *x.shape[1:]))

        return unfold_leading


_register_numba()
_register_jax()
