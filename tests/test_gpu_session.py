"""The program's own functions on rank 0 of a GPU-rank session (2 ranks, CPU devices
here): after synkhronos training steps, a plain ``pytensor.function`` reading the trained
shared variables (a validation loss, an L2 penalty) gives the numpy formula's value, given
a numpy array, a read-only one or a ``synk.data`` array. The session makes JAX the mode of
such functions, as it makes float32 floatX, and gives the old settings back at its close.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.api.training import TrainingFunction
from synkhronos.extensions import lasagne
from synkhronos.rank.compiled import is_jax

pytest.importorskip("jax")


def cross_entropy(logits, labels):
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -log_p[np.arange(len(labels)), labels].mean()


@pytest.mark.gpu
def test_plain_functions_read_what_gpu_ranks_trained(rng):
    mode, float_x = pytensor.config.mode, pytensor.config.floatX
    synk.fork(2, backend="gpu")
    try:
        w = pytensor.shared(rng.normal(size=(5, 3)).astype("float32"), name="w_session")
        b = pytensor.shared(np.zeros(3, "float32"), name="b_session")
        x, y = pt.matrix("x"), pt.ivector("y")
        loss = lasagne.objectives.categorical_crossentropy(
            pt.special.softmax(pt.dot(x, w) + b, axis=-1), y
        ).mean()
        updates = lasagne.updates.adam(loss, [w, b], learning_rate=0.05)
        train = synk.function([x, y], loss, updates=updates)
        assert isinstance(train, TrainingFunction)
        xv = rng.normal(size=(27, 5)).astype("float32")  # 27 rows: 14 and 13 per rank
        yv = rng.integers(0, 3, 27).astype("int32")
        start = w.get_value().copy()
        for _ in range(3):
            train(xv, yv)
        assert not np.allclose(np.asarray(w.get_value()), start)  # trained on the ranks
        synk.verify()
        validate = pytensor.function([x, y], loss)
        l2 = pytensor.function([], (w**2).sum() + (b**2).sum())
        scaled_l2 = pytensor.function([x], 1e-3 * (w**2).sum() * x.sum())
        wv, bv = (np.asarray(v.get_value()) for v in (w, b))
        read_only = xv.copy()
        read_only.flags.writeable = False
        for given in (xv, read_only, synk.data(xv)):
            np.testing.assert_allclose(
                validate(given, yv), cross_entropy(xv @ wv + bv, yv), rtol=1e-5
            )
            np.testing.assert_allclose(scaled_l2(given), 1e-3 * (wv**2).sum() * xv.sum(), rtol=1e-4)
        np.testing.assert_allclose(l2(), (wv**2).sum() + (bv**2).sum(), rtol=1e-5)
        assert is_jax(pytensor.config.mode)  # the mode they compiled in
        assert type(validate(xv, yv)) is np.ndarray and type(l2()) is np.ndarray
        train(xv, yv)  # and training goes on after them
        synk.verify()
    finally:
        synk.close()
    assert (pytensor.config.mode, pytensor.config.floatX) == (mode, float_x)
    import jax

    # JAX's precision follows the restored floatX (a later CPU session's workers' does).
    assert jax.config.read("jax_enable_x64") == (float_x == "float64")


#: A program's first function in a GPU session, before any synkhronos function compiled.
FIRST_FUNCTION = """
import numpy as np, pytensor, pytensor.tensor as pt
import synkhronos as synk
synk.fork(1, backend="gpu")
try:
    x, y = pt.matrix("x"), pt.ivector("y")
    log_p = pt.special.log_softmax(x, axis=1)
    f = pytensor.function([x, y], -log_p[pt.arange(y.shape[0]), y].mean())
    rng = np.random.default_rng(0)
    xv, yv = rng.normal(size=(300, 3)).astype("float32"), rng.integers(0, 3, 300).astype("int32")
    shifted = xv - xv.max(axis=1, keepdims=True)
    want = -(shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True)))[np.arange(300), yv]
    np.testing.assert_allclose(f(xv, yv), want.mean(), rtol=1e-5)
finally:
    synk.close()
print("ok")
"""


@pytest.mark.gpu
def test_the_programs_first_jax_function_has_the_fixes():
    """The session's JAX mode, before any synkhronos function compiled: PyTensor's JAX
    ``arange`` of a constant int8 start overflowed once the rows passed 127 (a fresh
    process: the fixes, once imported, stay)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(Path(__file__).parents[1]))
    done = subprocess.run(
        [sys.executable, "-c", FIRST_FUNCTION],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # a hang guard
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.gpu
def test_a_training_function_in_another_mode_trains_on_gpu_ranks(rng):
    """A training function the program compiles in a mode other than JAX's (here
    FAST_COMPILE) runs its chain step by step on GPU ranks: the fused program takes JAX
    functions only (it failed: 'Loop' object has no attribute 'jit_fn')."""
    synk.fork(2, backend="gpu")
    try:
        w = pytensor.shared(rng.normal(size=(5, 3)).astype("float32"), name="w_fast_compile")
        x, y = pt.matrix("x"), pt.ivector("y")
        loss = lasagne.objectives.categorical_crossentropy(
            pt.special.softmax(pt.dot(x, w), axis=-1), y
        ).mean()
        updates = lasagne.updates.sgd(loss, [w], learning_rate=0.1)
        train = synk.function([x, y], loss, updates=updates, mode="FAST_COMPILE")
        reference = pytensor.function([x, y], loss, updates=updates, mode="FAST_COMPILE")
        xv = rng.normal(size=(11, 5)).astype("float32")
        yv = rng.integers(0, 3, 11).astype("int32")
        start = w.get_value().copy()
        got = [float(train(xv, yv)) for _ in range(3)]
        trained = np.asarray(w.get_value())
        synk.verify()
        w.set_value(start)
        want = [float(reference(xv, yv)) for _ in range(3)]
        np.testing.assert_allclose(got, want, rtol=1e-5)
        np.testing.assert_allclose(trained, np.asarray(w.get_value()), rtol=1e-5, atol=1e-6)
    finally:
        synk.close()


@pytest.mark.gpu
def test_every_rank_computes_in_rank_0s_precision_from_its_start(monkeypatch):
    """With floatX float64, a worker's JAX computed in 32 bits until its first JAX-mode
    function compiled: a routine's program (the compiled NUTS's) crashed or differed."""
    from jax_precision import precision

    from synkhronos.api import routines

    monkeypatch.setenv("PYTENSOR_FLAGS", "floatX=float64")
    with pytensor.config.change_flags(floatX="float64"):
        synk.fork(3, backend="gpu")
        try:
            assert [r[0].tolist() for r in routines.run(precision)] == [[8], [8], [8]]
        finally:
            synk.close()
