"""Training steps and helpers the tests of synkhronos' graph rewrites share
(:mod:`synkhronos.rank.inplace_rewrite`, :mod:`synkhronos.rank.protection_check`)."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.maker import FunctionMaker
from pytensor.compile.rebuild import construct_function_ins_and_outs
from pytensor.graph.basic import equal_computations

from synkhronos.extensions.lasagne import updates as update_rules


def mlp_step(rng):
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


def lstm_step(rng):
    """A step through a scan (an inner graph, with its own in-place rewriting)."""
    x = pt.tensor3("x")
    w = pytensor.shared(rng.standard_normal((3, 3)) * 0.3, name="w")

    def cell(x_t, h):
        return pt.tanh(x_t + h @ w) * pt.sigmoid(x_t - h)

    hs, _ = pytensor.scan(cell, sequences=[x.dimshuffle(1, 0, 2)], outputs_info=[x[:, 0] * 0])
    loss = (hs[-1] ** 2).sum()
    return [x], [loss], update_rules.sgd(loss, [w], learning_rate=0.05)


def rewritten_graph(mode, inputs, outputs, steps):
    """The graph of ``pytensor.function(inputs, outputs, updates=steps)`` as ``mode``'s
    passes rewrite it."""
    ins, outs = construct_function_ins_and_outs(inputs, outputs, updates=steps)
    fgraph, _ = FunctionMaker.create_fgraph(
        ins, [FunctionMaker.wrap_out(o) for o in outs], force_clone=True
    )
    mode.optimizer.rewrite(fgraph)
    return fgraph


def same_graph(a, b) -> bool:
    """Whether two rewritten graphs compute the same, node for node, in-place ops too."""

    def nodes(fgraph):
        return [(str(n.op), n.op.destroy_map) for n in fgraph.toposort()]

    return equal_computations(a.outputs, b.outputs, a.inputs, b.inputs) and nodes(a) == nodes(b)
