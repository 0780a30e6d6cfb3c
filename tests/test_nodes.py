"""Several nodes over MPI: ``mpiexec -n 2`` runs one script per "node" on this machine.

Each test writes a small script, launches it under mpich's ``mpiexec`` (the one installed
next to this interpreter; oversubscribing the cores is mpich's default) and reads what the
nodes print. The checks inside the script compare with numpy formulas and with
single-process PyTensor on the whole batch.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import shm_entries

MPIEXEC = Path(sys.executable).parent / "mpiexec"
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    not MPIEXEC.exists() or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpi4py and mpiexec next to the interpreter (pip install 'synkhronos[mpi]' mpich)",
)

CHECKS = r"""
import logging
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.session import launch
from synkhronos.transport import nodes
from synkhronos.extensions import train as T
from synkhronos.extensions import updates as U

logging.basicConfig()
logging.getLogger("synkhronos").setLevel(logging.INFO)  # the world's description is INFO
synk.fork(int(sys.argv[1]), backend=sys.argv[2])
world = nodes.current()
N = world.n_global
failed = []


def check(name, got, want):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or not np.allclose(got, want, rtol=TOL, atol=TOL):
        failed.append(f"{name}: got {got.tolist()}, want {want.tolist()}")


FX = pytensor.config.floatX  # float32 on GPU ranks
TOL = 1e-10 if FX == "float64" else 1e-4
rng = np.random.default_rng(0)  # the same data on every node
X = rng.normal(size=(11, 3)).astype(FX)
sizes = [11 // N + (r < 11 % N) for r in range(N)]
starts = np.concatenate(([0], np.cumsum(sizes)))

# ---- function outputs over all global ranks (11 rows, uneven) -------------------------
x = pt.matrix("x")
f = synk.function([x], [x.mean(), (x.sum(), "sum"), (x.max(axis=1), "gather"),
                        (x.min(), "min"), (x.max(), "max"), ((1 + 0.1 * x).prod(), "prod"),
                        (x.sum(), "per_rank"), (x.sum(), None)])
mean, total, row_max, low, high, prod, per_rank, first = f(X)
check("avg", mean, X.mean())
check("sum", total, X.sum())
check("gather", row_max, X.max(axis=1))
check("min", low, X.min())
check("max", high, X.max())
check("prod", prod, (1 + 0.1 * X).prod())
check("per_rank", [v.sum() for v in per_rank], [X[a:b].sum() for a, b in
                                                 zip(starts[:-1], starts[1:])])
check("op None", first, X[:starts[1]].sum())
xd = synk.data(X)
rows = [10, 0, 3, 3, 7, 1, 9]
check("batch indices", f(xd, batch=rows)[0], X[rows].mean())
check("batch slice", f(xd, batch=slice(2, 9))[2], X[2:9].max(axis=1))
check("batch int", f(xd, batch=5)[1], X[:5].sum())
sliced_mean, sliced_max = f(xd, batch=slice(1, 10), num_slices=2, output_subset=[0, 2])
check("num_slices avg", sliced_mean, X[1:10].mean())
check("num_slices gather", sliced_max, X[1:10].max(axis=1))
# One shard per node: each node holds only the rows it computes, as minibatch Data.
lo, hi = nodes.node_rows(11)
check("node rows", [lo, hi], [starts[world.offset], starts[world.offset + int(sys.argv[1])]])
shard = synk.data(X[lo:hi], minibatch=True)
check("shard avg", f(shard, batch=11, output_subset=[0]), X.mean())
check("shard gather", f(shard, batch=11, output_subset=[2]), X.max(axis=1))

# ---- collectives over all global ranks ---------------------------------------------------
v = pytensor.shared(np.zeros(3, FX), name="v")
g = synk.function([x], (x.sum() + v.sum(), "sum"), sliceable_shareds=[v])
for r in range(N):
    synk.set_value(r, v, np.full(3, 10.0 + r, FX))
values = 10.0 + np.arange(N)[:, None] * np.ones(3)
check("gather stacked", synk.gather(v, nd_up=1), values)
check("get_value", synk.get_value(N - 1, v), values[-1])
check("reduce sum", synk.reduce(v, "sum", in_place=False), values.sum(axis=0))
synk.all_reduce(v, "max")
check("all_reduce max", synk.gather(v, nd_up=1), np.broadcast_to(values.max(axis=0), (N, 3)))
for r in range(N):
    synk.set_value(r, v, np.full(3, 10.0 + r, FX))
synk.all_reduce(v, "avg")
check("all_reduce avg", synk.gather(v, nd_up=1), np.broadcast_to(values.mean(axis=0), (N, 3)))
synk.broadcast(v, np.arange(3, dtype=FX) + 100 * world.node)  # node 0's value wins
check("broadcast", synk.gather(v, nd_up=1), np.broadcast_to(np.arange(3.0), (N, 3)))
synk.scatter(v, np.arange(2 * N, dtype=FX))
check("scatter", synk.gather(v, nd_up=0), np.arange(2.0 * N))
synk.all_gather(v)
check("all_gather", synk.get_value(N - 1, v), np.arange(2.0 * N))
check("lengths", synk.get_lengths(v), [2 * N] * N)
if sys.argv[2] == "gpu":  # the collectives above ran as XLA programs over every rank
    xla = launch.current().state.comm.local
    check("mesh size and XLA programs run", [xla.mesh.devices.size, xla.dispatches > 0],
          [N, True])
# batch_s: one selection for every rank, then one per global rank.
check("batch_s", g(X, batch_s=slice(1, 4)), X.sum() + N * np.arange(1.0, 4.0).sum())
per = [slice(r, r + 1) for r in range(N)]
check("batch_s per rank", g(X, batch_s=per), X.sum() + np.arange(float(N)).sum())

# ---- extensions.train: the trajectory of single-process PyTensor --------------------------
y_data = (X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=11)).astype(FX)
trajectories = []
for make in (T.make_train_function, T.make_train_function_theano):
    xv, yv = pt.matrix("x"), pt.vector("y")
    w = pytensor.shared(np.zeros(3, FX), name="w")
    loss = pt.mean((xv @ w - yv) ** 2)
    step = make(loss, [w], xv, yv, U.momentum, learning_rate=0.1)
    path = []
    for batch in (slice(0, 11), [0, 2, 3, 5, 7, 8, 10, 1], slice(2, 9)):
        if make is T.make_train_function:
            path.append(float(step(X, y_data, batch=batch)))
        else:
            path.append(float(step(X[batch], y_data[batch])))
        path.extend(w.get_value().tolist())
    trajectories.append(path)
check("train trajectory", trajectories[0], trajectories[1])

print(f"node {world.node}: {N} ranks, " + ("ok" if not failed else "FAILED " + "; ".join(failed)),
      flush=True)
synk.close()
"""

FAILS = r"""
import os
import signal
import sys
import threading

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.transport import nodes

synk.fork(2, backend="cpu")
node = nodes.current().node
x = pt.matrix("x")
f = synk.function([x], x.sum())
X = np.ones((9, 2))
f(X)
with open(f"node{node}.pid", "w") as out:  # a file: MPI_Abort may drop forwarded stdout
    out.write(str(os.getpid()))
if node == 1 and sys.argv[1] == "raise":
    f(X, batch=100)  # raises on node 1 only; node 0 is in its next call
if node == 1 and sys.argv[1] == "kill":
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
while True:
    f(X)
"""


def _launch(tmp_path: Path, script: str, *args: str, timeout: float = 120):
    path = tmp_path / "script.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(
        PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        ),
        PYTENSOR_FLAGS="mode=FAST_COMPILE",  # small graphs compile in a blink
        JAX_PLATFORMS="cpu",
    )  # "gpu": GPU ranks on CPU devices
    start = time.monotonic()
    proc = subprocess.run(
        [str(MPIEXEC), "-n", "2", sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp_path,
    )
    return proc, time.monotonic() - start


@pytest.mark.slow
@pytest.mark.parametrize(("local", "backend"), [(1, "cpu"), (2, "cpu"), (2, "jax-cpu"), (2, "gpu")])
def test_calls_and_collectives_span_every_node(tmp_path, local, backend):
    """2 nodes x ``local`` ranks: outputs, batch selections, collectives and a training
    trajectory equal one process on the whole batch. "gpu" runs GPU ranks on CPU devices
    (``JAX_PLATFORMS=cpu``): one XLA mesh over all 4 ranks, and outputs through it (the
    communicator path) across the nodes."""
    if backend != "cpu" and importlib.util.find_spec("jax") is None:
        pytest.skip("needs jax")
    proc, _ = _launch(tmp_path, CHECKS, str(local), backend)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert (
        f"2 nodes (MPI), {local} local ranks each, {2 * local} global ranks; this is "
        f"node 1 (pid " in out
    )
    for node in (0, 1):
        assert f"node {node}: {2 * local} ranks, ok" in out, out


CHANGES = r"""
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.api import collectives
from synkhronos.transport import nodes

synk.fork(2, backend="cpu")
world = nodes.current()
N, node = world.n_global, world.node
failed, sent = [], []
broadcast = collectives._collective


def counted(kind, *args, **kwargs):
    sent.append(kind == collectives.Collective.BROADCAST)
    return broadcast(kind, *args, **kwargs)


collectives._collective = counted
X = np.arange(22.0).reshape(11, 2)
lr = pytensor.shared(np.float64(0.1), name="lr")
x = pt.matrix("x")
f = synk.function([x], (lr * x.sum(), "sum"))


def call(name, rate):
    sent.clear()
    got = float(f(X))
    everywhere = [float(synk.get_value(r, lr)) for r in range(N)]
    if not np.isclose(got, rate * X.sum()) or everywhere != [rate] * N:
        failed.append(f"{name}: {got} for {rate * X.sum()}; lr per rank {everywhere}")
    if float(lr.get_value()) != rate:
        failed.append(f"{name}: this node's lr {lr.get_value()}, not {rate}")
    return sum(sent)


call("first call", 0.1)
if call("nothing changed", 0.1) != 0:
    failed.append("a broadcast sent with nothing changed")
lr.set_value(np.float64(0.05))  # on every node: the same script
call("set on every node", 0.05)
if node == 1:  # node 1 alone: node 0's value is every rank's again, node 1's own too
    lr.set_value(np.float64(7.0))
call("set on node 1 only", 0.05)
if node == 0:  # node 0 alone: every node's ranks get it
    lr.set_value(np.float64(0.2))
call("set on node 0 only", 0.2)
lr.get_value(borrow=True)[...] = 0.3  # in place, on every node
call("changed in place", 0.3)
print(f"node {node}: " + ("; ".join(failed) if failed else "ok"), flush=True)
synk.close()
"""


@pytest.mark.slow
def test_a_changed_shared_value_reaches_every_nodes_ranks(tmp_path):
    """2 nodes x 2 ranks: a ``set_value`` between calls (on every node, on node 1 only, on
    node 0 only, in place) reaches all 4 ranks before the next call, node 0's value; with
    nothing changed nothing is broadcast."""
    proc, _ = _launch(tmp_path, CHANGES)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for node in (0, 1):
        assert f"node {node}: ok" in out, out


def _pids(folder: Path) -> dict[int, int]:
    """Node -> pid of its rank 0, from the files the script writes."""
    return {
        node: int((folder / f"node{node}.pid").read_text())
        for node in (0, 1)
        if (folder / f"node{node}.pid").exists()
    }


def _no_leftovers(pids) -> bool:
    deadline = time.monotonic() + 10  # workers sweep once they see their rank 0 gone
    while time.monotonic() < deadline:
        if not any(shm_entries(f"synk_{pid}_") for pid in pids):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_node_ends_the_job(tmp_path, how):
    """An exception on node 1 (MPI abort, naming it) or node 1 killed mid-call (mpiexec
    ends the others): the job ends within seconds, and no shared memory is left."""
    mpich_before = set(shm_entries("mpich_shm_"))
    proc, seconds = _launch(tmp_path, FAILS, how, timeout=60)
    out = proc.stdout + proc.stderr
    # mpich's own segments outlive an aborted or killed job (docs/nodes.rst says so):
    # not synkhronos' to sweep, but a test must not leave them either.
    for name in set(shm_entries("mpich_shm_")) - mpich_before:
        Path("/dev/shm", name).unlink(missing_ok=True)
    pids = _pids(tmp_path)
    assert sorted(pids) == [0, 1], out
    assert proc.returncode != 0, out
    if how == "raise":
        assert (
            "synkhronos: node 1 of 2 (global ranks 2..3) failed in a synkhronos "
            "function call" in out
        ), out
        assert "ValueError: batch=100 is outside 0..9" in out, out
    else:  # mpich names the first process it saw end: node 1, or node 0 it then killed
        assert "Killed (signal 9)" in out, out
        assert any(f"PID {pid} " in out for pid in pids.values()), out
    assert seconds < 30, f"the job took {seconds:.0f} s to end"
    assert _no_leftovers(pids.values()), shm_entries()
