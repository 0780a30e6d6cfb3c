"""Theano's ``theano.misc.pkl_utils`` and ``var.transfer`` in :mod:`synkhronos.theano`."""

import io
import zipfile

import numpy as np
import pytest

from synkhronos import theano
from synkhronos.extensions import lasagne
from synkhronos.theano.misc import pkl_utils


def _network(rng):
    net = lasagne.layers.InputLayer((None, 4))
    net = lasagne.layers.DenseLayer(net, 5, W=rng.normal(size=(4, 5)))
    return lasagne.layers.DenseLayer(net, 2, W=rng.normal(size=(5, 2)))


def test_dump_and_load_a_networks_parameters(rng):
    params = lasagne.layers.get_all_params(_network(rng))
    buffer = io.BytesIO()
    pkl_utils.dump(params, buffer)
    saved = np.load(io.BytesIO(buffer.getvalue()))
    # every value under its variable's name (the repeated names numbered), and the pickle
    assert sorted(saved.files) == ["W", "W_2", "b", "b_2", "pkl"]
    np.testing.assert_array_equal(saved["W_2"], params[2].get_value())
    loaded = pkl_utils.load(io.BytesIO(buffer.getvalue()))
    assert [p.name for p in loaded] == [p.name for p in params]
    for old, new in zip(params, loaded, strict=True):
        np.testing.assert_array_equal(new.get_value(), old.get_value())
    x = theano.tensor.matrix("x")
    f = theano.function([x], (x.dot(loaded[0]) + loaded[1]).sum())
    xv = rng.normal(size=(3, 4))
    want = (xv @ params[0].get_value() + params[1].get_value()).sum()
    np.testing.assert_allclose(f(xv), want)


def test_an_array_held_twice_is_stored_once_and_loaded_shared(rng):
    a = rng.normal(size=3)
    buffer = io.BytesIO()
    pkl_utils.dump({"first": a, "again": a, "other": a.copy()}, buffer)
    assert sorted(zipfile.ZipFile(buffer).namelist()) == ["array_0", "array_1", "pkl"]
    loaded = pkl_utils.load(io.BytesIO(buffer.getvalue()))
    assert loaded["first"] is loaded["again"] and loaded["other"] is not loaded["first"]
    np.testing.assert_array_equal(loaded["other"], a)


def test_names_refused_where_asked():
    w = theano.shared(np.zeros(2), name="w")
    unnamed = theano.shared(np.zeros(2))

    def strict(zip_file):
        return pkl_utils.PersistentSharedVariableID(
            zip_file, allow_unnamed=False, allow_duplicates=False
        )

    with pytest.raises(ValueError, match="unnamed shared variable"):
        pkl_utils.dump([unnamed], io.BytesIO(), persistent_id=strict)
    with pytest.raises(ValueError, match="two shared variables are named 'w'"):
        pkl_utils.dump([w, theano.shared(np.ones(2), name="w")], io.BytesIO(), persistent_id=strict)
    with pytest.raises(ValueError, match="overwrite the pickle"):
        pkl_utils.dump([theano.shared(np.zeros(1), name="pkl")], io.BytesIO())


def test_transfer_none_stays_and_cpu_is_the_host(rng):
    x = theano.tensor.matrix("x")
    assert x.transfer(None) is x
    y = (x * 2).transfer("cpu")
    xv = rng.normal(size=(2, 3))
    np.testing.assert_allclose(theano.function([x], y.transfer(None))(xv), 2 * xv)
    with pytest.raises(ValueError, match="Can't transfer to target"):
        x.transfer("dev0")
