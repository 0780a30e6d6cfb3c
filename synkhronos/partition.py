"""How rows are split: across ranks, and within a rank across slices.

A *selection* of rows is either a ``slice`` with step 1 (a zero-copy view) or a 1-D int64
index array (a gather copy).
"""

from __future__ import annotations

import numpy as np

Selection = slice | np.ndarray


def split_bounds(n: int, parts: int) -> list[int]:
    """Boundaries splitting ``n`` rows into ``parts`` contiguous pieces as evenly as possible.

    The first ``n % parts`` pieces get one row more, as in ``numpy.array_split``.

    Examples
    --------
    >>> split_bounds(7, 3)
    [0, 3, 5, 7]
    """
    size, extra = divmod(n, parts)
    return [i * size + min(i, extra) for i in range(parts + 1)]


def selection_length(sel: Selection) -> int:
    """Number of rows a selection picks."""
    if isinstance(sel, slice):
        return sel.stop - sel.start
    return len(sel)


def split_selection(sel: Selection, parts: int) -> list[Selection]:
    """Split a selection into ``parts`` consecutive pieces (some may be empty)."""
    if parts == 1:
        return [sel]
    bounds = split_bounds(selection_length(sel), parts)
    pieces = zip(bounds[:-1], bounds[1:], strict=True)
    if isinstance(sel, slice):
        return [slice(sel.start + a, sel.start + b) for a, b in pieces]
    return [sel[a:b] for a, b in pieces]


def shift(sel: Selection, offset: int) -> Selection:
    """The selection moved down by ``offset`` rows (minibatch data starts at its lowest row)."""
    if offset == 0:
        return sel
    if isinstance(sel, slice):
        return slice(sel.start - offset, sel.stop - offset)
    return sel - offset

