"""synkhronos.transport.shm within one process: segments, their growth, and array messages."""

from __future__ import annotations

import numpy as np
import pytest

from synkhronos.transport import shm
from synkhronos.transport.names import NAME_ATTEMPTS, NameTaken, new_session_name, sweep
from synkhronos.transport.shm import GrowingSegment, Mailbox, Segment, message_words


@pytest.fixture
def session():
    name = new_session_name()
    yield name
    sweep(name)


def test_mailbox_round_trip_and_growth(session, rng):
    header = np.zeros(message_words(4), np.int64)
    writer, reader = Mailbox(f"{session}_box", header), Mailbox(f"{session}_box", header)
    small = [rng.normal(size=(3, 2)), np.arange(5, dtype=np.int16), np.array(True)]
    writer.post(small)
    got = reader.read()
    assert [g.dtype for g in got] == [a.dtype for a in small]
    for g, a in zip(got, small, strict=True):
        np.testing.assert_array_equal(g, a)
    assert all(o % 64 == 0 for o in reader.offsets())
    generation = int(header[0])
    big = [rng.normal(size=(200, 50))]  # outgrows the segment: a new generation
    writer.post(big)
    assert int(header[0]) == generation + 1
    np.testing.assert_array_equal(reader.read()[0], big[0])
    writer.post([])
    assert reader.read() == []


def test_mailbox_refuses_too_many_arrays(session):
    box = Mailbox(f"{session}_box", np.zeros(message_words(2), np.int64))
    with pytest.raises(ValueError, match="more than 2 arrays"):
        box.post([np.zeros(1)] * 3)


def test_every_shared_dtype_travels_and_others_are_named(session):
    header = np.zeros(message_words(len(shm.DTYPES)), np.int64)
    arrays = [np.arange(7).astype(d).reshape(1, 7) for d in shm.DTYPES]
    Mailbox(f"{session}_box", header).post(arrays)
    got = Mailbox(f"{session}_box", header).read()
    assert [g.dtype for g in got] == list(shm.DTYPES)
    for g, a in zip(got, arrays, strict=True):
        np.testing.assert_array_equal(g, a)
    with pytest.raises(TypeError, match="arrays of dtype U3"):
        shm.dtype_code("U3")
    with pytest.raises(TypeError, match="output 2 has dtype object"):
        shm.check_travels(object, 1, "output 2")
    shm.check_travels("complex128", shm.MAX_NDIM, "x")
    with pytest.raises(ValueError, match="more than 8 dimensions"):
        Mailbox(f"{session}_b2", header).post([np.zeros((1,) * 9)])


def test_a_message_left_to_fill_is_read_as_filled(session, rng):
    header = np.zeros(message_words(2), np.int64)
    writer = Mailbox(f"{session}_box", header)
    want = [rng.normal(size=(4, 3)).astype(np.float32), np.zeros((0, 5))]
    views = writer.post([np.empty_like(w) for w in want], copy=False)
    views[0][...] = want[0]
    got = Mailbox(f"{session}_box", header).read()
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1].shape == (0, 5)


def test_segments_are_exclusive_and_refuse_more_than_dev_shm_holds(session):
    first = Segment(f"{session}_seg", 100, create=True, keep_fd=True)
    assert first.size >= 100 and first.fd is not None
    first.close_fd()
    assert first.fd is None
    with pytest.raises(NameTaken, match=f"{session}_seg"):
        Segment(f"{session}_seg", 100, create=True)
    first.array(np.int32, (4,))[...] = [1, 2, 3, 4]
    assert Segment(f"{session}_seg").array(np.int32, (4,)).tolist() == [1, 2, 3, 4]
    first.unlink()
    first.unlink()  # twice: no error
    with pytest.raises(shm.SharedMemoryFull, match="free; free space there"):
        Segment(f"{session}_huge", shm.free_bytes() + 2**30, create=True)


def test_growth_skips_taken_generations_and_gives_up_after_many(session):
    grow = GrowingSegment(f"{session}_g")
    with pytest.raises(RuntimeError, match="no segment reserved"):
        _ = grow.attached
    grow.reserve(100)
    assert grow.generation == 0 and grow.size >= 100
    grow.reserve(50)  # fits: same segment
    assert grow.generation == 0
    squatter = Segment(f"{session}_g_1", 64, create=True)
    grow.reserve(10_000)
    assert grow.generation == 2 and grow.size >= 10_000
    reader = GrowingSegment(f"{session}_g")
    reader.follow(2)
    assert reader.attached.size == grow.size
    for g in range(3, 3 + NAME_ATTEMPTS):
        Segment(f"{session}_g_{g}", 64, create=True)
    with pytest.raises(NameTaken, match="other name"):
        grow.reserve(100_000)
    assert grow.generation == 2  # the old segment stays in use
    grow.release()
    assert grow.size == 0
    squatter.unlink()
