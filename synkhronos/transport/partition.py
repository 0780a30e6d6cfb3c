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


def resolve_rows(spec, length: int | None, what: str) -> Selection:
    """A ``batch``/``batch_s`` value as a selection of rows (slice or int64 indices).

    ``length`` is the number of rows the selection refers to (None if unknown: then
    slices need explicit bounds). Raises ``TypeError``/``ValueError`` naming ``what``.
    """
    if isinstance(spec, (bool, np.bool_)):
        raise TypeError(f"{what} must be an int, a slice or an index array, not a bool")
    if isinstance(spec, (int, np.integer)):
        n = int(spec)
        if n < 0 or (length is not None and n > length):
            raise ValueError(f"{what}={n} is outside 0..{length}")
        return slice(0, n)
    if isinstance(spec, slice):
        return _slice_rows(spec, length, what)
    return _index_rows(spec, length, what)


def _slice_rows(spec: slice, length: int | None, what: str) -> Selection:
    """A slice of rows: a view when its step is 1, else its indices."""
    if length is None:
        if spec.stop is None or (spec.start or 0) < 0 or spec.stop < 0:
            raise ValueError(f"{what}: give explicit non-negative slice bounds for minibatch data")
        length = spec.stop
    for bound in (spec.start, spec.stop):
        if bound is not None and not -length <= bound <= length:
            raise ValueError(f"{what}: slice bound {bound} is outside the {length} rows")
    start, stop, step = spec.indices(length)
    if step == 1:
        return slice(start, max(start, stop))
    return np.arange(start, stop, step, dtype=np.int64)


def _index_rows(spec, length: int | None, what: str) -> np.ndarray:
    """An index array or boolean mask of rows, as int64 indices checked against ``length``."""
    try:
        index = np.asarray(spec)
    except Exception as e:  # noqa: BLE001 - any failure means an unusable index
        raise TypeError(f"{what} must be an int, a slice or an index array") from e
    if index.dtype == bool:
        if index.ndim != 1 or (length is not None and len(index) != length):
            raise ValueError(f"{what}: a boolean mask must be 1-D with {length} entries")
        return np.flatnonzero(index).astype(np.int64)
    if index.ndim != 1 or (index.size and index.dtype.kind not in "iu"):
        raise TypeError(
            f"{what} must be a 1-D array of integer row indices, got dtype "
            f"{index.dtype} and {index.ndim} dimensions"
        )
    index = index.astype(np.int64)
    if index.size and index.min() < 0:
        raise ValueError(f"{what}: negative row indices are not supported")
    if index.size and length is not None and index.max() >= length:
        raise ValueError(f"{what}: row index {index.max()} is out of range for {length} rows")
    return index
