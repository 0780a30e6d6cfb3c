"""The split's phases (synkhronos.api.split.phases), in one process: what it says past
the rounds' limit, and the statistics' factors taken out of their sums together with a
softmax over the rows; each split evaluated on two uneven parts of a batch against the
one-process function (tests/test_split.py's ``assert_one_process``)."""

import numpy as np
import pytensor
import pytensor.tensor as pt

from synkhronos.api.split import phases
from tests.test_rounds import batch_norm_mlp, split_phases_of
from tests.test_split import FLOAT, ROWS, assert_one_process, split_of


def test_past_the_limit_the_sentence_names_the_layers(monkeypatch):
    """Each rank's own statistics, said in one sentence that names the layers (by their
    parameters' names) and the rounds the whole batch's would take."""
    monkeypatch.setattr(phases, "MAX_ROUNDS", 5)
    sources, outputs, updates, _ = batch_norm_mlp(2)
    split = split_phases_of(sources, outputs, updates, 2)
    assert not split.rounds
    said = split.inexact[0]
    assert "each rank computes them from its own rows, since the whole batch's" in said
    assert "would take 6 rounds, over MAX_ROUNDS (5;" in said
    assert "read with 'dense1" in said and "'dense0" in said, said


def test_the_default_limit_takes_a_deep_networks_rounds():
    """ResNet-110's 109 batch normalizations take 327 rounds: within the limit."""
    assert phases.MAX_ROUNDS >= 3 * 109


def test_batch_norm_under_a_softmax_over_the_rows():
    """A listwise loss (a softmax over the rows, expanded into its maximum and sum) on a
    normalized layer: both rewrites, one device's result."""
    rng = np.random.default_rng(7)
    x, y = pt.matrix("x", dtype=FLOAT), pt.vector("y", dtype=FLOAT)
    W = pytensor.shared(rng.normal(size=(3, 4)).astype(FLOAT), name="W")
    v = pytensor.shared(rng.normal(size=4).astype(FLOAT), name="v")
    h = pt.dot(x, W)
    mean = h.mean(axis=0)
    normal = (h - mean) / pt.sqrt(((h - mean) ** 2).mean(axis=0) + 1e-3)
    loss = -(pt.special.log_softmax(pt.dot(normal, v), axis=0) * y).sum()
    updates = [(p, p - 0.1 * g) for p, g in zip([W, v], pt.grad(loss, [W, v]), strict=True)]
    split = split_of([x, y], [loss], updates)
    assert not split.inexact, split.inexact
    arrays = [rng.normal(size=(ROWS, 3)).astype(FLOAT), rng.random(ROWS).astype(FLOAT)]
    assert_one_process([x, y], [loss], updates, arrays, split)


def test_a_product_over_the_rows_is_said_with_its_layer():
    """A reduction no round makes exact, read back by the rows: the sentence names the
    layer's parameter it is read with."""
    rng = np.random.default_rng(8)
    x = pt.matrix("x", dtype=FLOAT)
    w = pytensor.shared(rng.normal(size=(3, 2)).astype(FLOAT), name="dense.W")
    h = pt.dot(x, w)
    loss = (h * pt.prod(h, axis=0)).mean()
    updates = [(w, w - 0.1 * pt.grad(loss, w))]
    said = split_of([x], [loss], updates).inexact
    assert any("(read with 'dense.W') reduces the rows with" in s for s in said), said
