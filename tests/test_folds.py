"""synkhronos.ops.conv.folds: merging leading axes and splitting them back, in each linker,
and the shapes the Ops know as the graph is built."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.ops.conv.folds import FoldLeading, UnfoldLeading


@pytest.mark.parametrize("mode", ["NUMBA", "JAX"])
def test_folds_compile_in_each_linker(mode):
    """FoldLeading and UnfoldLeading (and their gradients, each other) run as reshapes in
    machine code in Numba's mode and JAX's, with no fallback warned, on a non-contiguous
    input too."""
    if mode == "JAX" and importlib.util.find_spec("jax") is None:
        pytest.skip("JAX is not installed")
    x = pt.tensor4("x")
    folded = FoldLeading(2)(x)
    unfolded = UnfoldLeading(2)(folded * 2, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = pytensor.function(
            [x], [folded, unfolded, pytensor.grad((unfolded**2).sum(), x)], mode=mode
        )
    value = np.random.default_rng(0).random((3, 2, 4, 5)).astype(x.dtype).transpose(1, 0, 2, 3)
    got = f(value)
    for result, expected in zip(got, [value.reshape(6, 4, 5), 2 * value, 8 * value], strict=True):
        np.testing.assert_allclose(np.asarray(result), expected, rtol=1e-6)


def test_static_shapes_and_refusals():
    x = pt.tensor("x", shape=(3, 2, None, 5))
    assert FoldLeading(2)(x).type.shape == (6, None, 5)
    assert FoldLeading(3)(x).type.shape == (None, 5)
    like = pt.tensor("like", shape=(None, 4, 7))
    assert UnfoldLeading(2)(pt.matrix("y"), like).type.shape == (None, 4, None)
    with pytest.raises(ValueError, match="cannot fold 3 axes of a 2-d tensor"):
        FoldLeading(3)(pt.matrix())
    for op in (FoldLeading, UnfoldLeading):
        with pytest.raises(ValueError, match="k must be positive"):
            op(0)
    value = np.arange(24.0).reshape(2, 3, 4)
    y = pt.tensor3("y")
    back = UnfoldLeading(2)(FoldLeading(2)(y), y)
    np.testing.assert_array_equal(back.eval({y: value}, mode="FAST_COMPILE"), value)


def test_folding_leaves_the_callers_input_unchanged():
    """The Ops declare their outputs views of their inputs, so an in-place Op after them
    copies first: without ``view_map`` each call of ``fold(x) * 3`` tripled ``x``."""
    x = pt.tensor4("x")
    f = pytensor.function([x], UnfoldLeading(2)(FoldLeading(2)(x) * 3, x), mode="NUMBA")
    value = np.arange(24.0).reshape(2, 3, 2, 2)
    first = f(value).copy()
    np.testing.assert_array_equal(value, np.arange(24.0).reshape(2, 3, 2, 2))
    np.testing.assert_array_equal(f(value), first)
