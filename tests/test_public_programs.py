"""What public Lasagne/Theano programs do that a port by one line (``theano.function`` →
``synk.function``) must survive, on 2 and 3 CPU ranks and GPU ranks (CPU devices here),
against one process: a trailing ``set_value`` before :func:`synkhronos.verify`; the
program's own plain function on rank 0; a per-row Gaussian draw (a VAE); a checkpoint of
its generator; the clipped LSTM; mixup by an index input (refused) and rows mixed in a
plain function (said).
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


def test_a_clipped_lstm_draws_no_warning(session):
    """The Lasagne port's gradient clipping (a subclass of PyTensor's ``GradClip``, a
    view of its input) is judged as the op it derives from: the character LSTM's
    training function is exact, and says nothing."""
    from synkhronos.extensions import lasagne

    layers = lasagne.layers
    x, y = pt.tensor3("x", dtype=FX), pt.ivector("y")
    net = layers.InputLayer((None, 5, 3), x)
    net = layers.LSTMLayer(net, 4, grad_clipping=5.0, only_return_final=True)
    net = layers.DenseLayer(net, 3, nonlinearity=lasagne.nonlinearities.softmax)
    loss = lasagne.objectives.categorical_crossentropy(layers.get_output(net), y).mean()
    params = layers.get_all_params(net, trainable=True)
    updates = lasagne.updates.adam(loss, params, learning_rate=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        synk.function([x, y], loss, updates=updates)
    said = [str(w.message) for w in caught if "rows" in str(w.message)]
    assert not said, said


def _mixup():
    x, perm = pt.matrix("x", dtype=FX), pt.lvector("perm")
    return x, perm, np.float32(0.7) * x + np.float32(0.3) * x[perm]


def test_mixup_by_an_index_input_is_refused(session):
    """``0.7 * x + 0.3 * x[perm]``: each rank's share of ``perm`` numbers the whole
    batch's rows, which a rank does not hold (it would read past its own): a plain
    function and a training function are refused, naming ``perm``, before any rank runs."""
    x, perm, mixed = _mixup()
    with pytest.raises(ValueError, match=r"by the values of 'perm'.* read past"):
        synk.function([x, perm], mixed)
    with pytest.raises(ValueError, match=r"by the values of 'perm'.* read past"):
        synk.function([x, perm], mixed.sum(), collect_modes="reduce", reduce_ops="sum")
    w = pytensor.shared(np.ones(3, FX), name="w_mixup")
    y = pt.vector("y", dtype=FX)
    loss = ((mixed @ w - y) ** 2).mean()
    with pytest.raises(ValueError, match=r"by the values of 'perm'.* read past"):
        synk.function([x, perm, y], loss, updates=[(w, w - np.float32(0.1) * pt.grad(loss, w))])


def test_mixup_by_a_given_permutation_is_exact(session, rng):
    """The permuted rows given as an input (``x[perm]`` made before the call): the plain
    function gives one device's rows, every row of the 11."""
    x, x_perm = pt.matrix("x", dtype=FX), pt.matrix("x_perm", dtype=FX)
    f = synk.function([x, x_perm], np.float32(0.7) * x + np.float32(0.3) * x_perm)
    xv = rng.normal(size=(11, 3)).astype(FX)
    pv = rng.permutation(11)
    np.testing.assert_allclose(f(xv, xv[pv]), 0.7 * xv + 0.3 * xv[pv], rtol=1e-6)


def test_a_plain_function_that_mixes_rows_is_said(session, rng):
    """An output the ranks gather that mixes rows (``x[::-1]``) is warned, as a training
    function's is; one each rank keeps (``per_rank``) is not."""
    x = pt.matrix("x", dtype=FX)
    with pytest.warns(UserWarning, match="mix rows"):
        synk.function([x], x[::-1] - x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        synk.function([x], (x[::-1] - x, "per_rank"))
        synk.function([x], [x * 2, x.sum()])


def test_a_value_kept_between_rounds_is_named_by_the_users_variable():
    """The reason rounds cannot be cut names a value PyTensor made (a scalar taken from an
    array) with the nearest variable of the user's it is computed from, in a whole
    sentence."""
    from synkhronos.api.split.analysis import RowGraph
    from synkhronos.api.split.rounds import _described

    x = pt.matrix("x", dtype=FX)
    gate = pytensor.shared(np.ones(1, FX), name="block7.gate")
    scalar = pt.scalar_from_tensor((gate * 2)[0])
    graph = RowGraph([x.sum() * scalar], [x])
    said = _described(graph, graph.clone_of.get(scalar, scalar))
    assert said.endswith("computed from 'block7.gate')"), said
