"""``synk.data``: shared-memory arrays, without workers."""

import numpy as np
import pytest

import synkhronos as synk


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
