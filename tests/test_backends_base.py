"""The CPU ranks' backend: values set in place, or replaced when JAX may read them."""

import numpy as np
import pytensor
import pytest

from synkhronos.rank.backends.base import Backend


def test_set_value_in_place_keeps_the_storage(rng):
    var = pytensor.shared(rng.standard_normal((11, 3)))
    storage = var.get_value(borrow=True)
    new = rng.standard_normal((11, 3))
    Backend("cpu", None).set_value(var, new)
    assert var.get_value(borrow=True) is storage
    np.testing.assert_array_equal(storage, new)
    new[0, 0] = 99.0  # copied: the caller's array stays its own
    assert storage[0, 0] != 99.0


def test_set_value_of_another_shape_or_dtype_replaces_with_the_variables_dtype(rng):
    var = pytensor.shared(rng.standard_normal(5).astype("float32"))
    backend = Backend("cpu", None)
    backend.set_value(var, rng.standard_normal(7))  # float64 values, 7 of them
    value = var.get_value(borrow=True)
    assert value.shape == (7,) and value.dtype == np.float32
    owned = rng.standard_normal(4).astype("float32")
    backend.set_value(var, owned, owned=True)
    assert var.get_value(borrow=True) is owned  # a fresh result is taken as it is


def test_jax_mode_never_writes_into_a_value_jax_may_read(rng):
    var = pytensor.shared(rng.standard_normal(6))
    storage = var.get_value(borrow=True)
    kept = storage.copy()
    backend = Backend("jax-cpu", "JAX")
    assert not backend.writes_in_place
    new = rng.standard_normal(6)
    backend.set_value(var, new)
    np.testing.assert_array_equal(storage, kept)  # the old storage is unchanged
    value = var.get_value(borrow=True)
    np.testing.assert_array_equal(value, new)
    assert not value.flags.writeable
    with pytest.raises(ValueError):
        value[0] = 1.0


def test_value_is_a_view_of_the_storage(rng):
    var = pytensor.shared(rng.standard_normal((2, 3)))
    assert np.shares_memory(Backend("cpu", None).value(var), var.get_value(borrow=True))
