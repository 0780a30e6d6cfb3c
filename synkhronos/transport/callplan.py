"""A checked function call, as rank 0 plans it and as it travels to the workers.

Rank 0 builds a :class:`CallPlan` from validated arguments, encodes it into arrays for the
command channel, and every worker decodes the same plan and picks its own rows.

The first array is one int64 vector of *words*::

    fid, num_slices, n_subset, n_scatter, n_bcast,
    subset[n_subset], by_position[n_scatter],
    per scattered input:  n, descriptor[n]              (a Data descriptor)
    per broadcast input:  Arg.DATA, n, descriptor[n]    or  Arg.VALUE  or  Arg.ROWS, n
    rows:                 a rows description (below)
    s_rows:               a rows description

A rows description is ``Rows.NONE``, or ``Rows.RANGES, n_ranks, (start, stop) * n_ranks``,
or ``Rows.INDICES, n_ranks + 1, bounds[n_ranks + 1]`` with the index array sent as an
array of its own. The arrays after the words are the index arrays (rows, then s_rows,
where present), then the values of the ``Arg.VALUE`` broadcast inputs in order.

Examples
--------
>>> import numpy as np
>>> rows = RankRows.split(slice(0, 7), 2)
>>> plan = CallPlan(fid=3, num_slices=1, subset=np.array([0]), scatter=[], by_position=np.array(
...     [], np.int64), rows=rows, bcast=[np.float64(2.0)], bcast_kinds=np.array([Arg.VALUE]),
...     s_rows=None)
>>> arrays = plan.encode()
>>> arrays[0].tolist()
[3, 1, 1, 0, 1, 0, 1, 0, 2, 0, 4, 4, 7, -1]
>>> back = CallPlan.decode(arrays)
>>> back.rows.for_rank(1), float(back.bcast[0])
(slice(4, 7, None), 2.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from synkhronos.transport.partition import Selection, split_bounds
from synkhronos.transport.protocol import Arg, Rows

# The markers as plain ints: enum attribute lookups would cost each call microseconds.
_DATA, _VALUE, _ROWS = int(Arg.DATA), int(Arg.VALUE), int(Arg.ROWS)
_NONE, _RANGES, _INDICES = int(Rows.NONE), int(Rows.RANGES), int(Rows.INDICES)


_NO_INDICES = np.zeros(0, np.int64)
_NO_INDICES.flags.writeable = False


@dataclass
class RankRows:
    """Rows for each rank: contiguous ``ranges``, or (``ranges`` None) one index array cut
    at ``bounds``."""

    ranges: np.ndarray | None = None  # (n_ranks, 2) int64 start, stop
    # int64, all ranks' rows concatenated; and (n_ranks + 1,) int64 cut points into them
    indices: np.ndarray = field(default_factory=lambda: _NO_INDICES)
    bounds: np.ndarray = field(default_factory=lambda: _NO_INDICES)

    @classmethod
    def split(cls, sel: Selection, n_ranks: int) -> RankRows:
        """Split one selection evenly (in order) across ranks."""
        if isinstance(sel, slice):
            cuts = [sel.start + c for c in split_bounds(sel.stop - sel.start, n_ranks)]
            return cls(ranges=np.array([cuts[:-1], cuts[1:]], np.int64).T)
        return cls(
            indices=np.asarray(sel, np.int64),
            bounds=np.array(split_bounds(len(sel), n_ranks), np.int64),
        )

    @classmethod
    def per_rank(cls, sels: list[Selection]) -> RankRows:
        """One selection given for each rank."""
        slices = [s for s in sels if isinstance(s, slice)]
        if len(slices) == len(sels):
            return cls(ranges=np.array([[s.start, s.stop] for s in slices], np.int64))
        parts = [np.arange(s.start, s.stop) if isinstance(s, slice) else s for s in sels]
        lengths = [len(p) for p in parts]
        return cls(
            indices=np.concatenate(parts).astype(np.int64),
            bounds=np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
        )

    def positions(self, rank: int) -> slice:
        """Where ``rank``'s rows sit within the whole selection (0 is its first row)."""
        if self.ranges is not None:
            base = int(self.ranges[0, 0])
            return slice(int(self.ranges[rank, 0]) - base, int(self.ranges[rank, 1]) - base)
        return slice(int(self.bounds[rank]), int(self.bounds[rank + 1]))

    def for_rank(self, rank: int) -> Selection:
        if self.ranges is not None:
            return slice(int(self.ranges[rank, 0]), int(self.ranges[rank, 1]))
        return self.indices[self.bounds[rank] : self.bounds[rank + 1]]

    def encode(self, words: list[int], arrays: list[np.ndarray]) -> None:
        """Append the description to ``words`` and any index array to ``arrays``."""
        if self.ranges is not None:
            words += [_RANGES, len(self.ranges), *self.ranges.ravel().tolist()]
        else:
            words += [_INDICES, len(self.bounds), *self.bounds.tolist()]
            arrays.append(self.indices)

    @classmethod
    def decode(cls, words: list[int], pos: int, arrays: list[np.ndarray]) -> tuple[RankRows, int]:
        """Decode from ``words`` at ``pos`` (index arrays are taken from the front of
        ``arrays``); returns the rows and the position after them."""
        kind, n = words[pos], words[pos + 1]
        pos += 2
        if kind == _RANGES:
            ranges = np.array(words[pos : pos + 2 * n], np.int64).reshape(n, 2)
            return cls(ranges=ranges), pos + 2 * n
        bounds = np.array(words[pos : pos + n], np.int64)
        return cls(indices=arrays.pop(0).copy(), bounds=bounds), pos + n


@dataclass
class CallPlan:
    """One call of a synkhronos function, checked and ready to run on every rank.

    ``scatter`` and ``bcast`` hold, on rank 0, ``Data`` objects or arrays; after decoding
    on a worker they hold ``Data`` descriptors (lists of int) or arrays, with ``bcast_kinds``
    telling which (:class:`~synkhronos.transport.protocol.Arg`). The word layout is in the module
    docstring.
    """

    fid: int
    num_slices: int
    subset: np.ndarray
    scatter: list
    by_position: np.ndarray  # per scattered input, 1: minibatch data read by position
    rows: RankRows | None
    bcast: list
    bcast_kinds: np.ndarray
    s_rows: RankRows | None

    def encode(self) -> list[np.ndarray]:
        """The plan as arrays for the command channel: one int64 vector of everything small
        (a message of few arrays is cheaper to post and read), then index arrays and the
        broadcast values."""
        words = [
            self.fid,
            self.num_slices,
            len(self.subset),
            len(self.scatter),
            len(self.bcast),
            *self.subset.tolist(),
            *self.by_position.tolist(),
        ]
        for d in self.scatter:
            desc = d.descriptor()
            words += [len(desc), *desc.tolist()]
        arrays: list[np.ndarray] = []
        values = []
        for v, k in zip(self.bcast, self.bcast_kinds.tolist(), strict=True):
            if k == _DATA:
                desc = v.descriptor()
                words += [_DATA, len(desc), *desc.tolist()]
            elif k == _ROWS:  # zeros: their length alone travels
                words += [_ROWS, len(v)]
            else:
                words.append(_VALUE)
                values.append(v)
        for rows in (self.rows, self.s_rows):
            if rows is None:
                words.append(_NONE)
            else:
                rows.encode(words, arrays)
        return [np.array(words, np.int64), *arrays, *values]

    @classmethod
    def decode(cls, arrays: list[np.ndarray]) -> CallPlan:
        """The plan :meth:`encode` wrote into ``arrays`` (as a worker reads them).

        ``Data`` entries come back as descriptors (lists of int), which the worker resolves
        into views of shared memory; index arrays and broadcast values are copied out of
        the message, whose mailbox the next command overwrites.
        """
        words, rest = arrays[0].tolist(), list(arrays[1:])
        fid, num_slices, n_subset, n_scatter, n_bcast = words[:5]
        pos = 5
        subset = np.array(words[pos : pos + n_subset], np.int64)
        pos += n_subset
        by_position = np.array(words[pos : pos + n_scatter], np.int64)
        pos += n_scatter
        scatter = []
        for _ in range(n_scatter):
            n = words[pos]
            scatter.append(words[pos + 1 : pos + 1 + n])
            pos += 1 + n
        kinds, bcast = [], []
        for _ in range(n_bcast):
            kinds.append(words[pos])
            if words[pos] == _DATA:
                n = words[pos + 1]
                bcast.append(words[pos + 2 : pos + 2 + n])
                pos += 2 + n
            elif words[pos] == _ROWS:
                bcast.append(np.zeros(words[pos + 1], np.int8))
                pos += 2
            else:
                bcast.append(None)  # a value: filled in below, after any index arrays
                pos += 1
        found: list[RankRows | None] = []
        for _ in range(2):
            if words[pos] == _NONE:
                found.append(None)
                pos += 1
            else:
                rows, pos = RankRows.decode(words, pos, rest)
                found.append(rows)
        bcast = [
            rest.pop(0).copy() if k == _VALUE else b for b, k in zip(bcast, kinds, strict=True)
        ]
        return cls(
            fid,
            num_slices,
            subset,
            scatter,
            by_position,
            found[0],
            bcast,
            np.array(kinds, np.int64),
            found[1],
        )
