"""Rewritten graphs kept on disk (:mod:`synkhronos.rank.rewritten_graphs`), and the compile
mode a function that names none gets for its graph (:mod:`synkhronos.api.mode_choice`)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.maker import FunctionMaker
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.traversal import io_toposort
from pytensor.link.c.cmodule import GCC_compiler
from pytensor.misc.frozendict import frozendict

import synkhronos as synk
from synkhronos.api import functions, mode_choice
from synkhronos.rank import rewritten_graphs

pytestmark = pytest.mark.usefixtures("graph_folder")


@pytest.fixture
def graph_folder(tmp_path, monkeypatch):
    """An empty folder of stored graphs for each test."""
    monkeypatch.setattr(rewritten_graphs, "folder", lambda: tmp_path)
    return tmp_path


def _model(rng):
    """A step of a small regression with noise from a shared generator (a default update):
    ``(input, outputs, updates, shared variables)``."""
    x = pt.matrix("x")
    w = pytensor.shared(rng.standard_normal((3, 2)), name="w")
    b = pytensor.shared(np.zeros(2), name="b")
    gen = pytensor.shared(np.random.default_rng(3))
    next_gen, noise = pt.random.normal(size=(2,), rng=gen).owner.outputs
    gen.default_update = next_gen
    y = pt.tanh(x @ w + b) + noise
    loss = (y**2).sum()
    gw, gb = pytensor.grad(loss, [w, b])
    return x, [loss, y], [(w, w - 0.1 * gw), (b, b - 0.1 * gb)], [w, b, gen]


def _run(fn, shared, values, data, steps=3):
    for var, value in zip(shared, values, strict=True):
        var.set_value(value)
    outs = [[np.asarray(o) for o in fn(data)] for _ in range(steps)]
    return outs, [np.asarray(v.get_value()) if v.ndim else None for v in shared[:2]]


@pytest.mark.parametrize("mode", [None, "CVM"])
def test_a_stored_graph_is_linked_without_rewriting_and_computes_the_same(
    rng, mode, graph_folder, monkeypatch
):
    x, outputs, updates, shared = _model(rng)
    start = [v.get_value() for v in shared[:2]] + [np.random.default_rng(3)]
    data = rng.standard_normal((5, 3))
    reference = _run(
        pytensor.function([x], outputs, updates=updates, mode=mode), shared, start, data
    )
    key = rewritten_graphs.graph_key([x, *outputs], ("test", mode))

    def compiled():
        return rewritten_graphs.compile_function([x], outputs, mode, "f", key, updates=updates)

    rewritten = _run(compiled(), shared, start, data)
    assert len(list(graph_folder.glob("*.pkl"))) == 1
    # The second compile must link the stored graph: rewriting it would fail.
    monkeypatch.setattr(FunctionMaker, "prepare_fgraph", staticmethod(_no_rewriting))
    loaded = _run(compiled(), shared, start, data)
    for result in (rewritten, loaded):
        for got_step, want_step in zip(result[0], reference[0], strict=True):
            for got, want in zip(got_step, want_step, strict=True):
                np.testing.assert_array_equal(got, want)
        for got, want in zip(result[1], reference[1], strict=True):
            np.testing.assert_array_equal(got, want)


def _no_rewriting(*args, **kwargs):
    raise AssertionError("the graph was rewritten again")


def test_a_graph_stored_ahead_has_its_c_modules_compiled_while_told(rng, monkeypatch):
    x = pt.matrix("x")
    c = np.random.default_rng().uniform(1.0, 2.0, size=4)  # unseeded: no cache has them
    told = [
        ([pt.tanh(x * c[0] + c[1]) ** 3], lambda: False),
        ([pt.exp(x * c[2]) - c[3]], lambda: True),
    ]
    compiles = []
    compile_str = GCC_compiler.compile_str
    monkeypatch.setattr(
        GCC_compiler,
        "compile_str",
        staticmethod(lambda *args, **kwargs: compiles.append(1) or compile_str(*args, **kwargs)),
    )
    counts = []
    for outputs, keep_going in told:
        key = rewritten_graphs.graph_key([x, *outputs], "ahead, C")
        assert rewritten_graphs.store_ahead([x], outputs, "CVM", "f", key, keep_going)
        counts.append(len(compiles))
    assert counts[0] == 0 and counts[1] >= 1  # told to stop, then told to go on
    data = rng.standard_normal((4, 3))
    refused = staticmethod(lambda *args, **kwargs: pytest.fail("the link compiled a module"))
    monkeypatch.setattr(GCC_compiler, "compile_str", refused)
    outputs = told[1][0]
    key = rewritten_graphs.graph_key([x, *outputs], "ahead, C")
    fn = rewritten_graphs.compile_function([x], outputs, "CVM", "f", key, share=(1, 2))
    np.testing.assert_allclose(fn(data)[0], np.exp(data * c[2]) - c[3], rtol=1e-12)


def test_a_graph_stored_ahead_is_linked_and_its_c_modules_shared(rng, graph_folder, monkeypatch):
    x, outputs, updates, shared = _model(rng)
    start = [v.get_value() for v in shared[:2]] + [np.random.default_rng(3)]
    data = rng.standard_normal((5, 3))
    reference = _run(
        pytensor.function([x], outputs, updates=updates, mode="CVM"), shared, start, data
    )
    key = rewritten_graphs.graph_key([x, *outputs], "ahead")
    assert not rewritten_graphs.store_ahead([x], outputs, "CVM", "f", None, updates=updates)
    assert rewritten_graphs.store_ahead([x], outputs, "CVM", "f", key, updates=updates)
    assert not rewritten_graphs.store_ahead([x], outputs, "CVM", "f", key, updates=updates)
    monkeypatch.setattr(FunctionMaker, "prepare_fgraph", staticmethod(_no_rewriting))
    shares = []
    monkeypatch.setattr(rewritten_graphs, "compile_share", lambda *args: shares.append(args[1:3]))

    def compiled():
        return rewritten_graphs.compile_function(
            [x], outputs, "CVM", "f", key, share=(1, 2), updates=updates
        )

    # Stored but never linked: the ranks that link it first compile its C modules together.
    linked = _run(compiled(), shared, start, data)
    assert shares == [(1, 2)]
    _run(compiled(), shared, start, data)
    assert shares == [(1, 2)]  # linked before: its modules are in the cache
    for got_step, want_step in zip(linked[0], reference[0], strict=True):
        for got, want in zip(got_step, want_step, strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_damaged_file_is_rewritten_again(rng, graph_folder, caplog):
    x, outputs, updates, shared = _model(rng)
    key = rewritten_graphs.graph_key([x, *outputs], "damaged")
    rewritten_graphs.compile_function([x], outputs, None, "f", key, updates=updates)
    (stored,) = graph_folder.glob("*.pkl")
    stored.write_bytes(stored.read_bytes()[:100])
    start = [v.get_value() for v in shared[:2]] + [np.random.default_rng(3)]
    data = rng.standard_normal((4, 3))
    fn = rewritten_graphs.compile_function([x], outputs, None, "f", key, updates=updates)
    assert "unreadable" in caplog.text
    reference = pytensor.function([x], outputs, updates=updates)
    got, want = _run(fn, shared, start, data), _run(reference, shared, start, data)
    np.testing.assert_array_equal(got[1][0], want[1][0])


def test_the_graph_stored_first_is_the_one_every_rank_links(rng, graph_folder, monkeypatch, caplog):
    x, outputs, updates, shared = _model(rng)
    key = rewritten_graphs.graph_key([x, *outputs], "race")
    rewritten_graphs.compile_function([x], outputs, "CVM", "f", key, updates=updates)
    (path,) = graph_folder.glob("*.pkl")
    first = path.read_bytes()
    # A rank that looked twice (before and in the lock) before the first rank stored its
    # graph: it rewrites too, and must then link the first rank's graph, not store its own.
    load, looks = rewritten_graphs._load, []

    def late(*args):
        looks.append(args)
        return None if len(looks) <= 2 else load(*args)

    monkeypatch.setattr(rewritten_graphs, "_load", late)
    monkeypatch.setattr(rewritten_graphs, "_store", _store_other(rewritten_graphs._store))
    caplog.set_level("INFO", logger=rewritten_graphs.__name__)
    fn = rewritten_graphs.compile_function([x], outputs, "CVM", "f", key, updates=updates)
    assert "another rank's loaded from" in caplog.text
    assert path.read_bytes() == first and len(looks) == 3
    start = [v.get_value() for v in shared[:2]] + [np.random.default_rng(3)]
    data = rng.standard_normal((4, 3))
    reference = pytensor.function([x], outputs, updates=updates, mode="CVM")
    got, want = _run(fn, shared, start, data), _run(reference, shared, start, data)
    np.testing.assert_array_equal(got[1][0], want[1][0])


def _store_other(store):
    """``store``, given a graph whose bytes differ from the stored one's (a rank's own
    rewrite need not pickle alike)."""

    def other(path, fgraph):
        fgraph.outputs[0].name = "rewritten by another rank"
        return store(path, fgraph)

    return other


def test_write_whole_keeps_a_file_unless_told_to_replace_it(tmp_path):
    path = tmp_path / "sub" / "file"
    assert rewritten_graphs.write_whole(path, b"first", replace=False)
    assert not rewritten_graphs.write_whole(path, b"second", replace=False)
    assert path.read_bytes() == b"first"
    assert rewritten_graphs.write_whole(path, b"third")
    assert path.read_bytes() == b"third"
    assert [p.name for p in path.parent.iterdir()] == ["file"]  # no temporary file left


def test_keys_tell_shared_variables_apart():
    a, b = pytensor.shared(np.ones(2), name="v"), pytensor.shared(np.ones(2), name="v")
    assert rewritten_graphs.graph_key([a + b], ()) != rewritten_graphs.graph_key([a + a], ())
    # ... but not their values: a later run's initial values differ.
    c = pytensor.shared(np.zeros(2), name="v")
    assert rewritten_graphs.graph_key([a + b], ()) == rewritten_graphs.graph_key([a + c], ())


def test_keys_follow_default_updates_of_default_updates():
    """A function applies the default update of every shared variable its graph reaches,
    through other default updates too: two graphs that differ there differ in key."""

    def key(factor):
        first, second = pytensor.shared(1.0, name="first"), pytensor.shared(2.0, name="second")
        first.default_update = first + second
        second.default_update = second * factor
        return rewritten_graphs.graph_key([pt.scalar("x") + first], ())

    assert key(2.0) != key(3.0)
    assert key(2.0) == key(2.0)


def test_keys_do_not_change_when_ops_are_hashed():
    """Ops keep hashes once asked (a frozendict in their properties does), hashes of
    strings that differ between processes: a key computed after a graph analysis that
    hashed them (a training function's split) is the key computed before."""
    x = pt.matrix("x")
    w = pytensor.shared(np.ones((3, 3)), name="w")
    loss = (pt.sqrt(pt.exp(x @ w) + 1) * 2).mean()
    variables = [x, loss, pytensor.grad(loss, w)]
    before = rewritten_graphs.graph_key(variables, ())
    for node in io_toposort([], variables):
        for part in (node.op, getattr(node.op, "scalar_op", None)):
            hash(part)
            for value in vars(part).values() if part is not None else ():
                if isinstance(value, frozendict):
                    hash(value)
    assert rewritten_graphs.graph_key(variables, ()) == before


def test_keys_do_not_depend_on_the_function_graphs_built_before():
    """PyTensor notes in a node's tag each function graph that imported it (and removed
    it): a key computed after a check or an analysis built some is the key before."""
    x = pt.matrix("x")
    w = pytensor.shared(np.ones((3, 3)), name="w")
    loss = (pt.tanh(x @ w) + 2.0).sum()
    variables = [x, loss, pytensor.grad(loss, w)]
    before = rewritten_graphs.graph_key(variables, ())
    for _ in range(2):
        FunctionGraph([x, w], variables[1:], clone=False)
    assert any(getattr(n.tag, "imported_by", None) for n in io_toposort([], variables))
    assert rewritten_graphs.graph_key(variables, ()) == before


_KEY_SCRIPT = """
import numpy as np, pytensor, pytensor.tensor as pt
from synkhronos.rank.rewritten_graphs import graph_key
x = pt.tensor3("x")
w = pytensor.shared(np.ones((4, 4)), name="w")
gen = pytensor.shared(np.random.default_rng(0))
nxt, mask = pt.random.bernoulli(0.5, size=(4,), rng=gen).owner.outputs
gen.default_update = nxt
h, _ = pytensor.scan(lambda xt, hp: pt.tanh(xt + hp @ w), sequences=[x.dimshuffle(1, 0, 2)],
                     outputs_info=[pt.zeros((x.shape[0], 4))])
loss = (h[-1] * mask).sum()
print(graph_key([x, loss, pytensor.grad(loss, w)], ("scan", 1)))
"""


def test_keys_are_the_same_in_every_process():
    """Another run (another string hash seed, so other set orders) finds the same key."""
    keys = {
        subprocess.run(
            [sys.executable, "-c", _KEY_SCRIPT],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert len(keys) == 1 and len(keys.pop()) == 64


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_a_large_graph_compiles_op_by_op_on_every_rank(ranks, rng, monkeypatch):
    monkeypatch.setattr(mode_choice, "LARGE_GRAPH_NODES", 5)  # rank 0 chooses
    x, y = pt.matrix("x"), pt.vector("y")
    w = pytensor.shared(rng.standard_normal(3), name="w")
    loss = ((x @ w - y) ** 2).mean()
    step = synk.function([x, y], loss, updates=[(w, w - 0.1 * pytensor.grad(loss, w))])
    assert step.row_function._spec.mode == mode_choice.LARGE_GRAPH_MODE  # a training function
    named = synk.function([x, y], loss, mode="NUMBA")
    assert named._spec.mode == "NUMBA"
    data = rng.standard_normal((7, 3)), rng.standard_normal(7)
    start = w.get_value()
    reference = pytensor.function([x, y], loss, updates=[(w, w - 0.1 * pytensor.grad(loss, w))])
    want = [float(reference(*data)) for _ in range(3)]
    w_want = w.get_value()
    w.set_value(start)
    synk.broadcast(w)
    got = [float(step(*data)) for _ in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(w.get_value(), w_want, rtol=1e-12)
    synk.verify()  # every rank holds the same w


def test_small_graphs_keep_the_default_mode():
    x = pt.vector("x")
    assert mode_choice.choose(None, None, [x], [x * 2], "f") is None
    assert mode_choice.choose("NUMBA", None, [x], [x * 2], "f") == "NUMBA"
    assert mode_choice.choose(None, "JAX", [x], [x * 2], "f") is None


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_a_graph_checked_before_is_not_checked_again(ranks, rng, monkeypatch):
    """Rank 0 checks a graph once (that it ships, that it builds): the same graph built
    again (a later run of the script) skips both, and still computes its answer."""
    checked = []
    real = functions.check_shippable
    monkeypatch.setattr(functions, "check_shippable", lambda *a: checked.append(a) or real(*a))
    data = rng.standard_normal((7, 3))
    for build in range(2):
        x = pt.matrix("x")
        w = pytensor.shared(np.arange(6.0).reshape(3, 2), name="w")
        f = synk.function([x], (x @ w).mean(), name="checked twice")
        assert len(checked) == 1, build
        assert f.get_shared() == [w]  # found by the skipped check, when asked
        np.testing.assert_allclose(f(data), (data @ w.get_value()).mean())
