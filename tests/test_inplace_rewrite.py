"""The fast in-place pass (:mod:`synkhronos.rank.inplace_rewrite`): the graph PyTensor's
own pass makes, and the same results."""

from __future__ import annotations

import logging

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.maker import FunctionMaker
from pytensor.compile.mode import get_mode
from pytensor.compile.rebuild import construct_function_ins_and_outs
from pytensor.graph.basic import equal_computations

from synkhronos.extensions.lasagne import updates as update_rules
from synkhronos.rank import inplace_rewrite


def _mlp_step(rng):
    """A training step of a two-layer network with momentum: its gradient reads the
    layers' outputs after they are computed (tries refused), a transpose views a weight
    (a view chain), and the updates overwrite shared variables."""
    x, y = pt.matrix("x"), pt.matrix("y")
    w1 = pytensor.shared(rng.standard_normal((4, 5)), name="w1")
    b1 = pytensor.shared(np.zeros(5), name="b1")
    w2 = pytensor.shared(rng.standard_normal((3, 5)), name="w2")
    hidden = pt.tanh(x @ w1 + b1)
    out = pt.exp(hidden @ w2.T) / (1 + hidden.sum(axis=1, keepdims=True) ** 2)
    loss = ((out - y) ** 2).mean() + 1e-3 * (w1**2).sum()
    steps = update_rules.momentum(loss, [w1, b1, w2], learning_rate=0.1, momentum=0.9)
    return [x, y], [loss, out], steps


def _lstm_step(rng):
    """A step through a scan (an inner graph, with its own in-place rewriting)."""
    x = pt.tensor3("x")
    w = pytensor.shared(rng.standard_normal((3, 3)) * 0.3, name="w")

    def cell(x_t, h):
        return pt.tanh(x_t + h @ w) * pt.sigmoid(x_t - h)

    hs, _ = pytensor.scan(cell, sequences=[x.dimshuffle(1, 0, 2)], outputs_info=[x[:, 0] * 0])
    loss = (hs[-1] ** 2).sum()
    return [x], [loss], update_rules.sgd(loss, [w], learning_rate=0.05)


def _fast_cvm():
    return inplace_rewrite.with_fast_inplace(get_mode("CVM"))


def _rewritten(mode, inputs, outputs, steps):
    ins, outs = construct_function_ins_and_outs(inputs, outputs, updates=steps)
    fgraph, _ = FunctionMaker.create_fgraph(
        ins, [FunctionMaker.wrap_out(o) for o in outs], force_clone=True
    )
    mode.optimizer.rewrite(fgraph)
    return fgraph


def _same_graph(a, b) -> bool:
    def nodes(fgraph):
        return [(str(n.op), n.op.destroy_map) for n in fgraph.toposort()]

    return equal_computations(a.outputs, b.outputs, a.inputs, b.inputs) and nodes(a) == nodes(b)


@pytest.mark.parametrize("model", [_mlp_step, _lstm_step])
def test_the_fast_pass_makes_pytensors_graph(rng, model, caplog):
    inputs, outputs, steps = model(rng)
    with caplog.at_level(logging.DEBUG, logger=inplace_rewrite.__name__):
        fast = _rewritten(_fast_cvm(), inputs, outputs, steps)
    own = _rewritten(get_mode("CVM"), inputs, outputs, steps)
    assert _same_graph(fast, own)
    assert sum(bool(n.op.destroy_map) for n in own.apply_nodes) > 0
    tries = [r.message for r in caplog.records if "in-place tries" in r.message]
    assert tries, "the fast pass did not run"
    if model is _mlp_step:  # both kinds of answer were given without the validator
        assert "'accepted': 0," not in tries[0] and "'refused': 0," not in tries[0]


def test_an_inconsistent_result_falls_back_to_pytensors_pass(rng, monkeypatch, caplog):
    inputs, outputs, steps = _mlp_step(rng)
    # Every try answered yes: the graph fails its last validation, and is redone.
    monkeypatch.setattr(inplace_rewrite._Tries, "answer", lambda self, old, new: True)
    with caplog.at_level(logging.WARNING, logger=inplace_rewrite.__name__):
        fast = _rewritten(_fast_cvm(), inputs, outputs, steps)
    assert any("running PyTensor's own" in r.message for r in caplog.records)
    assert _same_graph(fast, _rewritten(get_mode("CVM"), inputs, outputs, steps))


def test_compiled_with_the_fast_pass_the_step_computes_the_same(rng):
    inputs, outputs, steps = _mlp_step(rng)
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
    names = [getattr(r, "name", None) for r in get_mode("CVM").optimizer]
    swapped = [
        inplace_rewrite.PYTENSOR_PASS if name == inplace_rewrite.TAG else name
        for name in (
            getattr(r, "name", None)
            for r in inplace_rewrite.with_fast_inplace(get_mode("CVM")).optimizer
        )
    ]
    assert swapped == names and inplace_rewrite.PYTENSOR_PASS in names
