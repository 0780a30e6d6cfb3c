"""fork, close, distribute and get_n_gpu as the original had them (spec section "Process")."""

import numpy as np
import pytensor.tensor as pt
import pytest

import synkhronos as synk


@pytest.fixture(scope="module")
def forked():
    # The original's arguments; the last three are accepted and ignored.
    n = synk.fork(2, use_gpu=False, master_rank=0, profile_workers=True, max_n_var=10, max_dim=3)
    yield n
    synk.close()


def test_fork_returns_ranks_and_use_gpu_false_means_cpu(forked):
    assert forked == 2
    assert synk.backend() == "cpu"
    with pytest.raises(RuntimeError, match="already forked"):
        synk.fork(2, use_gpu=False)


def test_distribute_more_than_once(forked, rng):
    x = pt.vector("x")
    f = synk.function([x], (x.sum(), "sum"))
    synk.distribute()
    g = synk.function([x], (x.max(), "max"))  # built after a first distribute()
    synk.distribute()
    synk.distribute()  # nothing left to ship
    xv = rng.normal(size=7)
    np.testing.assert_allclose([f(xv), g(xv)], [xv.sum(), xv.max()])


def test_get_n_gpu_reads_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    assert synk.get_n_gpu() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert synk.get_n_gpu() == 0


def test_close_is_idempotent(forked):
    synk.close()
    synk.close()
    with pytest.raises(RuntimeError, match="fork"):
        synk.broadcast("anything")
    with pytest.raises(ValueError, match="use_gpu=False"):
        synk.fork(2, use_gpu=False, backend="gpu")
