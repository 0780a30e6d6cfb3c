"""The corrections to PyTensor's JAX mode, on small functions compared with numpy and with
PyTensor's default mode (no fork)."""

import pickle

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

pytest.importorskip("jax")

from synkhronos.rank.backends import jax_compat  # noqa: E402 - after the skip

JAX = "JAX"


def test_arange_past_int8_and_concrete_lengths_of_shapes(rng):
    p, y = pt.matrix("p"), pt.ivector("y")
    picked = p[pt.arange(y.shape[0]), y]  # the 0 is int8: overflowed past 127 rows
    pooled = pt.alloc(1.0, (p.shape[1] - 2) // 2 + 1)  # a fused scalar of a shape
    f = pytensor.function([p, y], [picked, pooled], mode=JAX)
    P, Y = rng.standard_normal((200, 9)), rng.integers(0, 9, 200).astype("int32")
    got, ones = f(P, Y)
    np.testing.assert_array_equal(got, P[np.arange(200), Y])
    assert np.shape(ones) == (4,)


def test_compile_time_copies_dropped_and_calls_direct(rng):
    x = pt.vector("x")
    w = pytensor.shared(rng.standard_normal(5), name="w")
    f = pytensor.function([x], [pt.exp(x) * w], mode=JAX)
    assert jax_compat.drop_compile_time_copies(f) == 1
    assert (
        jax_compat.drop_compile_time_copies(pytensor.function([x], x * 2, mode="FAST_COMPILE")) == 0
    )
    f.trust_input = True
    direct = jax_compat.direct_call(f)
    X = rng.standard_normal(5)
    np.testing.assert_allclose(np.asarray(direct(X)[0]), np.exp(X) * w.get_value(), rtol=1e-12)
    w.set_value(np.ones(5))  # the direct call reads the variable's present value
    np.testing.assert_allclose(np.asarray(direct(X)[0]), np.exp(X), rtol=1e-12)
    g = pytensor.function([x], x, updates=[(w, w * 2)], mode=JAX)
    g.trust_input = True
    assert jax_compat.direct_call(g) is None  # PyTensor applies updates after it


@pytest.mark.filterwarnings("ignore:The RandomType SharedVariables")
def test_generators_read_and_written_in_the_shared_storage():
    generator = pytensor.shared(np.random.default_rng(4), name="g")
    next_state, draw = pt.random.normal(size=3, rng=generator, return_next_rng=True)
    f = pytensor.function([], draw, updates=[(generator, next_state)], mode=JAX)
    g = pytensor.function([], draw, mode=JAX)  # compiled before the first shares
    assert jax_compat.share_generators(f) == 1
    assert "jax_state" in generator.container.storage[0]  # the key f draws from
    first, second = f(), f()
    assert not np.array_equal(first, second)  # f advanced the shared state
    assert jax_compat.share_generators(g) == 1
    np.testing.assert_array_equal(g(), f())  # g draws from the state f left


def test_host_outputs_mode_returns_numpy_and_pickles_as_itself(rng):
    x = pt.vector("x")
    f = pytensor.function([x], [x.sum(), x * 2], mode=jax_compat.HOST_OUTPUTS_JAX)
    total, twice = f(np.arange(3.0))
    assert type(total) is np.ndarray and type(twice) is np.ndarray
    assert float(total) == 3.0
    mode = pickle.loads(pickle.dumps(jax_compat.HOST_OUTPUTS_JAX))
    assert mode is jax_compat.HOST_OUTPUTS_JAX and str(mode) == "JAX, outputs on the host"


def test_shared_of_a_plain_dict_is_pytensors():
    var = pytensor.shared({"a": 1})
    assert var.get_value() == {"a": 1}
    assert type(var).__name__ != "RandomGeneratorSharedVariable"


def test_an_input_the_graph_does_not_read_leaves_the_compiled_program_alone(rng):
    """A variable an update writes but the graph does not read (a holder of rows, which a
    call fills with its own) is given to JAX as an empty stand-in: new values of other
    shapes, or on the device, compile nothing new (issue 62)."""
    import jax

    x = pt.vector("x")
    held = pytensor.shared(np.zeros(0), name="held", shape=(None,))
    w = pytensor.shared(rng.standard_normal(5), name="w")
    f = pytensor.function([x], (x * w).sum(), updates=[(held, x * 2)], mode=JAX)
    assert jax_compat.drop_compile_time_copies(f) == 1  # w's, found through the wrapper
    compiled: list[str] = []

    def listen(event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(str(kwargs.get("fun_name")))

    X = rng.standard_normal(5)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        first = f(X)
        held.set_value(np.ones(3))
        again = [f(X) for _ in range(2)]
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert len(compiled) == 1, compiled
    np.testing.assert_allclose([first, *again], (X * w.get_value()).sum(), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(held.get_value()), X * 2, rtol=1e-12)


_ALIKE = """
import collections, json, sys
import jax, numpy as np, pytensor, pytensor.tensor as pt
from synkhronos.rank.backends import jax_compat
events = collections.Counter()
jax.monitoring.register_event_listener(lambda event, **kwargs: events.update([event]))
x = pt.vector("x")
got = [pytensor.function([x], pt.exp(x) * 3, mode="JAX")(np.arange(4.0)) for _ in range(2)]
print(json.dumps([events["/jax/compilation_cache/cache_hits"], np.asarray(got).tolist()]))
"""


@pytest.mark.parametrize("min_seconds", [None, "1"])
def test_every_program_is_kept_and_alike_ones_compile_once(tmp_path, min_seconds):
    """Two functions of the same graph (as a deep network's alike rounds): the first's
    program, compiled in well under a second, is stored in the persistent cache and the
    second loads it, with the same results; unless the user asks JAX's minimum back."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    if min_seconds is not None:
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = min_seconds
    done = subprocess.run(
        [sys.executable, "-c", _ALIKE], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    hits, (first, second) = json.loads(done.stdout.strip().splitlines()[-1])
    assert first == second == pytest.approx(np.exp(np.arange(4.0)) * 3)
    stored = [p for p in tmp_path.rglob("*-cache") if p.is_file()]  # JAX names its entries so
    assert (hits, bool(stored)) == ((1, True) if min_seconds is None else (0, False))
