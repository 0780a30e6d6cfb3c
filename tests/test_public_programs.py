"""What public Lasagne/Theano programs do that a port by one line (``theano.function`` →
``synk.function``) must survive, on 2 and 3 CPU ranks and GPU ranks (CPU devices here),
against one process: a trailing ``set_value`` before :func:`synkhronos.verify`.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.rank.backends import gpu

SESSIONS = [
    ("cpu", 2),
    ("cpu", 3),
    pytest.param(("gpu", 2), marks=pytest.mark.gpu),
    pytest.param(("gpu", 3), marks=pytest.mark.gpu),
]
FX = "float32"


@pytest.fixture(scope="module", params=SESSIONS, ids=lambda p: f"{p[0]}x{p[1]}")
def session(request):
    """A session of ``request.param`` (backend, ranks): its number of ranks."""
    backend, n = request.param
    if backend == "gpu":
        pytest.importorskip("jax")
        if not gpu.on_cpu_devices() and len(gpu.visible_gpus()) < n:
            pytest.skip(f"needs {n} GPUs")
    synk.fork(n, backend=backend)
    yield n
    synk.close()


def test_verify_after_a_trailing_set_value(session, rng):
    """A learning rate set on rank 0 after the last call is pending, not a disagreement:
    verify sends it, as the next call would, and every rank then holds it."""
    lr = pytensor.shared(np.asarray(0.1, FX), name="lr")
    w = pytensor.shared(rng.normal(size=3).astype(FX), name="w")
    x = pt.matrix("x")
    step = synk.function([x], updates=[(w, w - lr * (x @ w).mean() * x.mean(axis=0))])
    xv = rng.normal(size=(11, 3)).astype(FX)
    step(xv)
    lr.set_value(np.asarray(0.05, FX))
    synk.verify()
    assert [synk.get_value(r, lr) for r in range(session)] == [np.float32(0.05)] * session
    synk.verify()
