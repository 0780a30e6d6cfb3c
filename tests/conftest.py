"""Shared fixtures: a forked session per module, and a check that nothing leaks."""

from __future__ import annotations

import os
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
# would share the same cores and leave the others idle (test_affinity.py unsets this).
os.environ["SYNK_AFFINITY"] = "0"


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
