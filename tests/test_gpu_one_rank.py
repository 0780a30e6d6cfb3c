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
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.api import routines
from synkhronos.transport.comm import xla_settings
from tests.test_gpu_step import ROWS, WIDTHS, _entry, _model

pytest.importorskip("jax")


@pytest.fixture(scope="module", params=["1", "0", ""], ids=["donated", "undonated", "auto"])
def one_rank(request):
    """One GPU rank whose fused chains donate their cells' buffers (as on GPUs), or not,
    or decide each (the default on CPU devices); yields True, False or None."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(xla_settings.DONATE_VAR, request.param)
        synk.fork(1, backend="gpu")
    yield {"1": True, "0": False, "": None}[request.param]
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
    copy per parameter. Left to decide (CPU devices), a program donates unless its
    updates read each other so."""
    from synkhronos.extensions import train
    from synkhronos.extensions.lasagne import updates

    float_x = pytensor.config.floatX
    x = rng.normal(size=(ROWS, WIDTHS[0])).astype(float_x)
    y = rng.normal(size=ROWS).astype(float_x)
    inputs, params, loss = _model(float_x)
    step = train.make_step_function(loss, params, inputs, getattr(updates, rule), 0.02)
    losses = [float(step(x, y)) for _ in range(2)]
    (reply,) = routines.run(copied_arrays, np.array([ROWS]), np.array([WIDTHS[0]]))
    donated = rule != "momentum" if one_rank is None else one_rank
    copied = len(params) if donated and rule == "momentum" else 0
    assert int(reply[0][0]) == copied  # donated sgd, adam: three weights before
    old = params[0].get_value(borrow=True)
    losses.append(float(step(x, y)))
    assert old.is_deleted() == donated  # donated: updated in place; else left valid
    trained = [p.get_value() for p in params]
    inputs, params, loss = _model(float_x)
    plain = pytensor.function(inputs, loss, updates=getattr(updates, rule)(loss, params, 0.02))
    np.testing.assert_allclose(losses, [plain(x, y) for _ in range(3)], rtol=2e-5)
    for got, p in zip(trained, params, strict=True):
        np.testing.assert_allclose(got, p.get_value(), rtol=2e-5, atol=1e-6)


def test_donation_is_on_for_gpus_and_decided_per_program_on_cpu_devices(monkeypatch):
    monkeypatch.delenv(xla_settings.DONATE_VAR, raising=False)
    assert (
        xla_settings.donate_from_env("gpu") is True and xla_settings.donate_from_env("cpu") is None
    )
    for text, donate in (("1", True), ("0", False), (" 1 ", True)):
        monkeypatch.setenv(xla_settings.DONATE_VAR, text)
        assert (
            xla_settings.donate_from_env("cpu") is donate
            and xla_settings.donate_from_env("gpu") is donate
        )
    monkeypatch.setenv(xla_settings.DONATE_VAR, "yes")
    with pytest.raises(ValueError, match="SYNK_DONATE='yes'"):
        xla_settings.donate_from_env()


def _convnet(float_x):
    from synkhronos.extensions.lasagne import layers as L
    from synkhronos.extensions.lasagne import nonlinearities, objectives

    x, y = pt.tensor4("x", dtype=float_x), pt.ivector("y")
    net = L.InputLayer((None, 3, 6, 6), input_var=x)
    net = L.Conv2DLayer(net, 8, 1, b=None, flip_filters=False)
    net = L.Conv2DLayer(net, 4, 3, pad="same", flip_filters=False)
    net = L.DenseLayer(net, 5, nonlinearity=nonlinearities.softmax)
    loss = objectives.categorical_crossentropy(L.get_output(net), y).mean()
    return [x, y], L.get_all_params(net, trainable=True), loss


@pytest.mark.gpu
def test_one_ranks_filter_gradients_are_written_whole(one_rank, rng, monkeypatch):
    """On one rank the all-reduce of a training step's filter gradients (arrays of more
    than two dimensions) is XLA's all-reduce over the mesh of one device, which writes
    each in its filter's layout once: as the identity, XLA transposed a filter's gradient
    anew inside each update reading it (Lasagne's momentum reads it twice; ResNet-50's
    step on a CPU device took 1.4x the CPU time). The step is plain PyTensor's."""
    import jax

    from synkhronos.extensions.lasagne import updates
    from synkhronos.session import launch

    float_x = pytensor.config.floatX
    x = rng.normal(size=(7, 3, 6, 6)).astype(float_x)
    y = rng.integers(0, 5, 7).astype("int32")
    inputs, params, loss = _convnet(float_x)
    start = [p.get_value() for p in params]
    step = synk.function(inputs, loss, updates=updates.momentum(loss, params, 0.05))
    comm = launch.current().state.comm
    run, calls = comm.run, []

    def recorded(program, arrays, donated=None, held=None):
        like = [jax.ShapeDtypeStruct(np.shape(d), d.dtype, sharding=comm.sharding) for d in donated]
        calls.append((program, list(arrays), like))
        return run(program, arrays, donated, held)

    monkeypatch.setattr(comm, "run", recorded)
    losses = [float(step(x, y)) for _ in range(3)]
    program, arrays, like = calls[-1]
    text = program.lower(arrays, like).compile().as_text()
    results = re.findall(r"= (.*?) all-reduce(?:-start)?\(", text[text.index("\nENTRY") :])
    reduced = [shape for r in results for shape in re.findall(r"\w+\[[\d,]*\]", r)]
    filters = [p for p in params if p.ndim > 2]  # (XLA may reduce them in one tuple)
    assert len(filters) == 2 and len(reduced) == len(filters), reduced
    trained = [p.get_value() for p in params]
    for p, value in zip(params, start, strict=True):
        p.set_value(value)
    plain = pytensor.function(inputs, loss, updates=updates.momentum(loss, params, 0.05))
    np.testing.assert_allclose(losses, [plain(x, y) for _ in range(3)], rtol=2e-5)
    for got, p in zip(trained, params, strict=True):
        np.testing.assert_allclose(got, p.get_value(), rtol=2e-5, atol=1e-6)
