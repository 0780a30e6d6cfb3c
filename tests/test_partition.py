"""Row partitioning, against plain numpy (no fork needed)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from synkhronos.transport.partition import selection_length, split_bounds, split_selection


@given(st.integers(0, 500), st.integers(1, 12))
def test_split_bounds_matches_array_split(n, parts):
    want = [len(p) for p in np.array_split(np.arange(n), parts)]
    bounds = split_bounds(n, parts)
    assert bounds[0] == 0 and bounds[-1] == n
    assert np.diff(bounds).tolist() == want


@settings(deadline=None)
@given(st.integers(0, 30), st.integers(0, 30), st.integers(1, 6), st.booleans())
def test_split_selection_keeps_rows_in_order(start, size, parts, as_index):
    sel = (
        np.arange(start, start + size, dtype=np.int64)[::-1].copy()
        if as_index
        else slice(start, start + size)
    )
    pieces = split_selection(sel, parts)
    assert len(pieces) == parts
    assert sum(selection_length(p) for p in pieces) == selection_length(sel)
    rows = np.arange(100)
    joined = np.concatenate([rows[p] for p in pieces])
    np.testing.assert_array_equal(joined, rows[sel])
