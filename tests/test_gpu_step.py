"""A fused training step on GPU ranks (issue 51), on 2 CPU devices where no GPU is visible.

Buckets: the compiled XLA program holds one all-reduce per bucket of the flat gradient,
scheduled between the backward pass's matrix products, where the unbucketed program holds
one all-reduce after all of them; the bucketed step's trajectory is bit for bit the
unbucketed one's, and that of single-process PyTensor within float32 rounding.

Memory: after the first step, rank 0's device holds the shared variables' values and
nothing more (PyTensor's JAX functions kept a compile-time copy of each).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.api import routines
from synkhronos.rank.backends import gpu
from synkhronos.session import launch
from synkhronos.transport.comm import xla

pytest.importorskip("jax")

BUCKET_MB = "0.004"  # 1,000 float32 elements: the model's 4,325-element gradient in 5
WIDTHS = (20, 40, 40, 40, 5)
ROWS = 8  # per rank: every rank the same rows, so the step runs fused


@pytest.fixture(scope="module")
def gpu_ranks():
    before = os.environ.get(xla.BUCKET_VAR)
    os.environ[xla.BUCKET_VAR] = BUCKET_MB  # read by every rank as it joins
    try:
        n = synk.fork(2 if gpu.on_cpu_devices() else None, backend="gpu")
    finally:
        if before is None:
            del os.environ[xla.BUCKET_VAR]
        else:
            os.environ[xla.BUCKET_VAR] = before
    yield n
    synk.close()


def set_buckets(state, size) -> list[np.ndarray]:
    """(A routine) This rank's bucket size, as joined; then ``size`` bytes from now on."""
    joined = state.comm.bucket_bytes
    state.comm.bucket_bytes = int(size[0])
    return [np.array([joined])]


def schedule(state, rows, features) -> list[np.ndarray]:
    """(A routine) The compiled order of this rank's latest fused program: n for each
    all-reduce of an n-element vector, -1 for each matrix product (a dot; a custom call,
    as cuBLAS's on GPUs; or a fusion of the custom kind, as XNNPACK's on CPU devices), as
    "A<n>" and "D" in the test."""
    import jax

    sharding = jax.sharding.NamedSharding(state.comm.mesh, jax.sharding.PartitionSpec())
    fused = list(state.fused.values())[-1]
    floatx = fused.cells[0][0].dtype
    kept = [  # the step's rows: x, y
        jax.ShapeDtypeStruct((int(rows[0]), int(features[0])), floatx, sharding=sharding),
        jax.ShapeDtypeStruct((int(rows[0]),), floatx, sharding=sharding),
    ]
    donated = [jax.ShapeDtypeStruct(c[0].shape, c[0].dtype, sharding=sharding) for c in fused.cells]
    text = fused.program.lower(kept, donated).compile().as_text()
    marks = []
    for line in text[text.index("\nENTRY") :].splitlines():
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
        else:  # NCCL's order of additions may follow the vector's length (xla.py)
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
