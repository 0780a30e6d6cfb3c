"""A fused training step on one GPU rank (issue 51), on a CPU device where no GPU is
visible: each parameter is updated in its own buffer, as on several ranks.

On one rank the all-reduce is the identity, so XLA saw that a weight's update needs only
its own slice of the gradient, not the backward pass that still reads the old weight, and
copied every such weight before the program started (ResNet-50 on a CPU device: 188 MB of
copies a step, the step 1.26x as long); the update phase now starts once the backward
pass is done.
"""

from __future__ import annotations

import re

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from synkhronos.api import routines
from tests.test_gpu_step import ROWS, WIDTHS, _entry, _model

pytest.importorskip("jax")


@pytest.fixture(scope="module")
def one_rank():
    synk.fork(1, backend="gpu")
    yield
    synk.close()


def copied_arrays(state, rows, features) -> list[np.ndarray]:
    """(A routine) How many arrays this rank's latest fused program copies (a donated
    buffer saved from the update that overwrites it)."""
    copies = [
        line
        for line in _entry(state, rows, features)
        if re.search(r"= \w+\[\d[\d,]*\]\S* copy\(", line)
    ]
    return [np.array([len(copies)])]


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["sgd", "adam"])
def test_one_ranks_fused_step_copies_no_parameter(one_rank, rng, rule):
    from synkhronos.extensions import train
    from synkhronos.extensions.lasagne import updates

    float_x = pytensor.config.floatX
    x = rng.normal(size=(ROWS, WIDTHS[0])).astype(float_x)
    y = rng.normal(size=ROWS).astype(float_x)
    inputs, params, loss = _model(float_x)
    step = train.make_step_function(loss, params, inputs, getattr(updates, rule), 0.02)
    losses = [float(step(x, y)) for _ in range(2)]
    (reply,) = routines.run(copied_arrays, np.array([ROWS]), np.array([WIDTHS[0]]))
    assert int(reply[0][0]) == 0  # three weights before (and Adam's step count, a scalar)
    trained = [p.get_value() for p in params]
    inputs, params, loss = _model(float_x)
    plain = pytensor.function(inputs, loss, updates=getattr(updates, rule)(loss, params, 0.02))
    np.testing.assert_allclose(losses, [plain(x, y), plain(x, y)], rtol=2e-5)
    for got, p in zip(trained, params, strict=True):
        np.testing.assert_allclose(got, p.get_value(), rtol=2e-5, atol=1e-6)
