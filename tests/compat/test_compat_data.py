"""``synk.data`` and ``Data`` as the original defined them (spec section "Data")."""

import numpy as np
import pytensor.tensor as pt
import pytest

import synkhronos as synk


def test_data_signature_and_properties(rng):
    value = rng.normal(size=(5, 2))
    d = synk.data(value, None, None, None, None, True, False, 1.5, "d")  # positional order
    assert (d.dtype, d.ndim, d.shape, d.size, len(d), d.name) == (np.float64, 2, (5, 2), 10, 5, "d")
    assert d.minibatch
    np.testing.assert_array_equal(d.data, value)
    np.testing.assert_array_equal(d[1:3], value[1:3])
    d[0] = 7.0
    assert d.data[0].tolist() == [7.0, 7.0]


def test_var_gives_dtype_and_ndim():
    d = synk.data(var=pt.tensor3("t", dtype="int32"))
    assert d.dtype == np.int32 and d.ndim == 3
    d.set_value(np.zeros((2, 3, 4), "int16"))
    assert d.shape == (2, 3, 4)
    with pytest.raises(TypeError, match="dimensions"):
        d.set_value(np.zeros((2, 3), "int32"))


def test_ndim_is_fixed():
    d = synk.data(dtype="float32", ndim=2)
    assert d.ndim == 2
    d.set_shape((3, 4))
    with pytest.raises(TypeError, match="dimensions"):
        d.set_value(np.zeros(4, "float32"))
    with pytest.raises(TypeError, match="dimensions"):
        d.set_shape((2, 2, 2))
    from_value = synk.data(np.zeros((2, 2)))
    with pytest.raises(TypeError, match="dimensions"):
        from_value.set_value(np.zeros(3))


def test_condition_data():
    d = synk.data(dtype="float32", ndim=1)
    got = d.condition_data(np.arange(3, dtype="int8"))
    assert got.dtype == np.float32 and got.tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="force_cast"):
        d.condition_data(np.ones(3))
    assert d.condition_data(np.ones(3), force_cast=True).dtype == np.float32


def test_alloc_size_in_elements_and_oversize_range():
    d = synk.data(np.zeros((10, 3), "float32"), oversize=2)
    assert d.alloc_size == 60
    d.set_value(np.ones((20, 3), "float32"))  # fits: no reallocation
    assert d.alloc_size == 60 and d.shape == (20, 3)
    d.set_length(25, oversize=1)
    assert d.alloc_size == 75 and d.data[:20].sum() == 60
    for bad in (0.5, 2.5):
        with pytest.raises(ValueError, match=r"\[1, 2\]"):
            synk.data(np.zeros(3), oversize=bad)
        with pytest.raises(ValueError, match=r"\[1, 2\]"):
            d.set_value(np.zeros((1, 3), "float32"), oversize=bad)


def test_methods_set_shape_and_free_memory():
    d = synk.data(shape=(2, 3), dtype="float64")
    assert d.shape == (2, 3) and not d.data.any()
    d.set_value(np.arange(6.0).reshape(2, 3))
    d.set_shape((3, 2))
    assert d.data[0].tolist() == [0.0, 1.0]
    d.free_memory()
    assert len(d) == 0 and d.alloc_size == 0
