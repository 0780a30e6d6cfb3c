"""GPU ranks. Without a GPU only the missing-extra message is checked; the tests marked
``gpu`` run on a machine with one (``bench/gpu_check.py`` runs them on a lent GPU)."""

import importlib.util

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from tests.graphs import check_ops, ops_function, random_xy

HAVE_CUDA_STACK = all(importlib.util.find_spec(m) for m in ("cupy", "jax"))


@pytest.mark.skipif(HAVE_CUDA_STACK, reason="the GPU extra is installed")
def test_missing_extra_says_what_to_install():
    with pytest.raises(ImportError, match=r"synkhronos\[cuda\]"):
        synk.fork(backend="gpu")


def _gpu_available() -> bool:
    if not HAVE_CUDA_STACK:
        return False
    from synkhronos.rank.backends.gpu import visible_gpus

    return len(visible_gpus()) > 0


gpu = pytest.mark.skipif(not _gpu_available(), reason="needs a CUDA GPU and synkhronos[cuda]")


@pytest.fixture(scope="module")
def gpu_ranks():
    n = synk.fork(backend="gpu")
    yield n
    synk.close()


@gpu
@pytest.mark.gpu
def test_function_matches_pytensor(gpu_ranks, rng):
    import jax

    f, ref = ops_function()
    xv, yv = random_xy(rng, 37)
    rtol = 1e-10 if jax.config.jax_enable_x64 else 1e-5
    check_ops(f(xv, yv, 0.5), ref(xv, yv, 0.5), rtol=rtol)
    idx = rng.permutation(37)[:20]
    got = f(xv, yv, 1.5, batch=idx, num_slices=3, output_subset=range(6))
    check_ops(got + [[20]], ref(xv[idx], yv[idx], 1.5)[:6] + [20], rtol=rtol)


@gpu
@pytest.mark.gpu
def test_collectives_and_device_residency(gpu_ranks, rng):
    import jax

    w = pytensor.shared(np.zeros(1000, dtype="float32"), name="w_gpu")
    data = pytensor.shared(np.zeros((1, 4), dtype="float32"), name="d_gpu")
    f = synk.function([], (data.sum(), "sum"), updates={w: w + 1}, sliceable_shareds=[data])
    whole = rng.normal(size=(10 * gpu_ranks, 4)).astype("float32")
    synk.scatter(data, whole)
    f(batch_s=slice(0, 5))
    assert isinstance(w.get_value(borrow=True), jax.Array)  # stayed on the device
    synk.all_reduce(w, op="avg")
    np.testing.assert_allclose(synk.gather(w, nd_up=1), np.ones((gpu_ranks, 1000)))
    for op in ("sum", "max", "min", "prod"):
        synk.all_reduce(w, op=op)
    synk.broadcast(w, np.arange(1000, dtype="float32"))
    np.testing.assert_array_equal(synk.reduce(w, op="max"), np.arange(1000))
    np.testing.assert_array_equal(synk.all_gather(data), whole)
    np.testing.assert_array_equal(synk.get_value(0, w), np.arange(1000))


def test_auto_falls_back_to_cpu_without_the_extra(monkeypatch, capsys):
    from synkhronos.rank.backends import gpu
    from synkhronos.session import launch

    monkeypatch.setattr(gpu, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(gpu, "gpu_packages_missing", lambda: ["cupy"])
    assert launch._auto_backend() == "cpu"
    assert "synkhronos[cuda]" in capsys.readouterr().out
    monkeypatch.setattr(gpu, "gpu_packages_missing", lambda: [])
    assert launch._auto_backend() == "gpu"
    monkeypatch.setattr(gpu, "visible_gpus", lambda: [])
    assert launch._auto_backend() == "cpu"


def test_master_rank_puts_its_gpu_first(monkeypatch, capsys):
    import warnings

    from synkhronos.rank.backends import gpu

    monkeypatch.setattr(gpu, "_require_gpu_packages", lambda: None)
    monkeypatch.setattr(gpu, "gpu_table", lambda: [(str(i), "Fake GPU", "1 MiB")
                                                   for i in range(4)])
    monkeypatch.setattr(gpu, "_default_float32", lambda: None)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "")  # prepare_gpus sets it
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # restored afterwards, whatever is set
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # every GPU of the table is visible
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "jax was imported before synk.fork()"
        assert gpu.prepare_gpus(3, None, master_rank=2) == ["2", "0", "1"]
        assert "rank 0: GPU 2, Fake GPU" in capsys.readouterr().out
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        assert gpu.prepare_gpus(None, [3, 1], master_rank=2) == ["3", "1"]  # gpus= decides
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        with pytest.raises(ValueError, match="master_rank=4, but 4 GPUs are visible"):
            gpu.prepare_gpus(None, None, master_rank=4)
