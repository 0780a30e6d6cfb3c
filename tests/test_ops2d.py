"""Tests of synkhronos.ops.conv.ops2d: the conv2d and pool2d Ops and their gradients.

References are float64 NumPy direct sums.  Most tests compile with the Python linker
(``FAST_COMPILE``), which runs the same Numba kernels as the default Numba linker but
compiles graphs in milliseconds instead of seconds; ``test_default_mode_matches`` covers
the Numba linker and the JAX tests the JAX linker.
"""

import importlib.util
import pickle

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.gradient import verify_grad

from synkhronos.ops.conv import (
    Conv2d,
    Pool2d,
    conv2d,
    conv_output_length,
    pool2d,
    pool_output_length,
)

MODE = "FAST_COMPILE"

# (x shape, w shape, stride, padding, dilation, groups), chosen to cover 1x1 filters
# (with and without the pointwise shortcut) and non-square ones, asymmetric padding,
# padding wider than the filter, strides that leave input rows unused, dilation and groups.
CONV_CASES = [
    ((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),
    ((3, 4, 9, 8), (6, 2, 3, 2), (2, 1), ((1, 0), (2, 1)), (1, 2), 2),
    ((1, 2, 6, 7), (3, 2, 1, 1), (2, 3), ((0, 0), (0, 0)), (1, 1), 1),
    ((2, 6, 8, 5), (6, 1, 2, 3), (1, 2), ((2, 3), (0, 1)), (2, 1), 6),
    ((2, 2, 5, 5), (5, 2, 4, 2), (3, 2), ((4, 1), (2, 2)), (1, 1), 1),
    ((2, 4, 5, 6), (6, 2, 1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 2),
]


def conv_taps(w_shape, out_hw, stride, dilation, groups):
    """``(f, chans, i, j, rows, cols)`` for every filter tap ``w[f, :, i, j]``.

    ``chans`` are the input channels of filter ``f``'s group, and ``rows``/``cols`` the
    strided slices of the padded input that the tap meets over the whole output.
    """
    o, cg, kh, kw = w_shape
    out_h, out_w = out_hw
    og = o // groups
    for f in range(o):
        chans = slice(f // og * cg, (f // og + 1) * cg)
        for i in range(kh):
            for j in range(kw):
                rows = slice(
                    i * dilation[0], i * dilation[0] + (out_h - 1) * stride[0] + 1, stride[0]
                )
                cols = slice(
                    j * dilation[1], j * dilation[1] + (out_w - 1) * stride[1] + 1, stride[1]
                )
                yield f, chans, i, j, rows, cols


def conv_ref(x, w, stride, padding, dilation, groups):
    """Direct-sum cross-correlation, float64."""
    (n, _, h, wd), (o, _, kh, kw) = x.shape, w.shape
    (pt_, pb), (pl, pr) = padding
    xp = np.pad(x, ((0, 0), (0, 0), (pt_, pb), (pl, pr)))
    out_h = (h + pt_ + pb - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    out_w = (wd + pl + pr - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((n, o, out_h, out_w))
    for f, chans, i, j, rows, cols in conv_taps(w.shape, (out_h, out_w), stride, dilation, groups):
        y[:, f] += np.einsum("nchw,c->nhw", xp[:, chans, rows, cols], w[f, :, i, j])
    return y


def conv_grads_ref(x, w, gy, stride, padding, dilation, groups):
    """Gradients of ``sum(conv(x, w) * gy)`` by the same direct sums, transposed."""
    h, wd = x.shape[2:]
    (pt_, pb), (pl, pr) = padding
    xp = np.pad(x, ((0, 0), (0, 0), (pt_, pb), (pl, pr)))
    gxp, gw = np.zeros_like(xp), np.zeros_like(w)
    for f, chans, i, j, rows, cols in conv_taps(w.shape, gy.shape[2:], stride, dilation, groups):
        gw[f, :, i, j] = np.einsum("nchw,nhw->c", xp[:, chans, rows, cols], gy[:, f])
        gxp[:, chans, rows, cols] += np.einsum("c,nhw->nchw", w[f, :, i, j], gy[:, f])
    return gxp[:, :, pt_ : pt_ + h, pl : pl + wd], gw


def pool_ref(x, ws, stride, pad, ignore_border, mode):
    """Window-by-window pooling with Lasagne's border and divisor rules, float64."""
    n, c, h, w = x.shape
    out_h, out_w = (
        pool_output_length(size, k, s, p, ignore_border)
        for size, k, s, p in zip((h, w), ws, stride, pad, strict=True)
    )
    y = np.zeros((n, c, out_h, out_w))
    for a in range(out_h):
        for b in range(out_w):
            r0, c0 = a * stride[0] - pad[0], b * stride[1] - pad[1]
            r1, c1 = r0 + ws[0], c0 + ws[1]
            win = x[:, :, max(r0, 0) : min(r1, h), max(c0, 0) : min(c1, w)]
            if mode == "max":
                y[:, :, a, b] = win.max(axis=(2, 3))
            elif mode == "average_exc_pad":
                y[:, :, a, b] = win.mean(axis=(2, 3))
            else:
                rows = min(r1, h + pad[0]) - max(r0, -pad[0])
                cols = min(c1, w + pad[1]) - max(c0, -pad[1])
                y[:, :, a, b] = win.sum(axis=(2, 3)) / (rows * cols)
    return y


def _conv_graph():
    """Inputs and [y, gx, gw] per case for all of CONV_CASES, as one graph."""
    inputs, outputs = [], []
    for _, _, stride, padding, dilation, groups in CONV_CASES:
        x, w, gy = pt.tensor4("x"), pt.tensor4("w"), pt.tensor4("gy")
        y = conv2d(x, w, stride, padding, dilation, groups)
        gx, gw = pytensor.grad(None, [x, w], known_grads={y: gy})
        inputs += [x, w, gy]
        outputs += [y, gx, gw]
    return inputs, outputs


@pytest.fixture(scope="module")
def conv_data():
    """Random x, w and output gradients for every case."""
    rng = np.random.default_rng(42)
    values = []
    for x_shape, w_shape, stride, padding, dilation, groups in CONV_CASES:
        x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
        y_shape = conv_ref(x, w, stride, padding, dilation, groups).shape
        values += [x, w, rng.standard_normal(y_shape)]
    return values


@pytest.fixture(scope="module")
def conv_results(conv_data):
    """[y, gx, gw] per case."""
    inputs, outputs = _conv_graph()
    return pytensor.function(inputs, outputs, mode=MODE)(*conv_data)


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv_forward_and_grads_match_direct_sums(case, conv_data, conv_results):
    x, w, gy = conv_data[3 * case : 3 * case + 3]
    y, gx, gw = conv_results[3 * case : 3 * case + 3]
    _, _, stride, padding, dilation, groups = CONV_CASES[case]
    np.testing.assert_allclose(y, conv_ref(x, w, stride, padding, dilation, groups), atol=1e-12)
    gx_ref, gw_ref = conv_grads_ref(x, w, gy, stride, padding, dilation, groups)
    np.testing.assert_allclose(gx, gx_ref, atol=1e-12)
    np.testing.assert_allclose(gw, gw_ref, atol=1e-12)


def random_case(rng):
    """A random convolution case, in the format of CONV_CASES."""
    groups = int(rng.integers(1, 3))
    kernel = tuple(int(k) for k in rng.integers(1, 5, size=2))
    stride = tuple(int(s) for s in rng.integers(1, 4, size=2))
    dilation = tuple(int(d) for d in rng.integers(1, 3, size=2))
    padding = tuple(tuple(int(p) for p in rng.integers(0, 4, size=2)) for _ in range(2))
    # Smallest input for which the dilated filter fits the padded input.
    spatial = [
        max(1, d * (k - 1) + 1 - sum(p)) + int(rng.integers(0, 5))
        for k, d, p in zip(kernel, dilation, padding, strict=True)
    ]
    in_ch, out_ch = groups * int(rng.integers(1, 4)), groups * int(rng.integers(1, 4))
    x_shape = (int(rng.integers(1, 4)), in_ch, *spatial)
    return x_shape, (out_ch, in_ch // groups, *kernel), stride, padding, dilation, groups


def test_random_cases_match_direct_sums():
    rng = np.random.default_rng(7)
    x, w, gy = pt.tensor4("x"), pt.tensor4("w"), pt.tensor4("gy")
    for _ in range(10):
        x_shape, w_shape, stride, padding, dilation, groups = random_case(rng)
        y = conv2d(x, w, stride, padding, dilation, groups)
        gx, gw = pytensor.grad(None, [x, w], known_grads={y: gy})
        fn = pytensor.function([x, w, gy], [y, gx, gw], mode=MODE)
        x_val, w_val = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
        y_ref = conv_ref(x_val, w_val, stride, padding, dilation, groups)
        gy_val = rng.standard_normal(y_ref.shape)
        y_val, gx_val, gw_val = fn(x_val, w_val, gy_val)
        gx_ref, gw_ref = conv_grads_ref(x_val, w_val, gy_val, stride, padding, dilation, groups)
        for got, ref in ((y_val, y_ref), (gx_val, gx_ref), (gw_val, gw_ref)):
            np.testing.assert_allclose(got, ref, atol=1e-12, err_msg=str((x_shape, w_shape)))


def test_jax_mode_matches_cpu(conv_data, conv_results):
    pytest.importorskip("jax")
    inputs, outputs = _conv_graph()
    jax_results = pytensor.function(inputs, outputs, mode="JAX")(*conv_data)
    for ours, theirs in zip(conv_results, jax_results, strict=True):
        np.testing.assert_allclose(np.asarray(theirs), ours, atol=1e-10)


def test_default_mode_matches(conv_data, conv_results):
    """The Numba linker (PyTensor's default mode) runs the kernels with the same results."""
    x, w, gy = conv_data[3:6]
    _, _, stride, padding, dilation, groups = CONV_CASES[1]
    xs, ws, gys = pt.tensor4("x"), pt.tensor4("w"), pt.tensor4("gy")
    y = conv2d(xs, ws, stride, padding, dilation, groups)
    pooled = pool2d(y, 2, 1, 1)
    gx, gw = pytensor.grad(None, [xs, ws], known_grads={y: gys})
    g_pool = pytensor.grad(pooled.sum(), xs)
    outputs = [y, gx, gw, pooled, g_pool]
    numba = pytensor.function([xs, ws, gys], outputs)(x, w, gy)
    python = pytensor.function([xs, ws, gys], outputs, mode=MODE)(x, w, gy)
    for a, b in zip(numba, python, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_verify_grad_strided_dilated_grouped():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 4, 6, 5)), rng.standard_normal((4, 2, 2, 3))
    verify_grad(
        lambda x_, w_: conv2d(x_, w_, (2, 1), ((1, 2), (0, 1)), (2, 1), 2),
        [x, w],
        rng=rng,
        mode=MODE,
    )


def test_verify_grad_of_gradients():
    """Gradients of the gradient Ops (second use in grads) are themselves correct."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((3, 2, 3, 2))

    def gradients(x_, w_):
        y = conv2d(x_, w_, (2, 1), 1)
        gx, gw = pytensor.grad((y**3).sum(), [x_, w_])
        return pt.concatenate([gx.ravel(), gw.ravel()])

    verify_grad(gradients, [x, w], rng=rng, mode=MODE)


def test_float32_and_flipped_filter_views():
    """float32 inputs and non-contiguous (flipped) filters give the float64 answer."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((2, 3, 3, 3))
    xs, ws = pt.tensor4("x", dtype="float32"), pt.tensor4("w", dtype="float32")
    y = conv2d(xs, ws[:, :, ::-1, ::-1], padding=1)
    assert y.dtype == "float32"
    out = pytensor.function([xs, ws], y, mode=MODE)(x.astype("float32"), w.astype("float32"))
    ref = conv_ref(x, w[:, :, ::-1, ::-1], (1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_static_shapes_and_errors():
    x = pt.tensor4("x", shape=(None, 4, 9, 8))
    y = conv2d(x, pt.tensor4("w", shape=(6, 2, 3, 2)), (2, 1), 1, (1, 2), groups=2)
    assert y.type.shape == (None, 6, 5, 8)
    assert conv_output_length(9, 3, 2, 1, 1) == 5
    # Symbolic shapes (infer_shape) agree with the computed ones.
    xv, wv = np.zeros((3, 4, 9, 8)), np.zeros((6, 2, 3, 2))
    w = pt.tensor4("w")
    pooled = pool2d(conv2d(x, w, (2, 1), 1, (1, 2), groups=2), 3, 2, ignore_border=False)
    shape = pytensor.function([x, w], pooled.shape, mode=MODE)(xv, wv)
    value = pytensor.function([x, w], pooled, mode=MODE)(xv, wv)
    assert tuple(shape) == value.shape == (3, 6, 2, 4)
    with pytest.raises(ValueError, match="groups"):
        conv2d(x, pt.tensor4("w", shape=(6, 3, 3, 3)))
    with pytest.raises(TypeError, match="float"):
        conv2d(pt.itensor4("x"), pt.itensor4("w"))
    with pytest.raises(ValueError, match="fit"):
        conv2d(x, w).eval(
            {x: np.zeros((1, 4, 9, 8)), w: np.zeros((2, 4, 11, 1))}, mode="FAST_COMPILE"
        )


def test_ops_pickle():
    op = Conv2d((2, 1), ((1, 0), (2, 1)), 2, 3)
    assert pickle.loads(pickle.dumps(op)) == op
    y = pool2d(conv2d(pt.tensor4("x"), pt.tensor4("w"), padding=1), 2)
    restored = pickle.loads(pickle.dumps(y))
    assert restored.owner.op == Pool2d(2)


# (ws, stride, pad, ignore_border) for pooling; each runs in all three modes.
POOL_CASES = [
    ((2, 2), (2, 2), (0, 0), True),
    ((3, 3), (2, 2), (1, 1), True),
    ((3, 2), (2, 1), (1, 0), True),
    ((3, 3), (2, 2), (0, 0), False),
    ((2, 2), (3, 3), (0, 0), False),
]
POOL_MODES = ["max", "average_inc_pad", "average_exc_pad"]


@pytest.fixture(scope="module")
def pool_results():
    """Forward and input-gradient of every pooling case, from CPU and (if present) JAX."""
    rng = np.random.default_rng(4)
    x = pt.tensor4("x")
    x_val = rng.standard_normal((2, 3, 7, 8))
    cases = [(c, m) for c in POOL_CASES for m in POOL_MODES]
    outputs = []
    for (ws, stride, pad, ignore_border), mode in cases:
        y = pool2d(x, ws, stride, pad, ignore_border, mode)
        outputs += [y, pytensor.grad((y * y).sum(), x)]
    cpu = pytensor.function([x], outputs, mode=MODE)(x_val)
    jax = None
    if importlib.util.find_spec("jax") is not None:
        jax = [np.asarray(a) for a in pytensor.function([x], outputs, mode="JAX")(x_val)]
    return x_val, cases, cpu, jax


@pytest.mark.parametrize("index", range(len(POOL_CASES) * len(POOL_MODES)))
def test_pool_forward_matches_reference(index, pool_results):
    x, cases, cpu, _ = pool_results
    (ws, stride, pad, ignore_border), mode = cases[index]
    np.testing.assert_allclose(cpu[2 * index], pool_ref(x, ws, stride, pad, ignore_border, mode))


def test_pool_jax_mode_matches_cpu(pool_results):
    _, _, cpu, jax = pool_results
    if jax is None:
        pytest.skip("jax is not installed")
    for ours, theirs in zip(cpu, jax, strict=True):
        np.testing.assert_allclose(theirs, ours, atol=1e-12)


@pytest.mark.parametrize("mode", POOL_MODES)
def test_pool_verify_grad(mode):
    # Distinct, well-separated values: finite differences never flip a max.
    rng = np.random.default_rng(5)
    x = rng.permutation(np.arange(2 * 2 * 5 * 6, dtype=float)).reshape(2, 2, 5, 6) / 10
    verify_grad(lambda x_: pool2d(x_, (3, 2), (2, 1), (1, 1), True, mode), [x], rng=rng, mode=MODE)


def test_max_pool_routes_ties_to_first_and_second_order():
    x = pt.tensor4("x")
    y = pool2d(x, 2)
    gx = pytensor.grad(y.sum(), x)
    ones = np.ones((1, 1, 2, 2))
    np.testing.assert_array_equal(gx.eval({x: ones}, mode=MODE), [[[[1, 0], [0, 0]]]])
    # Gradient of the pooling gradient w.r.t. its output gradient: the argmax gather.
    g = pt.tensor4("g")
    gg = pytensor.grad((pytensor.grad((y * g).sum(), x) * x).sum(), g)
    x_val = np.arange(16.0).reshape(1, 1, 4, 4)[:, :, ::-1]
    np.testing.assert_array_equal(
        gg.eval({x: x_val, g: np.zeros((1, 1, 2, 2))}, mode=MODE), [[[[13, 15], [5, 7]]]]
    )


def test_pool_output_length_and_validation():
    assert pool_output_length(7, 3, 2, 0, False) == 3
    assert pool_output_length(7, 2, 3, 0, False) == 3
    assert pool_output_length(7, 3, 2, 1, True) == 4
    with pytest.raises(ValueError, match="ignore_border"):
        Pool2d(3, 2, 1, ignore_border=False)
    with pytest.raises(ValueError, match="smaller than the pool size"):
        Pool2d(2, padding=2)
