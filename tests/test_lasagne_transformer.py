"""Spatial transformers and NINLayer_c01b against independent NumPy/float64 references.

The reference samples pixel by pixel: grid point -> source point (affine matrix, or a
thin-plate spline solved with ``np.linalg.solve`` per sample) -> four neighbours with
the border rule -> bilinear weights.
"""

import itertools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.extensions.lasagne import init
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne.layers.cuda_convnet import NINLayer_c01b
from synkhronos.extensions.lasagne.layers.transformer import TPSTransformerLayer, TransformerLayer

MODE = "FAST_COMPILE"
SHAPE = (2, 3, 6, 7)
IDENTITY = np.array([1.0, 0, 0, 0, 1, 0])


def border(i, n, mode):
    if mode == "nearest":
        return min(max(i, 0), n - 1)
    if mode == "wrap":
        return i % n
    period = max(2 * (n - 1), 1)
    i %= period
    return period - i if i >= n else i


def sample(image, x, y, mode):
    """``image`` (C, H, W) at normalized (x, y), bilinear, by hand."""
    _, h, w = image.shape
    px, py = (x + 1) / 2 * (w - 1), (y + 1) / 2 * (h - 1)
    x0, y0 = int(np.floor(px)), int(np.floor(py))
    out = np.zeros(image.shape[0])
    for dy, dx in itertools.product((0, 1), (0, 1)):
        weight = (1 - abs(px - (x0 + dx))) * (1 - abs(py - (y0 + dy)))
        out += weight * image[:, border(y0 + dy, h, mode), border(x0 + dx, w, mode)]
    return out


def warp(x, mapping, out_hw, mode):
    """Output of a transformer whose sample ``b`` maps (xt, yt) to ``mapping(b, xt, yt)``."""
    oh, ow = out_hw
    out = np.zeros((x.shape[0], x.shape[1], oh, ow))
    for b, i, j in itertools.product(range(x.shape[0]), range(oh), range(ow)):
        xt = -1 + 2 * j / (ow - 1) if ow > 1 else -1.0
        yt = -1 + 2 * i / (oh - 1) if oh > 1 else -1.0
        out[b, :, i, j] = sample(x[b], *mapping(b, xt, yt), mode)
    return out


def affine_reference(x, theta, out_hw, mode="nearest"):
    a = theta.reshape(-1, 2, 3)
    return warp(x, lambda b, xt, yt: a[b] @ [xt, yt, 1.0], out_hw, mode)


def tps_reference(x, offsets, k, out_hw, mode="nearest"):
    side = int(round(np.sqrt(k)))
    sx, sy = (g.ravel() for g in np.meshgrid(np.linspace(-1, 1, side), np.linspace(-1, 1, side)))

    def u(r2):
        return r2 * np.log(r2) if r2 > 0 else 0.0

    # k point equations [1 x y | U(p, q)] then 3 side conditions [0 | 1; x; y]
    affine = np.stack([np.ones(k), sx, sy], axis=1)
    kernel = [[u((sx[p] - sx[q]) ** 2 + (sy[p] - sy[q]) ** 2) for q in range(k)] for p in range(k)]
    system = np.block([[affine, np.array(kernel)], [np.zeros((3, 3)), affine.T]])
    dest = offsets.reshape(-1, 2, k) + np.stack([sx, sy])
    coef = [[np.linalg.solve(system, np.r_[d, 0, 0, 0]) for d in dest_b] for dest_b in dest]

    def mapping(b, xt, yt):
        basis = np.r_[1.0, xt, yt, [u((xt - sx[q]) ** 2 + (yt - sy[q]) ** 2) for q in range(k)]]
        return [c @ basis for c in coef[b]]

    return warp(x, mapping, out_hw, mode)


def constant_loc(l_in, values):
    """A localization network whose output is ``values`` for every sample (b = values)."""
    return L.DenseLayer(l_in, len(values), W=init.Constant(0.0), b=values, nonlinearity=None)


def run(layer, l_in, x):
    out = L.get_output(layer)
    return pytensor.function([l_in.input_var], out, mode=MODE)(x)


@pytest.mark.parametrize("mode", ["nearest", "mirror", "wrap"])
def test_affine_matches_reference(mode, rng):
    x = rng.standard_normal(SHAPE)
    theta = IDENTITY * 1.4 + rng.uniform(-0.3, 0.3, 6)  # reaches outside the image
    l_in = L.InputLayer((None, *SHAPE[1:]))
    layer = TransformerLayer(l_in, constant_loc(l_in, theta), border_mode=mode)
    expected = affine_reference(x, np.tile(theta, 2), SHAPE[2:], mode)
    np.testing.assert_allclose(run(layer, l_in, x), expected, rtol=1e-10, atol=1e-10)


def test_identity_translation_scale(rng):
    x = rng.standard_normal(SHAPE)
    l_in = L.InputLayer((None, *SHAPE[1:]))
    shift = IDENTITY + [0, 0, 2 / 6, 0, 0, 0]  # one column right (7 columns: step 2/6)
    scale = IDENTITY * [0.5, 1, 1, 1, 1, 1]  # x_s = x_t / 2: columns 1.5, 2, 2.5, ...
    ident, shifted, scaled = (
        run(TransformerLayer(l_in, constant_loc(l_in, t)), l_in, x)
        for t in (IDENTITY, shift, scale)
    )
    np.testing.assert_allclose(ident, x, atol=1e-12)
    np.testing.assert_allclose(shifted[..., :-1], x[..., 1:], atol=1e-12)
    np.testing.assert_allclose(shifted[..., -1], x[..., -1], atol=1e-12)  # clipped edge
    np.testing.assert_allclose(scaled[..., 1::2], x[..., 2:5], atol=1e-12)
    np.testing.assert_allclose(scaled[..., 0], (x[..., 1] + x[..., 2]) / 2, atol=1e-12)


def test_downsample_factor_shapes_and_values(rng):
    x = rng.standard_normal(SHAPE)
    l_in = L.InputLayer((None, *SHAPE[1:]))
    down = TransformerLayer(l_in, constant_loc(l_in, IDENTITY), downsample_factor=2)
    assert down.output_shape == (None, 3, 3, 3)
    out = run(down, l_in, x)  # rows 0, 2.5, 5 of 6; columns 0, 3, 6 of 7
    np.testing.assert_allclose(out[:, :, 0], x[:, :, 0, ::3], atol=1e-12)
    np.testing.assert_allclose(out[:, :, 1], (x[:, :, 2, ::3] + x[:, :, 3, ::3]) / 2, atol=1e-12)
    up = TransformerLayer(l_in, constant_loc(l_in, IDENTITY), downsample_factor=(0.5, 1))
    assert up.output_shape == (None, 3, 12, 7)
    assert run(up, l_in, x).shape == (2, 3, 12, 7)
    free = TransformerLayer(L.InputLayer((None, 3, None, None)), constant_loc(l_in, IDENTITY))
    assert free.output_shape == (None, 3, None, None)
    with pytest.raises(ValueError, match="localization"):
        TransformerLayer(l_in, constant_loc(l_in, np.zeros(5)))
    with pytest.raises(ValueError, match="border_mode"):
        TransformerLayer(l_in, constant_loc(l_in, IDENTITY), border_mode="zero")


def test_tps_identity_and_reference(rng):
    x = rng.standard_normal(SHAPE)
    l_in = L.InputLayer((None, *SHAPE[1:]))
    ident = TPSTransformerLayer(l_in, constant_loc(l_in, np.zeros(8)), control_points=4)
    assert ident.precompute_grid
    np.testing.assert_allclose(run(ident, l_in, x), x, atol=1e-10)
    offsets = rng.uniform(-0.3, 0.3, 18)
    expected = tps_reference(x, np.tile(offsets, 2), 9, (3, 7), "mirror")
    for precompute in (True, False):
        layer = TPSTransformerLayer(
            l_in, constant_loc(l_in, offsets), downsample_factor=(2, 1), control_points=9,
            precompute_grid=precompute, border_mode="mirror",
        )  # fmt: skip
        np.testing.assert_allclose(run(layer, l_in, x), expected, rtol=1e-9, atol=1e-9)
    free = L.InputLayer((None, 3, None, None))
    with pytest.raises(ValueError, match="precompute_grid"):
        TPSTransformerLayer(
            free, constant_loc(l_in, offsets), control_points=9, precompute_grid=True
        )
    assert not TPSTransformerLayer(
        free, constant_loc(l_in, offsets), control_points=9
    ).precompute_grid
    with pytest.raises(ValueError, match="perfect square"):
        TPSTransformerLayer(l_in, constant_loc(l_in, np.zeros(12)), control_points=6)


@pytest.mark.parametrize("kind", ["affine", "tps"])
def test_gradient_wrt_localization_params(kind, rng):
    """d sum(out * R) / d (W, b) of a pooled-dense localization net, by central differences."""
    x = rng.standard_normal(SHAPE)
    l_in = L.InputLayer((None, *SHAPE[1:]))
    pooled = L.GlobalPoolLayer(l_in)
    n = 6 if kind == "affine" else 8
    b0 = IDENTITY * 0.9 + 0.05 if kind == "affine" else rng.uniform(-0.2, 0.2, n)
    loc = L.DenseLayer(pooled, n, W=rng.uniform(-0.2, 0.2, (3, n)), b=b0, nonlinearity=None)
    layer = (TransformerLayer if kind == "affine" else TPSTransformerLayer)(
        l_in, loc, **({} if kind == "affine" else {"control_points": 4})
    )
    weights = rng.standard_normal((2, *layer.output_shape[1:]))
    cost = pt.sum(L.get_output(layer) * weights)
    grads = pytensor.function([l_in.input_var], pytensor.grad(cost, [loc.W, loc.b]), mode=MODE)(x)

    def reference(w, b):
        params = x.mean(axis=(2, 3)) @ w + b
        if kind == "affine":
            return np.sum(affine_reference(x, params, SHAPE[2:]) * weights)
        return np.sum(tps_reference(x, params, 4, SHAPE[2:]) * weights)

    values = [loc.W.get_value(), loc.b.get_value()]
    eps = 1e-6
    for which, (got, value) in enumerate(zip(grads, values, strict=True)):
        expected = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            plus, minus = [v.copy() for v in values], [v.copy() for v in values]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            expected[idx] = (reference(*plus) - reference(*minus)) / (2 * eps)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("untie_biases", [False, True])
def test_nin_c01b_equals_nin_on_bc01(untie_biases, rng):
    x = rng.standard_normal((2, 3, 4, 5))
    w = rng.standard_normal((3, 6))
    b_shape = (6, 4, 5) if untie_biases else (6,)
    b = rng.standard_normal(b_shape)
    nin = L.NINLayer(L.InputLayer((None, 3, 4, 5)), 6, untie_biases, W=w, b=b)
    c01b = NINLayer_c01b(L.InputLayer((3, 4, 5, None)), 6, untie_biases, W=w.T, b=b)
    assert c01b.output_shape == (6, 4, 5, None)
    xv = pt.tensor4()
    got, expected = pytensor.function(
        [xv],
        [
            L.get_output(c01b, xv.dimshuffle(1, 2, 3, 0)).dimshuffle(3, 0, 1, 2),
            L.get_output(nin, xv),
        ],
        mode=MODE,
    )(x)
    np.testing.assert_allclose(got, expected, atol=1e-12)
    no_bias = NINLayer_c01b((3, 4, 5, None), 6, b=None)
    assert no_bias.b is None and no_bias.get_params() == [no_bias.W]
