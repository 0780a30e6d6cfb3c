"""A training function's call that fails on one rank changes no rank's variables.

A test-only op raises on the workers (not on rank 0) while a flag file exists; placed in
the row phase, in a batch-statistics round or in the reduced phase of a small network's
training function, it makes that step fail on rank 1 alone. Every rank's parameters and
optimizer state are then as before the call (read per rank), ``synk.verify()`` passes,
the error says that nothing changed, and the next call trains as one device would. On
CPU ranks and on GPU ranks (CPU devices).
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.graph.traversal import graph_inputs
from pytensor.tensor.random.type import RandomType

import synkhronos as synk
from synkhronos.api import routines
from synkhronos.api.training import TrainingFunction
from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne import layers as L

ROWS = 27  # 14 and 13 rows on 2 ranks


class FailOnWorkers(Op):
    """The identity, raising on every process but ``pid``'s while ``flag`` exists."""

    __props__ = ("pid", "flag")

    def __init__(self, pid: int, flag: str):
        self.pid, self.flag = pid, flag

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def check(self) -> None:
        if os.getpid() != self.pid and os.path.exists(self.flag):
            raise RuntimeError("injected failure on a worker")

    def pullback(self, inputs, outputs, cotangents):
        return cotangents

    def perform(self, node, inputs, outputs):
        self.check()
        outputs[0][0] = inputs[0].copy()


try:
    from pytensor.link.jax.dispatch import jax_funcify

    @jax_funcify.register(FailOnWorkers)
    def _jax_fail_on_workers(op, **kwargs):
        def fail_on_workers(x):
            op.check()  # when the rank compiles (traces) the function
            return x

        return fail_on_workers
except ImportError:  # no JAX: the CPU cases still run
    pass


def network(x, y, fail, where: str):
    """A two-layer network with batch statistics and dropout (its generator's state moves
    in the row phase); ``fail`` wraps the value of ``where``."""
    rng = np.random.default_rng(0)
    w1 = pytensor.shared(rng.normal(size=(6, 8)).astype(pytensor.config.floatX), name="w1")
    w2 = pytensor.shared(rng.normal(size=(8, 3)).astype(pytensor.config.floatX), name="w2")
    rows = fail(x) if where == "rows" else x
    h = pt.dot(rows, w1)
    h = (h - h.mean(axis=0)) / pt.sqrt(h.var(axis=0) + 1e-3)  # the batch's statistics
    dropped = L.get_output(L.DropoutLayer(L.InputLayer((None, 8), pt.maximum(h, 0)), p=0.5))
    if where == "round":
        dropped = fail(dropped)
    p = pt.special.softmax(pt.dot(dropped, w2), axis=-1)
    loss = lasagne.objectives.categorical_crossentropy(p, y).mean()
    updates = lasagne.updates.adam(loss, [w1, w2], learning_rate=0.01)
    if where == "reduced":
        updates[w1] = fail(updates[w1])
    return loss, updates


def generator_states(state):
    """A routine: a checksum of each random generator's state on this rank."""
    generators = [v.get_value(borrow=True) for v in state.registry.variables
                  if isinstance(v.type, RandomType)]  # fmt: skip
    return [np.array([zlib.crc32(repr(_state(g)).encode()) for g in generators], np.int64)]


def _state(generator):
    return generator.bit_generator.state if hasattr(generator, "bit_generator") else generator


def state_per_rank(variables, n):
    """Each rank's values of ``variables``, then its generators' checksums."""
    generators = [r[0] for r in routines.run(generator_states)]
    return [
        [np.asarray(synk.get_value(r, v)).copy() for v in variables] + [generators[r]]
        for r in range(n)
    ]


def check_failure_changes_nothing(tmp_path, where, mode, warm):
    flag = tmp_path / "fail"
    fail = FailOnWorkers(os.getpid(), str(flag))
    x, y = pt.matrix("x"), pt.ivector("y")
    loss, updates = network(x, y, fail, where)
    train = synk.function([x, y], loss, updates=updates, mode=mode)
    assert isinstance(train, TrainingFunction) and train.round_functions
    rng = np.random.default_rng(1)
    xv = rng.normal(size=(ROWS, 6)).astype(pytensor.config.floatX)
    yv = rng.integers(0, 3, ROWS).astype("int32")
    variables = list(updates)
    generators = [v for v in graph_inputs([loss]) if isinstance(v.type, RandomType)]
    assert generators
    if warm:
        train(xv, yv)
    before = state_per_rank(variables, 2)
    start = [v.get_value() for v in variables + generators]  # rank 0's, for the reference
    flag.touch()
    with pytest.raises(synk.RemoteError, match="injected failure") as info:
        train(xv, yv)
    note = "\n".join(info.value.__notes__)
    if mode is None:  # JAX mode: the row phase's generator updates apply as it runs
        assert "no rank applied any update" in note or "disagree on: RNG(" in note
        assert "w1" not in note and "w2" not in note
    else:
        assert "no rank applied any update" in note
    flag.unlink()
    for got, want in zip(state_per_rank(variables, 2), before, strict=True):
        if mode is None and "disagree on: RNG(" in note:
            got, want = got[:-1], want[:-1]  # the generators the note names moved
        for var, g, w in zip([*variables, "generators"], got, want, strict=False):
            np.testing.assert_array_equal(g, w, err_msg=str(var))
    synk.verify()
    if mode is None:
        # JAX mode: the failed call's row phase moved the generators it drew from where
        # it ran (the note names them); the next call's dropout masks are then not the
        # reference's (the variables above are unchanged all the same).
        train(xv, yv)
        synk.verify()
        return
    ref = pytensor.function([x, y], loss, updates=updates, mode=mode)
    train(xv, yv)
    after = [np.asarray(v.get_value()).copy() for v in variables]
    for v, value in zip(variables + generators, start, strict=True):
        v.set_value(value)
    ref(xv, yv)  # one device's step from the same state
    for v, got in zip(variables, after, strict=True):
        np.testing.assert_allclose(got, np.asarray(v.get_value()), rtol=1e-4, atol=1e-6)
    synk.broadcast(variables)


@pytest.fixture(scope="module", params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def backend(request):
    """A 2-rank session of ``request.param``'s ranks (GPU ranks on CPU devices here)."""
    if request.param == "gpu":
        pytest.importorskip("jax")
    synk.fork(2, backend=request.param)
    yield request.param
    synk.close()


@pytest.mark.parametrize("where", ["rows", "round", "reduced"])
def test_failed_call_changes_nothing(backend, tmp_path, where):
    if backend == "cpu":
        check_failure_changes_nothing(tmp_path, where, "FAST_COMPILE", warm=True)
    else:
        # JAX mode runs the op's Python when a rank compiles the function: at the first
        # call, so that call is the one that fails.
        check_failure_changes_nothing(tmp_path, where, None, warm=False)
