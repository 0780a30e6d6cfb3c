"""A shared variable rank 0 changes between calls reaches every rank before the next call.

Lasagne programs lower their learning rate with ``eta.set_value(eta.get_value() * 0.1)``
between calls (and before the first); a plain ``pytensor.function`` on rank 0 may update a
shared variable a synkhronos function reads. Each case against one process's
``pytensor.function`` with the same schedule (float64, rtol 1e-9), on 2 and 3 CPU ranks and
GPU ranks on CPU devices, 11 rows (uneven shares), every rank bit-identical
(:func:`synkhronos.verify`); values already equal on every rank are not sent again.
"""

from __future__ import annotations

import os

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.api import collectives
from synkhronos.rank.backends import gpu
from synkhronos.session import launch
from synkhronos.session.agreed import SAMPLES, WHOLE_BYTES, AgreedValues
from synkhronos.transport.partition import split_bounds
from synkhronos.transport.protocol import Collective

ROWS = 11  # 2 ranks: 6/5, 3 ranks: 4/4/3
EVEN = 12  # every rank's rows of one shape: GPU ranks fuse a chain into one XLA program
RTOL = 1e-9


@pytest.fixture(
    scope="module",
    params=[("cpu", 2), ("cpu", 3), pytest.param(("gpu", 2), marks=pytest.mark.gpu)],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def session(request):
    """A float64 session: CPU ranks, or GPU ranks on CPU devices (which keep float64 only
    where PYTENSOR_FLAGS names floatX)."""
    backend, n = request.param
    flags = os.environ.get("PYTENSOR_FLAGS")
    if backend == "gpu":
        pytest.importorskip("jax")
        if not gpu.on_cpu_devices():
            pytest.skip("on real GPUs the rank count is the GPUs'")
        os.environ["PYTENSOR_FLAGS"] = ",".join(f for f in (flags, "floatX=float64") if f)
    try:
        with pytensor.config.change_flags(floatX="float64"):
            synk.fork(n, backend=backend)
            yield backend
            synk.close()
    finally:
        if flags is None:
            os.environ.pop("PYTENSOR_FLAGS", None)
        else:
            os.environ["PYTENSOR_FLAGS"] = flags


@pytest.fixture
def broadcasts(monkeypatch):
    """The variables of every broadcast that a call sends first, call by call."""
    sent: list[list] = []
    collective = collectives._collective

    def counting(kind, shared_vars, *args, **kwargs):
        if kind == Collective.BROADCAST:
            sent.append(list(shared_vars))
        return collective(kind, shared_vars, *args, **kwargs)

    monkeypatch.setattr(collectives, "_collective", counting)
    return sent


def mode(backend: str):
    return None if backend == "gpu" else "FAST_COMPILE"  # GPU ranks: JAX, their mode


def data(rng, rows: int = ROWS):
    return rng.normal(size=(rows, 3)), rng.normal(size=rows)


def least_squares(lr):
    """(x, y, w, loss, SGD updates at rate ``lr``) of a linear least-squares model."""
    x, y = pt.matrix("x"), pt.vector("y")
    w = pytensor.shared(np.zeros(3), name="w")
    loss = pt.mean((x @ w - y) ** 2)
    return x, y, w, loss, [(w, w - lr * pytensor.grad(loss, w))]


def reference(X, Y, w0, rates):
    """One process's ``pytensor.function`` step, at each rate in turn: w after each."""
    lr = pytensor.shared(np.float64(rates[0]))
    x, y, w, loss, updates = least_squares(lr)
    w.set_value(w0)
    step = pytensor.function([x, y], loss, updates=updates, mode="FAST_COMPILE")
    after = []
    for rate in rates:
        lr.set_value(np.float64(rate))
        step(X, Y)
        after.append(w.get_value())
    return after


def equal_everywhere(var, want) -> None:
    """Every rank's value of ``var`` is ``want`` (close), and the ranks are bit-identical."""
    for value in synk.gather(var, nd_up=1):  # each rank's, in rank order
        np.testing.assert_allclose(value, want, rtol=RTOL)
    synk.verify()


@pytest.mark.parametrize("rows", [ROWS, EVEN])
def test_learning_rate_decayed_between_steps_equals_one_process(session, rng, broadcasts, rows):
    X, Y = data(rng, rows)
    w0 = rng.normal(size=3)
    lr = pytensor.shared(np.float64(0.1), name="lr")
    x, y, w, loss, updates = least_squares(lr)
    w.set_value(w0)
    step = synk.function([x, y], loss, updates=updates, mode=mode(session))
    rates = [0.1]
    for _ in range(3):
        step(X, Y)
        lr.set_value(lr.get_value() * 0.5)  # the schedule, on rank 0 only
        rates.append(float(lr.get_value()))
    step(X, Y)
    assert [[v.name for v in b] for b in broadcasts] == [["lr"]] * 3  # once per change
    equal_everywhere(w, reference(X, Y, w0, rates)[-1])
    equal_everywhere(lr, rates[-1])


def test_rate_set_before_the_first_step(session, rng):
    """Lasagne/Recipes' DenseNet: ``eta.set_value(eta.get_value() * 0.1)`` before its first
    step, after the function was built (and here shipped, too)."""
    X, Y = data(rng)
    eta = pytensor.shared(np.float64(1.0), name="eta")
    x, y, w, loss, updates = least_squares(eta)
    step = synk.function([x, y], loss, updates=updates, mode=mode(session))
    synk.distribute()  # the workers hold eta = 1.0
    eta.set_value(eta.get_value() * 0.1)
    step(X, Y)
    step(X, Y)
    equal_everywhere(w, reference(X, Y, np.zeros(3), [0.1, 0.1])[-1])


def test_plain_pytensor_update_on_rank_0_reaches_the_next_call(session, rng):
    """A plain function on rank 0 updates the rate and a weight matrix over WHOLE_BYTES (in
    place, as PyTensor does on CPU); a plain synkhronos function reads them in its output
    and in an update every rank applies."""
    X, _ = data(rng)
    x = pt.matrix("x")
    rate = pytensor.shared(np.float64(2.0), name="rate")
    total = pytensor.shared(np.float64(0.0), name="total")
    weights = pytensor.shared(np.ones((3, WHOLE_BYTES // 8)), name="weights")
    f = synk.function(
        [x],
        ((x * rate).sum() + (x @ weights).sum(), "sum"),
        updates=[(total, total + rate)],
        mode=mode(session),
    )
    decay = pytensor.function([], [], updates={rate: rate * 0.25, weights: weights * 0.5})
    columns = WHOLE_BYTES // 8
    np.testing.assert_allclose(f(X), X.sum() * (2.0 + columns), rtol=RTOL)
    held = weights.get_value(borrow=True)
    decay()
    assert (weights.get_value(borrow=True) is held) == (session == "cpu")  # in place on CPU
    np.testing.assert_allclose(f(X), X.sum() * (0.5 + 0.5 * columns), rtol=RTOL)
    equal_everywhere(rate, 0.5)
    equal_everywhere(total, 2.5)
    equal_everywhere(weights, np.full((3, columns), 0.5))


@pytest.mark.parametrize("rows", [ROWS, EVEN])
def test_chain_reads_the_changed_rate(session, rng, rows):
    X, Y = data(rng, rows)
    x, y = pt.matrix("x"), pt.vector("y")
    lr = pytensor.shared(np.float64(0.2), name="lr_chain")
    w = pytensor.shared(np.zeros(3), name="w_chain")
    g = pytensor.shared(np.zeros(3), name="g_chain")
    grad = synk.function([x, y], updates=[(g, x.T @ (x @ w - y))], mode=mode(session))
    update = synk.function([], updates=[(w, w - lr * g)], mode=mode(session))
    step = synk.chain(grad, ("all_reduce", g, "sum"), update)
    programs = launch.current().state.fused.values  # GPU ranks' chains as one program
    runs_before = sum(p.calls for p in programs())
    want = np.zeros(3)
    for rate in (0.2, 0.02, 0.002):
        lr.set_value(np.float64(rate))
        step(X, Y)
        want = want - rate * X.T @ (X @ want - Y)
    equal_everywhere(w, want)
    fused = session == "gpu" and rows == EVEN
    assert sum(p.calls for p in programs()) - runs_before == (3 if fused else 0)


def test_values_the_ranks_hold_alike_are_not_sent_again(session, rng, broadcasts):
    X, _ = data(rng)
    x = pt.matrix("x")
    s = pytensor.shared(np.float64(3.0), name="s")
    big = pytensor.shared(np.ones((64, 300)), name="big")  # sampled: over WHOLE_BYTES
    acc = pytensor.shared(np.zeros(3), name="acc")
    f = synk.function([x], (x * s).sum() + big.sum(), updates=[(acc, acc + s)], mode=mode(session))
    for _ in range(3):
        f(X)
    s.set_value(np.float64(3.0))  # a new array, the same value
    f(X)
    assert broadcasts == []
    big.set_value(np.full((64, 300), 2.0))
    f(X)
    assert [[v.name for v in b] for b in broadcasts] == [["big"]]


def test_each_ranks_own_values_stay(session):
    """A value a collective gave one rank (``synk.set_value(rank, ...)``, ``synk.scatter``)
    is no change of rank 0's, and a sliceable shared variable (each rank's own rows) is not
    watched: the next call leaves them."""
    v = pytensor.shared(np.zeros(2), name="own")
    rows = pytensor.shared(np.zeros((1, 3)), name="rows")
    f = synk.function([], v.sum() + rows.sum(), sliceable_shareds=[rows], mode=mode(session))
    f()
    synk.set_value(1, v, np.ones(2))
    table = np.arange(21.0).reshape(7, 3)
    synk.scatter(rows, table)
    rows.set_value(np.full((2, 3), -1.0))  # rank 0's own rows, by the program
    f()
    np.testing.assert_array_equal(synk.get_value(1, v), np.ones(2))
    np.testing.assert_array_equal(synk.get_value(0, v), np.zeros(2))
    bounds = split_bounds(len(table), len(synk.get_shapes(rows)))
    np.testing.assert_array_equal(synk.get_value(1, rows), table[bounds[1] : bounds[2]])
    synk.broadcast(v)


def test_a_check_between_sends_a_change(session, rng):
    """:func:`synkhronos.verify` sends a change pending since the last call, as the next
    call would: a change on rank 0 is no disagreement, and every rank then holds it."""
    X, _ = data(rng)
    x = pt.matrix("x")
    lr = pytensor.shared(np.float64(1.0), name="lr_checked")
    f = synk.function([x], (x * lr).sum(), mode=mode(session))
    f(X)
    lr.set_value(np.float64(0.5))
    synk.verify()
    equal_everywhere(lr, 0.5)
    f(X)
    equal_everywhere(lr, 0.5)


def test_changes_in_place_through_the_borrowed_buffer(session, rng):
    """A NumPy value of at most WHOLE_BYTES changed in place is seen; a larger one where a
    sampled element changed. A change that spares every sampled element is not:
    ``synk.broadcast`` it. (On GPU ranks, what a call wrote is an immutable JAX array;
    these variables are only read, and stay NumPy arrays on rank 0.)"""
    X, _ = data(rng)
    x = pt.matrix("x")
    small = pytensor.shared(np.ones(3), name="small")
    rows = WHOLE_BYTES // (8 * 100) + 1
    large = pytensor.shared(np.ones((rows, 100)), name="large")
    f = synk.function([x], (x @ small).sum() + large.sum(), mode=mode(session))
    f(X)
    small.get_value(borrow=True)[1] = 5.0
    large.get_value(borrow=True)[...] *= 3.0
    f(X)
    equal_everywhere(small, [1.0, 5.0, 1.0])
    equal_everywhere(large, np.full((rows, 100), 3.0))
    # The element just after the first sample, which the samples' spacing (> 1) skips.
    assert large.get_value().size > SAMPLES
    large.get_value(borrow=True)[0, 1] = -1.0
    f(X)
    with pytest.raises(synk.RanksDisagree, match="large"):
        synk.verify()
    synk.broadcast(large)
    synk.verify()


def test_a_large_value_is_sampled_whatever_its_strides():
    """The record of a value held as a transposed view samples it in place, as a C-ordered
    one."""
    agreed = AgreedValues()
    base = np.ones((300, 100))
    var = pytensor.shared(base.T, borrow=True)
    assert not var.get_value(borrow=True).flags.c_contiguous
    agreed.agree([var])
    assert agreed.changed([var]) == []
    base[-1, -1] = 2.0  # the last element, sampled
    assert agreed.changed([var]) == [var]
