"""The fast in-place pass (:mod:`synkhronos.rank.inplace_rewrite`): the graph PyTensor's
own pass makes, and the same results."""

from __future__ import annotations

import logging

import numpy as np
import pytensor
import pytest
from pytensor.compile.mode import get_mode

from synkhronos.rank import inplace_rewrite
from tests.rewrite_steps import lstm_step, mlp_step, rewritten_graph, same_graph


def _fast_cvm():
    return inplace_rewrite.with_fast_inplace(get_mode("CVM"))


@pytest.mark.parametrize("model", [mlp_step, lstm_step])
def test_the_fast_pass_makes_pytensors_graph(rng, model, caplog):
    inputs, outputs, steps = model(rng)
    with caplog.at_level(logging.DEBUG, logger=inplace_rewrite.__name__):
        fast = rewritten_graph(_fast_cvm(), inputs, outputs, steps)
    own = rewritten_graph(get_mode("CVM"), inputs, outputs, steps)
    assert same_graph(fast, own)
    assert sum(bool(n.op.destroy_map) for n in own.apply_nodes) > 0
    tries = [r.message for r in caplog.records if "in-place tries" in r.message]
    assert tries, "the fast pass did not run"
    if model is mlp_step:  # both kinds of answer were given without the validator
        assert "'accepted': 0," not in tries[0] and "'refused': 0," not in tries[0]


def test_an_inconsistent_result_falls_back_to_pytensors_pass(rng, monkeypatch, caplog):
    inputs, outputs, steps = mlp_step(rng)
    # Every try answered yes: the graph fails its last validation, and is redone.
    monkeypatch.setattr(inplace_rewrite._Tries, "answer", lambda self, old, new: True)
    with caplog.at_level(logging.WARNING, logger=inplace_rewrite.__name__):
        fast = rewritten_graph(_fast_cvm(), inputs, outputs, steps)
    assert any("running PyTensor's own" in r.message for r in caplog.records)
    assert same_graph(fast, rewritten_graph(get_mode("CVM"), inputs, outputs, steps))


def test_compiled_with_the_fast_pass_the_step_computes_the_same(rng):
    inputs, outputs, steps = mlp_step(rng)
    shared = list(steps)
    start = [v.get_value() for v in shared]
    data = [rng.standard_normal((7, 4)), rng.standard_normal((7, 3))]
    results = []
    for mode in (get_mode("CVM"), inplace_rewrite.with_fast_inplace(get_mode("CVM"))):
        for var, value in zip(shared, start, strict=True):
            var.set_value(value)
        fn = pytensor.function(inputs, outputs, updates=steps, mode=mode)
        outs = [[np.asarray(o) for o in fn(*data)] for _ in range(3)]
        results.append((outs, [v.get_value() for v in shared]))
    (outs_a, state_a), (outs_b, state_b) = results
    for a, b in zip(outs_a, outs_b, strict=True):
        for u, v in zip(a, b, strict=True):
            np.testing.assert_array_equal(u, v)
    for u, v in zip(state_a, state_b, strict=True):
        np.testing.assert_array_equal(u, v)


def test_a_mode_without_the_pass_is_left_as_it_is():
    fast_compile = get_mode("FAST_COMPILE")
    assert inplace_rewrite.with_fast_inplace(fast_compile) is fast_compile
    names = [getattr(r, "name", None) for r in get_mode("CVM").optimizer.data]
    swapped = [
        inplace_rewrite.PYTENSOR_PASS if name == inplace_rewrite.TAG else name
        for name in (
            getattr(r, "name", None)
            for r in inplace_rewrite.with_fast_inplace(get_mode("CVM")).optimizer.data
        )
    ]
    assert swapped == names and inplace_rewrite.PYTENSOR_PASS in names
