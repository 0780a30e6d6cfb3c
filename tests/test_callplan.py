"""CallPlan and RankRows: what rank 0 encodes, every worker decodes (no fork needed)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from synkhronos.transport.callplan import CallPlan, RankRows
from synkhronos.transport.partition import selection_length
from synkhronos.transport.protocol import Arg, Rows


class FakeData:
    """Stands for a ``Data``: only its descriptor travels."""

    def __init__(self, words: list[int]):
        self.words = words

    def descriptor(self) -> np.ndarray:
        return np.array(self.words, np.int64)


words = st.lists(st.integers(0, 2**40), min_size=3, max_size=6)


@st.composite
def selections(draw, n_max: int = 40):
    if draw(st.booleans()):
        start = draw(st.integers(0, n_max))
        return slice(start, start + draw(st.integers(0, n_max)))
    return np.array(draw(st.lists(st.integers(0, n_max), max_size=n_max)), np.int64)


@st.composite
def rank_rows(draw, n_ranks: int):
    if draw(st.booleans()):
        return RankRows.split(draw(selections()), n_ranks)
    return RankRows.per_rank([draw(selections()) for _ in range(n_ranks)])


def _rows_of(rows: RankRows | None, n_ranks: int) -> list:
    if rows is None:
        return [None] * n_ranks
    out = []
    for r in range(n_ranks):
        sel = rows.for_rank(r)
        out.append((sel.start, sel.stop) if isinstance(sel, slice) else sel.tolist())
    return out


@st.composite
def plans(draw):
    n_ranks = draw(st.integers(1, 4))
    n_scatter = draw(st.integers(0, 3))
    kinds = draw(st.lists(st.sampled_from([Arg.DATA, Arg.VALUE, Arg.ROWS]), max_size=4))
    bcast = [
        FakeData(draw(words))
        if k == Arg.DATA
        else np.zeros(draw(st.integers(0, 300)), np.int8)  # a row count: its length travels
        if k == Arg.ROWS
        else np.array(draw(st.lists(st.floats(-1e6, 1e6), max_size=5)), np.float32)
        for k in kinds
    ]
    plan = CallPlan(
        fid=draw(st.integers(0, 1000)),
        num_slices=draw(st.integers(1, 8)),
        subset=np.array(draw(st.lists(st.integers(0, 20), max_size=6)), np.int64),
        scatter=[FakeData(draw(words)) for _ in range(n_scatter)],
        by_position=np.array(
            draw(st.lists(st.integers(0, 1), min_size=n_scatter, max_size=n_scatter)), np.int64
        ),
        rows=draw(rank_rows(n_ranks)) if n_scatter and draw(st.booleans()) else None,
        bcast=bcast,
        bcast_kinds=np.array(kinds, np.int64),
        s_rows=draw(rank_rows(n_ranks)) if draw(st.booleans()) else None,
    )
    return plan, n_ranks


@settings(max_examples=150, deadline=None)
@given(plans())
def test_decode_inverts_encode(drawn):
    plan, n_ranks = drawn
    back = CallPlan.decode(plan.encode())
    assert (back.fid, back.num_slices) == (plan.fid, plan.num_slices)
    assert back.subset.tolist() == plan.subset.tolist()
    assert back.by_position.tolist() == plan.by_position.tolist()
    assert back.scatter == [d.words for d in plan.scatter]
    assert back.bcast_kinds.tolist() == plan.bcast_kinds.tolist()
    for got, sent, kind in zip(back.bcast, plan.bcast, plan.bcast_kinds, strict=True):
        if kind == Arg.DATA:
            assert got == sent.words
        else:
            assert got.dtype == sent.dtype and got.tolist() == sent.tolist()
    for mine, theirs in ((back.rows, plan.rows), (back.s_rows, plan.s_rows)):
        assert _rows_of(mine, n_ranks) == _rows_of(theirs, n_ranks)


@settings(max_examples=100, deadline=None)
@given(selections(), st.integers(1, 5))
def test_split_gives_every_row_once_in_order(sel, n_ranks):
    rows = RankRows.split(sel, n_ranks)
    parts = [rows.for_rank(r) for r in range(n_ranks)]
    whole = np.arange(sel.start, sel.stop) if isinstance(sel, slice) else sel
    joined = np.concatenate(
        [np.arange(p.start, p.stop) if isinstance(p, slice) else p for p in parts]
    )
    assert joined.tolist() == whole.tolist()
    sizes = [selection_length(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_decoded_arrays_do_not_alias_the_message():
    # The mailbox is overwritten by the next command: decode must copy what it keeps.
    plan = CallPlan(
        0,
        1,
        np.array([0]),
        [],
        np.array([], np.int64),
        None,
        [np.ones(3)],
        np.array([Arg.VALUE]),
        RankRows.split(np.array([4, 1, 3], np.int64), 2),
    )
    arrays = plan.encode()
    back = CallPlan.decode(arrays)
    for a in arrays[1:]:
        a[...] = -7
    assert back.bcast[0].tolist() == [1.0, 1.0, 1.0]
    assert back.s_rows.for_rank(0).tolist() == [4, 1]


def test_word_layout_marks_rows():
    plan = CallPlan(
        5,
        2,
        np.array([1]),
        [],
        np.array([], np.int64),
        None,
        [],
        np.array([], np.int64),
        RankRows.per_rank([slice(0, 3), slice(2, 4)]),
    )
    assert plan.encode()[0].tolist() == [5, 2, 1, 0, 0, 1, Rows.NONE, Rows.RANGES, 2, 0, 3, 2, 4]
