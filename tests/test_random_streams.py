"""synkhronos.ops.random_streams: Theano's random streams, their distributions, seeds and
the default updates that advance them."""

from __future__ import annotations

import math

import numpy as np
import pytensor
import pytensor.tensor as pt

from synkhronos.ops.random_streams import RandomStreams, add_default_update

MODE = "FAST_COMPILE"
floatX = pytensor.config.floatX


def function(inputs, outputs):
    return pytensor.function(inputs, outputs, mode=MODE)


def test_distributions_and_their_updates():
    srng = RandomStreams(seed=11)
    x = pt.vector("x")
    n = 4000
    draws = [
        srng.uniform((n,), low=-1.0, high=3.0),
        srng.normal((n,), avg=1.0, std=2.0),
        srng.normal((n,), avg=1.0, std=2.0, truncate=True),
        srng.binomial(x.shape, p=0.3, dtype=floatX),
        srng.binomial((5,), n=4, p=0.5),
    ]
    f = function([x], draws)
    u, nrm, trunc, mask, counts = f(np.zeros(n))
    assert u.dtype == nrm.dtype == mask.dtype == floatX and counts.dtype == np.int64
    assert -1 <= u.min() and u.max() < 3 and abs(u.mean() - 1) < 5 * 4 / math.sqrt(12 * n)
    assert abs(nrm.mean() - 1) < 5 * 2 / math.sqrt(n) and abs(nrm.std() - 2) < 0.15
    # a normal cut at two deviations keeps 0.8796 of the deviation
    assert -3 <= trunc.min() and trunc.max() <= 5 and abs(trunc.std() - 2 * 0.8796) < 0.12
    assert set(np.unique(mask)) <= {0.0, 1.0} and abs(mask.mean() - 0.3) < 5 * math.sqrt(0.21 / n)
    assert set(np.unique(counts)) <= set(range(5))
    again = f(np.zeros(n))  # the default updates advance every generator
    assert all(
        not np.array_equal(a, b) for a, b in zip(again[:4], (u, nrm, trunc, mask), strict=True)
    )


def test_random_streams_seeds():
    def draws(srng):
        return function([], [srng.uniform((3,)), srng.normal((2,))])

    first = draws(RandomStreams(5))
    twin = draws(RandomStreams(5))
    a, b = first(), twin()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)  # same seed, same draws
    srng = RandomStreams(5)
    f = draws(srng)
    f()
    srng.seed()  # back to the construction seed
    for x, y in zip(f(), a, strict=True):
        np.testing.assert_array_equal(x, y)
    assert len(srng.updates()) == 2


def test_reseeding_repeats_a_new_streams_draws_and_updates_fit_their_variable():
    srng = RandomStreams(seed=1)
    f = function([], [srng.uniform((4,), dtype="float32"), srng.binomial((6,), n=3, p=0.5)])
    first = f()
    assert first[0].dtype == np.float32 and first[1].dtype == np.int64
    assert not np.array_equal(f()[0], first[0])
    srng.seed(9)
    fresh = RandomStreams(seed=9)
    want = function([], [fresh.uniform((4,), dtype="float32"), fresh.binomial((6,), n=3, p=0.5)])
    for a, b in zip(f(), want(), strict=True):
        np.testing.assert_array_equal(a, b)
    # An update whose static shape the variable leaves open (and of another dtype) fits it.
    v = pytensor.shared(np.zeros(3), shape=(None,))
    add_default_update(v, pt.ones((3,), dtype="int32") + v)
    g = function([], v.sum())
    g()
    g()
    np.testing.assert_array_equal(v.get_value(), [2.0, 2.0, 2.0])
