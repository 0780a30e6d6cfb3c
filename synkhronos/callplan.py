"""A checked function call, as rank 0 plans it and as it travels to the workers.

Rank 0 builds a :class:`CallPlan` from validated arguments, encodes it into arrays for the
command channel, and every worker decodes the same plan and picks its own rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .partition import Selection, split_bounds


@dataclass
class RankRows:
    """Rows for each rank: contiguous ranges, or one index array cut at ``bounds``."""

    ranges: np.ndarray | None = None  # (n_ranks, 2) int64 start, stop
    indices: np.ndarray | None = None  # int64, all ranks' rows concatenated
    bounds: np.ndarray | None = None  # (n_ranks + 1,) int64 cut points into indices

    @classmethod
    def split(cls, sel: Selection, n_ranks: int) -> RankRows:
        """Split one selection evenly (in order) across ranks."""
        if isinstance(sel, slice):
            cuts = [sel.start + c for c in split_bounds(sel.stop - sel.start, n_ranks)]
            return cls(ranges=np.array([cuts[:-1], cuts[1:]], np.int64).T)
        return cls(indices=np.asarray(sel, np.int64),
                   bounds=np.array(split_bounds(len(sel), n_ranks), np.int64))

    @classmethod
    def per_rank(cls, sels: list[Selection]) -> RankRows:
        """One selection given for each rank."""
        if all(isinstance(s, slice) for s in sels):
            return cls(ranges=np.array([[s.start, s.stop] for s in sels], np.int64))
        parts = [np.arange(s.start, s.stop) if isinstance(s, slice) else s for s in sels]
        lengths = [len(p) for p in parts]
        return cls(indices=np.concatenate(parts).astype(np.int64),
                   bounds=np.concatenate(([0], np.cumsum(lengths))).astype(np.int64))

    def for_rank(self, rank: int) -> Selection:
        if self.ranges is not None:
            return slice(int(self.ranges[rank, 0]), int(self.ranges[rank, 1]))
        return self.indices[self.bounds[rank]: self.bounds[rank + 1]]

    def encode(self) -> list[np.ndarray]:
        if self.ranges is not None:
            return [np.array([0], np.int64), self.ranges]
        return [np.array([1], np.int64), self.indices, self.bounds]

    @classmethod
    def decode(cls, arrays: list[np.ndarray]) -> tuple[RankRows, int]:
        """Decode from the front of ``arrays``; returns the rows and arrays consumed."""
        if arrays[0][0] == 0:
            return cls(ranges=arrays[1].copy()), 2
        return cls(indices=arrays[1].copy(), bounds=arrays[2].copy()), 3


@dataclass
class CallPlan:
    """One call of a synkhronos function, checked and ready to run on every rank.

    ``scatter`` and ``bcast`` hold, on rank 0, ``Data`` objects or arrays; after decoding
    on a worker they hold ``Data`` descriptors (int64 arrays) or arrays, with ``bcast_kinds``
    telling which (0: descriptor, 1: value).
    """

    fid: int
    num_slices: int
    subset: np.ndarray
    scatter: list
    offsets: np.ndarray
    rows: RankRows | None
    bcast: list
    bcast_kinds: np.ndarray
    s_rows: RankRows | None

    def encode(self) -> list[np.ndarray]:
        header = np.array([self.fid, self.num_slices, len(self.scatter), len(self.bcast),
                           self.rows is not None, self.s_rows is not None], np.int64)
        arrays = [header, self.subset, self.offsets]
        arrays += [d.descriptor() for d in self.scatter]
        arrays.append(self.bcast_kinds)
        arrays += [v.descriptor() if k == 0 else v
                   for v, k in zip(self.bcast, self.bcast_kinds, strict=True)]
        for rows in (self.rows, self.s_rows):
            if rows is not None:
                arrays += rows.encode()
        return arrays

    @classmethod
    def decode(cls, arrays: list[np.ndarray]) -> CallPlan:
        fid, num_slices, n_scatter, n_bcast, has_rows, has_s = (int(x) for x in arrays[0])
        subset, offsets = arrays[1].copy(), arrays[2].copy()
        pos = 3
        scatter = [a.copy() for a in arrays[pos: pos + n_scatter]]
        pos += n_scatter
        kinds = arrays[pos].copy()
        bcast = [a.copy() for a in arrays[pos + 1: pos + 1 + n_bcast]]
        pos += 1 + n_bcast
        rows = s_rows = None
        if has_rows:
            rows, used = RankRows.decode(arrays[pos:])
            pos += used
        if has_s:
            s_rows, _ = RankRows.decode(arrays[pos:])
        return cls(fid, num_slices, subset, scatter, offsets, rows, bcast, kinds,
                   s_rows)
