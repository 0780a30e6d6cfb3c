"""synkhronos.ops.conv.nd: 1-D and 3-D convolution and pooling, built of the 2-D Ops, against
direct sums and windows in numpy."""

from __future__ import annotations

import itertools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.ops.conv.nd import conv1d, conv3d, pool1d, pool3d

MODE = "FAST_COMPILE"


def _conv_ref(x, w, stride, padding, dilation, groups):
    """Cross-correlation over any number of spatial axes, by direct sums (symmetric padding)."""
    spatial = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0), *[(p, p) for p in padding]])
    o, cg = w.shape[:2]
    out = [
        (xp.shape[2 + a] - dilation[a] * (w.shape[2 + a] - 1) - 1) // stride[a] + 1
        for a in range(spatial)
    ]
    y = np.zeros((x.shape[0], o, *out))
    for f in range(o):
        g = f // (o // groups)
        for tap in itertools.product(*(range(k) for k in w.shape[2:])):
            index = tuple(
                slice(t * d, t * d + (n - 1) * s + 1, s)
                for t, d, n, s in zip(tap, dilation, out, stride, strict=True)
            )
            patch = xp[(slice(None), slice(g * cg, (g + 1) * cg), *index)]
            y[:, f] += np.tensordot(w[(f, slice(None), *tap)], patch, axes=([0], [1]))
    return y


def _pool_ref(x, ws, stride, pad, mode):
    """Pooling over the trailing axes, window by window (ignore_border, symmetric padding)."""
    spatial = len(ws)
    lengths = x.shape[2:]
    out = [(n + 2 * p - k) // s + 1 for n, k, s, p in zip(lengths, ws, stride, pad, strict=True)]
    y = np.zeros((*x.shape[:2], *out))
    for position in itertools.product(*(range(n) for n in out)):
        starts = [o * s - p for o, s, p in zip(position, stride, pad, strict=True)]
        index = tuple(
            slice(max(a, 0), min(a + k, n)) for a, k, n in zip(starts, ws, lengths, strict=True)
        )
        window = x[(slice(None), slice(None), *index)].reshape(*x.shape[:2], -1)
        if mode == "max":
            value = window.max(-1)
        elif mode == "average_exc_pad":
            value = window.mean(-1)
        else:
            value = window.sum(-1) / np.prod(ws)
        y[(slice(None), slice(None), *position)] = value
    assert spatial == x.ndim - 2
    return y


def test_convolutions_match_direct_sums(rng):
    x1, w1 = pt.tensor3("x1"), pt.tensor3("w1")
    x3, w3 = pt.tensor5("x3"), pt.tensor("w3", shape=(None, None, 2, None, None))
    outputs = [
        conv1d(x1, w1, stride=2, padding=(1,), dilation=2, groups=2),
        conv3d(x3, w3, stride=(2, 1, 2), padding=(1, 0, 1), dilation=(2, 1, 1), groups=2),
    ]
    values = [
        rng.standard_normal((2, 4, 11)),
        rng.standard_normal((6, 2, 3)),
        rng.standard_normal((2, 4, 5, 4, 6)),
        rng.standard_normal((4, 2, 2, 3, 2)),
    ]
    got = pytensor.function([x1, w1, x3, w3], outputs, mode=MODE)(*values)
    np.testing.assert_allclose(got[0], _conv_ref(*values[:2], (2,), (1,), (2,), 2), atol=1e-12)
    want = _conv_ref(*values[2:], (2, 1, 2), (1, 0, 1), (2, 1, 1), 2)
    np.testing.assert_allclose(got[1], want, atol=1e-12)
    # The gradients, through the folds and the 2-D gradient Ops: a convolution is linear in
    # x and in w, so <dL/dx, x> = <dL/dw, w> = L for L = <conv3d(x, w), g>.
    g = pt.tensor5("g")
    loss = (outputs[1] * g).sum()
    grads = pytensor.function([x3, w3, g], [loss, *pytensor.grad(loss, [x3, w3])], mode=MODE)
    total, gx, gw = grads(*values[2:], rng.standard_normal(want.shape))
    np.testing.assert_allclose([np.vdot(gx, values[2]), np.vdot(gw, values[3])], [total] * 2)


@pytest.mark.parametrize("mode", ["max", "average_inc_pad", "average_exc_pad"])
def test_pools_match_windows(mode, rng):
    x1, x3 = pt.tensor3("x1"), pt.tensor5("x3")
    pad3 = (1, 0, 1) if mode != "max" else (0, 0, 0)
    outputs = [
        pool1d(x1, 3, 2, 1, mode=mode),
        pool3d(x3, (2, 3, 2), (1, 2, 2), pad3, mode=mode),
    ]
    values = [rng.standard_normal((2, 3, 10)), rng.standard_normal((2, 2, 5, 7, 6))]
    got = pytensor.function([x1, x3], outputs, mode=MODE)(*values)
    np.testing.assert_allclose(got[0], _pool_ref(values[0], (3,), (2,), (1,), mode), atol=1e-12)
    want = _pool_ref(values[1], (2, 3, 2), (1, 2, 2), pad3, mode)
    np.testing.assert_allclose(got[1], want, atol=1e-12)


def test_unbordered_pool1d_and_refusals(rng):
    x = pt.tensor3("x")
    value = rng.standard_normal((1, 2, 7))
    got = pool1d(x, 3, ignore_border=False).eval({x: value}, mode=MODE)
    want = np.stack([value[..., 0:3].max(-1), value[..., 3:6].max(-1), value[..., 6]], -1)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="known depth"):
        conv3d(pt.tensor5("x"), pt.tensor5("w"))
    with pytest.raises(ValueError, match="stride must be an int or 3 ints"):
        conv3d(pt.tensor5("x"), np.ones((1, 1, 1, 1, 1)), stride=(1, 2))
