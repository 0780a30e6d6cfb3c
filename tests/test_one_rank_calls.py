"""Calls like the last one (the same ``Data``, of the same layouts), which reuse the last
call's plan and rank 0's piece of it; on one rank they run that piece at once, with no
message sent (a ``KeptCall``, :mod:`synkhronos.api.calls`, through the one-rank branch of
``Session.execute``). Each call's outputs, and the shared variables its updates wrote, are
compared with a plain ``pytensor.function`` of the same graph on the whole data, between
calls: a Data changed in place, a shared variable set, a broadcast Data set, a Data of
another length, numpy arguments. CPU ranks and GPU ranks (on CPU devices here), one rank
and, for the reuse through the command channel, two with uneven rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk

CASES = [
    ("cpu", 1),
    pytest.param("gpu", 1, marks=pytest.mark.gpu),
    pytest.param("gpu", 2, marks=pytest.mark.gpu),
]


def _graph(rng, dtype: str):
    """A synk function with several reduce ops and updates (one that reads its broadcast
    input), and the same graph as a plain PyTensor function on shared variables of its own."""
    x, k = pt.matrix("x", dtype=dtype), pt.scalar("k", dtype=dtype)
    w0 = rng.normal(size=3).astype(dtype)
    w, w_ref = (pytensor.shared(w0.copy(), name=n) for n in ("w", "w_ref"))
    steps, steps_ref = (pytensor.shared(np.int64(0), name=n) for n in ("steps", "steps_ref"))

    def outputs(w, steps):
        h = x @ w
        return [
            ((h * k).sum(), "sum"),
            (h, "gather"),
            (x.max(), "max"),
            ((h**2).mean(), "avg"),
            (steps * 1, None),
        ], [(w, w * 0.5 + k), (steps, steps + 1)]

    outs, updates = outputs(w, steps)
    f = synk.function([x], outs, bcast_inputs=[k], updates=updates)
    outs_ref, updates_ref = outputs(w_ref, steps_ref)
    ref = pytensor.function([x, k], [o for o, _ in outs_ref], updates=updates_ref)
    return f, ref, (w, w_ref), (steps, steps_ref)


@pytest.mark.parametrize(("backend", "n_ranks"), CASES)
def test_calls_like_the_last_equal_plain_pytensor(backend, n_ranks, rng):
    if backend == "gpu":
        pytest.importorskip("jax")
    synk.fork(n_ranks, backend=backend)
    try:
        dtype = "float32" if backend == "gpu" else "float64"
        rtol = 1e-5 if dtype == "float32" else 1e-12
        f, ref, (w, w_ref), (steps, steps_ref) = _graph(rng, dtype)

        def check(*args):
            values = [a.data if isinstance(a, synk.Data) else a for a in args]
            got, want = f(*args), ref(*values)
            for g, v in zip(got, want, strict=True):
                np.testing.assert_allclose(g, v, rtol=rtol, atol=rtol)
            np.testing.assert_allclose(w.get_value(), w_ref.get_value(), rtol=rtol)
            assert int(steps.get_value()) == int(steps_ref.get_value())
            return got

        xv = rng.normal(size=(11, 3)).astype(dtype)
        xd, kd = f.build_inputs(xv, np.asarray(0.25, dtype))
        first = check(xd, kd)  # planned
        kept = f._kept
        assert kept.alone == (n_ranks == 1)
        again = check(xd, kd)  # reused
        assert f._kept is kept
        for a, b in zip(first, again, strict=True):  # the same kinds of values
            assert (np.asarray(a).dtype, np.shape(a)) == (np.asarray(b).dtype, np.shape(b))
        assert again[0].flags.writeable and again[1].flags.writeable
        xd.data[:] = rng.normal(size=(11, 3)).astype(dtype)  # in place
        check(xd, kd)
        w.set_value(rng.normal(size=3).astype(dtype))  # a shared variable set
        w_ref.set_value(w.get_value())
        check(xd, kd)
        kd.set_value(np.asarray(-1.5, dtype))  # the broadcast Data set
        check(xd, kd)
        assert f._kept is kept
        xd.set_value(rng.normal(size=(17, 3)).astype(dtype))  # another length: planned again
        check(xd, kd)
        assert f._kept is not kept
        check(xd, kd)
        for _ in range(2):  # numpy arrays: the function's scratch Data, then a call like it
            check(rng.normal(size=(5, 3)).astype(dtype), kd)
        kept, scratch = f._kept, f.planner.scratch[0].data.copy()
        check(rng.normal(size=(5, 3)).astype(dtype), kd)
        assert f._kept is kept
        if n_ranks == 1:  # taken as it is, not copied into the scratch Data
            np.testing.assert_array_equal(f.planner.scratch[0].data, scratch)
        check(rng.normal(size=(5, 6)).astype(dtype)[:, ::2], kd)  # not C-contiguous: copied
        check(rng.normal(size=(5, 3)).astype("float16"), kd)  # another dtype: cast
        check(rng.normal(size=(8, 3)).astype(dtype), kd)  # another length: planned
        check(rng.normal(size=(8, 3)).astype(dtype), kd)
    finally:
        synk.close()


def test_released_data_do_not_pile_up_between_one_rank_calls(rng):
    """Data made and dropped between calls that take the one-rank shortcut: their segments
    leave /dev/shm and the list of released ids, which only a command to workers empties,
    stays empty (on one rank there is no worker to tell); the outputs stay right."""
    from synkhronos.transport import shared_arrays
    from synkhronos.transport.names import process_prefix

    synk.fork(1)
    try:
        x = pt.matrix("x")
        f = synk.function([x], (x.sum(axis=0), "sum"))
        xd = synk.data(rng.normal(size=(7, 3)))
        f(xd)
        assert f._kept.alone

        def data_names():
            return sorted(
                p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(process_prefix())
            )

        before = data_names()
        for i in range(50):
            tmp = synk.data(np.full((4, 3), float(i)))  # dropped at the next iteration
            tmp.data  # noqa: B018 - allocate its segment
            if i % 2:
                tmp.free_memory()
            np.testing.assert_allclose(f(xd), xd.data.sum(axis=0), rtol=1e-12)
            assert f._kept.alone
        del tmp
        f(xd)
        assert shared_arrays.released_ids == []
        assert data_names() == before
    finally:
        synk.close()


@pytest.mark.gpu
def test_one_gpu_ranks_training_step_runs_on_its_devices_own_arrays(rng, monkeypatch):
    """On one GPU rank a one-line training step's fused program takes and gives the
    device's own arrays: no array of the mesh is made per call (host rows are put by the
    program's call, as a ``jax.jit`` function's), each parameter's and Adam moment's buffer
    goes to its own new value, and the losses and parameters are plain PyTensor's."""
    pytest.importorskip("jax")
    import jax

    from synkhronos.extensions.lasagne import updates
    from synkhronos.session import launch
    from synkhronos.transport.comm import xla_settings
    from tests.test_gpu_step import WIDTHS, _model, program_layout

    monkeypatch.setenv(xla_settings.DONATE_VAR, "1")  # as on GPUs (read at the fork)
    synk.fork(1, backend="gpu")
    try:
        float_x = pytensor.config.floatX
        x_all = rng.normal(size=(56, WIDTHS[0])).astype(float_x)
        y_all = rng.normal(size=56).astype(float_x)
        inputs, params, loss = _model(float_x)
        start = [p.get_value() for p in params]
        step = synk.function(inputs, loss, updates=updates.adam(loss, params, learning_rate=0.02))
        state = launch.current().state
        monkeypatch.setattr(state.comm, "_whole", None)  # a call that made one would fail
        batches = [slice(0, 28), slice(28, 56), slice(0, 27), slice(28, 56)]
        losses = [float(step(x_all[b], y_all[b])) for b in batches]
        fused = list(state.fused.values())[-1]
        assert fused.calls == len(batches)
        own = jax.sharding.SingleDeviceSharding(state.comm.device)
        assert state.comm.sharding == own
        assert all(c[0].sharding == own for c in fused.cells)
        (held, n_cells, n_results), to = program_layout(state, [28, 28], [WIDTHS[0]])
        assert held == 0 and n_results == n_cells + 1
        assert to.tolist() == list(range(n_cells))  # each buffer to its own new value
        trained = [p.get_value() for p in params]
    finally:
        synk.close()
    for p, value in zip(params, start, strict=True):
        p.set_value(value)
    plain = pytensor.function(inputs, loss, updates=updates.adam(loss, params, learning_rate=0.02))
    expected = [float(plain(x_all[b], y_all[b])) for b in batches]
    np.testing.assert_allclose(losses, expected, rtol=2e-5)
    for got, p in zip(trained, params, strict=True):  # Adam: a near-0 gradient's m / sqrt(v)
        np.testing.assert_allclose(got, p.get_value(), rtol=2e-5, atol=1e-5)  # is float32 noise


@pytest.fixture
def planned(monkeypatch):
    """One GPU rank, and the list of the Functions planned (``Function.plan``) while it runs."""
    pytest.importorskip("jax")
    from synkhronos.api.functions import Function

    made: list = []
    plan = Function.plan
    monkeypatch.setattr(Function, "plan", lambda f, *a: made.append(f) or plan(f, *a))
    synk.fork(1, backend="gpu")
    yield made
    synk.close()


@pytest.mark.gpu
def test_one_gpu_ranks_training_calls_like_the_last_equal_plain_pytensor(rng, planned):
    """On one GPU rank a training step called like its last call (no option, numpy rows of
    the same shapes and dtypes, or the same Data of the same layouts) goes straight to its
    fused program, unplanned (``KeptCall``); between such calls a shared variable
    set, another learning rate (a broadcast input), another batch size, Data for numpy
    rows and back, a Data changed in place or set to another length, an option, rows of
    another dtype and arguments by name: each call's outputs and the parameters after it
    are plain PyTensor's."""
    from synkhronos.extensions.lasagne import updates
    from synkhronos.transport import shared_arrays
    from tests.test_gpu_step import _model

    float_x = pytensor.config.floatX  # float32 on GPU ranks
    lr = pt.scalar("lr", dtype=float_x)
    (x, y), params, loss = _model(float_x)
    outputs = [loss, (x.sum(), "sum")]
    step = synk.function([x, y], outputs, bcast_inputs=[lr], updates=updates.adam(loss, params, lr))
    (x_r, y_r), params_r, loss_r = _model(float_x)
    ref = pytensor.function(
        [x_r, y_r, lr], [loss_r, x_r.sum()], updates=updates.adam(loss_r, params_r, lr)
    )
    xs = rng.normal(size=(40, 20)).astype(float_x)
    ys = rng.normal(size=40).astype(float_x)

    def check(xv, yv, rate=0.02, **options):
        got = step(xv, yv, rate, **options)
        values = [np.asarray(a)[options.get("batch", slice(None))] for a in (xv, yv)]
        want = ref(*values, rate)
        want = want[0] if options.get("output_subset") == [0] else want
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)
        for p, p_r in zip(params, params_r, strict=True):
            np.testing.assert_allclose(p.get_value(), p_r.get_value(), rtol=2e-5, atol=1e-5)

    check(xs[:16], ys[:16])
    assert len(planned) == 1
    check(xs[16:32], ys[16:32])  # like the last: unplanned
    check(xs[:16], ys[:16], 0.005)  # another learning rate
    p0 = rng.normal(size=params[0].get_value().shape).astype(float_x)
    params[0].set_value(p0)
    params_r[0].set_value(p0)
    check(xs[16:32], ys[16:32])
    for i in range(3):  # Data released meanwhile: no worker to tell
        synk.data(np.zeros(3)).free_memory()
        check(xs[i : i + 16], ys[i : i + 16])
    assert len(planned) == 1 and shared_arrays.released_ids == []
    check(xs[:11], ys[:11])  # another batch size: planned, then kept
    check(xs[11:22], ys[11:22])
    assert len(planned) == 2
    xd, yd = synk.data(xs[:11]), synk.data(ys[:11])
    check(xd, yd)
    check(xd, yd)
    xd.data[:] = xs[20:31]  # in place, the same layout
    check(xd, yd)
    assert len(planned) == 3
    xd.set_value(xs[:20])
    yd.set_value(ys[:20])
    check(xd, yd)  # another layout: planned
    check(xs[:20], ys[:20])  # numpy again: planned, then kept
    check(xs[20:], ys[20:])
    assert len(planned) == 5
    check(xs[:20], ys[:20], output_subset=[0])
    check(xd, yd, batch=slice(2, 18))
    check(xs[20:], ys[20:])
    assert len(planned) == 7
    with pytest.raises(TypeError, match="lose precision"):
        step(xs[:20].astype("float64"), ys[:20], 0.02)
    check(xs[:20], ys[:20])
    assert len(planned) == 8
    got = step(y=ys[20:], x=xs[20:], lr=0.01)  # by name
    np.testing.assert_allclose(got, ref(xs[20:], ys[20:], 0.01), rtol=2e-5, atol=1e-5)
    assert len(planned) == 8


@pytest.mark.gpu
def test_one_gpu_ranks_chain_calls_like_the_last_equal_plain_pytensor(rng, planned):
    """A chain of functions and a collective on one GPU rank, called like its last call,
    goes straight to its program: its outputs (reduced and gathered) and the shared
    variables after each call are plain PyTensor's, between a shared variable set and
    arguments of other shapes."""
    float_x = pytensor.config.floatX
    x = pt.matrix("x", dtype=float_x)
    w0 = rng.normal(size=3).astype(float_x)
    w, g = pytensor.shared(w0.copy(), name="w"), pytensor.shared(np.zeros(3, float_x), "g")
    cost = ((x @ w) ** 2).sum()
    grad = synk.function(
        [x], [(cost, "sum"), (x @ w, "gather")], updates=[(g, pytensor.grad(cost, w))]
    )
    move = synk.function([], updates=[(w, w - 0.01 * g)])
    step = synk.chain(grad, ("all_reduce", g, "sum"), move)
    w_r = pytensor.shared(w0.copy())
    cost_r = ((x @ w_r) ** 2).sum()
    ref = pytensor.function(
        [x], [cost_r, x @ w_r], updates=[(w_r, w_r - 0.01 * pytensor.grad(cost_r, w_r))]
    )

    def check(xv):
        (got, _), want = step(xv), ref(np.asarray(xv))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-5)
        np.testing.assert_allclose(w.get_value(), w_r.get_value(), rtol=2e-5, atol=1e-6)

    xs = rng.normal(size=(30, 3)).astype(float_x)
    check(xs[:10])
    check(xs[10:20])
    check(xs[20:])
    assert len(planned) == 1
    w.set_value(w0)
    w_r.set_value(w0)
    check(xs[:10])
    check(xs[:13])  # another length: planned
    check(xs[13:26])
    assert len(planned) == 2


def test_calls_like_the_last_of_a_closed_session_are_refused(rng):
    """A function and a training function whose calls took the one-rank fast path are
    refused after the next fork, as the general path refuses them."""
    synk.fork(1, backend="cpu")
    try:
        x, index = pt.vector("x"), pt.lscalar("index")
        f = synk.function([x], (x.sum(), "sum"))
        data = pytensor.shared(rng.normal(size=(12, 2)), name="data")
        w = pytensor.shared(np.zeros(2), name="w")
        rows = pt.matrix("rows")
        loss = ((rows @ w - 1.0) ** 2).mean()
        train = synk.function(
            [index],
            loss,
            updates=[(w, w - 0.1 * pytensor.grad(loss, w))],
            givens={rows: data[index * 4 : (index + 1) * 4]},
            mode="FAST_COMPILE",
        )
        d = synk.data(np.ones(5))
        for k in range(3):
            f(d)
            train(k)
        assert f.fast is not None and train._fast is not None
    finally:
        synk.close()
    synk.fork(1, backend="cpu")
    try:
        with pytest.raises(RuntimeError, match="build it again"):
            train(0)
        with pytest.raises(RuntimeError, match="build it again"):
            f(d)
    finally:
        synk.close()
