"""synkhronos.ops.conv.geometry: output lengths (against counting windows) and the
normalising of int-or-tuple arguments."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.ops.conv.geometry import (
    conv_output_length,
    int_tuple,
    padding_pairs,
    pool_output_length,
    pool_output_length_int,
)


def _windows(length, size, stride, pad, ignore_border):
    """Windows counted one by one. With ``ignore_border``: those within the padded input.
    Without (no padding): from 0, until one reaches the input's end or starts past it."""
    if ignore_border:
        return len(range(-pad, length + pad - size + 1, stride))
    count, start = 0, 0
    while start < length:
        count += 1
        if start + size >= length:
            break
        start += stride
    return count


def test_pool_lengths_count_the_windows():
    for length in range(1, 12):
        for size in range(1, 5):
            for stride in range(1, 5):
                for pad in range(size):
                    if length + 2 * pad >= size:  # else no window fits (an error later)
                        want = _windows(length, size, stride, pad, True)
                        assert pool_output_length(length, size, stride, pad, True) == want
                want = _windows(length, size, stride, 0, False)
                assert pool_output_length(length, size, stride, 0, False) == want


def test_symbolic_lengths_agree_with_the_ints():
    n = pt.iscalar("n")
    lengths = range(1, 10)
    cases = [(3, 2), (2, 3), (4, 1)]
    f = pytensor.function(
        [n],
        [pool_output_length(n, size, stride, 0, False) for size, stride in cases]
        + [conv_output_length(n, 3, 2, 1, 2, 2)],
        mode="FAST_COMPILE",
    )
    for k in lengths:
        *pools, conv = (int(v) for v in f(k))
        assert pools == [
            pool_output_length_int(k, size, stride, 0, False) for size, stride in cases
        ]
        want = len(range(0, k + 3 - 2 * (3 - 1), 2))  # positions of a dilated 3-tap filter
        assert conv == conv_output_length(k, 3, 2, 1, 2, 2) == want


def test_int_tuples_and_padding_pairs():
    assert int_tuple(np.int32(2), 3, "ws") == (2, 2, 2)
    assert int_tuple([np.int64(1), 2], 2, "stride") == (1, 2)
    with pytest.raises(ValueError, match="stride must be an int or 2 ints, got \\(1, 2, 3\\)"):
        int_tuple((1, 2, 3), 2, "stride")
    assert padding_pairs(np.int8(1)) == ((1, 1), (1, 1))
    assert padding_pairs((1, 2)) == ((1, 1), (2, 2))
    assert padding_pairs(((0, 1), (2, 3))) == ((0, 1), (2, 3))
    with pytest.raises(ValueError, match="padding"):
        padding_pairs(((0, 1, 2), 3))
