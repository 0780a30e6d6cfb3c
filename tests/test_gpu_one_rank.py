"""A fused training step on one GPU rank (issue 51), on a CPU device where no GPU is
visible: each parameter is updated in its own buffer, as on several ranks.

On one rank the all-reduce is the identity, so XLA saw that a weight's update needs only
its own slice of the gradient, not the backward pass that still reads the old weight, and
copied every such weight before the program started (ResNet-50 on a CPU device: 188 MB of
copies a step, the step 1.26x as long); where the buffers are donated (GPUs) the update
phase now starts once the backward pass is done. Undonated (the default on CPU devices:
``SYNK_DONATE``) the program copies nothing and the old arrays stay valid.
"""

from __future__ import annotations

import re

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from synkhronos.api import routines
from synkhronos.transport.comm import xla
from tests.test_gpu_step import ROWS, WIDTHS, _entry, _model

pytest.importorskip("jax")


@pytest.fixture(scope="module", params=["1", "0"], ids=["donated", "undonated"])
def one_rank(request):
    """One GPU rank whose fused chains donate their cells' buffers (as on GPUs) or not
    (the default on CPU devices); yields whether they do."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(xla.DONATE_VAR, request.param)
        synk.fork(1, backend="gpu")
    yield request.param == "1"
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
@pytest.mark.parametrize("rule", ["sgd", "adam", "momentum"])
def test_one_ranks_fused_step_copies_no_parameter(one_rank, rng, rule):
    """No copy, except where donated buffers meet an update rule that reads a variable
    after another update overwrote it: Lasagne's momentum computes the new velocity from
    the old parameter and the new parameter from the old velocity, so XLA keeps one old
    copy per parameter."""
    from synkhronos.extensions import train
    from synkhronos.extensions.lasagne import updates

    float_x = pytensor.config.floatX
    x = rng.normal(size=(ROWS, WIDTHS[0])).astype(float_x)
    y = rng.normal(size=ROWS).astype(float_x)
    inputs, params, loss = _model(float_x)
    step = train.make_step_function(loss, params, inputs, getattr(updates, rule), 0.02)
    losses = [float(step(x, y)) for _ in range(2)]
    (reply,) = routines.run(copied_arrays, np.array([ROWS]), np.array([WIDTHS[0]]))
    copied = len(params) if one_rank and rule == "momentum" else 0
    assert int(reply[0][0]) == copied  # donated sgd, adam: three weights before
    old = params[0].get_value(borrow=True)
    losses.append(float(step(x, y)))
    assert old.is_deleted() == one_rank  # donated: updated in place; else left valid
    trained = [p.get_value() for p in params]
    inputs, params, loss = _model(float_x)
    plain = pytensor.function(inputs, loss, updates=getattr(updates, rule)(loss, params, 0.02))
    np.testing.assert_allclose(losses, [plain(x, y) for _ in range(3)], rtol=2e-5)
    for got, p in zip(trained, params, strict=True):
        np.testing.assert_allclose(got, p.get_value(), rtol=2e-5, atol=1e-6)


def test_donation_is_on_for_gpus_and_off_for_cpu_devices(monkeypatch):
    monkeypatch.delenv(xla.DONATE_VAR, raising=False)
    assert xla.donate_from_env("gpu") and not xla.donate_from_env("cpu")
    for text, donate in (("1", True), ("0", False), (" 1 ", True)):
        monkeypatch.setenv(xla.DONATE_VAR, text)
        assert xla.donate_from_env("cpu") is donate and xla.donate_from_env("gpu") is donate
    monkeypatch.setenv(xla.DONATE_VAR, "yes")
    with pytest.raises(ValueError, match="SYNK_DONATE='yes'"):
        xla.donate_from_env()
