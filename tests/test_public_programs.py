"""What public Lasagne/Theano programs do that a port by one line (``theano.function`` →
``synk.function``) must survive, on 2 and 3 CPU ranks and GPU ranks (CPU devices here),
against one process: a trailing ``set_value`` before :func:`synkhronos.verify`.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.rank.backends import gpu

SESSIONS = [
    ("cpu", 2),
    ("cpu", 3),
    pytest.param(("gpu", 2), marks=pytest.mark.gpu),
    pytest.param(("gpu", 3), marks=pytest.mark.gpu),
]
FX = "float32"


@pytest.fixture(scope="module", params=SESSIONS, ids=lambda p: f"{p[0]}x{p[1]}")
def session(request):
    """A session of ``request.param`` (backend, ranks): its number of ranks."""
    backend, n = request.param
    if backend == "gpu":
        pytest.importorskip("jax")
        if not gpu.on_cpu_devices() and len(gpu.visible_gpus()) < n:
            pytest.skip(f"needs {n} GPUs")
    synk.fork(n, backend=backend)
    yield n
    synk.close()


def test_verify_after_a_trailing_set_value(session, rng):
    """A learning rate set on rank 0 after the last call is pending, not a disagreement:
    verify sends it, as the next call would, and every rank then holds it."""
    lr = pytensor.shared(np.asarray(0.1, FX), name="lr")
    w = pytensor.shared(rng.normal(size=3).astype(FX), name="w")
    x = pt.matrix("x", dtype=FX)
    step = synk.function([x], updates=[(w, w - lr * (x @ w).mean() * x.mean(axis=0))])
    xv = rng.normal(size=(11, 3)).astype(FX)
    step(xv)
    lr.set_value(np.asarray(0.05, FX))
    synk.verify()
    assert [synk.get_value(r, lr) for r in range(session)] == [np.float32(0.05)] * session
    synk.verify()


def test_a_plain_function_on_rank_0_returns_numpy(session, rng):
    """The program's own ``pytensor.function`` (no mode named) returns NumPy arrays, also
    on GPU ranks (where it compiles in JAX mode) and after a call trained the parameters
    it reads: a character model's ``ix_to_char[np.argmax(probs(x).ravel())]``."""
    w = pytensor.shared(rng.normal(size=(4, 5)).astype(FX), name="w_chars")
    x = pt.matrix("x", dtype=FX)
    probs = pt.special.softmax(x @ w, axis=-1)
    step = synk.function([x], probs.max(axis=1).mean(), updates=[(w, w * 0.9)])
    xv = rng.normal(size=(11, 4)).astype(FX)
    step(xv)
    plain = pytensor.function([x], probs)
    ix_to_char = dict(enumerate("abcde"))
    got = plain(xv[:1])
    assert type(got) is np.ndarray
    assert ix_to_char[np.argmax(got.ravel())] in "abcde"
    want = pytensor.function([x], probs, mode="FAST_COMPILE")(xv[:1])
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _gaussian_sample_model(rng_seed: int):
    """A variational autoencoder's training step, small: a per-row Gaussian draw
    (``srng.normal`` the batch's size), its loss a sum over the rows, plain SGD."""
    from synkhronos.theano.sandbox.rng_mrg import MRG_RandomStreams

    init = np.random.default_rng(rng_seed)
    w_enc = pytensor.shared(init.normal(size=(6, 4)).astype(FX) * 0.5, name="w_enc")
    w_dec = pytensor.shared(init.normal(size=(2, 6)).astype(FX) * 0.5, name="w_dec")
    srng = MRG_RandomStreams(1234)
    x = pt.matrix("x", dtype=FX)
    h = x @ w_enc
    mu, log_sigma = h[:, :2], h[:, 2:]
    z = mu + pt.exp(log_sigma) * srng.normal((x.shape[0], 2), dtype=FX)
    out = pt.sigmoid(z @ w_dec)
    kl = 0.5 * pt.sum(1 + 2 * log_sigma - mu**2 - pt.exp(2 * log_sigma))
    loss = -(x * pt.log(out) + (1 - x) * pt.log(1 - out)).sum() - kl
    params = [w_enc, w_dec]
    grads = pt.grad(loss, params)
    updates = [(p, p - np.float32(0.01) * g) for p, g in zip(params, grads, strict=True)]
    return x, loss, updates, params


def test_a_per_row_gaussian_sample_trains_as_one_device(session):
    """Every rank draws the whole batch's numbers from rank 0's generator, as one device
    would (:mod:`synkhronos.api.split`): 4 steps equal one process's function in the
    same mode (JAX on GPU ranks), the generator's state carried from call to call."""
    xv = (np.random.default_rng(1).random((11, 6)) > 0.5).astype(FX)
    x, loss, updates, params = _gaussian_sample_model(0)
    train = synk.function([x], loss, updates=updates)
    got = [float(train(xv)) for _ in range(4)]
    x, loss, updates, reference = _gaussian_sample_model(0)
    one = pytensor.function([x], loss, updates=updates)
    want = [float(one(xv)) for _ in range(4)]
    assert len(set(want)) == 4  # each step draws anew
    np.testing.assert_allclose(got, want, rtol=2e-5)
    for p, r in zip(params, reference, strict=True):
        for rank in range(session):
            np.testing.assert_allclose(
                synk.get_value(rank, p), np.asarray(r.get_value()), rtol=1e-4, atol=1e-6
            )


def test_a_checkpoint_keeps_the_draws(session, tmp_path):
    """A generator's state saved and loaded (a JAX key on GPU ranks): the step after the
    load draws what the step after the save drew."""
    xv = (np.random.default_rng(2).random((11, 6)) > 0.5).astype(FX)
    x, loss, updates, _ = _gaussian_sample_model(5)
    train = synk.function([x], loss, updates=updates)
    train(xv)
    synk.save(tmp_path / "vae.npz")
    after = [float(train(xv)) for _ in range(2)]
    synk.load(tmp_path / "vae.npz")
    assert [float(train(xv)) for _ in range(2)] == after

