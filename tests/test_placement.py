"""Each rank pinned to its own cores, its math libraries' threads sized to match."""

import os

import numpy as np
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.rank.backends.cpu import XLA_ONE_THREAD
from synkhronos.session import launch, placement

CORES = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores")
def test_ranks_pinned_to_their_own_cores_and_restored(monkeypatch):
    from threadpoolctl import threadpool_info

    monkeypatch.delenv("SYNK_AFFINITY")  # conftest.py turns pinning off for the suite
    before = os.sched_getaffinity(0)
    synk.fork(2, backend="cpu")
    try:
        session = launch.current()
        k = len(CORES) // 2
        assert os.sched_getaffinity(0) == set(CORES[:k])
        assert os.sched_getaffinity(session.processes[0].pid) == set(CORES[k : 2 * k])
        assert all(p["num_threads"] == k for p in threadpool_info() if p["user_api"] == "blas")
    finally:
        synk.close()
    assert os.sched_getaffinity(0) == before


def test_no_pinning_when_asked_or_with_more_ranks_than_cores(monkeypatch):
    assert placement.rank_cores(len(CORES) + 1) is None
    monkeypatch.delenv("SYNK_AFFINITY")
    assert placement.cores_to_pin(1, "cpu") == [CORES]
    monkeypatch.setenv("SYNK_AFFINITY", "0")
    assert placement.cores_to_pin(1, "cpu") is None


def test_xla_gets_one_thread_on_one_core(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    for backend in ("cpu", "jax-cpu"):  # CPU ranks run XLA too (a routine, PyMC's NUTS)
        env = placement.worker_env(1, backend, None)
        assert env["XLA_FLAGS"] == XLA_ONE_THREAD and env["JAX_PLATFORMS"] == "cpu"
    assert "XLA_FLAGS" not in placement.worker_env(2, "jax-cpu", None)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")
    assert placement.worker_env(1, "jax-cpu", None)["XLA_FLAGS"] == (
        "--xla_cpu_multi_thread_eigen=true"
    )  # the user's choice stands


def test_uneven_cores_leave_the_rest_unpinned():
    assert placement.rank_cores(3, {7, 1, 5, 3, 9, 11, 13}) == [[1, 3], [5, 7], [9, 11]]
    assert placement.rank_cores(2, {4, 6}) == [[4], [6]]


def test_gpu_ranks_on_gpus_are_not_pinned(monkeypatch):
    monkeypatch.delenv("SYNK_AFFINITY")
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert placement.cores_to_pin(1, "gpu") is None
    assert not placement.on_cpu_cores("gpu")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert placement.cores_to_pin(1, "gpu") == [CORES]
    assert all(map(placement.on_cpu_cores, ("gpu", "jax-cpu", "cpu")))


def test_worker_env_threads_floatx_and_device(monkeypatch):
    import json
    import sys

    import pytensor

    for var in placement.THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # the user's setting stands
    monkeypatch.setenv("PYTENSOR_FLAGS", "optimizer=fast_run")
    env = placement.worker_env(2, "cpu", "3")
    assert env["OMP_NUM_THREADS"] == "5"
    assert all(env[v] == "2" for v in placement.THREAD_VARS[1:])
    assert env["PYTENSOR_FLAGS"] == f"optimizer=fast_run,floatX={pytensor.config.floatX}"
    assert json.loads(env["SYNK_SYS_PATH"]) == sys.path
    assert env["CUDA_VISIBLE_DEVICES"] == "3"


def test_a_forced_host_device_count_leaves_each_gpu_rank_one_device(monkeypatch):
    """``XLA_FLAGS`` forcing several host devices (``pymc.sampling.jax`` sets 100 when
    imported) is dropped for GPU ranks on CPU devices: each rank is one device."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    synk.fork(2, backend="gpu")
    try:
        x = pt.matrix("x")
        f = synk.function([x], 2 * x, collect_modes="gather")
        data = np.random.default_rng(0).normal(size=(11, 3)).astype(x.dtype)
        np.testing.assert_array_equal(f(data), 2 * data)
    finally:
        synk.close()


def test_rank_zero_keeps_the_users_thread_limit(monkeypatch):
    """``OMP_NUM_THREADS=1`` set by the user stays rank 0's limit, as the workers keep it
    (rank 0's BLAS went up to its share of the cores: 2 threads on this 2-core machine)."""
    from threadpoolctl import threadpool_info

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    synk.fork(1, backend="cpu")
    try:
        assert all(p["num_threads"] == 1 for p in threadpool_info() if p["user_api"] == "blas")
    finally:
        synk.close()
