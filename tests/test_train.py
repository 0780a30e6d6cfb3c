"""Multi-rank tests of synkhronos.extensions.train, on 2 and 3 CPU ranks.

Every rule trains the model of tests/test_updates.py for 20 steps with uneven
splits, ``batch`` selections and ``num_slices``; the trajectory must equal the
single-process PyTensor one on the whole batch and the numpy reference.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from test_updates import RULE_KWARGS, RULES, assert_traj_close, build_model, np_trajectory

import synkhronos as synk
from synkhronos.extensions import train as T
from synkhronos.extensions import updates as U
from synkhronos.extensions.lasagne import updates as L

# One fork per rank count (the conftest's module-scoped `ranks` fixture).
pytestmark = pytest.mark.parametrize("ranks", [2, 3], indirect=True)

# Numba (the default mode) compiles each graph for seconds on every rank;
# test_default_mode covers it.
MODE = "FAST_COMPILE"
N_STEPS = 20
ROWS = 13  # 2 ranks: 7/6, 3 ranks: 5/4/4
INDEX = np.array([0, 2, 3, 5, 8, 9, 12])  # 7 rows: 4/3 and 3/2/2


def step_args(k):
    """``batch`` and ``num_slices`` of step ``k``: all rows, the first 11, or an index list."""
    batch = (None, 11, INDEX)[k % 3]
    return batch, 1 + k % 2


def select(a, batch):
    return a if batch is None else a[:batch] if isinstance(batch, int) else a[batch]


def step_data(n_steps=N_STEPS):
    rng = np.random.default_rng(5)
    return rng.normal(size=(n_steps, ROWS, 3)), rng.normal(size=(n_steps, ROWS, 2))


@pytest.fixture(scope="module")
def runs(ranks):
    """Per rule: 20 steps of the data-parallel and the single-process training."""
    xs, ys = step_data()
    built = {}
    for rule in RULES:
        params, inputs, loss = build_model()
        train = T.make_step_function(
            loss, params, inputs, getattr(L, rule), mode=MODE, name=rule, **RULE_KWARGS[rule]
        )
        ref_params, ref_inputs, ref_loss = build_model()
        ref = T.make_pytensor_step_function(
            ref_loss, ref_params, ref_inputs, getattr(L, rule), mode=MODE, **RULE_KWARGS[rule]
        )
        built[rule] = (params, train, ref_params, ref)
    out = {}
    for rule, (params, train, ref_params, ref) in built.items():
        traj, ref_traj, losses, ref_losses = [], [], [], []
        for k in range(N_STEPS):
            batch, num_slices = step_args(k)
            losses.append(train(xs[k], ys[k], batch=batch, num_slices=num_slices))
            ref_losses.append(ref(xs[k], ys[k], batch=batch))
            traj.append([p.get_value() for p in params])  # rank 0 is this process
            ref_traj.append([p.get_value() for p in ref_params])
        out[rule] = {
            "train": train,
            "traj": traj,
            "ref_traj": ref_traj,
            "losses": losses,
            "ref_losses": ref_losses,
        }
    selected = [[select(a[k], step_args(k)[0]) for k in range(N_STEPS)] for a in (xs, ys)]
    return out, selected


@pytest.mark.parametrize("rule", RULES)
def test_trajectory_matches_single_process(runs, rule):
    run = runs[0][rule]
    assert_traj_close(run["traj"], run["ref_traj"], rtol=1e-10)
    np.testing.assert_allclose(run["losses"], run["ref_losses"], rtol=1e-12)


@pytest.mark.parametrize("rule", RULES)
def test_trajectory_matches_numpy(runs, rule):
    run, (xs, ys) = runs[0][rule], runs[1]
    assert_traj_close(run["traj"], np_trajectory(rule, RULE_KWARGS[rule], xs, ys))


@pytest.mark.parametrize("rule", RULES)
def test_state_bitwise_identical_on_ranks(runs, ranks, rule):
    # Parameters, optimizer state and the (cleared) flat vector.
    variables = list(runs[0][rule]["train"].phases.param_updates)
    for var, stacked in zip(variables, synk.gather(variables, nd_up=1), strict=True):
        assert stacked.shape[0] == ranks
        for r in range(1, ranks):
            assert np.array_equal(stacked[r], stacked[0]), (var, r)
            assert stacked[r].tobytes() == stacked[0].tobytes(), (var, r)


def test_flat_grad_is_whole_batch_grad(ranks):
    params, inputs, loss = build_model()
    train = T.make_step_function(loss, params, inputs, L.sgd, 0.1, mode=MODE)
    xs, ys = step_data(1)
    x, y = synk.data(xs[0]), synk.data(ys[0])
    train.grad_function(x, y, batch=11, num_slices=2)
    flat = train.phases.flat_grad
    synk.all_reduce(flat, op="sum")
    got = synk.gather(flat, nd_up=1)
    assert all(np.array_equal(g, got[0]) for g in got)
    plain = pytensor.function(inputs, pytensor.grad(loss, params), mode=MODE)
    want = np.concatenate([g.ravel() for g in plain(xs[0][:11], ys[0][:11])])
    assert got[0][-1] == 11
    np.testing.assert_allclose(got[0][:-1] / got[0][-1], want, rtol=1e-12)
    # Phase one overwrites the vector (phase two leaves it): a second call gives the same.
    train.update_function()
    train.grad_function(x, y, batch=11, num_slices=2)
    synk.all_reduce(flat, op="sum")
    again = synk.gather(flat, nd_up=1)
    assert again[0][-1] == 11
    np.testing.assert_allclose(
        again[0][:-1] / again[0][-1],
        np.concatenate([g.ravel() for g in plain(xs[0][:11], ys[0][:11])]),
        rtol=1e-12,
    )
    x.free_memory()
    y.free_memory()


def test_one_command_and_one_all_reduce_per_step(ranks, monkeypatch):
    # 50 parameter tensors: one command per step, holding one collective.
    from synkhronos.rank import collective_part
    from synkhronos.session import launch

    params = [pytensor.shared(np.full(2, 0.1 * i), name=f"p{i}") for i in range(50)]
    x = pt.matrix("x")
    # (A Python sum of 50 terms would be one 50-input add, which FAST_COMPILE cannot run.)
    loss = pt.mean(pt.sum(x, axis=1) * pt.sum(U.flatten_vars(params) ** 2))
    train = T.make_step_function(loss, params, [x], L.momentum, 0.01, mode=MODE)
    train(np.ones((5, 2)))  # ships the functions (a command of its own)
    session = launch.current()
    commands, collectives = [], []
    real_execute, real_run = session.execute, collective_part.run
    monkeypatch.setattr(
        session, "execute", lambda code, *a: (commands.append(code), real_execute(code, *a))[1]
    )
    monkeypatch.setattr(
        collective_part, "run", lambda *a, **k: (collectives.append(a[1]), real_run(*a, **k))[1]
    )
    for _ in range(3):
        train(np.ones((5, 2)))
    assert [c.name for c in commands] == ["CHAIN"] * 3
    assert [c.name for c in collectives] == ["ALL_REDUCE"] * 3  # rank 0's parts


def test_a_batch_leaving_a_rank_without_rows_raises(ranks):
    params, inputs, loss = build_model()
    train = T.make_step_function(loss, params, inputs, L.sgd, 0.1, mode=MODE)
    xs, ys = step_data(1)
    with pytest.raises(ValueError, match="every rank needs at least one row"):
        train(xs[0], ys[0], batch=ranks - 1)


def test_default_mode(ranks):
    """Adam in float32, compiled in the default (Numba) mode on every rank."""
    if ranks != 2:
        pytest.skip("the default mode's compile cost is paid once, on 2 ranks")
    params, inputs, loss = build_model("float32")
    train = T.make_step_function(loss, params, inputs, L.adam, **RULE_KWARGS["adam"])
    xs, ys = step_data(4)
    for k in range(4):
        batch, num_slices = step_args(k)
        train(xs[k].astype("float32"), ys[k].astype("float32"), batch=batch, num_slices=num_slices)
    selected = [[select(a[k], step_args(k)[0]) for k in range(4)] for a in (xs, ys)]
    want = np_trajectory("adam", RULE_KWARGS["adam"], *selected)[-1]
    for p, w in zip(params, want, strict=True):
        assert p.get_value().dtype == np.float32
        np.testing.assert_allclose(p.get_value(), w, rtol=1e-4, atol=1e-5)
    stacked = synk.gather(params, nd_up=1)
    assert all(np.array_equal(s[1], s[0]) for s in stacked)


def test_mixed_dtypes_raise(ranks):
    a = pytensor.shared(np.ones(2, dtype="float32"), name="a")
    b = pytensor.shared(np.ones(2), name="b")
    x = pt.matrix("x")
    with pytest.raises(TypeError, match="one dtype"):
        T.make_step_function(pt.mean(x @ b) + pt.sum(a), [a, b], [x], L.sgd, 0.1)
    with pytest.raises(ValueError, match="scattered input or sliceable"):
        T.make_step_function(pt.sum(b), [b], [], L.sgd, 0.1)


def test_params_and_inputs_as_any_iterable(ranks):
    """Params as a generator, inputs as an iterator: the step trains as the
    single-process one with lists."""
    xs, ys = step_data(3)
    params, inputs, loss = build_model()
    train = T.make_step_function(
        loss, (p for p in params), iter(inputs), L.adam, mode=MODE, **RULE_KWARGS["adam"]
    )
    ref_params, ref_inputs, ref_loss = build_model()
    ref = T.make_pytensor_step_function(
        ref_loss, ref_params, ref_inputs, L.adam, mode=MODE, **RULE_KWARGS["adam"]
    )
    for k in range(3):
        batch, num_slices = step_args(k)
        got = train(xs[k], ys[k], batch=batch, num_slices=num_slices)
        np.testing.assert_allclose(got, ref(xs[k], ys[k], batch=batch), rtol=1e-12)
    for p, r in zip(params, ref_params, strict=True):
        np.testing.assert_allclose(p.get_value(), r.get_value(), rtol=1e-10)


def test_data_in_sliceable_shareds_with_batch_s(ranks):
    """The paper's second layout: each rank trains on rows of its own shared copy."""
    from pytensor.graph.replace import clone_replace

    xs, ys = step_data(4)
    params, (x, y), loss = build_model()
    x_s = pytensor.shared(np.zeros((1, 3)), name="x_rows")
    y_s = pytensor.shared(np.zeros((1, 2)), name="y_rows")
    train = T.make_step_function(
        clone_replace(loss, {x: x_s, y: y_s}),
        params,
        [],
        L.adam,
        mode=MODE,
        sliceable_shareds=[x_s, y_s],
        **RULE_KWARGS["adam"],
    )
    ref_params, ref_inputs, ref_loss = build_model()
    ref = T.make_pytensor_step_function(
        ref_loss, ref_params, ref_inputs, L.adam, mode=MODE, **RULE_KWARGS["adam"]
    )
    for k in range(4):
        synk.scatter([x_s, y_s], [xs[k], ys[k]])
        lengths = synk.get_lengths(x_s)  # uneven, e.g. 7/6 rows; each rank skips its last
        per_rank = [slice(0, n - 1) for n in lengths]
        rows = np.concatenate([np.arange(n - 1) + sum(lengths[:r]) for r, n in enumerate(lengths)])
        got = train(batch_s=per_rank, num_slices=1 + k % 2)
        want = ref(xs[k][rows], ys[k][rows])
        np.testing.assert_allclose(got, want, rtol=1e-10)
    for p, r in zip(params, ref_params, strict=True):
        np.testing.assert_allclose(p.get_value(), r.get_value(), rtol=1e-10)


def bn_model():
    """Batch norm on the inputs, then a dense layer: the running averages depend on x only."""
    from synkhronos.extensions.lasagne import layers

    x, y = pt.matrix("x"), pt.vector("y")
    bn = layers.BatchNormLayer(layers.InputLayer((None, 3), x), alpha=0.5)
    out = layers.DenseLayer(bn, 1, nonlinearity=None)
    loss = pt.mean((layers.get_output(out).flatten() - y) ** 2)
    return bn, layers.get_all_params(out, trainable=True), x, y, loss


@pytest.mark.parametrize("form", ["original", "step"])
def test_batch_norm_state_identical_on_ranks(ranks, form):
    """Running mean/inv_std: averaged over ranks, equal on all; with equal rows the mean
    is the single-process one."""
    if ranks != 2:
        pytest.skip("one rank count suffices")
    rng = np.random.default_rng(9)
    # Rank 1's rows are shifted, so per-rank statistics differ unless averaged.
    xs = rng.normal(size=(3, 8, 3)) + np.repeat([0.0, 3.0], 4)[None, :, None]
    ys = rng.normal(size=(3, 8))
    bn, params, x, y, loss = bn_model()
    if form == "original":
        train = T.make_train_function(loss, params, x, y, U.sgd, learning_rate=0.01)
        state = T.running_state(loss)
    else:
        train = T.make_step_function(loss, params, [x, y], L.sgd, 0.01, mode=MODE)
        state = train.state
    assert len(state) == 2
    ref_bn, ref_params, ref_x, ref_y, ref_loss = bn_model()
    ref = pytensor.function(
        [ref_x, ref_y], ref_loss, updates=L.sgd(ref_loss, ref_params, 0.01), mode=MODE
    )
    for k in range(3):
        train(xs[k], ys[k])
        ref(xs[k], ys[k])
    for stacked in synk.gather(state, nd_up=1):
        np.testing.assert_array_equal(stacked[1], stacked[0])
    # The state variables are clones sharing the layer's storage; find which is which.
    by_storage = dict(
        zip(
            (id(v.container) for v in state),
            (s[0] for s in synk.gather(state, nd_up=1)),
            strict=True,
        )
    )
    mean, inv_std = by_storage[id(bn.mean.container)], by_storage[id(bn.inv_std.container)]
    np.testing.assert_array_equal(bn.mean.get_value(), mean)
    np.testing.assert_allclose(mean, ref_bn.mean.get_value(), rtol=1e-12)
    # The inverse std is the average of the ranks' (not the whole batch's).
    want = np.ones(3)
    for k in range(3):
        halves = (xs[k][:4], xs[k][4:])
        want = 0.5 * want + 0.5 * np.mean(
            [1 / np.sqrt(h.var(axis=0) + 1e-4) for h in halves], axis=0
        )
    np.testing.assert_allclose(inv_std, want, rtol=1e-12)
