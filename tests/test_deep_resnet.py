"""Pre-activation residual networks with batch normalization (He et al. 2016, the CIFAR
models): deep enough that their batch statistics take more rounds than the 64 the split
once allowed, they train as one device would, on 2 and 3 CPU ranks and GPU ranks (CPU
devices here), against ``pytensor.function`` in one process.

ResNet-110 (109 batch normalizations, CIFAR's 32x32x3 input; 327 rounds) trains in every
session in the mode chosen for its whole line (CPU ranks: the C VM, op by op; GPU ranks:
JAX), in float64; in float32 a 26-layer network (2 CPU ranks) or an 8-layer one (the others)
shows the ranks as close to float64's values as one device. Elsewhere the 26-layer network
at 8x8 trains on 2 CPU ranks, the 8-layer one on the others, CPU ranks in PyTensor's
FAST_COMPILE mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Iterator

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import get_mode
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import io_toposort

import synkhronos as synk
from synkhronos.api import mode_choice
from synkhronos.api.function_parts import FunctionParts
from synkhronos.api.split.phases import MAX_ROUNDS, split_phases
from synkhronos.api.training import TrainingFunction, running_updates
from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne import init
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne.nonlinearities import rectify, softmax
from synkhronos.extensions.lasagne.updates import momentum
from synkhronos.rank.backends import gpu
from synkhronos.rank.inplace_rewrite import with_fast_inplace
from synkhronos.rank.protection_check import with_fast_protection_check

MODE = "FAST_COMPILE"
#: (backend, ranks, blocks a stage): 4 blocks (75 rounds, past the 64 once allowed) on 2
#: CPU ranks; 1 (21 rounds) elsewhere, as each round is a function each rank compiles.
SESSIONS = [
    ("cpu", 2, 4),
    ("cpu", 3, 1),
    pytest.param(("gpu", 2, 1), marks=pytest.mark.gpu),
    pytest.param(("gpu", 3, 1), marks=pytest.mark.gpu),
]


def _conv(incoming, channels: int, stride: int = 1, size: int = 3):
    return L.Conv2DLayer(
        incoming,
        channels,
        size,
        stride=stride,
        pad="same",
        W=init.HeNormal(gain="relu"),
        b=None,
        nonlinearity=None,
    )


def _activated(incoming, name: str):
    return L.NonlinearityLayer(L.BatchNormLayer(incoming, name=name), rectify)


def preactivation_resnet(x, blocks: int, size: int):
    """Three stages of ``blocks`` pre-activation blocks (16, 32, 64 channels; the second
    and third halve the size, with a 1x1 projection), batch normalization before every
    convolution but the first, then a normalized global pooling and a softmax over 10
    classes: 6 * blocks + 2 layers with weights, 6 * blocks + 1 batch normalizations."""
    net = _conv(L.InputLayer((None, 3, size, size), x), 16)
    for stage, channels in enumerate((16, 32, 64)):
        for b in range(blocks):
            stride = 2 if stage and not b else 1
            name = f"stage{stage}_block{b}"
            activated = _activated(net, f"{name}_bn1")
            branch = _conv(_activated(_conv(activated, channels, stride), f"{name}_bn2"), channels)
            shortcut = net if stride == 1 else _conv(activated, channels, stride, 1)
            net = L.ElemwiseSumLayer([branch, shortcut])
    net = L.GlobalPoolLayer(_activated(net, "final_bn"))
    return L.DenseLayer(net, 10, nonlinearity=softmax)


def training(blocks: int, size: int):
    """The network's loss and momentum updates (the parameters' and running averages'),
    in floatX (float32 in a GPU session)."""
    lasagne.random.set_rng(np.random.RandomState(3))
    x, t = pt.tensor4("x", dtype=pytensor.config.floatX), pt.ivector("t")
    net = preactivation_resnet(x, blocks, size)
    loss = lasagne.objectives.categorical_crossentropy(L.get_output(net), t).mean()
    params = L.get_all_params(net, trainable=True)
    return x, t, loss, list(momentum(loss, params, 0.01, 0.9).items())


@pytest.fixture(scope="module")
def resnet110():
    """ResNet-110's training line at 32x32: its inputs, loss and momentum updates, and
    its running averages' updates (built once: seconds)."""
    x, t, loss, updates = training(18, 32)
    running = running_updates([loss, *(u for _, u in updates)], [v for v, _ in updates])
    return x, t, loss, updates, running


def test_resnet110_statistics_fit_the_rounds(resnet110):
    """ResNet-110's batch statistics, the whole batch's: 3 rounds for each of its 109 batch
    normalizations (the mean; the variance; the gradient's two sums), within the limit."""
    x, t, loss, updates, running = resnet110
    assert len(running) == 2 * 109
    with pytensor.config.change_flags(traceback__limit=0):
        split = split_phases([x, t], [loss], [True], updates + running, True, True, len(updates))
    assert not split.inexact, split.inexact
    assert len(split.rounds) == 327 <= MAX_ROUNDS


def test_resnet110_phases_take_the_lines_mode(resnet110, monkeypatch):
    """The mode of every phase is chosen for the whole line: ResNet-110's is large, so
    its rounds (each a small graph, the first under the size) compile op by op."""
    if not pytensor.config.cxx:
        pytest.skip("no C compiler: the default mode is kept")
    monkeypatch.setattr(mode_choice, "configured", lambda: False)
    x, t, loss, updates, running = resnet110
    parts = FunctionParts.parse(inputs=[x, t], outputs=loss, updates=updates)
    assert mode_choice.choose_for_line(parts, None, updates + running) == "CVM"
    assert mode_choice.choose_for_line(parts, "JAX", updates + running) is None
    parts.mode = "FAST_COMPILE"
    assert mode_choice.choose_for_line(parts, None, updates + running) == "FAST_COMPILE"
    first = min((value for _, value in running), key=lambda v: len(io_toposort([x], [v])))
    assert mode_choice.choose(None, None, [x], [first], "first round") is None


@pytest.fixture(scope="module", params=SESSIONS, ids=lambda p: f"{p[0]}x{p[1]}")
def session(request):
    """A session of ``request.param`` (backend, ranks, blocks): the mode its training
    functions are built in (GPU ranks': their own, JAX), the blocks a stage, and
    ``request.param``."""
    backend, n, blocks = request.param
    if backend == "gpu":
        pytest.importorskip("jax")
        if not gpu.on_cpu_devices() and len(gpu.visible_gpus()) < n:
            pytest.skip(f"needs {n} GPUs")
    synk.fork(n, backend=backend)
    yield None if backend == "gpu" else MODE, blocks, request.param
    synk.close()


def test_a_deep_resnet_trains_as_one_device(session):
    """A 26-layer network's 75 rounds of batch statistics (past the 64 once allowed), or
    an 8-layer one's 21: no warning, and two steps on 5 rows give one device's losses,
    parameters and running averages."""
    mode, blocks, _ = session
    x, t, loss, updates = training(blocks, 8)
    floatx = x.dtype
    variables = [v for v, _ in updates]
    variables += [v for v, _ in running_updates([loss], variables)]
    start = [v.get_value() for v in variables]
    rng = np.random.default_rng(11)
    xs = rng.normal(size=(5, 3, 8, 8)).astype(floatx)
    ts = rng.integers(0, 10, 5).astype("int32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train = synk.function([x, t], loss, updates=updates, mode=mode)
    said = [str(w.message) for w in caught if "synkhronos" in str(w.message)]
    assert not said, said  # exact: nothing said
    assert isinstance(train, TrainingFunction)
    assert len(train.round_functions) == 3 * (6 * blocks + 1)
    losses = [train(xs, ts) for _ in range(2)]
    synk.verify()  # every rank bit-identical
    trained = [v.get_value() for v in variables]
    for v, value in zip(variables, start, strict=True):
        v.set_value(value)
    reference = pytensor.function([x, t], loss, updates=updates, mode=MODE)
    rtol = 1e-9 if floatx == "float64" else 1e-4
    np.testing.assert_allclose(losses, [reference(xs, ts) for _ in range(2)], rtol=rtol)
    for var, got in zip(variables, trained, strict=True):
        want = var.get_value()
        # Float32 rounds at the scale of the variable's largest entry.
        atol = 1e-12 if floatx == "float64" else 1e-4 * np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=str(var))
    synk.broadcast(variables)  # rank 0 holds the reference's values: every rank takes them


def test_a_large_lines_rounds_compile_op_by_op(session, rng, monkeypatch):
    """A line of at least LARGE_GRAPH_NODES nodes compiles op by op in every phase, its
    first round (a few nodes) too, and trains as one device."""
    if session[0] is None:
        pytest.skip("GPU ranks compile in their backend's mode")
    if not pytensor.config.cxx:
        pytest.skip("no C compiler: the default mode is kept")
    # Dense layers without their rectifier before batch norm: a unit the rectifier zeroed
    # on every row would sit at the next one's kink, where rounding picks the branch.
    x, t = pt.matrix("x"), pt.ivector("t")
    net = L.InputLayer((None, 4), x)
    for name in ("bn1", "bn2"):
        dense = L.DenseLayer(net, 5, nonlinearity=None)
        net = L.NonlinearityLayer(L.BatchNormLayer(dense, name=name), rectify)
    net = L.DenseLayer(net, 3, nonlinearity=softmax)
    loss = lasagne.objectives.categorical_crossentropy(L.get_output(net), t).mean()
    params = L.get_all_params(net, trainable=True)
    updates = list(momentum(loss, params, 0.1, 0.9).items())
    variables = [v for v, _ in updates]
    variables += [v for v, _ in running_updates([loss], variables)]
    roots = [loss, *(v.default_update for v in variables[len(updates) :]), *dict(updates).values()]
    monkeypatch.setattr(mode_choice, "LARGE_GRAPH_NODES", len(io_toposort([x, t], roots)))
    monkeypatch.setattr(mode_choice, "configured", lambda: False)
    train = synk.function([x, t], loss, updates=updates)
    phases = [train.row_function, *train.round_functions, train.reduced_function]
    assert len(phases) == 2 + 3 * 2 and {f.mode for f in phases} == {"CVM"}
    xs, ts = rng.standard_normal((11, 4)), rng.integers(0, 3, 11).astype("int32")
    start = [v.get_value() for v in variables]
    losses = [train(xs, ts) for _ in range(2)]
    synk.verify()
    trained = [v.get_value() for v in variables]
    for v, value in zip(variables, start, strict=True):
        v.set_value(value)
    reference = pytensor.function([x, t], loss, updates=updates, mode="CVM")
    np.testing.assert_allclose(losses, [reference(xs, ts) for _ in range(2)], rtol=1e-9)
    for var, got in zip(variables, trained, strict=True):
        np.testing.assert_allclose(got, var.get_value(), rtol=1e-9, atol=1e-12, err_msg=str(var))
    synk.broadcast(variables)


@dataclasses.dataclass
class TrainedLine:
    """A training line, its variables' starting values, its rows, and what two steps of
    ``pytensor.function`` give in one process."""

    x: Variable
    t: Variable
    loss: Variable
    updates: list
    variables: list
    start: list
    rows: tuple
    losses: list
    trained: list


@pytest.fixture(scope="module")
def trained_resnet110():
    """ResNet-110 at CIFAR's 32x32 in float64, 5 rows, two steps in one process in the C
    VM, once for every session. (The reference takes PyTensor's in-place pass in
    synkhronos' faster form, which makes the same graph: PyTensor's own takes most of the
    reference's build on this graph.)"""
    if not pytensor.config.cxx:
        pytest.skip("no C compiler: the default mode is kept")
    with pytensor.config.change_flags(floatX="float64"):
        x, t, loss, updates = training(18, 32)
        variables = [v for v, _ in updates]
        variables += [v for v, _ in running_updates([loss], variables)]
        start = [v.get_value() for v in variables]
        rng = np.random.default_rng(7)
        rows = rng.normal(size=(5, 3, 32, 32)), rng.integers(0, 10, 5).astype("int32")
        mode = with_fast_protection_check(with_fast_inplace(get_mode("CVM")))
        reference = pytensor.function([x, t], loss, updates=updates, mode=mode)
        losses = [reference(*rows) for _ in range(2)]
    trained = [v.get_value() for v in variables]
    return TrainedLine(x, t, loss, updates, variables, start, rows, losses, trained)


@contextlib.contextmanager
def _in_float64(backend: str, n: int, monkeypatch) -> Iterator[None]:
    """The session in float64: GPU ranks compute in floatX float32 unless it is named
    when they are forked (docs/limitations.rst), so they are forked again naming it, and
    once more as the module's session after."""
    if backend != "gpu":
        yield
        return
    synk.close()
    flags = os.environ.get("PYTENSOR_FLAGS", "")
    monkeypatch.setenv("PYTENSOR_FLAGS", ",".join(f for f in (flags, "floatX=float64") if f))
    try:
        synk.fork(n, backend=backend)
        yield
    finally:
        synk.close()
        monkeypatch.setenv("PYTENSOR_FLAGS", flags)
        synk.fork(n, backend=backend)


def test_resnet110_trains_as_one_device(session, trained_resnet110, monkeypatch):
    """ResNet-110 itself (5 rows: 3 + 2 on 2 ranks, 2 + 2 + 1 on 3), in the mode chosen
    for its line (CPU ranks: the C VM, op by op; GPU ranks: their own): its 327 rounds of
    batch statistics, no warning, and two steps give one device's losses, parameters and
    running averages. In float64 (GPU ranks forked with it named): in float32, one
    process and the ranks alike differ from float64's values by rounding that 110 layers
    of 5 rows' statistics amplify (up to half a velocity's scale, measured; see
    bench/RESULTS.md, "Deep residual networks")."""
    backend, n, _ = session[2]
    monkeypatch.setattr(mode_choice, "configured", lambda: False)
    line = trained_resnet110
    for v, value in zip(line.variables, line.start, strict=True):
        v.set_value(value)
    with _in_float64(backend, n, monkeypatch), pytensor.config.change_flags(floatX="float64"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train = synk.function([line.x, line.t], line.loss, updates=line.updates)
        said = [str(w.message) for w in caught if "synkhronos" in str(w.message)]
        assert not said, said
        assert len(train.round_functions) == 327
        assert backend != "cpu" or train.mode == "CVM"
        losses = [train(*line.rows) for _ in range(2)]
    synk.verify()  # every rank bit-identical
    np.testing.assert_allclose(losses, line.losses, rtol=1e-9)
    for var, want in zip(line.variables, line.trained, strict=True):
        atol = 1e-10 * np.abs(want).max()  # rounding at the scale of the largest entry
        np.testing.assert_allclose(var.get_value(), want, rtol=1e-9, atol=atol, err_msg=str(var))


def _scaled_errors(values: list, exact: list) -> np.ndarray:
    """Per variable, its largest difference from ``exact``'s, at the scale of ``exact``'s
    largest entry."""
    return np.array(
        [np.abs(v - e).max() / np.abs(e).max() for v, e in zip(values, exact, strict=True)]
    )


def test_a_deep_resnet_in_float32_is_as_close_as_one_device(session):
    """In float32 the ranks' two steps of a deep network are as close to float64's as one
    device's float32 steps: the split's sums over the ranks round no worse than one
    device's (rounding alone separates them, amplified through the layers' statistics)."""
    mode, blocks, _ = session
    rng = np.random.default_rng(5)
    xs, ts = rng.normal(size=(5, 3, 8, 8)), rng.integers(0, 10, 5).astype("int32")
    results = {}
    for floatx, ranks in (("float64", False), ("float32", False), ("float32", True)):
        with pytensor.config.change_flags(floatX=floatx):
            x, t, loss, updates = training(blocks, 8)
            variables = [v for v, _ in updates]
            variables += [v for v, _ in running_updates([loss], variables)]
            build = synk.function if ranks else pytensor.function
            train = build([x, t], loss, updates=updates, mode=mode if ranks else MODE)
            losses = [train(xs.astype(floatx), ts) for _ in range(2)]
        results[floatx, ranks] = losses, [np.asarray(v.get_value(), float) for v in variables]
    synk.verify()
    (exact_losses, exact), (one_losses, one) = results["float64", False], results["float32", False]
    ranks_losses, ranks = results["float32", True]
    one_error, ranks_error = _scaled_errors(one, exact), _scaled_errors(ranks, exact)
    # Rounding differs between the two float32 lines; either may land nearer: a factor 2.
    assert ranks_error.max() <= 2 * one_error.max(), (ranks_error.max(), one_error.max())
    assert np.median(ranks_error) <= 2 * np.median(one_error)
    eps = 4 * np.finfo(np.float32).eps * np.abs(exact_losses).max()
    one_off = max(np.abs(np.subtract(one_losses, exact_losses)).max(), eps)
    assert np.abs(np.subtract(ranks_losses, exact_losses)).max() <= 2 * one_off
