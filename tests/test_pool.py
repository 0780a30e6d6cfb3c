"""synkhronos.ops.pool: Theano's pool_2d and pool_3d (its arguments, defaults and border
rules) against pooling window by window in NumPy."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.ops import pool

MODE = "FAST_COMPILE"
floatX = pytensor.config.floatX


def function(inputs, outputs):
    return pytensor.function(inputs, outputs, mode=MODE)


def np_pool(x, ws, stride, pad, ignore_border, mode):
    """Theano's pooling of the trailing ``len(ws)`` axes, window by window."""
    n = len(ws)
    lengths = x.shape[-n:]

    def n_out(length, w, s, p):
        if ignore_border:
            return (length + 2 * p - w) // s + 1
        return (length - 1) // s + 1 if s >= w else max(0, (length - 1 - w + s) // s) + 1

    counts = [n_out(*a) for a in zip(lengths, ws, stride, pad, strict=True)]
    out = np.zeros((*x.shape[:-n], *counts))
    for pos in itertools.product(*[range(c) for c in counts]):
        starts = [o * s - p for o, s, p in zip(pos, stride, pad, strict=True)]
        inside = tuple(
            slice(max(b, 0), min(b + w, length))
            for b, w, length in zip(starts, ws, lengths, strict=True)
        )
        region = x[(Ellipsis, *inside)]
        flat = region.reshape(*region.shape[:-n], -1)
        if mode == "max":
            value = flat.max(axis=-1)
        elif mode == "sum":
            value = flat.sum(axis=-1)
        elif mode == "average_exc_pad":
            value = flat.mean(axis=-1)
        else:  # the window clipped to the padded input
            area = math.prod(
                min(b + w, length + p) - max(b, -p)
                for b, w, length, p in zip(starts, ws, lengths, pad, strict=True)
            )
            value = flat.sum(axis=-1) / area
        out[(Ellipsis, *pos)] = value
    return out


def test_pool_2d_modes_and_borders(rng):
    x4, x3 = pt.tensor4("x4"), pt.tensor3("x3")
    pool_2d = pool.pool_2d
    cases = [  # (input, kwargs, ws, stride, pad, ignore_border, mode)
        (x4, {"ws": (2, 3), "ignore_border": False}, (2, 3), (2, 3), (0, 0), False, "max"),
        (
            x4,
            {"ws": (2, 3), "stride": (1, 2), "ignore_border": False, "mode": "sum"},
            (2, 3),
            (1, 2),
            (0, 0),
            False,
            "sum",
        ),
        (
            x4,
            {
                "ws": (3, 3),
                "stride": (2, 2),
                "pad": (1, 1),
                "ignore_border": True,
                "mode": "average_inc_pad",
            },
            (3, 3),
            (2, 2),
            (1, 1),
            True,
            "average_inc_pad",
        ),
        (
            x4,
            {
                "ws": (3, 3),
                "stride": (2, 1),
                "pad": (1, 2),
                "ignore_border": True,
                "mode": "average_exc_pad",
            },
            (3, 3),
            (2, 1),
            (1, 2),
            True,
            "average_exc_pad",
        ),
        (
            x4,
            {"ws": (2, 2), "stride": (1, 1), "pad": (1, 1), "ignore_border": True, "mode": "sum"},
            (2, 2),
            (1, 1),
            (1, 1),
            True,
            "sum",
        ),
        (
            x3,
            {"ds": (2, 2), "st": (1, 3), "ignore_border": True, "mode": "max"},
            (2, 2),
            (1, 3),
            (0, 0),
            True,
            "max",
        ),
    ]
    f = function([x4, x3], [pool_2d(c[0], **c[1]) for c in cases])
    xv, x3v = rng.normal(size=(2, 3, 5, 7)), rng.normal(size=(3, 5, 7))
    for got, (var, _, ws, stride, pad, ib, mode) in zip(f(xv, x3v), cases, strict=True):
        want = np_pool(xv if var is x4 else x3v, ws, stride, pad, ib, mode)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    with pytest.warns(UserWarning, match="ignore_border"):
        pool_2d(x4, (2, 2))
    with pytest.raises(NotImplementedError, match="ignore_border=True"):
        pool_2d(x4, (2, 2), ignore_border=False, pad=(1, 1))
    with pytest.raises(ValueError, match="not both"):
        pool_2d(x4, (2, 2), ignore_border=True, ds=(2, 2))


def test_pool_3d(rng):
    x = pt.tensor5("x")
    pool_3d = pool.pool_3d
    f = function(
        [x],
        [
            pool_3d(x, (2, 2, 2), ignore_border=True),
            pool_3d(x, (2, 3, 2), ignore_border=False, mode="sum"),
        ],
    )
    xv = rng.normal(size=(1, 2, 4, 5, 3))
    got = f(xv)
    np.testing.assert_allclose(got[0], np_pool(xv, (2, 2, 2), (2, 2, 2), (0,) * 3, True, "max"))
    np.testing.assert_allclose(got[1], np_pool(xv, (2, 3, 2), (2, 3, 2), (0,) * 3, False, "sum"))
