"""A fused training step on GPU ranks (issue 51), on 2 CPU devices where no GPU is visible.

Buckets: the compiled XLA program holds one all-reduce per bucket of the flat gradient,
scheduled between the backward pass's matrix products, where the unbucketed program holds
one all-reduce after all of them; the bucketed step's trajectory is bit for bit the
unbucketed one's, and that of single-process PyTensor within float32 rounding.

Memory: after the first step, rank 0's device holds the shared variables' values and
nothing more (PyTensor's JAX functions kept a compile-time copy of each).
"""

from __future__ import annotations

import re

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.api import routines
from synkhronos.rank.backends import gpu
from synkhronos.session import launch
from synkhronos.transport.comm import xla_settings

pytest.importorskip("jax")

BUCKET_MB = "0.004"  # 1,000 float32 elements: the model's 4,325-element gradient in 5
WIDTHS = (20, 40, 40, 40, 5)
ROWS = 8  # per rank: every rank the same rows, so the step runs fused


@pytest.fixture(scope="module")
def gpu_ranks():
    with pytest.MonkeyPatch.context() as env:  # read by every rank as it joins
        env.setenv(xla_settings.BUCKET_VAR, BUCKET_MB)
        env.setenv(xla_settings.DONATE_VAR, "1")  # as on GPUs: the cells' buffers donated
        n = synk.fork(2 if gpu.on_cpu_devices() else None, backend="gpu")
    yield n
    synk.close()


def set_buckets(state, size) -> list[np.ndarray]:
    """(A routine) This rank's bucket size, as joined; then ``size`` bytes from now on."""
    joined = state.comm.bucket_bytes
    state.comm.bucket_bytes = int(size[0])
    return [np.array([joined])]


def _entry(state, rows, features) -> list[str]:
    """The lines of the compiled entry computation of this rank's latest fused program (a
    step of :func:`_model` on ``rows`` rows of ``features``)."""
    import jax

    sharding = state.comm.sharding  # of the arrays its programs take
    fused = list(state.fused.values())[-1]
    floatx = fused.cells[0][0].dtype
    kept = [  # the step's rows: x, y
        jax.ShapeDtypeStruct((int(rows[0]), int(features[0])), floatx, sharding=sharding),
        jax.ShapeDtypeStruct((int(rows[0]),), floatx, sharding=sharding),
    ]
    donated = [jax.ShapeDtypeStruct(c[0].shape, c[0].dtype, sharding=sharding) for c in fused.cells]
    text = fused.program.lower(kept, donated).compile().as_text()
    return text[text.index("\nENTRY") :].splitlines()


def schedule(state, rows, features) -> list[np.ndarray]:
    """(A routine) The compiled order of this rank's latest fused program: n for each
    all-reduce of an n-element vector, -1 for each matrix product (a dot; a custom call,
    as cuBLAS's on GPUs; or a fusion of the custom kind, as XNNPACK's on CPU devices), as
    "A<n>" and "D" in the test."""
    marks = []
    for line in _entry(state, rows, features):
        reduced = re.search(r"= (.*) all-reduce(?:-start)?\(", line)
        if reduced:  # one mark per vector it reduces (XLA may combine them in a tuple)
            marks += [int(n) for n in re.findall(r"f32\[(\d+)\]", reduced.group(1))]
        elif re.search(r"= f32\[\d+,\d+\]\S* (dot\(|custom-call\(|fusion\(.*kind=kCustom)", line):
            marks.append(-1)
    return [np.array(marks, np.int64)]


def _model(float_x):
    rng = np.random.default_rng(5)
    x, y = pt.matrix("x"), pt.vector("y")
    params = []
    for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:], strict=True)):
        params.append(pytensor.shared((rng.normal(size=(a, b)) / a**0.5).astype(float_x), f"w{i}"))
        params.append(pytensor.shared(np.zeros(b, float_x), f"b{i}"))
    h = x
    for w, b in zip(params[0::2], params[1::2], strict=True):
        h = pt.tanh(h @ w + b)
    loss = pt.mean((h.sum(axis=1) - y) ** 2)
    return [x, y], params, loss


def _steps(bucket_bytes: int, data, batches, make):
    """Losses and parameters after ``batches`` of a fresh Adam step, with buckets of
    ``bucket_bytes`` on every rank."""
    from synkhronos.extensions.lasagne import updates

    routines.run(set_buckets, np.array([bucket_bytes]))
    inputs, params, loss = _model(pytensor.config.floatX)
    step = make(loss, params, inputs, updates.adam, learning_rate=0.02)
    losses = [float(step(*data, batch=batch)) for batch in batches]
    return np.array(losses), np.concatenate([np.ravel(p.get_value()) for p in params])


@pytest.mark.gpu
def test_buckets_are_all_reduced_between_the_backward_products(gpu_ranks, rng):
    from synkhronos.extensions import train

    if gpu_ranks < 2:
        pytest.skip("one rank: XLA leaves out an all-reduce over one device")
    joined = [int(r[0][0]) for r in routines.run(set_buckets, np.array([4000]))]
    assert joined == [4000] * gpu_ranks  # SYNK_BUCKET_MB at the fork, on every rank
    float_x, rows = pytensor.config.floatX, ROWS * gpu_ranks
    data = (
        rng.normal(size=(rows, WIDTHS[0])).astype(float_x),
        rng.normal(size=rows).astype(float_x),
    )
    size = sum(a * b + b for a, b in zip(WIDTHS[:-1], WIDTHS[1:], strict=True)) + 1  # + rows
    for bucket_bytes in (4000, 0):
        _steps(bucket_bytes, data, [slice(0, rows)], train.make_step_function)
        replies = routines.run(schedule, np.array([ROWS]), np.array([WIDTHS[0]]))
        marks = [f"A{m}" if m > 0 else "D" for m in replies[0][0].tolist()]
        assert all(r[0].tolist() == replies[0][0].tolist() for r in replies)  # every rank's
        reduced = [int(m[1:]) for m in marks if m.startswith("A")]
        if bucket_bytes:
            assert sorted(reduced) == sorted([1000] * 4 + [size - 4000]), marks
            # A bucket's all-reduce is scheduled before the last backward products.
            assert "D" in marks[marks.index(next(m for m in marks if m[0] == "A")) :], marks
        else:
            assert reduced == [size], marks
            assert "D" not in marks[marks.index(f"A{size}") :], marks


@pytest.mark.gpu
def test_bucketed_steps_are_bit_identical_to_one_all_reduce(gpu_ranks, rng):
    from synkhronos.extensions import train

    float_x, rows = pytensor.config.floatX, ROWS * gpu_ranks
    data = (
        rng.normal(size=(4 * rows, WIDTHS[0])).astype(float_x),
        rng.normal(size=4 * rows).astype(float_x),
    )
    batches = [slice(rows * (i % 4), rows * (i % 4) + rows) for i in range(12)]
    batches.append(slice(0, rows - 1))  # rows split 8 and 7: step by step, the same
    got = {size: _steps(size, data, batches, train.make_step_function) for size in (4000, 0)}
    fused = list(launch.current().state.fused.values())[-2:]  # bucketed, then not
    assert [f.calls for f in fused] == [len(batches) - 1] * 2
    one = _steps(0, data, batches, train.make_pytensor_step_function)
    routines.run(set_buckets, np.array([4000]))
    for part in (0, 1):  # losses, then parameters
        if gpu_ranks == 2:  # a + b: the same bits in any pieces
            np.testing.assert_array_equal(got[4000][part], got[0][part])
        else:  # NCCL's order of additions may follow the vector's length (xla_settings.py)
            np.testing.assert_allclose(got[4000][part], got[0][part], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got[4000][part], one[part], rtol=2e-5, atol=1e-6)


def _device_buffers() -> dict[int, int]:
    """The distinct buffers alive in this process on rank 0's device: their bytes, by
    address."""
    import jax

    device = launch.current().state.comm.device
    return {
        shard.data.unsafe_buffer_pointer(): shard.data.nbytes
        for a in jax.live_arrays()
        for shard in a.addressable_shards
        if shard.device == device
    }


@pytest.mark.gpu
def test_the_first_step_holds_no_second_copy(gpu_ranks, rng):
    """After a fused Adam step, rank 0's device holds the parameters, Adam's state and the
    flat gradient once (issue 51: 3.6x the shared variables on an H200), besides the
    batch."""
    from synkhronos.extensions import train
    from synkhronos.extensions.lasagne import updates

    float_x, rows = pytensor.config.floatX, ROWS * gpu_ranks
    x = synk.data(rng.normal(size=(rows, 256)).astype(float_x))
    y = synk.data(rng.normal(size=rows).astype(float_x))
    inputs = [pt.matrix("x"), pt.vector("y")]
    w = pytensor.shared((0.05 * rng.normal(size=(256, 512))).astype(float_x), "w")
    v = pytensor.shared((0.05 * rng.normal(size=512)).astype(float_x), "v")
    loss = pt.mean((pt.tanh(inputs[0] @ w) @ v - inputs[1]) ** 2)
    step = train.make_step_function(loss, [w, v], inputs, updates.adam, learning_rate=0.01)
    before = _device_buffers()  # earlier tests' arrays, if any
    step(x, y)
    new = {p: n for p, n in _device_buffers().items() if p not in before}
    shared = sum(
        a.nbytes
        for a in (var.container.storage[0] for var in launch.current().state.registry.variables)
        if getattr(a, "unsafe_buffer_pointer", None) and a.unsafe_buffer_pointer() in new
    )
    assert shared >= 4 * w.get_value().nbytes  # w, Adam's two moments, the flat gradient
    batch = x.data.nbytes + y.data.nbytes
    assert sum(new.values()) <= shared + batch, (sum(new.values()), shared)


def test_compile_time_copies_are_dropped_and_the_function_still_reads_its_variables():
    """A ``pytensor.function`` in JAX mode holds a device copy of each shared variable it
    reads until :func:`drop_compile_time_copies`; then it still computes with the
    variables' current values."""
    import jax

    from synkhronos.rank.backends.jax_compat import drop_compile_time_copies

    x = pt.vector("x", dtype="float32")
    w = pytensor.shared(np.arange(4, dtype="float32"), "w")
    fn = pytensor.function([x], (x * w).sum(), updates=[(w, w + 1)], mode="JAX")
    held = [a for a in jax.live_arrays() if a.shape == (4,) and a.dtype == np.float32]
    assert any(np.array_equal(a, np.arange(4)) for a in held)  # PyTensor's copy
    assert drop_compile_time_copies(fn) == 1
    del held
    assert not [a for a in jax.live_arrays() if a.shape == (4,) and a.dtype == np.float32]
    ones = np.ones(4, "float32")
    assert float(fn(ones)) == 6.0 and float(fn(ones)) == 10.0
    w.set_value(np.zeros(4, "float32"))
    assert float(fn(ones)) == 0.0
    assert drop_compile_time_copies(pytensor.function([x], x + 1, mode="FAST_RUN")) == 0


def program_layout(state, rows, features) -> list[np.ndarray]:
    """(A routine) Of this rank's latest fused program (a training function's step on
    ``rows`` rows of ``features``): the bytes its handover variables hold on the device,
    the cells it keeps, its results, and the result each donated cell's buffer goes to
    (-1 where none)."""
    import jax

    sharding = state.comm.sharding  # of the arrays its programs take
    fused = list(state.fused.values())[-1]
    spec = fused.function_calls[0].fn.spec
    handed = [v.container.storage[0] for c in fused.function_calls for v in c.fn.spec.handover]
    held = sum(a.nbytes for a in handed if isinstance(a, jax.Array))
    n, width, whole = int(rows[0]), int(features[0]), int(rows[1])
    shapes = [(n, width), (n,), (whole,)]  # x, y, the whole batch's rows
    kept = [
        jax.ShapeDtypeStruct(shape, v.type.dtype, sharding=sharding)
        for shape, v in zip(shapes, [*spec.inputs, *spec.bcast_inputs], strict=True)
    ]
    donated = [jax.ShapeDtypeStruct(c[0].shape, c[0].dtype, sharding=sharding) for c in fused.cells]
    text = fused.program.lower(kept, donated).compile().as_text()
    header = text.splitlines()[0]
    results = re.search(r"->\((.*?)\)\}", header).group(1)
    aliased = dict((int(p), int(o)) for o, p in re.findall(r"\{(\d+)\}: \((\d+), \{\}", header))
    to = [aliased.get(len(kept) + k, -1) for k in range(len(fused.cells))]
    n_results = len(re.findall(r"\w+\[[\d,]*\]", results))
    return [np.array([held, len(fused.cells), n_results]), np.array(to)]


@pytest.mark.gpu
def test_a_training_functions_handover_stays_inside_its_program(gpu_ranks, rng):
    """A one-line training function's fused step keeps what its phases hand over (the
    gradients) inside its program: no result, no buffer held after the step, and each
    parameter's and Adam moment's buffer goes to its own new value (a gradient result of
    the same shape took it, and XLA copied every moment: 1.3x a jax.jit step). The answer
    is one process's, on every rank alike, fused (28 rows) or step by step (27)."""
    from synkhronos.extensions.lasagne import updates

    float_x = pytensor.config.floatX
    x_all = rng.normal(size=(56, WIDTHS[0])).astype(float_x)
    y_all = rng.normal(size=56).astype(float_x)
    inputs, params, loss = _model(float_x)
    start = [p.get_value() for p in params]
    adam = updates.adam(loss, params, learning_rate=0.02)
    step = synk.function(inputs, loss, updates=adam)
    batches = [slice(0, 28), slice(28, 56), slice(0, 27), slice(28, 56)]
    losses = [float(step(x_all[b], y_all[b])) for b in batches[:2]]
    rows = np.array([28 // gpu_ranks, 28])
    replies = routines.run(program_layout, rows, np.array([WIDTHS[0]]))
    losses += [float(step(x_all[b], y_all[b])) for b in batches[2:]]
    fused = list(launch.current().state.fused.values())[-1]
    assert fused.calls == (4 if gpu_ranks == 1 else 3)  # 27 rows as 14 and 13: step by step
    if gpu_ranks > 1:  # the cells' mesh-wide arrays kept for the next call: none made again
        assert all(fused._held[id(c[0])][0] is c[0] for c in fused.cells)
    moments = 2 * len(params) + 1  # and Adam's step count
    for (held, n_cells, n_results), to in replies:
        assert held == 0  # no gradient kept on the device after a fused step
        assert n_cells == len(params) + moments, n_cells
        assert n_results == n_cells + 1  # the cells, then the loss
        assert to.tolist() == list(range(n_cells))  # each buffer to its own new value
    trained = [p.get_value() for p in params]
    for var, stacked in zip(params, synk.gather(params, nd_up=1), strict=True):
        for r in range(1, gpu_ranks):
            assert np.array_equal(stacked[r], stacked[0]), (var, r)
    for p, value in zip(params, start, strict=True):
        p.set_value(value)
    plain = pytensor.function(inputs, loss, updates=updates.adam(loss, params, learning_rate=0.02))
    expected = [float(plain(x_all[b], y_all[b])) for b in batches]
    np.testing.assert_allclose(losses, expected, rtol=2e-5)
    for got, p in zip(trained, params, strict=True):
        np.testing.assert_allclose(got, p.get_value(), rtol=2e-5, atol=1e-6)
    synk.broadcast(params)
