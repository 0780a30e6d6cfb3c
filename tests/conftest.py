"""Shared fixtures: a forked session per module, and a check that nothing leaks."""

from __future__ import annotations

import os
import shutil
import tempfile
import zlib

import numpy as np
import pytest

import synkhronos as synk
from synkhronos.rank.backends.gpu import visible_gpus

# Without a GPU, GPU ranks (the "gpu"-marked tests) run on one CPU device each: the same
# code, with gloo collectives between the CPU devices instead of NCCL between GPUs.
if not visible_gpus():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Which CPU backend backend="auto" takes depends on what this machine measured faster;
# the suite must not (test_cpu_choice.py tests that choice with this variable removed).
os.environ["SYNK_CPU_BACKEND"] = "cpu"
# `make test` runs two test processes at once (pytest-xdist): pinned, the ranks of both
# would share the same cores and leave the others idle (test_placement.py unsets this).
os.environ["SYNK_AFFINITY"] = "0"


# The files `make test-fast` leaves out (it runs `pytest -m "not slow"`): each takes a minute
# or more on 2 cores (whole demos and ResNet-50, the GPU path on CPU devices, MPI nodes,
# killed and stopped ranks, cold caches, the Sphinx build). `make test` runs them all.
SLOW_FILES = {
    "test_async_demo.py",
    "test_atomic_training.py",
    "test_c_modules.py",
    "test_checkpoints.py",
    "test_cpu_choice.py",
    "test_demos.py",
    "test_differential.py",
    "test_docs.py",
    "test_faults.py",
    "test_first_calls.py",
    "test_gpu.py",
    "test_gpu_step.py",
    "test_gpu_check.py",
    "test_gpu_session.py",
    "test_gpu_faults.py",
    "test_jax_backend.py",
    "test_lasagne_demo.py",
    "test_lasagne_jax.py",
    "test_model_families.py",
    "test_models.py",
    "test_node_reductions.py",
    "test_nodes.py",
    "test_one_program.py",
    "test_pymc.py",
    "test_port_names.py",
    "test_porting.py",
    "test_reliability.py",
    "test_resnet50_demo.py",
    "test_rewritten_graphs.py",
    "test_security.py",
    "test_synkhronos_style_demo.py",
    "test_train.py",
}


def pytest_configure(config: pytest.Config) -> None:
    # PyTensor's JAX and Numba linkers write each compiled function's source to a temporary
    # file they never delete (tens of thousands per run): the run's processes (test workers
    # and ranks inherit the variable) write them in one folder, removed at the end.
    if not hasattr(config, "workerinput"):
        config.synk_tmpdir = tempfile.mkdtemp(prefix="synk-tests-")
        os.environ["TMPDIR"] = config.synk_tmpdir
        tempfile.tempdir = None


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = getattr(config, "synk_tmpdir", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def ranks(request):
    """Fork ``request.param`` CPU ranks (default 2) for one test module; close afterwards."""
    n = getattr(request, "param", 2)
    synk.fork(n, backend="cpu")
    yield n
    synk.close()


@pytest.fixture
def rng(request):
    """A random generator seeded from the test's id, so failures reproduce.

    ``zlib.crc32`` rather than ``hash``: Python salts ``hash`` of a string anew in every
    process. ``SYNK_TEST_SEED`` (an integer) shifts every seed, to try other inputs.
    """
    salt = int(os.environ.get("SYNK_TEST_SEED", "0"))
    return np.random.default_rng([zlib.crc32(request.node.nodeid.encode()), salt])


def shm_entries(prefix: str = "synk_") -> list[str]:
    """Names in /dev/shm made by synkhronos (segments and semaphores)."""
    return [
        e for e in os.listdir("/dev/shm") if e.startswith(prefix) or e.startswith("sem." + prefix)
    ]
