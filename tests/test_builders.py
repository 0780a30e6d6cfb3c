"""``synkhronos.api.builders``' pieces without a session: the original Synkhronos'
``collect_modes``/``reduce_ops`` spelling, ``In`` inputs and their defaults (in
``synk.function``'s inputs and in a compiled ``pytensor`` function), and scalars
broadcast by themselves."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.api.builders import (
    In,
    WithDefaults,
    _broadcast_by_themselves,
    _with_collect_modes,
    without_in,
)


def test_collect_modes_and_reduce_ops():
    x = pt.vector("x")
    a, b = x.sum(), x.max()
    assert _with_collect_modes([a, b], None, ["+", "maximum"]) == [(a, "sum"), (b, "max")]
    assert _with_collect_modes(a, "gather", None) == (a, "gather")
    assert _with_collect_modes([a, b], ["reduce", None], None) == [(a, "avg"), (b, None)]
    with pytest.raises(ValueError, match="reduce_ops has 1 entries for 2 outputs"):
        _with_collect_modes([a, b], None, ["sum"])
    with pytest.raises(TypeError, match="plain-variable outputs"):
        _with_collect_modes([(a, "sum")], None, "sum")


def test_in_defaults_by_position():
    level, x = pt.scalar("level"), pt.vector("x")
    entry = In(level, value=0.25)
    assert float(entry.default) == 0.25 and entry.default.dtype == level.dtype
    variables, defaults = without_in([x, entry, pytensor.In(pt.scalar("plain"))])
    assert variables[:2] == [x, level] and list(defaults) == [1]
    shared = pytensor.shared(np.float64(1.0))
    with pytest.raises(TypeError, match="input 0"):
        without_in([pytensor.In(level, update=level + 1, value=shared)])


def test_with_defaults_fills_omitted_arguments():
    level, x = pt.scalar("level"), pt.vector("x")
    inputs = [x, In(level, value=2.0)]
    compiled = pytensor.function(inputs, (x * level).sum(), mode="FAST_COMPILE")
    called = WithDefaults(compiled, inputs)
    X = np.ones(3, x.dtype)
    assert float(called(X)) == 6.0
    assert float(called(X, 3.0)) == 9.0
    assert float(called(X, level=4.0)) == 12.0
    assert called.maker is compiled.maker  # its other attributes: the function's


def test_scalars_broadcast_by_themselves():
    x, y, lr = pt.matrix("x"), pt.vector("y"), pt.scalar("lr")
    rate = pt.scalar("rate")
    assert _broadcast_by_themselves([x, y, lr], [rate]) == ([x, y], [lr, rate])
    with pytest.raises(TypeError, match="list the scalars after them"):
        _broadcast_by_themselves([lr, x], [])
