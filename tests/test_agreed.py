"""Rank 0's records of shared values as synkhronos left them: what counts as changed."""

import numpy as np
import pytensor

from synkhronos.session.agreed import SAMPLES, WHOLE_BYTES, AgreedValues


def test_small_values_compared_whole(rng):
    bias = pytensor.shared(rng.standard_normal(11))
    other = pytensor.shared(rng.standard_normal(3))
    agreed = AgreedValues()
    agreed.agree([bias, other])
    assert agreed.changed([bias, other]) == []
    bias.get_value(borrow=True)[7] += 1e-12  # any element, in place
    assert agreed.changed([bias, other]) == [bias]
    agreed.agree([bias])
    assert agreed.changed([bias, other]) == []
    bias.set_value(bias.get_value().astype("float32"))  # same numbers, other dtype
    assert agreed.changed([bias]) == [bias]


def test_a_new_equal_array_of_a_large_value_is_a_change(rng):
    weights = pytensor.shared(rng.standard_normal(WHOLE_BYTES // 8 + 1))
    agreed = AgreedValues()
    agreed.agree([weights])
    weights.set_value(weights.get_value())  # equal values, a new array
    assert agreed.changed([weights]) == [weights]


def test_a_large_value_changed_in_place_where_sampled(rng):
    weights = pytensor.shared(rng.standard_normal((1000, 11)))
    agreed = AgreedValues()
    agreed.agree([weights])
    value = weights.get_value(borrow=True)
    value[0, 0] += 1.0  # the first element is always sampled
    assert agreed.changed([weights]) == [weights]
    agreed.agree([weights])
    value.reshape(-1)[-1] += 1.0  # and the last
    assert agreed.changed([weights]) == [weights]
    assert value.size > SAMPLES


def test_variables_never_agreed_count_unchanged(rng):
    var = pytensor.shared(rng.standard_normal(4))
    assert AgreedValues().changed([var]) == []


def test_scalars_and_other_objects_by_identity():
    rate = pytensor.shared(np.float64(0.1))
    agreed = AgreedValues()
    agreed.agree([rate])
    assert agreed.changed([rate]) == []
    rate.set_value(np.float64(0.2))
    assert agreed.changed([rate]) == [rate]
