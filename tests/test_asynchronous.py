"""EASGD, Downpour and gossip SGD against numpy formulas, and the centre's lock.

The model: linear regression, loss mean((x @ w - y)**2), plain SGD as the local rule, 11
rows (uneven shares on 2 and 3 ranks), minibatches of 2 rows cycling through each share.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from conftest import shm_entries

import synkhronos as synk
from synkhronos.api import routines
from synkhronos.extensions import updates as three_part
from synkhronos.extensions.asynchronous import (
    EASGD,
    AsyncEASGD,
    Downpour,
    Gossip,
    HolderDied,
    LocalStep,
)
from synkhronos.extensions.asynchronous.easgd import AsyncExchange
from synkhronos.extensions.asynchronous.phase import run_phase
from synkhronos.extensions.asynchronous.shared_block import DIE_HOLDING_LOCK, SharedBlock
from synkhronos.extensions.lasagne import updates as one_phase
from synkhronos.session import launch
from synkhronos.transport.names import new_session_name

N_ROWS, N_FEATURES, BATCH, LR = 11, 3, 2, 0.05
PHASES = (7, 5)  # two phases: the second continues the first's minibatches and centre


@contextlib.contextmanager
def forked(n_ranks: int, backend: str = "cpu"):
    synk.fork(n_ranks, backend=backend)
    try:
        yield n_ranks
    finally:
        synk.close()


def problem(rng):
    x = rng.normal(size=(N_ROWS, N_FEATURES))
    y = x @ rng.normal(size=N_FEATURES) + 0.1 * rng.normal(size=N_ROWS)
    return x, y, rng.normal(size=N_FEATURES)


def build_step(w0, rule=one_phase.sgd, mode="FAST_COMPILE"):
    x, y = pt.matrix("x"), pt.vector("y")
    w = pytensor.shared(w0.copy(), name="w")
    loss = pt.mean((x @ w - y) ** 2)
    return LocalStep(loss, [w], [x, y], rule, learning_rate=LR, mode=mode), w


# ---- numpy formulas ----------------------------------------------------------------------


def shares(n_ranks):
    return np.array_split(np.arange(N_ROWS), n_ranks)


def batch_rows(share, step):
    n_batches = max(1, len(share) // BATCH)
    k = step % n_batches
    return share[k * BATCH : (k + 1) * BATCH]


def sgd(w, x, y):
    """One SGD step; returns the new w and the loss before it."""
    residual = x @ w - y
    return w - LR * 2 / len(x) * (x.T @ residual), np.mean(residual**2)


def local_steps(w0, x, y, n_ranks, exchange):
    """Each rank's SGD on its share; ``exchange(step, ws)`` after every step (all ranks)."""
    n_steps = sum(PHASES)
    ws, losses = [w0.copy() for _ in range(n_ranks)], np.zeros((n_ranks, n_steps))
    for g in range(n_steps):
        for r, share in enumerate(shares(n_ranks)):
            rows = batch_rows(share, g)
            ws[r], losses[r, g] = sgd(ws[r], x[rows], y[rows])
        exchange(g, ws)
    return ws, losses


def easgd_formula(w0, x, y, n_ranks, tau, alpha, beta):
    centre = [w0.copy()]

    def exchange(g, ws):
        if (g + 1) % tau == 0:
            d = [w - centre[0] for w in ws]
            ws[:] = [w - alpha * di for w, di in zip(ws, d, strict=True)]
            centre[0] = centre[0] + beta * np.mean(d, axis=0)

    ws, losses = local_steps(w0, x, y, n_ranks, exchange)
    return ws, losses, centre[0]


def run_phases(trainer, data):
    results = [trainer.run(data, n) for n in PHASES]
    return np.concatenate([r.losses for r in results], axis=1), results[-1]


# ---- exact trajectories ------------------------------------------------------------------


@pytest.mark.parametrize("n_ranks, backend", [(1, "cpu"), (2, "cpu"), (3, "cpu"), (2, "jax-cpu")])
def test_sync_easgd_matches_formula_step_for_step(n_ranks, backend, rng):
    """(jax-cpu: parameters on the device, copied to the host only at exchanges.)"""
    x, y, w0 = problem(rng)
    tau, alpha = 3, 0.3
    beta = 0.5  # not n_ranks * alpha: the centre's own rate is used as given
    with forked(n_ranks, backend):
        step, w = build_step(w0, mode=None if backend == "jax-cpu" else "FAST_COMPILE")
        data = [synk.data(x), synk.data(y)]
        with EASGD(step, BATCH, tau=tau, alpha=alpha, beta=beta) as trainer:
            losses, last = run_phases(trainer, data)
        ws, expected_losses, centre = easgd_formula(w0, x, y, n_ranks, tau, alpha, beta)
        np.testing.assert_allclose(losses, expected_losses, rtol=1e-12)
        np.testing.assert_allclose(last.centre[0], centre, rtol=1e-12)
        np.testing.assert_allclose(w.get_value(), ws[0], rtol=1e-12)  # rank 0's own
        assert last.samples == PHASES[-1] * sum(min(BATCH, len(s)) for s in shares(n_ranks))


@pytest.fixture
def one_rank():
    with forked(1):
        yield


def test_async_easgd_one_rank_matches_formula(one_rank, rng):
    x, y, w0 = problem(rng)
    step, w = build_step(w0)
    with AsyncEASGD(step, BATCH, tau=2, alpha=0.4) as trainer:
        losses, last = run_phases(trainer, [synk.data(x), synk.data(y)])
    ws, expected_losses, centre = easgd_formula(w0, x, y, 1, 2, 0.4, 0.4)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-12)
    np.testing.assert_allclose(last.centre[0], centre, rtol=1e-12)
    np.testing.assert_allclose(w.get_value(), ws[0], rtol=1e-12)


def downpour_formula(w0, x, y, n_push, n_pull):
    w, centre, base = w0.copy(), w0.copy(), w0.copy()  # w - base: the change not pushed
    losses, g = [], 0
    for n in PHASES:
        for _ in range(n):
            rows = batch_rows(np.arange(N_ROWS), g)
            w, loss = sgd(w, x[rows], y[rows])
            losses.append(loss)
            g += 1
            if g % n_push == 0:
                centre, base = centre + w - base, w
            if g % n_pull == 0:
                w, base = centre.copy(), centre - (w - base)
        centre, base = centre + w - base, w  # each phase ends with a push of what is left
    return w, np.array([losses]), centre


@pytest.mark.parametrize("rule", [one_phase.sgd, three_part.sgd], ids=["one-phase", "three-part"])
@pytest.mark.parametrize("n_push, n_pull", [(1, 1), (2, 3)])
def test_downpour_one_rank_matches_formula(one_rank, rng, rule, n_push, n_pull):
    x, y, w0 = problem(rng)
    step, w = build_step(w0, rule)
    with Downpour(step, BATCH, n_push=n_push, n_pull=n_pull) as trainer:
        losses, last = run_phases(trainer, [synk.data(x), synk.data(y)])
    w_end, expected_losses, centre = downpour_formula(w0, x, y, n_push, n_pull)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-12)
    np.testing.assert_allclose(last.centre[0], centre, rtol=1e-12)
    np.testing.assert_allclose(w.get_value(), w_end, rtol=1e-12)
    if n_push == n_pull == 1:  # pushing and pulling every step is plain SGD
        plain, _ = local_steps(w0, x, y, 1, lambda g, ws: None)
        np.testing.assert_allclose(centre, plain[0], rtol=1e-12)


@pytest.mark.parametrize("n_ranks, p", [(1, 0.5), (2, 0.0)])
def test_gossip_without_messages_is_local_sgd_and_mean(n_ranks, p, rng):
    """(Also: numpy arrays as data, travelling with the command, and given row indices.)"""
    x, y, w0 = problem(rng)
    order = rng.permutation(N_ROWS + 4)[:N_ROWS]  # rows 0..N_ROWS+3: 4 are never used
    x_big, y_big = np.zeros((N_ROWS + 4, N_FEATURES)), np.zeros(N_ROWS + 4)
    x_big[order], y_big[order] = x, y
    with forked(n_ranks):
        step, _ = build_step(w0)
        with Gossip(step, BATCH, p=p) as trainer:
            results = [trainer.run([x_big, y_big], n, rows=order) for n in PHASES]
        losses, last = np.concatenate([r.losses for r in results], axis=1), results[-1]
    ws, expected_losses = local_steps(w0, x, y, n_ranks, lambda g, ws: None)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-12)
    np.testing.assert_allclose(last.centre[0], np.mean(ws, axis=0), rtol=1e-12)
    np.testing.assert_allclose([float(r[0][0]) for r in last.replies], [1 / n_ranks] * n_ranks)


# ---- asynchronous invariants ---------------------------------------------------------------


def check_centre_is_running_sum(logs, centre0, centre_end, n_params):
    """Logged exchanges ``[sequence, ..., centre before, added]`` in sequence order: each
    one saw the centre the previous ones left, and the last leaves the final centre."""
    rows = np.concatenate([log for log in logs if log.size])
    rows = rows[np.argsort(rows[:, 0])]
    np.testing.assert_array_equal(rows[:, 0], np.arange(len(rows)))  # none lost, none twice
    before, added = rows[:, -2 * n_params : -n_params], rows[:, -n_params:]
    expected = centre0 + np.concatenate([np.zeros((1, n_params)), np.cumsum(added, axis=0)])
    np.testing.assert_allclose(before, expected[:-1], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(centre_end, expected[-1], rtol=1e-10, atol=1e-12)
    return rows


@pytest.fixture
def two_ranks():
    with forked(2):
        yield


def test_async_easgd_centre_is_the_running_formula_of_the_exchanges(two_ranks, rng):
    x, y, w0 = problem(rng)
    step, _ = build_step(w0)
    alpha = 0.3
    with AsyncEASGD(step, BATCH, tau=2, alpha=alpha, log=True) as trainer:
        result = trainer.run([synk.data(x), synk.data(y)], 40)
    logs = [r[0] for r in result.replies]
    assert [len(log) for log in logs] == [20, 20]
    rows = check_centre_is_running_sum(logs, w0, result.centre[0], N_FEATURES)
    params, centre, added = (
        rows[:, 1 + i * N_FEATURES : 1 + (i + 1) * N_FEATURES] for i in range(3)
    )
    np.testing.assert_allclose(added, alpha * (params - centre), rtol=1e-12)


def test_downpour_centre_is_the_running_formula_of_the_pushes(two_ranks, rng):
    x, y, w0 = problem(rng)
    step, _ = build_step(w0)
    with Downpour(step, BATCH, n_push=3, n_pull=4, log=True) as trainer:
        result = trainer.run([synk.data(x), synk.data(y)], 24)
    logs = [r[0] for r in result.replies]
    for log in logs:  # 8 pushes, 6 pulls, one final push
        kinds = log[:, 1]
        assert (kinds == 0).sum() == 9 and (kinds == 1).sum() == 6
        assert np.all(log[kinds == 1, -N_FEATURES:] == 0)  # a pull adds nothing
    check_centre_is_running_sum(logs, w0, result.centre[0], N_FEATURES)


def test_gossip_conserves_weight_and_delivers_every_message(two_ranks, rng):
    x, y, w0 = problem(rng)
    step, _ = build_step(w0)
    with Gossip(step, BATCH, p=0.5, log=True, seed=3) as trainer:
        result = trainer.run([synk.data(x), synk.data(y)], 30)
        second = trainer.run([synk.data(x), synk.data(y)], 10)
    weights = [float(r[0][0]) for r in second.replies]
    assert sum(weights) == 1.0  # halvings and sums of powers of two are exact
    logs = np.concatenate([r[1] for r in result.replies + second.replies if r[1].size])
    n = N_FEATURES
    weight, own, x_before, mass, x_after = (
        logs[:, 2],
        logs[:, 3],
        logs[:, 4 : 4 + n],
        logs[:, 4 + n : 4 + 2 * n],
        logs[:, 4 + 2 * n :],
    )
    sends, receives = logs[:, 0] == 0, logs[:, 0] == 1
    assert sends.sum() > 0 and receives.sum() > 0
    # A send halves the sender's weight and carries w * x; a receive merges (GoSGD):
    # x <- (w x + sum_s w_s x_s) / (w + sum_s w_s).
    np.testing.assert_array_equal(weight[sends], own[sends] / 2)
    np.testing.assert_allclose(mass[sends], weight[sends, None] * x_before[sends], rtol=1e-12)
    expected = (own[receives, None] * x_before[receives] + mass[receives]) / (
        own[receives] + weight[receives]
    )[:, None]
    np.testing.assert_allclose(x_after[receives], expected, rtol=1e-12)
    # Every message is delivered, weight and parameters alike, none twice.
    assert weight[sends].sum() == weight[receives].sum()
    np.testing.assert_allclose(mass[sends].sum(axis=0), mass[receives].sum(axis=0), rtol=1e-10)


# ---- the routine command and the lock -------------------------------------------------------


def rank_sum(state, values, scale):
    """A routine for the test below: this rank's number and a sum."""
    return [np.array([state.rank, values.sum() * scale[0]])]


def test_bad_hyperparameters_are_refused_on_rank_0_before_any_block_exists(one_rank, rng):
    step, _ = build_step(problem(rng)[2])
    name = launch.current().name
    before = shm_entries(name)
    for make, match in (
        (lambda: EASGD(step, BATCH, tau=0), "tau"),
        (lambda: AsyncEASGD(step, BATCH, tau=2.5), "tau"),
        (lambda: Downpour(step, BATCH, n_push=1, n_pull=0), "n_pull"),
        (lambda: Gossip(step, BATCH, p=1.5), "probability"),
    ):
        with pytest.raises(ValueError, match=match):
            make()
    assert shm_entries(name) == before


def test_routine_runs_on_every_rank_with_data_and_arrays(two_ranks):
    values = synk.data(np.arange(5.0))
    replies = routines.run(rank_sum, values, np.array([2.0]))
    assert [r[0].tolist() for r in replies] == [[0.0, 20.0], [1.0, 20.0]]

    def nested(state):
        return []

    for refused in (lambda state: [], nested, functools.partial(rank_sum, scale=[1.0])):
        with pytest.raises(ValueError, match="module-level"):
            routines.run(refused)


def fail_on_rank(state, failing_rank):
    """A routine for the test below: ``failing_rank`` raises while the others all-reduce."""
    if state.rank == int(failing_rank[0]):
        raise ArithmeticError(f"rank {state.rank} fails mid-phase")
    state.comm.all_reduce([np.ones(3)], "sum")
    return []


@pytest.mark.parametrize("failing_rank", [0, 2])
def test_a_rank_failing_mid_phase_aborts_the_others_waiting_in_an_all_reduce(failing_rank):
    """The existing abort reaches ranks blocked in a collective: nothing hangs, the error
    names the failing rank, and the session still runs the next routine."""
    with forked(3):
        if failing_rank == 0:
            with pytest.raises(ArithmeticError, match="rank 0 fails"):
                routines.run(fail_on_rank, np.array([0.0]))
        else:
            with pytest.raises(synk.RemoteError, match="rank 2") as raised:
                routines.run(fail_on_rank, np.array([2.0]))
            assert "rank 2 fails mid-phase" in str(raised.value)
        replies = routines.run(rank_sum, np.arange(3.0), np.array([1.0]))
        assert [r[0].tolist() for r in replies] == [[r, 3.0] for r in range(3)]


class AsyncExchangeFailingOnRank1(AsyncExchange):
    """Asynchronous EASGD whose rank 1 raises after a few steps (outside the lock)."""

    def after_step(self, step: int) -> None:
        if self.rank == 1 and step == 3:
            raise ArithmeticError("rank 1 fails mid-phase")
        super().after_step(step)


def failing_async_easgd_phase(state, *args):
    return run_phase(state, AsyncExchangeFailingOnRank1, *args)


class AsyncEASGDFailingOnRank1(AsyncEASGD):
    routine = staticmethod(failing_async_easgd_phase)


def test_a_rank_failing_in_an_asynchronous_phase_stops_the_others_at_their_next_step(
    two_ranks, rng
):
    """Without the abort check between local steps rank 0 would run its 10**7 steps."""
    x, y, w0 = problem(rng)
    step, _ = build_step(w0)
    data = [synk.data(x), synk.data(y)]
    with AsyncEASGDFailingOnRank1(step, BATCH, tau=2, alpha=0.1) as trainer:
        started = time.monotonic()
        with pytest.raises(synk.RemoteError, match="rank 1") as raised:
            trainer.run(data, 10**7)
        assert time.monotonic() - started < 60
        assert "rank 1 fails mid-phase" in str(raised.value)
        trainer.centre()  # rank 1 failed outside the lock: the centre is still clean
    with AsyncEASGD(step, BATCH, tau=2, alpha=0.1) as trainer:  # the session still works
        assert trainer.run(data, 4).losses.shape == (2, 4)


def test_a_busy_lock_polls_its_check_and_a_failed_holder_leaves_it_refused():
    name = new_session_name() + "_block"
    first = SharedBlock(name, 2, "float64", create=True)
    second = SharedBlock(name, 0, "float64", create=False)  # another open file: another lock
    assert not os.get_inheritable(first._fd)  # an exec'd child never holds it on
    assert second.values.shape == (2,)
    calls = []

    def give_up():
        calls.append(1)
        raise TimeoutError

    with first.locked(0) as values:
        values[:] = 3.0
        with pytest.raises(TimeoutError), second.locked(1, give_up):
            pass
    assert calls == [1]
    np.testing.assert_array_equal(second.read(1), [3.0, 3.0])
    with pytest.raises(ZeroDivisionError), second.locked(1) as values:
        values[0] = 1 / 0  # a holder that fails half-way
    with pytest.raises(HolderDied, match="rank 1 died or failed"):
        first.read(0)
    first.unlink()
    second.close()
    assert not shm_entries(name)


def test_a_rank_dying_inside_the_lock_is_named_and_nothing_leaks(monkeypatch, rng):
    x, y, w0 = problem(rng)
    monkeypatch.setenv(DIE_HOLDING_LOCK, "1")  # the workers inherit it; rank 0 is "0"
    synk.fork(2, backend="cpu")
    name = launch.current().name
    try:
        step, _ = build_step(w0)
        trainer = AsyncEASGD(step, BATCH, tau=1, alpha=0.1)
        # Rank 1 dies at its first lock (reading the centre); rank 0, exchanging every
        # step, meets the dirty centre at its next exchange, long before 10**6 steps.
        with pytest.raises(HolderDied, match="rank 1") as raised:
            trainer.run([synk.data(x), synk.data(y)], 10**6)
        assert isinstance(raised.value.__cause__, synk.WorkerDied)
        assert "rank 1 died" in str(raised.value.__cause__)
        with pytest.raises(HolderDied, match="rank 1 died or failed while holding"):
            trainer.centre()  # the centre stays refused: rank 1 may have half-written it
        trainer.close()
    finally:
        synk.close()
    assert shm_entries(name) == []
    assert not any(e.startswith(name) for e in os.listdir("/dev/shm"))
