"""GPU ranks: ``fork(backend="gpu")``, on CUDA GPUs where some are visible, else on 2 CPU
devices with ``JAX_PLATFORMS=cpu`` (``conftest.py`` sets it): the same code, XLA
collectives between the ranks (NCCL between GPUs, gloo between CPU devices), shared
variables kept on the devices, outputs reduced through the communicator, training steps
as one XLA program. Results are checked against numpy and single-process PyTensor, with
uneven splits. One session serves the module, with ``SYNK_HOST_REDUCE_BYTES=0`` so that
even scalar outputs take the communicator path (small ones take the host replies by
default: ``tests/test_gpu_host_outputs.py``); ``tests/test_gpu_faults.py`` kills ranks.
"""

from __future__ import annotations

import logging

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.api import routines
from synkhronos.rank.backends import gpu
from synkhronos.rank.compiled import RankFunction
from synkhronos.rank.outputs import HOST_BYTES_VAR
from synkhronos.session import backend_choice, launch
from synkhronos.transport.comm import xla_settings
from synkhronos.transport.comm.xla import XlaCommunicator
from tests.graphs import check_ops, ops_function, random_xy, record_reduce_ops
from tests.test_split_training import assert_extrema_step_exact

pytest.importorskip("jax")


@pytest.fixture(scope="module")
def gpu_ranks():
    with pytest.MonkeyPatch.context() as env:
        env.setenv(HOST_BYTES_VAR, "0")  # read at the fork, by every rank
        env.setenv(xla_settings.DONATE_VAR, "1")  # as on GPUs: fused chains update in place
        n = synk.fork(2 if gpu.on_cpu_devices() else None, backend="gpu")
    yield n
    synk.close()


def _comm() -> XlaCommunicator:
    comm = launch.current().state.comm
    assert isinstance(comm, XlaCommunicator)
    return comm


@pytest.mark.gpu
def test_outputs_reduced_on_the_devices_match_pytensor(gpu_ranks, rng):
    assert pytensor.config.floatX == "float32"  # the GPU default, set by fork
    with pytest.warns(UserWarning, match="computed as 32-bit"):  # float64 graphs
        f, ref = ops_function()
    reduce_ops = record_reduce_ops(_comm())
    try:
        xv, yv = random_xy(rng, 37)
        check_ops(f(xv, yv, 0.5), ref(xv, yv, 0.5), rtol=1e-5)
        assert reduce_ops == ["sum", "prod", "max", "min"]  # "avg" goes with "sum"
        idx = rng.permutation(37)[:20]
        got = f(xv, yv, 1.5, batch=idx, num_slices=3, output_subset=range(6))
        check_ops(got + [[20]], ref(xv[idx], yv[idx], 1.5)[:6] + [20], rtol=1e-5)
        reduce_ops.clear()
        got = f(xv, yv, 2.0, batch=[7])  # rank 1 gets no rows: every output by the host
        check_ops(
            got, ref(xv[[7]], yv[[7]], 2.0), rows_per_rank=[1] + [0] * (gpu_ranks - 1), rtol=1e-5
        )
        assert reduce_ops == []
    finally:
        del _comm().reduce
    x = pt.matrix("x")
    with pytest.raises(ValueError, match="same shape on every rank"):  # refused on every rank
        synk.function([x], (x[:, 0] * 2, "sum"))(np.ones((5, 3), "float32"))
    any_positive, n_rows = synk.function(
        [x], [((x > 0).any(), "max"), (pt.cast(x.shape[0], "int16"), "sum")]
    )(xv.astype("float32"))
    assert any_positive.dtype == bool and bool(any_positive)  # by the host: no such dtype
    assert n_rows.dtype == np.int16 and int(n_rows) == 37


@pytest.mark.gpu
def test_collectives_keep_shared_variables_on_the_devices(gpu_ranks, rng):
    import jax

    n = gpu_ranks
    w = pytensor.shared(np.zeros(1000, dtype="float32"), name="w_gpu")
    data = pytensor.shared(np.zeros((1, 4), dtype="float32"), name="d_gpu")
    f = synk.function(
        [], (data.sum(), "sum"), updates={w: w + data.sum()}, sliceable_shareds=[data]
    )
    whole = rng.normal(size=(10 * n + 1, 4)).astype("float32")  # 11 and 10 rows
    synk.scatter(data, whole)
    parts = np.array_split(whole, n)
    np.testing.assert_allclose(f(batch_s=slice(0, 5)), sum(p[:5].sum() for p in parts), rtol=1e-5)
    assert isinstance(w.get_value(borrow=True), jax.Array)  # stayed on the device
    per_rank = synk.gather(w, nd_up=1)
    np.testing.assert_allclose(per_rank[:, 0], [p[:5].sum() for p in parts], rtol=1e-5)
    before = _comm().dispatches
    synk.all_reduce(w, op="avg")
    assert _comm().dispatches == before + 1  # one XLA program
    np.testing.assert_allclose(synk.gather(w, nd_up=1), np.stack([per_rank.mean(0)] * n), rtol=1e-5)
    synk.broadcast(w, np.arange(1000, dtype="float32"))
    synk.set_value(n - 1, w, np.full(1000, 2000, "float32"))
    np.testing.assert_array_equal(
        synk.reduce(w, op="min", nccl=False, in_place=False), np.arange(1000)
    )  # by the host
    np.testing.assert_array_equal(synk.get_value(0, w), np.arange(1000))
    np.testing.assert_array_equal(synk.reduce(w, op="max"), np.full(1000, 2000))
    np.testing.assert_array_equal(synk.get_value(0, w), np.full(1000, 2000))  # in place
    np.testing.assert_array_equal(synk.all_gather(data), whole)  # 11 and 10 rows: by the host
    assert isinstance(data.get_value(borrow=True), jax.Array)
    np.testing.assert_array_equal(synk.get_lengths(data), [len(whole)] * n)


OPS = ("avg", "sum", "prod", "max", "min")
DTYPES = ("float32", "float16", "int32")


def _inputs(seed: int, rank: int, dtype: str) -> list[np.ndarray]:
    """Rank ``rank``'s arrays: small values, so that "prod" cannot overflow; a 0-d one."""
    rng = np.random.default_rng([seed, rank])
    return [rng.integers(1, 4, (5, 3)).astype(dtype), rng.integers(1, 4, ()).astype(dtype)]


def _reduced(op: str, per_rank: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(per_rank)
    if op == "avg":  # in the input dtype; integers toward zero
        return (stack.astype(np.float64).sum(0) / len(per_rank)).astype(stack.dtype)
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    return ufunc.reduce(stack, axis=0, dtype=stack.dtype)


def every_collective(state, seed) -> list[np.ndarray]:
    """(A routine, on every rank) Every collective and op of the XLA communicator on
    device arrays, against numpy on every rank's inputs (each rank makes them all from
    the seed). Returns ``[XLA programs run, checks made]``."""
    import jax

    comm, n, r = state.comm, state.n_ranks, state.rank
    seed, checks, start = int(seed[0]), 0, comm.dispatches
    last = n - 1

    def check(what, got, want):
        nonlocal checks
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape, (what, got, want)
        np.testing.assert_allclose(got, want, rtol=1e-3, err_msg=what)
        checks += 1

    for dtype in DTYPES:
        everyone = [_inputs(seed, k, dtype) for k in range(n)]
        mine = [jax.device_put(a) for a in everyone[r]]
        for op in OPS:
            want = [_reduced(op, [e[i] for e in everyone]) for i in range(2)]
            for i, got in enumerate(comm.all_reduce(mine, op)):
                check(f"all_reduce {op} {dtype} {i}", got, want[i])
            got = comm.reduce(mine, op, root=last)
            assert (got is None) == (r != last)
            for i, g in enumerate(got or []):
                check(f"reduce {op} {dtype} {i}", g, want[i])
        for i, g in enumerate(comm.broadcast(mine if r == last else None, root=last)):
            check(f"broadcast {dtype} {i}", g, everyone[last][i])
        for k, box in enumerate(comm.all_gather(mine)):
            for i, g in enumerate(box):
                check(f"all_gather {dtype} rank {k} {i}", g, everyone[k][i])
        got = comm.gather(mine, root=0)
        assert (got is None) == (r != 0)
        parts = [[jax.device_put(a) for a in e] for e in everyone] if r == last else None
        for i, g in enumerate(comm.scatter(parts, root=last)):
            check(f"scatter {dtype} {i}", g, everyone[r][i])
    programs = comm.dispatches - start
    # By the host: pieces of different shapes, bool (no XLA reduction of it here).
    uneven = jax.device_put(np.arange(r + 2.0, dtype="float32"))
    for k, box in enumerate(comm.all_gather([uneven])):
        check(f"uneven all_gather {k}", box[0], np.arange(k + 2.0, dtype="float32"))
    flags = comm.all_reduce([jax.device_put(np.array([r == 0, True, False]))], "max")
    check("bool all_reduce", flags[0], np.array([True, True, False]))
    assert comm.dispatches - start == programs, "the host path ran an XLA program"
    return [np.array([programs, checks])]


def scatter_inputs(state, root) -> list[np.ndarray]:
    """(A routine) Scatter device arrays from rank ``root``; returns ``[largest bytes one
    program took on this rank, programs]`` and checks this rank's part."""
    import jax

    comm, sizes, run = state.comm, [], state.comm.run

    def recorded(program, arrays, donated=None):
        sizes.append(sum(a.nbytes for a in [*arrays, *(donated or [])]))
        return run(program, arrays, donated)

    comm.run = recorded
    try:
        parts = [
            [np.full(1000, k, "float32"), np.full((3, 2), -k, "int32")] for k in range(comm.n_ranks)
        ]
        mine = comm.rank == int(root[0])
        got = comm.scatter(
            [[jax.device_put(a) for a in p] for p in parts] if mine else None, int(root[0])
        )
    finally:
        del comm.run
    for g, want in zip(got, parts[comm.rank], strict=True):
        np.testing.assert_array_equal(np.asarray(g), want)
    return [np.array([max(sizes, default=0), len(sizes)])]


@pytest.mark.gpu
def test_scatter_holds_one_part_per_program(gpu_ranks):
    """No rank allocates every rank's part: each program carries one part (4024 bytes)."""
    for root in (0, gpu_ranks - 1):
        replies = routines.run(scatter_inputs, np.array([root]))
        assert [r[0].tolist() for r in replies] == [[4024, gpu_ranks - 1]] * gpu_ranks


def deterministic_flag(state) -> list[np.ndarray]:
    """(A routine) Whether this rank's XLA_FLAGS hold the deterministic flags."""
    import os

    return [np.array([all(f in os.environ.get("XLA_FLAGS", "") for f in gpu.DETERMINISTIC_FLAGS)])]


@pytest.mark.gpu
def test_every_rank_gets_the_deterministic_flags(gpu_ranks):
    assert [bool(r[0][0]) for r in routines.run(deterministic_flag)] == [True] * gpu_ranks


@pytest.mark.gpu
def test_every_collective_and_op_on_device_arrays(gpu_ranks):
    replies = routines.run(every_collective, np.array([7]))
    # Per dtype: 5 all_reduce and 5 reduce programs, broadcast, all_gather, gather, scatter.
    assert [r[0].tolist()[0] for r in replies] == [len(DTYPES) * 14] * gpu_ranks
    # Per dtype and rank: 10 all_reduce arrays, broadcast 2, all_gather 2 per rank, scatter
    # 2, and on the reduce's root 10 more; then 3 by the host.
    n, per_dtype = gpu_ranks, 14 + 2 * gpu_ranks
    assert [r[0].tolist()[1] for r in replies] == [
        len(DTYPES) * (per_dtype + 10 * (r == n - 1)) + n + 1 for r in range(n)
    ]


def _model(rng, float_x):
    x, y = pt.matrix("x"), pt.vector("y")
    w = pytensor.shared((0.3 * rng.normal(size=(6, 5))).astype(float_x), name="w")
    b = pytensor.shared(np.zeros(5, float_x), name="b")
    v = pytensor.shared((0.3 * rng.normal(size=5)).astype(float_x), name="v")
    loss = pt.mean((pt.tanh(x @ w + b) @ v - y) ** 2)
    return [x, y], [w, b, v], loss


@pytest.mark.gpu
def test_a_training_step_is_one_xla_program(gpu_ranks, rng, monkeypatch):
    """extensions.train's step (gradient, all-reduce, Adam) fused into one program per
    rank, dispatched once per step: 20 steps give the trajectory of the same chain run
    step by step and of single-process PyTensor. Uneven rows run step by step."""
    from synkhronos.extensions import train
    from synkhronos.extensions.lasagne import updates

    float_x, rows = pytensor.config.floatX, 8 * gpu_ranks  # every rank gets 8 rows
    data = (
        rng.normal(size=(4 * rows, 6)).astype(float_x),
        rng.normal(size=4 * rows).astype(float_x),
    )
    runs = []
    monkeypatch.setattr(RankFunction, "run", _counting(RankFunction.run, runs))
    batches = [slice(rows * (i % 4), rows * (i % 4) + rows) for i in range(20)]
    steps, params = {}, {}
    for kind in ("fused", "unfused", "pytensor"):
        inputs, params[kind], loss = _model(np.random.default_rng(3), float_x)
        make = train.make_pytensor_step_function if kind == "pytensor" else train.make_step_function
        steps[kind] = make(loss, params[kind], inputs, updates.adam, learning_rate=0.05)
    steps["unfused"] = _unfused(steps["unfused"])
    trajectories = {}
    for kind, step in steps.items():
        before, runs[:] = _comm().dispatches, []
        trajectories[kind] = np.array(
            [[float(step(*data, batch=batch)), *_flat(params[kind])] for batch in batches]
        )
        if kind == "fused":
            assert runs == [] and _comm().dispatches - before == len(batches)
            fused = launch.current().state.fused
            assert [f.calls for f in fused.values()] == [len(batches)]
        elif kind == "unfused":
            assert len(runs) == 2 * len(batches)
    for kind in ("fused", "unfused"):
        np.testing.assert_allclose(
            trajectories[kind], trajectories["pytensor"], rtol=2e-5, atol=1e-6, err_msg=kind
        )
    # The parameters' buffers were donated to their new values: the old arrays are gone.
    old = [p.get_value(borrow=True) for p in params["fused"]]
    for kind in ("fused", "pytensor"):
        steps[kind](*data, batch=batches[0])
    assert all(o.is_deleted() for o in old)
    # Rows split 8 and 7: no one program for every rank, so step by step, still exact.
    runs[:] = []
    for kind in ("fused", "pytensor"):
        steps[kind](*data, batch=slice(0, rows - 1))
    assert len(runs) == 2
    np.testing.assert_allclose(
        _flat(params["fused"]), _flat(params["pytensor"]), rtol=2e-5, atol=1e-6
    )


@pytest.mark.gpu
@pytest.mark.parametrize("num_slices", [1, 2])
def test_extrema_only_the_update_and_outputs_read(gpu_ranks, num_slices):
    """A maximum and a minimum over the rows that only the update or an output reads
    cross to the reduced phase by XLA all-reduces with "max" and "min": one device's
    step on 5/4 rows (float32)."""
    assert_extrema_step_exact(None, rtol=1e-5, num_slices=num_slices)


def _embedding_step(float_x: str, mode=None):
    """(one-line SGD step of a Lasagne embedding and a ``W[idx]`` read, its parameters)."""
    from synkhronos.extensions.lasagne import layers

    idx = pt.ivector("idx")
    rng = np.random.default_rng(5)
    table = layers.EmbeddingLayer(
        layers.InputLayer((None,), idx), 7, 3, W=rng.normal(size=(7, 3)).astype(float_x)
    )
    W = pytensor.shared(rng.normal(size=(7, 3)).astype(float_x), name="W_rows")
    loss = pt.mean((layers.get_output(table) * W[idx]).sum(axis=1) ** 2)
    params = [table.W, W]
    updates = [(p, p - 0.1 * g) for p, g in zip(params, pt.grad(loss, params), strict=True)]
    make = synk.function if mode is None else lambda *a, **k: pytensor.function(*a, **k, mode=mode)
    return make([idx], loss, updates=updates), params


@pytest.mark.gpu
@pytest.mark.parametrize("n_rows", [1, 2, 3])
def test_an_embedding_trains_on_one_row_per_rank(gpu_ranks, n_rows):
    """An embedding's gradient adds one row into the table (``AdvancedIncSubtensor1``),
    which PyTensor's JAX mode refused as runtime broadcasting: a rank given one row (2
    rows on 2 ranks, 3 split 2 and 1) trains as one process does, in C mode; 1 row is
    JAX mode in this process (a training step needs rows on every rank)."""
    float_x = pytensor.config.floatX
    (step, params), (ref, ref_params) = (
        _embedding_step(float_x, mode="JAX" if n_rows < gpu_ranks else None),
        _embedding_step(float_x, mode="FAST_RUN"),
    )
    idx = np.array([4, 1, 4][:n_rows], dtype="int32")
    for _ in range(2):
        np.testing.assert_allclose(step(idx), ref(idx), rtol=1e-5)
    for p, want in zip(params, ref_params, strict=True):
        np.testing.assert_allclose(p.get_value(), want.get_value(), rtol=1e-5, atol=1e-7)
    if n_rows >= gpu_ranks:
        for p in params:  # every rank's copy is rank 0's
            np.testing.assert_array_equal(synk.get_value(gpu_ranks - 1, p), p.get_value())


def test_a_one_row_embedding_gradient_still_refuses_undeclared_broadcasting():
    """The fixed check still refuses what PyTensor refuses: a ``y`` of one row, its rows
    not declared broadcastable, added at two indices."""
    from synkhronos.rank.backends import jax_compat  # noqa: F401  (the fix)

    W, y, idx = pt.matrix("W"), pt.matrix("y"), pt.ivector("idx")
    f = pytensor.function([W, y, idx], pt.inc_subtensor(W[idx], y), mode="JAX")
    zeros, ones = np.zeros((5, 3), pytensor.config.floatX), np.ones((1, 3), pytensor.config.floatX)
    np.testing.assert_allclose(f(zeros, ones, np.array([2], "int32"))[2], 1.0)
    with pytest.raises(ValueError, match="Runtime broadcasting not allowed"):
        f(zeros, ones, np.array([1, 2], "int32"))


def _clip_graph(float_x):
    """A CLIP-style contrastive loss of two views' embeddings (``a @ W``, ``b @ W``): the
    diagonal of their similarities, whose size is the batch's, known at run time only;
    the inputs, the per-row matching scores, the loss and its gradient, and ``W``."""
    rng = np.random.default_rng(5)
    W = pytensor.shared(rng.normal(size=(4, 3)).astype(float_x), name="W_clip")
    a, b = pt.matrix("a"), pt.matrix("b")
    logits = (a @ W) @ (b @ W).T
    loss = -pt.diag(pt.special.log_softmax(logits, axis=1)).mean()
    return [a, b], [pt.diagonal(logits), loss, pt.grad(loss, W)], W


def test_jax_mode_takes_a_diagonal_of_run_time_size():
    """``pt.diag`` of a batch's similarities and its gradient (an ``AllocDiag`` whose
    ``arange`` and zeros are as long as the batch, a scalar computed from shapes, fused
    with the loss): PyTensor's JAX mode refused the arange's bound, not a constant nor
    one shape. An arange bound computed from values is still refused."""
    from synkhronos.rank.backends import jax_compat  # noqa: F401  (the fix)

    float_x = pytensor.config.floatX
    inputs, outputs, _ = _clip_graph(float_x)
    rng = np.random.default_rng(6)
    values = [rng.normal(size=(rows, 4)).astype(float_x) for rows in (7, 7)]
    got = pytensor.function(inputs, outputs, mode="JAX")(*values)
    for g, w in zip(got, pytensor.function(inputs, outputs)(*values), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    x = pt.vector("x")
    with pytest.raises(NotImplementedError, match="bounds of arange"):
        pytensor.function([x], pt.arange(x.sum().astype("int64")), mode="JAX")(np.ones(3, float_x))


@pytest.mark.gpu
def test_gpu_ranks_take_a_diagonal_of_run_time_size(gpu_ranks):
    """Each rank's diagonal of its rows' similarities, gathered, is the batch's; the mean
    of a per-row score, and its gradient, averaged by rows are the batch's: 27 rows."""
    float_x = pytensor.config.floatX
    inputs, (scores, _, _), W = _clip_graph(float_x)
    loss = -scores.mean()
    outputs = [scores, loss, pt.grad(loss, W)]
    f = synk.function(inputs, [(scores, "gather"), (loss, "avg"), (outputs[2], "avg")])
    rng = np.random.default_rng(7)
    values = [rng.normal(size=(27, 4)).astype(float_x) for _ in range(2)]
    for g, w in zip(f(*values), pytensor.function(inputs, outputs)(*values), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_ranks_train_a_clip_loss_as_cpu_ranks(gpu_ranks):
    """A CLIP loss pairs rows with rows (``z1 @ z2.T``): the split says each rank pairs
    its own only, and every rank then steps by the row-weighted mean of its block's loss,
    as CPU ranks do (2 GPU and 2 CPU ranks gave the same 3 steps, 27 rows: 1e-6 apart in
    float32). Here against that mean in one process, and every rank's ``W`` equal."""
    float_x = pytensor.config.floatX
    inputs, (_, loss, grad), W = _clip_graph(float_x)
    start = W.get_value()
    with pytest.warns(UserWarning, match="each rank would pair its own rows only"):
        train = synk.function(inputs, loss, updates=[(W, W - 0.1 * grad)])
    rng = np.random.default_rng(8)
    A, B = (rng.normal(size=(27, 4)).astype(float_x) for _ in range(2))
    got = [train(A, B) for _ in range(3)]
    after = [synk.get_value(r, W) for r in range(gpu_ranks)]
    blocks = np.array_split(np.arange(27), gpu_ranks)
    value = pt.matrix("W_value")
    of_block = pytensor.function(
        [*inputs, value], [loss, grad], givens={W: value}, allow_input_downcast=True
    )
    W_value = start
    for step in range(3):
        parts = [of_block(A[rows], B[rows], W_value) for rows in blocks]
        weights = [len(rows) / 27 for rows in blocks]
        np.testing.assert_allclose(
            got[step], sum(w * p[0] for w, p in zip(weights, parts, strict=True)), rtol=1e-5
        )
        W_value = W_value - 0.1 * sum(w * p[1] for w, p in zip(weights, parts, strict=True))
    for value_on_rank in after:
        np.testing.assert_array_equal(value_on_rank, after[0])
    np.testing.assert_allclose(after[0], W_value, rtol=1e-5, atol=1e-6)


def _batch_norm_training(float_x):
    """A dense layer, batch normalization and a softmax layer, trained by momentum: a
    training function whose batch statistics take rounds (the inputs, loss, updates and
    every variable they write, the running averages too)."""
    from synkhronos.api.training import running_updates
    from synkhronos.extensions import lasagne
    from synkhronos.extensions.lasagne import layers as L
    from synkhronos.extensions.lasagne.nonlinearities import rectify, softmax
    from synkhronos.extensions.lasagne.updates import momentum

    lasagne.random.set_rng(np.random.RandomState(4))
    x, t = pt.matrix("x", dtype=float_x), pt.ivector("t")
    # No bias before batch normalization, which cancels it: its gradient is rounding.
    net = L.DenseLayer(L.InputLayer((None, 4), x), 5, b=None, nonlinearity=None)
    net = L.DenseLayer(L.NonlinearityLayer(L.BatchNormLayer(net), rectify), 3, nonlinearity=softmax)
    loss = lasagne.objectives.categorical_crossentropy(L.get_output(net), t).mean()
    updates = list(momentum(loss, L.get_all_params(net, trainable=True), 0.1, 0.9).items())
    variables = [v for v, _ in updates]
    variables += [v for v, _ in running_updates([loss], variables)]
    return [x, t], loss, updates, variables


@pytest.mark.gpu
def test_a_training_functions_rounds_compile_at_its_first_call_only(gpu_ranks, rng, tmp_path):
    """Issue 62: each round of a training function with batch statistics (11 rows, split
    unevenly: step by step) compiled again at the second call, where the variables it
    writes but does not read held the first call's rows instead of their empty start
    values; and every function compiled again after a checkpoint's load, whose values
    were not committed to the device as computed ones are. No XLA compile after the
    first call; the losses and variables are one process's."""
    import jax

    float_x = pytensor.config.floatX
    inputs, loss, updates, variables = _batch_norm_training(float_x)
    start = [v.get_value() for v in variables]
    train = synk.function(inputs, loss, updates=updates)
    assert train.round_functions
    xs, ts = rng.normal(size=(11, 4)).astype(float_x), rng.integers(0, 3, 11).astype("int32")
    compiled: list[str] = []

    def listen(event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(str(kwargs.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        losses = [train(xs, ts)]
        first = len(compiled)
        losses += [train(xs, ts) for _ in range(2)]
        synk.save(tmp_path / "step.npz")
        synk.load(tmp_path / "step.npz")
        losses.append(train(xs, ts))
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert first > 0  # the listener hears this rank's compiles
    # PyTensor's functions: the checkpoint's collectives are programs of their own.
    assert [f for f in compiled[first:] if "jax_funcified_fgraph" in f] == []
    synk.verify()
    trained = [v.get_value() for v in variables]
    for v, value in zip(variables, start, strict=True):
        v.set_value(value)
    reference = pytensor.function(inputs, loss, updates=updates, mode="FAST_COMPILE")
    np.testing.assert_allclose(losses, [reference(xs, ts) for _ in range(4)], rtol=1e-5)
    for var, got in zip(variables, trained, strict=True):
        want = var.get_value()
        atol = 1e-5 * np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol, err_msg=str(var))
    synk.broadcast(variables)  # rank 0 holds the reference's values: every rank takes them


def _flat(params) -> np.ndarray:
    return np.concatenate([np.ravel(p.get_value()) for p in params])


def _counting(method, calls: list):
    def counted(self, *args, **kwargs):
        calls.append(self.spec.name)
        return method(self, *args, **kwargs)

    return counted


def _unfused(step):
    """``step``'s chain, run step by step."""
    chain = synk.chain(
        step.grad_function,
        ("all_reduce", step.phases.flat_grad, "sum"),
        step.update_function,
        every_rank_rows=True,
        fuse=False,
    )
    return lambda *data, batch: chain(*data, batch=batch)[0]


def test_gpu_ranks_on_cpu_devices_need_no_gpu_tools(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setattr(gpu, "gpu_table", lambda: pytest.fail("nvidia-smi was called"))
    monkeypatch.setattr(gpu, "_gpu_defaults", lambda: None)
    assert gpu.prepare_gpus(3, None) is None
    monkeypatch.setattr(gpu, "gpu_packages_missing", lambda: ["jax"])
    with pytest.raises(ImportError, match=r"needs jax; .*synkhronos\[cuda\]"):
        gpu.prepare_gpus(2, None)


def test_auto_takes_gpus_only_where_jax_may_use_them(monkeypatch, caplog):
    monkeypatch.setattr(gpu, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(gpu, "gpu_packages_missing", lambda: ["JAX's CUDA plugin"])
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    with caplog.at_level(logging.WARNING):
        assert backend_choice.auto_backend()[0] == "cpu"
    assert "synkhronos[cuda]" in caplog.text
    caplog.clear()
    choice, why = backend_choice.auto_backend(deciding=False)  # as `python -m synkhronos check`
    assert choice == "cpu" and "CUDA plugin is missing" in why and not caplog.text
    monkeypatch.setattr(gpu, "gpu_packages_missing", lambda: [])
    assert backend_choice.auto_backend()[0] == "gpu"
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # JAX told to leave the GPUs alone
    assert backend_choice.auto_backend()[0] == "cpu"
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setattr(gpu, "visible_gpus", lambda: [])
    assert backend_choice.auto_backend()[0] == "cpu"


@pytest.fixture
def fake_gpus(monkeypatch):
    """Four fake GPUs (nvidia-smi's table), JAX not started, no GPU variables set; whatever
    prepare_gpus sets is checked restored afterwards."""

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(gpu, "_require_gpu_packages", lambda: None)
    monkeypatch.setattr(gpu, "gpu_table", lambda: [(str(i), "Fake GPU", "1 MiB") for i in range(4)])
    monkeypatch.setattr(gpu, "jax_started", lambda: False)
    monkeypatch.setattr(gpu, "_gpu_defaults", lambda: None)
    # What a session of this module's may have saved is its own.
    for saved in ("_saved_env", "_saved_visible", "_replaced_settings"):
        monkeypatch.setattr(gpu, saved, type(getattr(gpu, saved))())
    for name in (*GPU_VARS, gpu.DETERMINISTIC_VAR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_hlo_as_text")
    before = _gpu_settings()
    yield
    gpu.restore_environment()
    after = _gpu_settings()
    assert after["jax_cuda_visible_devices"] == "all"
    for name in ("XLA_FLAGS", "XLA_PYTHON_CLIENT_MEM_FRACTION", "floatX"):  # no test sets them
        assert after[name] == before[name], name


REAL_GPU_TABLE = gpu.gpu_table
GPU_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
)


def _gpu_settings() -> dict:
    import os

    import jax

    return {
        **{name: os.environ.get(name) for name in (*GPU_VARS, "XLA_FLAGS")},
        "jax_cuda_visible_devices": jax.config.read("jax_cuda_visible_devices"),
        "floatX": pytensor.config.floatX,
    }


def test_master_rank_puts_its_gpu_first(fake_gpus, caplog):
    with caplog.at_level(logging.INFO):
        assert gpu.prepare_gpus(3, None, master_rank=2) == ["2", "0", "1"]
        assert "rank 0: GPU 2, Fake GPU" in caplog.text
    gpu.restore_environment()
    assert gpu.prepare_gpus(None, [3, 1], master_rank=2) == ["3", "1"]  # gpus= decides
    gpu.restore_environment()
    with pytest.raises(ValueError, match="master_rank=4, but 4 GPUs are visible"):
        gpu.prepare_gpus(None, None, master_rank=4)


def test_rank_0_takes_its_gpu_through_jax_and_gives_everything_back(fake_gpus, monkeypatch):
    """jax imported (as it is here) before the fork is fine: rank 0's CUDA_VISIBLE_DEVICES
    is left alone, JAX's client is told its GPU; a second fork sees every GPU again."""
    import os
    import warnings

    import jax

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):  # fork, close, fork: every GPU each time
            assert gpu.prepare_gpus(None, None, master_rank=1) == ["1", "0", "2", "3"]
            assert "CUDA_VISIBLE_DEVICES" not in os.environ
            assert jax.config.read("jax_cuda_visible_devices") == "1"  # CUDA's ordinal of GPU 1
            assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
            assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == gpu.MEMORY_FRACTION
            assert os.environ["XLA_FLAGS"] == "--xla_dump_hlo_as_text " + " ".join(
                gpu.DETERMINISTIC_FLAGS
            )
            gpu.restore_environment()
            assert os.environ["XLA_FLAGS"] == "--xla_dump_hlo_as_text"
            assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")  # the user's choice stays
    monkeypatch.setenv(gpu.DETERMINISTIC_VAR, "0")  # the way out
    assert gpu.prepare_gpus(2, None) == ["0", "1"]
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    assert os.environ["XLA_FLAGS"] == "--xla_dump_hlo_as_text"
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")  # as the fixture found it


def test_jax_started_before_the_fork_is_refused(fake_gpus, monkeypatch):
    import os

    monkeypatch.setattr(gpu, "jax_started", lambda: True)
    with pytest.raises(RuntimeError, match="JAX already runs in this process.*GPU 0 alone"):
        gpu.prepare_gpus(2, None)
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ  # nothing set before refusing


def test_without_nvidia_smi_cuda_visible_devices_decides(fake_gpus, monkeypatch, tmp_path):
    """A container without nvidia-smi (a PATH without it) but with CUDA_VISIBLE_DEVICES."""
    import jax

    monkeypatch.setattr(gpu, "gpu_table", REAL_GPU_TABLE)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="nvidia-smi failed"):
        gpu.prepare_gpus(None, None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,3")
    assert gpu.prepare_gpus(None, None) == ["5", "3"]
    assert jax.config.read("jax_cuda_visible_devices") == "0"
    gpu.restore_environment()
    assert gpu.prepare_gpus(None, [3]) == ["3"]
    assert jax.config.read("jax_cuda_visible_devices") == "1"
    gpu.restore_environment()
    with pytest.raises(ValueError, match="rank 0's GPU 2 is not visible"):
        gpu.prepare_gpus(None, [2, 3])


class _Probe:
    """A UDP socket that routes to ``routed``."""

    routed = "0.0.0.0"

    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def connect(self, address):
        pass

    def getsockname(self):
        return (self.routed, 40000)


def test_the_coordinator_is_an_address_other_nodes_reach(monkeypatch):
    """Over several nodes node 0 gives JAX's coordinator an IP address, never a name only
    it may resolve (``socket.getfqdn()`` in a container)."""
    import socket
    import types

    from synkhronos.transport import nodes

    names = {"10.1.2.3": ["127.0.1.1", "10.1.2.3"], "loopback": ["127.0.1.1"]}
    fake = types.SimpleNamespace(
        AF_INET=socket.AF_INET,
        SOCK_DGRAM=socket.SOCK_DGRAM,
        gethostname=lambda: "box",
        gethostbyname_ex=lambda name: (name, [], names[which]),
        getfqdn=lambda: pytest.fail("a name only this machine may resolve"),
        socket=_Probe,
    )
    monkeypatch.setattr(nodes, "socket", fake)
    monkeypatch.delenv(nodes.COORDINATOR_HOST_VAR, raising=False)
    assert nodes.coordinator_host(1) == "127.0.0.1"
    which = "10.1.2.3"
    assert nodes.coordinator_host(2) == "10.1.2.3"
    which = "loopback"  # Debian's 127.0.1.1: the default route's interface instead
    monkeypatch.setattr(_Probe, "routed", "172.17.0.5")
    assert nodes.coordinator_host(3) == "172.17.0.5"
    monkeypatch.setattr(_Probe, "routed", "0.0.0.0")  # no route either
    with pytest.raises(RuntimeError, match="set SYNK_COORDINATOR_HOST"):
        nodes.coordinator_host(2)
    monkeypatch.setenv(nodes.COORDINATOR_HOST_VAR, "node0.example")
    assert nodes.coordinator_host(2) == "node0.example"
