"""Single-process tests of synkhronos.extensions.updates and extensions.lasagne.updates.

The numpy references below implement the published formulas independently of
the PyTensor code; tests/test_train.py reuses them for the multi-rank runs.
"""

import inspect
from functools import partial

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.extensions import updates as U
from synkhronos.extensions.lasagne import updates as L

# Numba (the default mode) compiles each graph for seconds; the arithmetic under
# test is the same in FAST_COMPILE. test_default_mode_float32 covers the default mode.
compile_fn = partial(pytensor.function, mode="FAST_COMPILE")

N_STEPS = 20
BATCH = 12

# Non-default hyperparameters, so that argument plumbing is tested too.
RULE_KWARGS = {
    "sgd": {"learning_rate": 0.05},
    "momentum": {"learning_rate": 0.05, "momentum": 0.8},
    "nesterov_momentum": {"learning_rate": 0.05, "momentum": 0.7},
    "adagrad": {"learning_rate": 0.2, "epsilon": 1e-5},
    "rmsprop": {"learning_rate": 0.02, "rho": 0.8, "epsilon": 1e-5},
    "adadelta": {"learning_rate": 0.5, "rho": 0.9, "epsilon": 1e-5},
    "adam": {"learning_rate": 0.02, "beta1": 0.8, "beta2": 0.99, "epsilon": 1e-7},
    "adamax": {"learning_rate": 0.03, "beta1": 0.85, "beta2": 0.98, "epsilon": 1e-7},
}
RULES = list(RULE_KWARGS)


# --- numpy references: one closure per rule, mapping (params, grads) -> new params ---


def np_sgd(learning_rate):
    def step(ps, gs):
        return [p - learning_rate * g for p, g in zip(ps, gs, strict=True)]

    return step


def np_momentum(learning_rate, momentum=0.9):
    vel = {}

    def step(ps, gs):
        out = []
        for i, (p, g) in enumerate(zip(ps, gs, strict=True)):
            vel[i] = momentum * vel.get(i, 0.0) - learning_rate * g
            out.append(p + vel[i])
        return out

    return step


def np_nesterov_momentum(learning_rate, momentum=0.9):
    vel = {}

    def step(ps, gs):
        out = []
        for i, (p, g) in enumerate(zip(ps, gs, strict=True)):
            vel[i] = momentum * vel.get(i, 0.0) - learning_rate * g
            out.append(p + momentum * vel[i] - learning_rate * g)
        return out

    return step


def np_adagrad(learning_rate=1.0, epsilon=1e-6):
    accu = {}

    def step(ps, gs):
        out = []
        for i, (p, g) in enumerate(zip(ps, gs, strict=True)):
            accu[i] = accu.get(i, 0.0) + g**2
            out.append(p - learning_rate * g / np.sqrt(accu[i] + epsilon))
        return out

    return step


def np_rmsprop(learning_rate=1.0, rho=0.9, epsilon=1e-6):
    accu = {}

    def step(ps, gs):
        out = []
        for i, (p, g) in enumerate(zip(ps, gs, strict=True)):
            accu[i] = rho * accu.get(i, 0.0) + (1 - rho) * g**2
            out.append(p - learning_rate * g / np.sqrt(accu[i] + epsilon))
        return out

    return step


def np_adadelta(learning_rate=1.0, rho=0.95, epsilon=1e-6):
    accu, delta = {}, {}

    def step(ps, gs):
        out = []
        for i, (p, g) in enumerate(zip(ps, gs, strict=True)):
            accu[i] = rho * accu.get(i, 0.0) + (1 - rho) * g**2
            upd = g * np.sqrt(delta.get(i, 0.0) + epsilon) / np.sqrt(accu[i] + epsilon)
            out.append(p - learning_rate * upd)
            delta[i] = rho * delta.get(i, 0.0) + (1 - rho) * upd**2
        return out

    return step


def np_adam(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, amsgrad=False):
    """Adam; with ``amsgrad`` the step uses the running maximum of ``v``."""
    m, v, v_max, t = {}, {}, {}, [0]

    def step(ps, gs):
        t[0] += 1
        a_t = learning_rate * np.sqrt(1 - beta2 ** t[0]) / (1 - beta1 ** t[0])
        out = []
        for i, (p, g) in enumerate(zip(ps, gs, strict=True)):
            m[i] = beta1 * m.get(i, 0.0) + (1 - beta1) * g
            v[i] = beta2 * v.get(i, 0.0) + (1 - beta2) * g**2
            v_max[i] = np.maximum(v_max.get(i, 0.0), v[i]) if amsgrad else v[i]
            out.append(p - a_t * m[i] / (np.sqrt(v_max[i]) + epsilon))
        return out

    return step


def np_adamax(learning_rate=0.002, beta1=0.9, beta2=0.999, epsilon=1e-8):
    m, u, t = {}, {}, [0]

    def step(ps, gs):
        t[0] += 1
        a_t = learning_rate / (1 - beta1 ** t[0])
        out = []
        for i, (p, g) in enumerate(zip(ps, gs, strict=True)):
            m[i] = beta1 * m.get(i, 0.0) + (1 - beta1) * g
            u[i] = np.maximum(beta2 * u.get(i, 0.0), np.abs(g))
            out.append(p - a_t * m[i] / (u[i] + epsilon))
        return out

    return step


np_amsgrad = partial(np_adam, amsgrad=True)


# Lasagne's one-phase rules: the two-phase ones plus amsgrad (Lasagne master).
ONE_PHASE_KWARGS = {
    **RULE_KWARGS,
    "amsgrad": {"learning_rate": 0.02, "beta1": 0.8, "beta2": 0.99, "epsilon": 1e-7},
}
NP_RULES = {name: globals()[f"np_{name}"] for name in ONE_PHASE_KWARGS}


# --- the model: y_hat = s * (x @ W) + b, loss = mean over samples of squared error ---


def init_params(dtype="float64"):
    rng = np.random.default_rng(1)
    return [
        rng.normal(size=(3, 2)).astype(dtype),
        rng.normal(size=2).astype(dtype),
        np.asarray(1.5, dtype=dtype),
    ]


def make_data(n_steps=N_STEPS, batch=BATCH, dtype="float64"):
    """Per-step batches: xs (n_steps, batch, 3), ys (n_steps, batch, 2)."""
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(n_steps, batch, 3)).astype(dtype)
    ys = rng.normal(size=(n_steps, batch, 2)).astype(dtype)
    return xs, ys


def build_model(dtype="float64"):
    """Fresh shared params, symbolic inputs and the mean-over-samples loss."""
    w, b, s = (pytensor.shared(v, name=n) for v, n in zip(init_params(dtype), "wbs", strict=True))
    x, y = pt.matrix("x", dtype=dtype), pt.matrix("y", dtype=dtype)
    loss = pt.mean(pt.sum(pt.square(s * (x @ w) + b - y), axis=1))
    return [w, b, s], [x, y], loss


def np_grads(params, x, y):
    """Analytic gradient of the model's loss."""
    w, b, s = params
    xw = x @ w
    err = 2.0 * (s * xw + b - y) / len(x)
    return [s * x.T @ err, err.sum(axis=0), np.sum(err * xw)]


def np_trajectory(rule, kwargs, xs, ys):
    """Parameters after each step of the numpy reference."""
    step = NP_RULES[rule](**kwargs)
    params = init_params()
    traj = []
    for x, y in zip(xs, ys, strict=True):
        params = step(params, np_grads(params, x, y))
        traj.append([p.copy() for p in params])
    return traj


@pytest.fixture(scope="module")
def data():
    return make_data()


def assert_traj_close(got, want, rtol=1e-9, atol=1e-12):
    for step, (g_step, w_step) in enumerate(zip(got, want, strict=True)):
        for g, w in zip(g_step, w_step, strict=True):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"step {step}")


@pytest.mark.parametrize("rule", list(ONE_PHASE_KWARGS))
def test_one_phase_matches_numpy(rule, data):
    params, inputs, loss = build_model()
    f = compile_fn(inputs, loss, updates=getattr(L, rule)(loss, params, **ONE_PHASE_KWARGS[rule]))
    traj = []
    for x, y in zip(*data, strict=True):
        f(x, y)
        traj.append([p.get_value() for p in params])
    assert_traj_close(traj, np_trajectory(rule, ONE_PHASE_KWARGS[rule], *data))


def two_phase_parts(form, rule, loss, params, **kwargs):
    """``(grad_updates, param_updates)`` of the three-part rule or of ``two_phase``."""
    if form == "three_part":
        grad_updates, param_updates, _ = getattr(U, rule)(loss, params, **kwargs)
        return grad_updates, param_updates
    tp = U.two_phase(getattr(L, rule), loss, params, **kwargs)
    return tp.grad_updates, tp.param_updates


@pytest.mark.parametrize("form", ["three_part", "two_phase"])
@pytest.mark.parametrize("rule", RULES)
def test_two_phase_matches_numpy(rule, form, data):
    params, inputs, loss = build_model()
    grad_updates, param_updates = two_phase_parts(form, rule, loss, params, **RULE_KWARGS[rule])
    grad_step = compile_fn(inputs, loss, updates=grad_updates)
    apply_step = compile_fn([], [], updates=param_updates)
    traj = []
    for x, y in zip(*data, strict=True):
        grad_step(x, y)
        apply_step()
        traj.append([p.get_value() for p in params])
    assert_traj_close(traj, np_trajectory(rule, RULE_KWARGS[rule], *data))


def test_flat_grad_is_concatenated_grad(data):
    params, inputs, loss = build_model()
    x, y = data[0][0], data[1][0]
    want = np.concatenate([g.ravel() for g in np_grads(init_params(), x, y)])
    # The original layout: the plain gradient, and views of the shared vector.
    grad_shared, flat_grad, unflat = U.flat_unflat_grads(loss, params)
    assert grad_shared.get_value().shape == (U.vars_flat_size(params),) == (9,)
    compile_fn(inputs, [], updates=[(grad_shared, flat_grad)])(x, y)
    np.testing.assert_allclose(grad_shared.get_value(), want, rtol=1e-12)
    for piece, p in zip(compile_fn([], unflat)(), params, strict=True):
        assert piece.shape == p.get_value().shape
    # The rules' layout: rows * gradient, then the rows.
    grad_updates, _, grad_shared = U.sgd(loss, params, learning_rate=0.1)
    compile_fn(inputs, [], updates=grad_updates)(x, y)
    flat = grad_shared.get_value()
    assert flat[-1] == BATCH
    np.testing.assert_allclose(flat[:-1], BATCH * want, rtol=1e-12)


def test_n_rows_default_and_explicit(data):
    params, (x, y), loss = build_model()
    x_val, y_val = data[0][0], data[1][0]
    assert U.loss_rows(loss).eval({x: x_val, y: y_val}, on_unused_input="ignore") == BATCH
    for n_rows, want in [(None, BATCH), (5, 5), (y.shape[0], BATCH), (1, 1)]:
        grad_updates, _, grad_shared = U.adam(loss, params, n_rows=n_rows)
        compile_fn([x, y], [], updates=grad_updates)(x_val, y_val)
        assert grad_shared.get_value()[-1] == want
    # No non-shared input (data in shared variables): one row, the original's average.
    x_s = pytensor.shared(x_val)
    assert U.loss_rows(pt.sum(x_s)).eval() == 1


@pytest.mark.parametrize("rule", ["nesterov_momentum", "adam"])
def test_two_phase_n_rows_accumulates(rule, data):
    """With n_rows, uneven chunks (as ranks or slices) add up to the whole-batch step."""
    params, inputs, loss = build_model()
    tp = U.two_phase(getattr(L, rule), loss, params, n_rows=inputs[0].shape[0], **RULE_KWARGS[rule])
    assert tp.flat_grad.get_value().shape == (U.vars_flat_size(params) + 1,)
    grad_step = compile_fn(inputs, loss, updates=tp.grad_updates)
    apply_step = compile_fn([], [], updates=tp.param_updates)
    plain = compile_fn(inputs, pytensor.grad(loss, params))
    traj = []
    for k, (x, y) in enumerate(zip(*data, strict=True)):
        for rows in (slice(0, 5), slice(5, 7), slice(7, BATCH)):
            grad_step(x[rows], y[rows])
        flat = tp.flat_grad.get_value()
        assert flat[-1] == BATCH
        if k == 0:
            want = np.concatenate([g.ravel() for g in plain(x, y)])
            np.testing.assert_allclose(flat[:-1] / flat[-1], want, rtol=1e-12)
        apply_step()
        assert not np.any(tp.flat_grad.get_value())
        traj.append([p.get_value() for p in params])
    assert_traj_close(traj, np_trajectory(rule, RULE_KWARGS[rule], *data))


@pytest.mark.parametrize("rule", ["momentum", "adam"])
def test_two_phase_without_accumulating_overwrites(rule, data):
    """accumulate=False: phase one overwrites the vector, phase two leaves it; the
    trajectory is numpy's."""
    params, inputs, loss = build_model()
    tp = U.two_phase(getattr(L, rule), loss, params, accumulate=False, **RULE_KWARGS[rule])
    assert tp.flat_grad not in tp.param_updates
    grad_step = compile_fn(inputs, loss, updates=tp.grad_updates)
    apply_step = compile_fn([], [], updates=tp.param_updates)
    traj = []
    for x, y in zip(*data, strict=True):
        grad_step(x[:3], y[:3])  # overwritten by the next call
        grad_step(x, y)
        flat = tp.flat_grad.get_value()
        assert flat[-1] == BATCH
        apply_step()
        np.testing.assert_array_equal(tp.flat_grad.get_value(), flat)
        traj.append([p.get_value() for p in params])
    assert_traj_close(traj, np_trajectory(rule, RULE_KWARGS[rule], *data))


def test_flatten_unflatten_roundtrip():
    values = [np.arange(6.0).reshape(2, 3), np.asarray(7.0), np.arange(4.0).reshape(1, 4)]
    shared = [pytensor.shared(v) for v in values]
    assert U.vars_flat_size(shared) == U.vars_flat_size(values) == 11
    flat = U.flatten_vars(shared)
    pieces = U.unflatten_vars(flat, shared)
    out = compile_fn([], [flat, *pieces])()
    np.testing.assert_array_equal(out[0], np.concatenate([v.ravel() for v in values]))
    for got, want in zip(out[1:], values, strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rule", RULES)
def test_phase_two_updates_parameters_in_place(rule):
    """Phase two overwrites each parameter's array, as a one-phase rule on the gradients
    does, rather than allocating a new one per step (costly for large models)."""
    # FAST_COMPILE leaves out the in-place rewrites; the Python linker honours them as
    # Numba does, without compiling for seconds.
    mode = pytensor.compile.mode.Mode(linker="py", optimizer="fast_run")
    params, inputs, loss = build_model("float64")
    tp = U.two_phase(getattr(L, rule), loss, params, **RULE_KWARGS[rule])
    grad_step = pytensor.function(inputs, [], updates=tp.grad_updates, mode=mode)
    apply_step = pytensor.function([], [], updates=tp.param_updates, mode=mode)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((6, 3)), rng.standard_normal((6, 2))
    grad_step(x, y)
    storage = [p.get_value(borrow=True) for p in params]
    before = [a.copy() for a in storage]
    apply_step()
    for p, array, old in zip(params, storage, before, strict=True):
        assert p.get_value(borrow=True) is array, f"{rule}: {p.name} got a new array"
        assert not np.array_equal(array, old), f"{rule}: {p.name} did not change"


def test_float32_stays_float32():
    params, inputs, loss = build_model("float32")
    for rule in RULES:
        tp = U.two_phase(getattr(L, rule), loss, params, **RULE_KWARGS[rule])
        grad_updates, param_updates, grad_shared = getattr(U, rule)(
            loss, params, **RULE_KWARGS[rule]
        )
        assert tp.flat_grad.dtype == grad_shared.dtype == "float32"
        for var, new in [*tp.param_updates.items(), *grad_updates, *param_updates]:
            assert new.dtype == var.dtype == "float32", (rule, var)


def test_default_mode_float32(data):
    """Adam's two phases compile in the default (Numba) mode and track numpy in float32."""
    params, inputs, loss = build_model("float32")
    grad_updates, param_updates, _ = U.adam(loss, params, **RULE_KWARGS["adam"])
    grad_step = pytensor.function(inputs, loss, updates=grad_updates)
    apply_step = pytensor.function([], [], updates=param_updates)
    xs, ys = (d[:5] for d in data)
    traj = []
    for x, y in zip(xs, ys, strict=True):
        grad_step(x.astype("float32"), y.astype("float32"))
        apply_step()
        traj.append([p.get_value() for p in params])
    assert all(v.dtype == "float32" for v in traj[-1])
    assert_traj_close(
        traj, np_trajectory("adam", RULE_KWARGS["adam"], xs, ys), rtol=1e-4, atol=1e-5
    )


def test_broadcastable_param():
    b = pytensor.shared(np.ones((1, 3)), shape=(1, 3), name="b")
    x = pt.matrix("x")
    loss = pt.mean(pt.square(x + b))
    grad_updates, param_updates, _ = U.momentum(loss, [b], learning_rate=0.1)
    velocity = next(v for v, _ in param_updates if v is not b)
    assert velocity.type.shape == (1, 3)
    grad_step = compile_fn([x], [], updates=grad_updates)
    apply_step = compile_fn([], [], updates=param_updates)
    grad_step(np.zeros((2, 3)))
    apply_step()
    # d/db of the mean over 2x3 elements of b**2 is 2 * 2 * b / 6.
    np.testing.assert_allclose(b.get_value(), np.full((1, 3), 1 - 0.1 * 2 / 3))


def test_mixed_dtypes_raise():
    a = pytensor.shared(np.ones(2, dtype="float32"), name="a")
    c = pytensor.shared(np.ones(2, dtype="float64"), name="c")
    loss = pt.sum(a) + pt.sum(c)
    with pytest.raises(TypeError, match="one dtype"):
        U.sgd(loss, [a, c], learning_rate=0.1)
    with pytest.raises(TypeError, match="one dtype"):
        U.flatten_vars([a, c])
    with pytest.raises(TypeError, match="one dtype"):
        L.adam(loss, [a, c])
    with pytest.raises(TypeError, match="one dtype"):
        L.total_norm_constraint([a, c], 1.0)
    # Per-parameter rules keep each parameter in its own dtype.
    updates = L.rmsprop(loss, [a, c])
    assert [updates[a].dtype, updates[c].dtype] == ["float32", "float64"]
    _, _, grads_shared = U.sgd_nonflat(loss, [a, c], learning_rate=0.1)
    assert [g.dtype for g in grads_shared] == ["float32", "float64"]


def test_lasagne_signatures():
    defaults = {
        "sgd": {},
        "momentum": {"momentum": 0.9},
        "nesterov_momentum": {"momentum": 0.9},
        "adagrad": {"learning_rate": 1.0, "epsilon": 1e-6},
        "rmsprop": {"learning_rate": 1.0, "rho": 0.9, "epsilon": 1e-6},
        "adadelta": {"learning_rate": 1.0, "rho": 0.95, "epsilon": 1e-6},
        "adam": {"learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
        "adamax": {"learning_rate": 0.002, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
        "amsgrad": {"learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
        "get_or_compute_grads": {},
        "apply_momentum": {"params": None, "momentum": 0.9},
        "apply_nesterov_momentum": {"params": None, "momentum": 0.9},
        "norm_constraint": {"norm_axes": None, "epsilon": 1e-7},
        "total_norm_constraint": {"epsilon": 1e-7, "return_norm": False},
    }
    for name, want in defaults.items():
        sig = inspect.signature(getattr(L, name))
        got = {
            k: p.default
            for k, p in sig.parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        assert got == want, name
    assert list(inspect.signature(L.sgd).parameters) == ["loss_or_grads", "params", "learning_rate"]
    assert sorted(L.__all__) == sorted(set(defaults) - {"get_or_compute_grads"})  # Lasagne's


def iterables(params):
    """``params`` as the iterables Lasagne and Theano scripts pass: a generator, a dict's
    values (``net.values()``), a tuple."""
    yield (p for p in params)
    yield dict(zip("wbs", params, strict=True)).values()
    yield tuple(params)


@pytest.mark.parametrize("which", range(3))
def test_rules_take_any_iterable_of_params(which, data):
    """Every form of rule (one-phase, three-part, two_phase), given params as any
    iterable, trains as the NumPy reference."""

    def one_phase(inputs, loss, params):
        return [compile_fn(inputs, loss, updates=L.adam(loss, params, **RULE_KWARGS["adam"]))]

    def three_part(inputs, loss, params):
        grad_updates, param_updates, _ = U.adadelta(loss, params, **RULE_KWARGS["adadelta"])
        return [
            compile_fn(inputs, loss, updates=grad_updates),
            compile_fn([], [], updates=param_updates),
        ]

    def two_phase(inputs, loss, params):
        tp = U.two_phase(L.nesterov_momentum, loss, params, **RULE_KWARGS["nesterov_momentum"])
        return [
            compile_fn(inputs, loss, updates=tp.grad_updates),
            compile_fn([], [], updates=tp.param_updates),
        ]

    xs, ys = data[0][:3], data[1][:3]
    for rule, build in (
        ("adam", one_phase),
        ("adadelta", three_part),
        ("nesterov_momentum", two_phase),
    ):
        params, inputs, loss = build_model()
        steps = build(inputs, loss, list(iterables(params))[which])
        traj = []
        for x, y in zip(xs, ys, strict=True):
            steps[0](x, y)
            for step in steps[1:]:
                step()
            traj.append([p.get_value() for p in params])
        assert_traj_close(traj, np_trajectory(rule, RULE_KWARGS[rule], xs, ys))


def test_helpers_take_any_iterable(data):
    params, inputs, loss = build_model()
    x, y = data[0][0], data[1][0]
    want = np.concatenate([g.ravel() for g in np_grads(init_params(), x, y)])
    assert U.vars_flat_size(p for p in params) == 9
    grad_shared, flat_grad, unflat = U.flat_unflat_grads(loss, (p for p in params))
    grads_shared, grads = U.nonflat_grads(loss, (p for p in params))
    grad_updates, _, _ = U.sgd_nonflat(loss, (p for p in params), 0.1)
    pieces = U.unflatten_vars(flat_grad, (p for p in params))
    got = compile_fn(
        inputs,
        [
            flat_grad,
            U.flatten_vars(g for g in grads),
            *pieces,
            *L.get_or_compute_grads(loss, (p for p in params)),
            *L.total_norm_constraint((g for g in grads), 1e9, epsilon=0.0),
        ],
    )(x, y)
    for flat in got[:2]:
        np.testing.assert_allclose(flat, want, rtol=1e-12)
    for g_list in (got[2:5], got[5:8], got[8:11]):
        np.testing.assert_allclose(np.concatenate([g.ravel() for g in g_list]), want, rtol=1e-12)
    assert len(unflat) == len(grads_shared) == len(grad_updates) == 3


def test_train_function_theano_takes_dict_values(data):
    from synkhronos.extensions import train

    params, (x, y), loss = build_model()
    named = dict(zip("wbs", params, strict=True))
    with pytensor.config.change_flags(mode="FAST_COMPILE"):
        step = train.make_train_function_theano(
            loss, named.values(), x, y, U.adam, **RULE_KWARGS["adam"]
        )
    for xv, yv in zip(data[0][:3], data[1][:3], strict=True):
        step(xv, yv)
    want = np_trajectory("adam", RULE_KWARGS["adam"], data[0][:3], data[1][:3])[-1]
    for p, w in zip(params, want, strict=True):
        np.testing.assert_allclose(p.get_value(), w, rtol=1e-9, atol=1e-12)


def test_grads_list_and_errors():
    w = pytensor.shared(np.ones(3), name="w")
    g = pt.vector("g")
    updates = L.sgd([g], [w], 0.5)
    assert list(updates) == [w]
    compile_fn([g], [], updates=updates)(np.arange(3.0))
    np.testing.assert_allclose(w.get_value(), [1.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="2 gradient expressions for 1 parameters"):
        L.sgd([g, g], [w], 0.5)
    with pytest.raises(ValueError, match="shared variables only"):
        L.sgd(pt.sum(g), [g], 0.5)


def test_apply_momentum_subset():
    w = pytensor.shared(np.ones(2), name="w")
    v = pytensor.shared(np.ones(2), name="v")
    loss = pt.sum(w) + pt.sum(v)
    updates = L.apply_momentum(L.sgd(loss, [w, v], 0.1), params=[w], momentum=0.5)
    assert len(updates) == 3  # w, its velocity, and v untouched by momentum
    f = compile_fn([], [], updates=updates)
    f()
    f()
    np.testing.assert_allclose(w.get_value(), 1 - 0.1 - (0.5 * 0.1 + 0.1))
    np.testing.assert_allclose(v.get_value(), 1 - 0.2)


def np_norm_constraint(x, max_norm, axes, epsilon=1e-7):
    norms = np.sqrt(np.sum(x**2, axis=axes, keepdims=True))
    return x * np.clip(norms, 0, max_norm) / (epsilon + norms)


@pytest.mark.parametrize(
    ("shape", "norm_axes", "np_axes"),
    [
        ((4, 3), None, (0,)),
        ((2, 3, 4), None, (1, 2)),
        ((2, 2, 2, 3), None, (1, 2, 3)),
        ((4, 3), (1,), (1,)),
    ],
)
def test_norm_constraint(shape, norm_axes, np_axes):
    x_val = np.random.default_rng(3).normal(size=shape) * 3
    x = pt.tensor("x", shape=(None,) * len(shape))
    out = compile_fn([x], L.norm_constraint(x, 2.0, norm_axes=norm_axes))(x_val)
    np.testing.assert_allclose(out, np_norm_constraint(x_val, 2.0, np_axes), rtol=1e-12)
    norms = np.sqrt(np.sum(out**2, axis=np_axes))
    assert np.all(norms <= 2.0 + 1e-9)


def test_norm_constraint_needs_axes_for_vectors():
    with pytest.raises(ValueError, match="norm_axes"):
        L.norm_constraint(pt.vector("v"), 1.0)


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_total_norm_constraint(max_norm):
    rng = np.random.default_rng(4)
    vals = [rng.normal(size=(3, 2)), rng.normal(size=4)]
    xs = [pt.matrix("a"), pt.vector("b")]
    scaled, norm = L.total_norm_constraint(xs, max_norm, return_norm=True)
    out = compile_fn(xs, [*scaled, norm])(*vals)
    want_norm = np.sqrt(sum(np.sum(v**2) for v in vals))
    np.testing.assert_allclose(out[-1], want_norm, rtol=1e-12)
    mult = np.clip(want_norm, 0, max_norm) / (1e-7 + want_norm)
    for got, v in zip(out[:-1], vals, strict=True):
        np.testing.assert_allclose(got, v * mult, rtol=1e-12)
    assert len(L.total_norm_constraint(xs, max_norm)) == 2
