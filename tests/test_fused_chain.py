"""synkhronos.rank.fused_chain without forking: the fused program's choice to donate its
shared variables' buffers (reads_overwritten), on JAX functions compiled as a rank compiles
them."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.api.function_parts import FunctionParts
from synkhronos.rank.compiled import RankFunction
from synkhronos.rank.first_calls import FirstCalls

pytest.importorskip("jax")

_M = np.float32(0.9)  # float32 constants keep float32 updates float32


def _call(updates):
    from synkhronos.rank.fused_chain import _Call

    g = pt.vector("g", dtype="float32")
    spec = FunctionParts.parse(inputs=[g], updates=updates(g)).spec(0, "JAX")
    fn = RankFunction(spec, "JAX", False, FirstCalls(None, lambda: None))
    return _Call(fn, fn._function("plain", False), [], 1)


def _shared():
    return (
        pytensor.shared(np.ones(3, np.float32), name="w"),
        pytensor.shared(np.zeros(3, np.float32), name="v"),
    )


def test_an_update_reading_anothers_old_value_keeps_it():
    from synkhronos.rank.fused_chain import reads_overwritten

    w, v = _shared()
    # Lasagne's momentum: the new parameter reads the old velocity.
    momentum = _call(lambda g: [(v, _M * v - g), (w, w + _M * v - 2 * g)])
    assert reads_overwritten([momentum])


@pytest.mark.parametrize(
    "updates",
    [
        lambda w, v: lambda g: [(v, _M * v + g), (w, w - (_M * v + g))],  # the new value
        lambda w, v: (
            lambda g: [(v, v + g), (w, w - g * pt.cast(v.shape[0], "float32"))]
        ),  # its shape only
        lambda w, v: lambda g: [(w, w - g)],  # one variable
    ],
)
def test_updates_reading_only_new_values_or_shapes_donate(updates):
    from synkhronos.rank.fused_chain import reads_overwritten

    assert not reads_overwritten([_call(updates(*_shared()))])
