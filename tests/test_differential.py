"""A differential test matrix: data-parallel results against one process on the whole batch.

Hypothesis draws the data (uneven rows, shares left empty when there are fewer rows than
ranks), the batch selection (``batch`` as an int, a slice or indices with repeats,
``batch_s`` one selection or one per rank, ``num_slices``), the dtypes, and the
collectives with their ops, on each backend (``cpu`` with 3 ranks, ``jax-cpu`` and GPU
ranks on CPU devices with 2). The oracles: plain PyTensor (or numpy) on the whole batch,
within float tolerance; and, after every call and collective, :func:`synkhronos.verify`:
every rank holds bit-identical shared variables.

The graphs are a fixed pool built once per backend (compiling one costs seconds on every
rank), covering every output op (and the ``c_`` host forms), updates combined over slices,
sliceable shared variables, a chained training step, and the collectives on shared
variables of eleven dtypes.

Profiles: the fast one runs in the suite with a few derandomized examples per test on
``cpu`` and ``gpu`` (the module under 60 s on a 2-core VM). The long one::

    SYNK_DIFF_EXAMPLES=200 python -m pytest -q tests/test_differential.py -p no:cacheprovider

draws that many random examples per test and backend, ``jax-cpu`` included, and adds the
topologies and caches the suite's run leaves out: the whole module again over 2 MPI nodes
of 1 and 2 ranks (``mpiexec``, cpu and GPU ranks), and again from empty compile caches
(every backend) (its last result: bench/RESULTS.md, "Differential test matrix"). Under
MPI every node runs the same examples (the draws are derandomized there), as every node
runs the same program.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import synkhronos as synk
from synkhronos.extensions import train as T
from synkhronos.extensions import updates as U
from synkhronos.rank.backends import gpu
from synkhronos.session import launch
from synkhronos.transport import nodes
from synkhronos.transport.partition import split_bounds
from tests.test_split import EXACT, MINIMA, OVER_THE_BATCH
from tests.test_split import FLOAT as SPLIT_FLOAT

ROOT = Path(__file__).resolve().parents[1]
LONG = int(os.environ.get("SYNK_DIFF_EXAMPLES", "0"))
# Set by the long profile's runs of this module over MPI nodes: the ranks of each node.
NODE_RANKS = int(os.environ.get("SYNK_DIFF_NODE_RANKS", "0"))
# Set in the module's runs started by this module (nodes, cold caches): no deeper runs.
NESTED = bool(os.environ.get("SYNK_DIFF_NESTED"))
SETTINGS = settings(
    max_examples=LONG or 3,
    # The suite's run is the same every time; over MPI nodes each node draws the same.
    derandomize=not LONG or bool(NODE_RANKS),
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
# JAX mode compiles anew for every shape a rank sees: in the fast profile, of the two JAX
# backends only GPU ranks (on CPU devices), whose collectives are XLA programs; jax-cpu
# (shared-memory collectives, as cpu) joins in the long profile.
BACKENDS = [
    ("cpu", 3),
    pytest.param(
        ("jax-cpu", 2),
        marks=pytest.mark.skipif(not LONG, reason="jax-cpu: long profile (SYNK_DIFF_EXAMPLES)"),
    ),
    pytest.param(("gpu", 2), marks=pytest.mark.gpu),
]
COLLECTIVE_DTYPES = [
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "complex64",
    "complex128",
]
UFUNCS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _outputs(x, s):
    """Every output op, on a float matrix ``x`` and broadcast scalar ``s``."""
    return [
        (((x * s) ** 2).mean(), "avg"),
        ((x.sum(axis=1) ** 2).sum(), "sum"),
        (pt.prod(1 + 0.01 * x), "prod"),
        (x.max(), "max"),
        (x.min(), "min"),
        (x.sum(axis=1) * s, "gather"),
        (x.mean(), "c_avg"),
        (x.max(axis=0), "c_max"),
        (x[:, 0], "c_gather"),
        (x.shape[0], "per_rank"),
        (x.sum(), None),
    ]


class Pool:
    """The graphs of one backend's session, each built at its first use (JAX mode compiles
    at build time, and a test filtered out should not pay for it)."""

    def __init__(self, backend: str, n: int):
        self.backend, self.n = backend, n
        # JAX computes float64 graphs in 32 bits unless floatX is float64 (a warning says so).
        self.exact = backend == "cpu" or pytensor.config.floatX == "float64"
        self._calls: dict[str, tuple] = {}

    def outputs_call(self, dtype: str) -> tuple:
        """(synk function with every output op and an update summed over slices, its
        PyTensor reference, the updated variable, the ops)."""
        if dtype not in self._calls:
            x, s = pt.matrix("x", dtype=dtype), pt.scalar("s", dtype=dtype)
            acc = pytensor.shared(np.zeros(3, dtype), name=f"acc_{dtype}")
            outputs = _outputs(x, s)
            f = synk.function(
                [x], outputs, bcast_inputs=[s], updates=[(acc, acc + x.sum(axis=0), "sum")]
            )
            ref = pytensor.function([x, s], [v for v, _ in outputs])
            self._calls[dtype] = (f, ref, acc, [op for _, op in outputs])
        return self._calls[dtype]

    @functools.cached_property
    def int_call(self) -> tuple:
        xi = pt.matrix("xi", dtype="int32")
        outputs = [
            (xi.sum(), "sum"),
            (xi.max(), "max"),
            (xi.min(), "min"),
            (xi.sum(axis=1), "gather"),
            (xi.sum(), "c_sum"),
            (xi.mean(), "avg"),
        ]
        return synk.function([xi], outputs), pytensor.function([xi], [v for v, _ in outputs])

    @functools.cached_property
    def sliced(self) -> tuple:
        """(a function of a sliceable shared variable only, that variable)."""
        rows = pytensor.shared(np.zeros((4, 3), "float64"), name="rows")
        outputs = [(rows.sum(), "sum"), (rows.max(), "max"), (rows[:, 1], "gather")]
        return synk.function([], outputs, sliceable_shareds=[rows]), rows

    @functools.cached_property
    def held(self) -> dict:
        """A shared vector of each of :data:`COLLECTIVE_DTYPES`, used by a function (so the
        workers have them)."""
        held = {d: pytensor.shared(np.zeros(4, d), name=f"held_{d}") for d in COLLECTIVE_DTYPES}
        v = pt.vector("v")
        synk.function([v], v.sum() + sum(pt.real(h).astype("float64").sum() for h in held.values()))
        synk.distribute()
        return held

    @functools.cached_property
    def sgd(self) -> tuple:
        """(make_train_function's chained SGD step of a linear least-squares model, w)."""
        xs, ys = pt.matrix("xs", dtype="float64"), pt.vector("ys", dtype="float64")
        w = pytensor.shared(np.zeros(3, "float64"), name="w")
        loss = pt.mean((xs @ w - ys) ** 2)
        return T.make_train_function(loss, [w], xs, ys, U.sgd, learning_rate=0.05), w

    @functools.cached_property
    def chains(self) -> tuple:
        """({fuse: a chained two-phase least-squares step}, w): a gradient summed over each
        rank's rows, its all-reduce, the update, and a broadcast of w."""
        xc, yc = pt.matrix("xc"), pt.vector("yc")  # floatX: JAX mode's own width
        w = pytensor.shared(np.zeros(3, xc.dtype), name="w_chain")
        g = pytensor.shared(np.zeros(3, xc.dtype), name="g_chain")
        grad = synk.function([xc, yc], updates=[(g, xc.T @ (xc @ w - yc))])
        update = synk.function([], updates=[(w, w - 0.01 * g)])
        steps = (grad, ("all_reduce", g, "sum"), update, ("broadcast", w))
        return {fuse: synk.chain(*steps, fuse=fuse) for fuse in (True, False)}, w

    @functools.cached_property
    def row_outputs(self) -> tuple:
        """(a softmax classifier's one-line training step and a plain function, both with
        per-row outputs and no reduce op named, their references, the weights)."""
        xr, yr = pt.matrix("xr"), pt.ivector("yr")  # floatX: JAX mode's own width
        w = pytensor.shared(np.zeros((3, 4), xr.dtype), name="w_rows")
        p = pt.special.softmax(xr @ w, axis=1)
        ce = -pt.log(p[pt.arange(yr.shape[0]), yr])
        outputs = [ce.mean(), ce.sum(), p, ce]
        step = synk.function([xr, yr], outputs, updates=[(w, w - 0.1 * pt.grad(ce.mean(), w))])
        rows = synk.function([xr], [xr @ w, pt.argmax(p, axis=1), (xr @ w).mean()])
        references = (
            pytensor.function([xr, yr], outputs),
            pytensor.function([xr], [xr @ w, pt.argmax(p, axis=1), (xr @ w).mean()]),
        )
        return step, rows, references, w


@pytest.fixture(scope="module", params=BACKENDS, ids=lambda p: f"{p[0]}x{p[1]}")
def pool(request):
    backend, n = request.param
    if backend != "cpu":
        pytest.importorskip("jax")
    if backend == "gpu" and not gpu.on_cpu_devices():
        n = None
    synk.fork(NODE_RANKS or n, backend=backend)
    assert nodes.current().n_nodes == (2 if NODE_RANKS else 1)
    yield Pool(backend, nodes.current().n_global)  # ranks are numbered over every node
    synk.close()


# ---- drawing -------------------------------------------------------------------------------
@st.composite
def batches(draw, n_rows: int):
    """A ``batch`` argument over ``n_rows`` rows and the rows it selects."""
    kind = draw(st.sampled_from(["none", "int", "slice", "indices"]))
    if kind == "none":
        return None, np.arange(n_rows)
    if kind == "int":
        k = draw(st.integers(1, n_rows))
        return k, np.arange(k)
    if kind == "slice":
        a = draw(st.integers(0, n_rows - 1))
        b = draw(st.integers(a + 1, n_rows))
        return slice(a, b), np.arange(a, b)
    idx = draw(st.lists(st.integers(0, n_rows - 1), min_size=1, max_size=2 * n_rows))
    return np.array(idx), np.array(idx)


def _tol(pool, dtype) -> float:
    return 1e-9 if pool.exact and dtype == "float64" else 2e-4


def _shares(n_sel: int, n: int) -> list[int]:
    return np.diff(split_bounds(n_sel, n)).tolist()


# ---- function outputs ----------------------------------------------------------------------
@SETTINGS
@given(
    data=st.data(),
    dtype=st.sampled_from(["float32", "float64"]),
    n_rows=st.integers(1, 9),
    num_slices=st.integers(1, 3),
)
def test_outputs_and_updates_equal_one_process(pool, data, dtype, n_rows, num_slices):
    f, ref, acc, ops = pool.outputs_call(dtype)
    X = data.draw(
        st.builds(
            lambda seed: np.random.default_rng(seed).normal(size=(n_rows, 3)), st.integers(0, 2**16)
        )
    ).astype(dtype)
    s = np.asarray(data.draw(st.sampled_from([0.5, 1.0, -2.0])), dtype)
    batch, sel = data.draw(batches(n_rows))
    synk.broadcast(acc, np.zeros(3, dtype))
    # Ops None and "per_rank" have no combination over slices (refused): left out then.
    subset = [i for i, op in enumerate(ops) if num_slices == 1 or op not in (None, "per_rank")]
    got = f(X, s, batch=batch, num_slices=num_slices, output_subset=subset)
    want = ref(X[sel], s)
    shares = _shares(len(sel), pool.n)
    tol = _tol(pool, dtype)
    for i, g in zip(subset, got, strict=True):
        op, w = ops[i], want[i]
        if op == "per_rank":
            assert [0 if v is None else int(v) for v in g] == shares
        elif op is None:
            np.testing.assert_allclose(g, ref(X[sel][: shares[0]], s)[-1], rtol=tol, atol=tol)
        else:
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=str(op))
    # The update summed each rank's rows over its slices; summed over the ranks, the batch's.
    synk.all_reduce(acc, "sum")
    np.testing.assert_allclose(
        synk.get_value(pool.n - 1, acc), X[sel].sum(axis=0), rtol=tol, atol=tol
    )
    synk.verify()


@SETTINGS
@given(data=st.data(), n_rows=st.integers(1, 9), num_slices=st.integers(1, 2))
def test_integer_outputs_are_exact(pool, data, n_rows, num_slices):
    f, ref = pool.int_call
    X = np.array(
        data.draw(st.lists(st.integers(-1000, 1000), min_size=3 * n_rows, max_size=3 * n_rows)),
        np.int32,
    ).reshape(n_rows, 3)
    batch, sel = data.draw(batches(n_rows))
    got = f(X, batch=batch, num_slices=num_slices)
    for g, w in zip(got[:-1], ref(X[sel])[:-1], strict=True):
        np.testing.assert_array_equal(g, w)
    # The mean is a float (32 bits in JAX mode): ranks' means of large values, combined.
    tol = _tol(pool, "float64")
    np.testing.assert_allclose(got[-1], X[sel].mean(), rtol=tol, atol=tol * np.abs(X).max())


@SETTINGS
@given(data=st.data())
def test_batch_s_selects_each_ranks_rows(pool, data):
    held = [
        np.random.default_rng(data.draw(st.integers(0, 2**16))).normal(
            size=(data.draw(st.integers(1, 5)), 3)
        )
        for _ in range(pool.n)
    ]
    sliced, rows = pool.sliced
    for r, value in enumerate(held):
        synk.set_value(r, rows, value)
    shortest = min(len(h) for h in held)
    per_rank = data.draw(st.booleans())
    if per_rank:
        sels = []
        for h in held:
            a = data.draw(st.integers(0, len(h) - 1))
            sels.append(slice(a, data.draw(st.integers(a + 1, len(h)))))
        batch_s = sels
    else:
        a = data.draw(st.integers(0, shortest - 1))
        batch_s = slice(a, data.draw(st.integers(a + 1, shortest)))
        sels = [batch_s] * pool.n
    total, top, column = sliced(batch_s=batch_s)
    chosen = [h[sel] for h, sel in zip(held, sels, strict=True)]
    tol = _tol(pool, "float64")
    np.testing.assert_allclose(total, sum(c.sum() for c in chosen), rtol=tol, atol=tol)
    np.testing.assert_allclose(top, max(c.max() for c in chosen), rtol=tol)
    np.testing.assert_allclose(column, np.concatenate([c[:, 1] for c in chosen]), rtol=tol)


# ---- collectives ---------------------------------------------------------------------------
def _held(rng, dtype: str, n: int) -> list[np.ndarray]:
    """Each rank's values: small, so that prod fits int8; different on every rank."""
    base = rng.integers(1, 4, size=(n, 4))
    if dtype == "bool":
        return list(base % 2 == 0)
    if dtype.startswith("complex"):
        return list((base + 1j * rng.integers(-2, 3, size=(n, 4))).astype(dtype))
    return list(base.astype(dtype))


def _reduced(op: str, values: list[np.ndarray]) -> np.ndarray:
    stack, dtype = np.stack(values), values[0].dtype
    if op == "avg":
        total = np.add.reduce(stack, axis=0, dtype=dtype)
        if dtype.kind in "fc":
            return total * dtype.type(1.0 / len(values))
        return (total / len(values)).astype(dtype)  # integers truncate, bools: any
    return UFUNCS[op].reduce(stack, axis=0, dtype=dtype)


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from(COLLECTIVE_DTYPES),
    op=st.sampled_from(["sum", "avg", "prod", "max", "min"]),
    kind=st.sampled_from(["all_reduce", "reduce", "broadcast", "all_gather", "scatter"]),
)
def test_collectives_of_every_dtype(pool, seed, dtype, op, kind):
    var, n = pool.held[dtype], pool.n
    values = _held(np.random.default_rng(seed), dtype, n)
    for r, value in enumerate(values):
        synk.set_value(r, var, value)
    tol = 1e-2 if dtype == "float16" else 1e-6
    if kind == "all_reduce":
        synk.all_reduce(var, op)
        want = _reduced(op, values)
    elif kind == "reduce":
        got = synk.reduce(var, op, in_place=False)
        np.testing.assert_allclose(got, _reduced(op, values), rtol=tol)
        synk.broadcast(var)  # verify, in the next example, compares every variable
        return
    elif kind == "broadcast":
        synk.broadcast(var, values[-1])
        want = values[-1]
    elif kind == "all_gather":
        synk.all_gather(var)
        want = np.concatenate(values)
    else:
        whole = np.concatenate(values)
        synk.scatter(var, whole)
        bounds = split_bounds(len(whole), n)
        got = [synk.get_value(r, var) for r in range(n)]
        for r in range(n):
            np.testing.assert_array_equal(got[r], whole[bounds[r] : bounds[r + 1]])
        synk.broadcast(var, whole)
        return
    everyone = synk.gather(var, nd_up=1)
    assert everyone.dtype.kind == np.dtype(dtype).kind
    np.testing.assert_allclose(everyone[0], want, rtol=tol)
    synk.verify()  # bit-identical on every rank


# ---- a chained training step ---------------------------------------------------------------
@SETTINGS
@given(data=st.data(), n_rows=st.integers(3, 12))
def test_chained_sgd_step_equals_numpy(pool, data, n_rows):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    X, y = rng.normal(size=(n_rows, 3)), rng.normal(size=n_rows)
    w0 = rng.normal(size=3)
    step, w = pool.sgd
    synk.broadcast(w, w0)
    # make_train_function refuses a batch that leaves a rank without rows.
    k = data.draw(st.integers(pool.n, max(pool.n, n_rows)))  # rows may repeat
    sel = np.array(data.draw(st.lists(st.integers(0, n_rows - 1), min_size=k, max_size=k)))
    step(X, y, batch=sel)
    Xs, ys = X[sel], y[sel]
    want = w0 - 0.05 * (2.0 / len(sel)) * Xs.T @ (Xs @ w0 - ys)
    np.testing.assert_allclose(synk.get_value(0, w), want, rtol=_tol(pool, "float64"), atol=1e-6)
    synk.verify()


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    per_rank=st.integers(1, 4),
    extra=st.integers(0, 2),
    fuse=st.booleans(),
    n_calls=st.integers(1, 3),
)
@example(seed=1, per_rank=2, extra=0, fuse=True, n_calls=2)  # fused on GPU ranks
@example(seed=2, per_rank=1, extra=1, fuse=True, n_calls=1)  # uneven: step by step
def test_chains_fused_or_step_by_step_equal_numpy(pool, seed, per_rank, extra, fuse, n_calls):
    """GPU ranks fuse a chain into one XLA program when every rank's rows have one shape
    (rows a multiple of the ranks, one node); other calls, and other backends, run it
    step by step."""
    rng = np.random.default_rng(seed)
    k = pool.n * per_rank + extra
    fx = pytensor.config.floatX
    X, y, w0 = (rng.normal(size=size).astype(fx) for size in ((k, 3), k, 3))
    chains, w = pool.chains
    synk.broadcast(w, w0)
    programs = launch.current().state.fused.values
    runs_before = sum(p.calls for p in programs())
    want = w0
    for _ in range(n_calls):
        chains[fuse](X, y)
        want = want - 0.01 * X.T @ (X @ want - y)
    np.testing.assert_allclose(synk.get_value(0, w), want, rtol=_tol(pool, fx), atol=1e-5)
    even = k % pool.n == 0
    fused = pool.backend == "gpu" and fuse and even and nodes.current().n_nodes == 1
    assert sum(p.calls for p in programs()) - runs_before == (n_calls if fused else 0)
    synk.verify()


# ---- per-row outputs, no reduce op named ------------------------------------------------------
@SETTINGS
@given(data=st.data(), n_rows=st.integers(3, 12))
def test_per_row_outputs_come_back_whole(pool, data, n_rows):
    """A one-line training step's and a plain function's outputs whose leading axis is the
    rows: every rank's rows, in order, as one process returns them; scalars (a mean, a
    sum) the whole batch's."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    fx = pytensor.config.floatX
    X, y = rng.normal(size=(n_rows, 3)).astype(fx), rng.integers(0, 4, n_rows).astype("int32")
    step, rows, (ref_step, ref_rows), w = pool.row_outputs
    assert step.output_modes == ["avg", "avg", "gather", "gather"]
    assert rows.output_modes == ["gather", "gather", "avg"]
    synk.broadcast(w, rng.normal(size=(3, 4)).astype(fx))
    batch, sel = data.draw(batches(n_rows))
    if len(sel) < pool.n:  # a training step needs rows on every rank
        batch, sel = None, np.arange(n_rows)
    tol = _tol(pool, fx)
    wants = ref_rows(X[sel]), ref_step(X[sel], y[sel])  # before the step moves w
    for got, want in zip((rows(X, batch=batch), step(X, y, batch=batch)), wants, strict=True):
        for g, v in zip(got, want, strict=True):
            assert np.shape(g) == np.shape(v)
            np.testing.assert_allclose(g, v, rtol=tol, atol=tol)
    synk.verify()


# ---- losses whose rows meet (issue #50) ---------------------------------------------------
def _regression_case(loss_of, x_shape):
    """(inputs, weights, loss, data of n rows) of a regression on ``x`` and ``y``."""

    def build():
        x = pt.tensor("x", shape=(None, *x_shape), dtype=SPLIT_FLOAT)
        y = pt.vector("y", dtype=SPLIT_FLOAT)
        start = np.random.default_rng(0).normal(size=int(np.prod(x_shape))).astype(SPLIT_FLOAT)
        w = pytensor.shared(start, name="w")
        return (
            [x, y],
            [w],
            loss_of(x, y, w),
            lambda rng, n: [
                rng.normal(size=(n, *x_shape)).astype(SPLIT_FLOAT),
                rng.normal(size=n).astype(SPLIT_FLOAT),
            ],
        )

    return build


def _embedding_case():
    """An embedding read by integer indices only (the rows are the indices')."""
    idx = pt.ivector("idx")
    W = pytensor.shared(np.random.default_rng(1).normal(size=(10, 4)).astype(SPLIT_FLOAT), name="W")
    loss = pt.mean(pt.special.log_softmax(W[idx], axis=1)[:, 0] ** 2)
    return [idx], [W], loss, lambda rng, n: [rng.integers(0, 10, n).astype("int32")]


def _pairwise(x, y, w):
    """A contrastive loss, every row scored against every row (its diagonal as a sum of
    products: JAX mode cannot take a diagonal of a size known at run time only)."""
    z1, z2 = pt.outer(pt.dot(x, w), y), pt.outer(y, pt.dot(x, w))
    return (pt.logsumexp(z1 @ z2.T, axis=1) - (z1 * z2).sum(axis=1)).mean()


#: name: (build, the words its building must say, or None for none: exact).
ROWS_MEET = {
    "log_softmax_over_the_batch": (_regression_case(OVER_THE_BATCH["log_softmax"], (3,)), None),
    "softmax_over_the_batch": (_regression_case(OVER_THE_BATCH["softmax"], (3,)), None),
    "pairwise_product": (_regression_case(_pairwise, (3,)), r"matrix product .* pairs rows"),
    "integer_inputs_only": (_embedding_case, None),
    "min_over_the_batch": (_regression_case(MINIMA["min_op"], (3,)), None),
    **{name: (_regression_case(*EXACT[name]), None) for name in EXACT},
}


def _rows_meet_call(pool, name: str) -> tuple:
    """(training function, one process's, weights, their start, data, words said), built
    at the first draw of ``name`` on this backend."""
    key = f"rows meet: {name}"
    if key not in pool._calls:
        inputs, weights, loss, data = ROWS_MEET[name][0]()
        updates = [(w, w - 0.1 * g) for w, g in zip(weights, pt.grad(loss, weights), strict=True)]
        # CPU ranks: no C compile (an LSTM's took minutes); GPU ranks: JAX mode.
        mode = "FAST_COMPILE" if pool.backend == "cpu" else None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            f = synk.function(inputs, loss, updates=updates, mode=mode)
        words = [str(c.message) for c in caught if "one device" in str(c.message)]
        ref = pytensor.function(inputs, loss, updates=updates, mode=mode)
        pool._calls[key] = (f, ref, weights, [w.get_value() for w in weights], data, words)
    return pool._calls[key]


@pytest.mark.parametrize("name", ROWS_MEET)
@settings(SETTINGS, max_examples=LONG or 1)  # each case compiles its own function
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_losses_whose_rows_meet(pool, name, data, seed):
    """A loss whose rows meet through a softmax over the batch, a minimum over it (an
    all-reduce with "min"), a pairwise product, an embedding read by indices only, or an
    exact model: one step on uneven rows equals one
    process's (and says nothing), or is said (and the ranks stay identical)."""
    f, ref, weights, start, make, words = _rows_meet_call(pool, name)
    said = ROWS_MEET[name][1]
    if said is None:
        assert not words, words
    else:
        assert len(words) == 1 and re.search(said, words[0]), words
    n_rows = data.draw(st.integers(pool.n, 3 * pool.n + 2))  # one row a rank at least
    arrays = make(np.random.default_rng(seed), n_rows)
    for w, value in zip(weights, start, strict=True):
        synk.broadcast(w, value)
    loss = f(*arrays)
    synk.verify()
    trained = [w.get_value() for w in weights]
    for w, value in zip(weights, start, strict=True):
        w.set_value(value)
    want = ref(*arrays)
    synk.broadcast(weights)  # rank 0's values (one process's) on every rank again
    if said is None:
        tol = _tol(pool, SPLIT_FLOAT)
        np.testing.assert_allclose(loss, want, rtol=tol, atol=tol)
        for got, w in zip(trained, weights, strict=True):
            np.testing.assert_allclose(got, w.get_value(), rtol=tol, atol=tol, err_msg=name)


# ---- a learning rate set between calls ------------------------------------------------------
@functools.cache
def _decayed_step(pool) -> tuple:
    """(the one-line SGD step of a least-squares model at a shared rate, w, the rate), in
    ``pool``'s session: a Lasagne program's decay is ``lr.set_value(...)`` on rank 0."""
    fx = pytensor.config.floatX  # JAX mode's own width
    xs, ys = pt.matrix("xs_lr"), pt.vector("ys_lr")
    w = pytensor.shared(np.zeros(3, fx), name="w_lr")
    lr = pytensor.shared(np.asarray(0.1, fx), name="lr")
    loss = pt.mean((xs @ w - ys) ** 2)
    return synk.function([xs, ys], loss, updates=[(w, w - lr * pytensor.grad(loss, w))]), w, lr


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    n_rows=st.integers(3, 12),
    rates=st.lists(st.sampled_from([0.3, 0.1, 0.03, 0.01]), min_size=1, max_size=3),
)
def test_learning_rate_set_between_calls_reaches_every_rank(pool, seed, n_rows, rates):
    """Every call after ``lr.set_value`` on rank 0 alone steps at the new rate, on every rank."""
    rng = np.random.default_rng(seed)
    fx = pytensor.config.floatX
    X, y, w0 = (rng.normal(size=size).astype(fx) for size in ((n_rows, 3), n_rows, 3))
    step, w, lr = _decayed_step(pool)
    synk.broadcast(w, w0)
    # A training step needs rows on every rank: as many rows as ranks at least.
    rows = slice(0, n_rows) if n_rows >= pool.n else np.arange(pool.n) % n_rows
    Xs, ys = X[rows], y[rows]
    want = w0.astype("float64")
    for rate in rates:
        lr.set_value(np.asarray(rate, fx))
        step(X, y, batch=rows)
        want = want - rate * (2.0 / len(Xs)) * Xs.T @ (Xs @ want - ys)
    tol = _tol(pool, fx)
    np.testing.assert_allclose(synk.get_value(pool.n - 1, lr), rates[-1], rtol=tol)
    np.testing.assert_allclose(synk.get_value(pool.n - 1, w), want, rtol=tol, atol=1e-5)
    synk.verify()


# ---- the long profile's other topologies and caches -----------------------------------------
def _run_module(command: list[str], env: dict, backend: str, timeout: float):
    """Run this module's tests of ``backend`` as ``command`` (``pytest`` or ``mpiexec`` of
    it), the examples as many as this run's; returns the finished process."""
    env = dict(
        env,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        JAX_PLATFORMS="cpu",
        SYNK_DIFF_EXAMPLES=str(LONG),
        SYNK_DIFF_NESTED="1",
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    pytest_args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", f"[{backend}x"]
    return subprocess.run(
        [*command, sys.executable, *pytest_args, __file__],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,  # a hang guard: the examples take minutes
        check=False,
    )


LONG_ONLY = pytest.mark.skipif(
    not LONG or NESTED, reason="long profile (SYNK_DIFF_EXAMPLES), from its first run only"
)


@LONG_ONLY
@pytest.mark.slow
@pytest.mark.parametrize("local", [1, 2])
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_matrix_over_two_mpi_nodes(backend, local):
    """Every test above, over 2 MPI nodes of ``local`` ranks each (GPU ranks on CPU
    devices): each node runs the same examples, as every node runs the same program."""
    from tests.test_nodes import MPIEXEC

    if not MPIEXEC.exists():
        pytest.skip("needs mpiexec next to the interpreter (pip install mpich)")
    if backend == "gpu":
        pytest.importorskip("jax")
    env = dict(os.environ, SYNK_DIFF_NODE_RANKS=str(local))
    done = _run_module([str(MPIEXEC), "-n", "2"], env, backend, timeout=3600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-8000:]
    assert out.count(" passed") == 2, out[-8000:]  # one summary line per node


@LONG_ONLY
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", "jax-cpu", "gpu"])
def test_matrix_from_cold_caches(backend, tmp_path):
    """Every test above in a fresh process whose compile folder (PyTensor's C code, Numba's
    cache, the stored rewritten graphs, XLA's programs) starts empty."""
    if backend != "cpu":
        pytest.importorskip("jax")
    flags = ",".join(
        filter(None, [os.environ.get("PYTENSOR_FLAGS"), f"base_compiledir={tmp_path / 'cache'}"])
    )
    done = _run_module([], dict(os.environ, PYTENSOR_FLAGS=flags), backend, timeout=3600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-8000:]
    assert " passed" in out, out[-8000:]
