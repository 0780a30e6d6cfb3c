"""``synk.data`` (synkhronos.transport.shared_arrays): shared-memory arrays, without workers."""

import numpy as np
import pytest

import synkhronos as synk
from synkhronos.transport import shared_arrays
from synkhronos.transport.names import process_prefix


def test_value_roundtrip_and_views():
    value = np.arange(12, dtype="float32").reshape(4, 3)
    d = synk.data(value, name="x")
    assert d.shape == (4, 3) and d.ndim == 2 and d.size == 12 and len(d) == 4
    assert d.dtype == np.float32 and d.name == "x" and not d.minibatch
    np.testing.assert_array_equal(d.data, value)
    np.testing.assert_array_equal(d[1:3], value[1:3])
    d[0] = -1
    assert d.data[0].tolist() == [-1, -1, -1]
    np.testing.assert_array_equal(np.asarray(d), d.data)


def test_shape_allocates_zeros_and_default_dtype():
    import pytensor

    d = synk.data(shape=(5, 2))
    assert d.dtype == np.dtype(pytensor.config.floatX)
    assert d.shape == (5, 2) and not d.data.any()


def test_set_value_reallocates_only_when_larger():
    d = synk.data(np.zeros((10, 2)), oversize=2.0)
    first = d.alloc_size
    assert first >= 10 * 2 * 2  # elements, as the original counted them
    d.set_value(np.ones((15, 2)))
    assert d.alloc_size == first and d.shape == (15, 2)
    d.set_value(np.ones((100, 2)), oversize=1.0)
    assert d.alloc_size >= 100 * 2 and d.shape == (100, 2)
    assert d.data.sum() == 200


def test_set_length_and_shape_keep_contents():
    d = synk.data(np.arange(6.0).reshape(3, 2))
    d.set_length(2)
    assert d.data.tolist() == [[0, 1], [2, 3]]
    d.set_length(50)
    assert d.shape == (50, 2) and d.data[:2].tolist() == [[0, 1], [2, 3]]
    d.set_shape((4, 25))
    assert d.data[0, :4].tolist() == [0, 1, 2, 3]


def test_casting_rules():
    d = synk.data(np.zeros(3, dtype="float32"))
    d.set_value(np.arange(3, dtype="int8"))  # safe cast is fine
    with pytest.raises(TypeError, match="force_cast"):
        d.set_value(np.zeros(3, dtype="float64"))
    d.set_value(np.full(3, 0.5, dtype="float64"), force_cast=True)
    assert d.data.tolist() == [0.5] * 3
    with pytest.raises(TypeError, match="force_cast"):
        synk.data(np.zeros(2), dtype="int32")
    assert synk.data(np.zeros(2), dtype="int32", force_cast=True).dtype == np.int32


def test_free_memory():
    d = synk.data(np.ones((4, 2)))
    d.free_memory()
    assert len(d) == 0
    d.set_value(np.ones((3, 2)))
    assert d.data.sum() == 6


def test_unsupported_dtype():
    with pytest.raises(TypeError, match="cannot share"):
        synk.data(np.array(["a", "b"]))


def test_segment_is_unlinked_when_data_goes_away():
    import gc

    from tests.conftest import shm_entries

    d = synk.data(np.ones(10))
    name = d._segment.segment.name
    assert name in shm_entries()
    del d
    gc.collect()
    assert name not in shm_entries()


def test_a_workers_views_follow_reallocation_and_forget_released_data(rng):
    d = synk.data(rng.normal(size=(3, 4)).astype(np.float32))
    views = shared_arrays.DataViews(process_prefix())
    seen = views.view(d.descriptor())
    np.testing.assert_array_equal(seen, d.data)
    d[1] = 7.0  # one memory: the worker sees the change without a message
    assert (seen[1] == 7.0).all()
    layout = d.layout
    d.set_value(rng.normal(size=(11, 4)).astype(np.float32))  # grows: a new segment
    assert d.layout != layout and d.layout[0] == (11, 4)
    np.testing.assert_array_equal(views.view(d.descriptor().tolist()), d.data)
    before = len(shared_arrays.released_ids)
    d.free_memory()
    assert shared_arrays.released_ids[before:] == [d._id]
    views.forget([np.int64(d._id)])
    assert d._id not in views.segments


def test_dimensions_are_fixed_once_known_and_oversize_is_bounded():
    d = synk.data(ndim=2, dtype="int16")
    assert d.shape == (0, 0) and repr(d) == "<synkhronos.Data shape=(0, 0) dtype=int16>"
    with pytest.raises(TypeError, match="the value has 1 dimensions, but this Data has 2"):
        d.set_value(np.zeros(3, np.int16))
    with pytest.raises(TypeError, match="the shape has 3 dimensions"):
        d.set_shape((1, 2, 3))
    for bad in (0.5, 2.5):
        with pytest.raises(ValueError, match="oversize must be in"):
            d.set_length(4, oversize=bad)
    free = synk.data()
    free.set_shape(5)
    assert free.shape == (5,) and free.ndim == 1
    words = free.descriptor()
    assert words.dtype == np.int64 and words[3:].tolist() == [5]
