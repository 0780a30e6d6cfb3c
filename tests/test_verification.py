"""synk.verify(): every rank's shared variables compared by digest; RanksDisagree names
the variables, the ranks and the largest difference.

A disagreement is planted with ``synk.set_value(rank, var, value)`` on one rank (or
several), after training steps that leave the parameters and optimizer state equal on
every rank. Several nodes: tests/test_node_reductions.py.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.extensions import train as T
from synkhronos.extensions import updates as U
from synkhronos.rank.backends import gpu
from synkhronos.session import launch

BACKENDS = [
    ("cpu", 3),
    ("jax-cpu", 2),
    pytest.param(("gpu", 2), marks=pytest.mark.gpu),
]


@pytest.fixture(scope="module", params=BACKENDS, ids=lambda p: f"{p[0]}x{p[1]}")
def trained(request):
    """A session of ``request.param`` (backend, ranks) and a model trained a few steps with
    momentum: (w, its velocity, the data, the step)."""
    backend, n = request.param
    if backend != "cpu":
        pytest.importorskip("jax")
    if backend == "gpu" and not gpu.on_cpu_devices():
        n = None
    synk.fork(n, backend=backend)
    fx = pytensor.config.floatX
    rng = np.random.default_rng(3)
    x_data = rng.normal(size=(13, 4)).astype(fx)
    y_data = (x_data @ rng.normal(size=4)).astype(fx)
    x, y = pt.matrix("x"), pt.vector("y")
    w = pytensor.shared(np.zeros(4, fx), name="w")
    loss = pt.mean((x @ w - y) ** 2)
    step = T.make_train_function(loss, [w], x, y, U.momentum, learning_rate=0.1)
    for batch in (slice(0, 13), [1, 4, 5, 9, 12], slice(2, 9)):
        step(x_data, y_data, batch=batch)
    velocity = [
        v
        for v in launch.current().state.registry.variables
        if v is not w and getattr(v, "ndim", None) == 1 and v.get_value().shape == (4,)
    ]
    yield w, velocity, launch.current().n_ranks
    synk.close()


def _plant(var, rank: int, value) -> np.ndarray:
    """Set ``var`` on ``rank`` only; return the value every rank held."""
    held = np.array(synk.get_value(0, var))
    synk.set_value(rank, var, np.asarray(value, dtype=held.dtype))
    return held


def _restore(var, value, n: int) -> None:
    for r in range(n):
        synk.set_value(r, var, value)


def test_agreeing_ranks_pass(trained):
    w, velocity, n = trained
    assert velocity  # the optimizer state is among the compared variables
    synk.verify()
    values = synk.gather(w, nd_up=1)
    assert all(row.tobytes() == values[0].tobytes() for row in values)


def test_a_disagreement_on_one_rank_is_named(trained):
    w, _, n = trained
    rank = n - 1
    held = _plant(w, rank, synk.get_value(0, w) + np.array([0, 0.25, 0, -0.5]))
    try:
        with pytest.raises(synk.RanksDisagree) as caught:
            synk.verify()
        (found,) = caught.value.disagreements
        assert found.name.startswith("w (") and found.ranks == [rank]
        assert found.largest == pytest.approx(0.5, rel=1e-3)
        assert "w (" in str(caught.value) and f"rank(s) [{rank}]" in str(caught.value)
        synk.verify(per_rank=[w])  # named as kept per rank: not compared
    finally:
        _restore(w, held, n)
    synk.verify()


def test_a_scalar_disagreement_is_named(trained):
    _, _, n = trained
    fx = pytensor.config.floatX
    scalar = pytensor.shared(np.asarray(1.5, fx), name="scalar")
    synk.function([], scalar * 2)
    synk.verify()
    _plant(scalar, n - 1, 2.0)
    with pytest.raises(synk.RanksDisagree) as caught:
        synk.verify()
    (found,) = caught.value.disagreements
    assert found.largest == pytest.approx(0.5)
    _restore(scalar, np.asarray(1.5, fx), n)


def test_optimizer_state_and_shapes(trained):
    """The velocity differs on rank 1 by a bit only; w has another shape on rank 0's peer."""
    w, velocity, n = trained
    vel = velocity[0]
    held_v = np.array(synk.get_value(0, vel))
    bumped = np.nextafter(held_v, np.inf)
    held_w = _plant(w, 1, np.zeros(5))
    synk.set_value(1, vel, bumped)
    try:
        with pytest.raises(synk.RanksDisagree) as caught:
            synk.verify()
        by_name = {d.name.split(" ")[0]: d for d in caught.value.disagreements}
        assert by_name["w"].ranks == [1] and by_name["w"].largest is None
        assert by_name["w"].shapes == [(4,), (5,), *[(4,)] * (n - 2)]
        gap = by_name[vel.name.split(" ")[0] if vel.name else "unnamed"]
        assert gap.ranks == [1]
        assert 0 < gap.largest == pytest.approx(np.max(np.abs(bumped - held_v)))
    finally:
        _restore(w, held_w, n)
        _restore(vel, held_v, n)
    synk.verify()


def test_verify_every_n_calls(trained):
    """Set as fork(verify_every=2) sets it: the second call after a planted difference
    raises (the first does not run the check)."""
    w, _, n = trained
    x = pt.vector("x")
    f = synk.function([x], x.sum() + w.sum())
    session = launch.current()
    session.verify_every, session.calls = 2, 0
    held = _plant(w, n - 1, np.ones(4))
    try:
        f(np.ones(6, pytensor.config.floatX))
        with pytest.raises(synk.RanksDisagree, match=r"w \("):
            f(np.ones(6, pytensor.config.floatX))
    finally:
        session.verify_every = None
        _restore(w, held, n)


def test_fork_checks_verify_every():
    with pytest.raises(ValueError, match="verify_every must be a positive int"):
        synk.fork(2, backend="cpu", verify_every=0)


NODES_SCRIPT = r"""
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.extensions import train as T
from synkhronos.extensions import updates as U
from synkhronos.transport import nodes

synk.fork(int(sys.argv[1]), backend=sys.argv[2])
world = nodes.current()
N = world.n_global
fx = pytensor.config.floatX
rng = np.random.default_rng(3)  # the same data on every node
x_data = rng.normal(size=(13, 4)).astype(fx)
y_data = (x_data @ rng.normal(size=4)).astype(fx)
x, y = pt.matrix("x"), pt.vector("y")
w = pytensor.shared(np.zeros(4, fx), name="w")
step = T.make_train_function(pt.mean((x @ w - y) ** 2), [w], x, y, U.adam, learning_rate=0.1)
for batch in (slice(0, 13), [1, 4, 5, 9, 12], slice(2, 9)):
    step(x_data, y_data, batch=batch)
held = np.array(synk.get_value(0, w))
seen = []


def caught(ranks):
    try:
        synk.verify()
    except synk.RanksDisagree as error:
        (found,) = error.disagreements
        return found.ranks == ranks and abs(found.largest - 0.5) < 1e-3
    return False


seen.append(("agree", caught(None) is False))
synk.verify()
synk.set_value(N - 1, w, held + 0.5)  # one rank of node 1
seen.append(("one rank", caught([N - 1])))
for r in range(N // 2, N):  # every rank of node 1: each node agrees within itself
    synk.set_value(r, w, held - 0.5)
seen.append(("node 1", caught(list(range(N // 2, N)))))
for r in range(N):
    synk.set_value(r, w, held)
synk.verify()
failed = [name for name, ok in seen if not ok]
print(f"node {world.node}: " + ("ok" if not failed else f"FAILED {failed}"), flush=True)
synk.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("local", "backend"), [(1, "cpu"), (2, "gpu")])
def test_verify_spans_every_node(tmp_path, local, backend):
    """2 MPI nodes of ``local`` ranks: a difference on one rank of node 1, and on all of
    node 1's ranks (each node agreeing within itself), is caught on both nodes."""
    from tests.test_nodes import MPIEXEC, _launch

    if not MPIEXEC.exists():
        pytest.skip("needs mpiexec next to the interpreter (pip install mpich)")
    pytest.importorskip("mpi4py")
    if backend == "gpu":
        pytest.importorskip("jax")
    proc, _ = _launch(tmp_path, NODES_SCRIPT, str(local), backend)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for node in (0, 1):
        assert f"node {node}: ok" in out, out
