"""Which cores and threads each rank gets, and the environment a worker starts in.

Each rank is pinned to its own share of the cores and limits its math libraries' threads
to that share (oversubscribed BLAS threads spin against each other; a rank that migrates
loses its caches); rank 0 applies its share in :class:`~synkhronos.session.session.Session`.
"""

from __future__ import annotations

import json
import os
import sys

from synkhronos.rank.backends import gpu
from synkhronos.rank.backends.cpu import xla_flags as cpu_xla_flags

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def rank_cores(n_ranks: int, available=None) -> list[list[int]] | None:
    """The cores each rank is pinned to, or None to pin none.

    Rank ``r`` gets ``cores[r * k:(r + 1) * k]`` of the sorted ``available`` cores (default:
    this process's affinity set), ``k = len(cores) // n_ranks``. None when there are fewer
    cores than ranks.

    Examples
    --------
    >>> rank_cores(2, {0, 1, 2, 3, 4})
    [[0, 1], [2, 3]]
    >>> rank_cores(3, {4, 6}) is None
    True
    """
    cores = sorted(os.sched_getaffinity(0) if available is None else available)
    if len(cores) < n_ranks:
        return None
    k = len(cores) // n_ranks
    return [cores[r * k : (r + 1) * k] for r in range(n_ranks)]


def cores_to_pin(n_ranks: int, backend_name: str) -> list[list[int]] | None:
    """:func:`rank_cores`, or None to pin none: when the environment variable
    ``SYNK_AFFINITY`` is ``0``, and for GPU ranks on GPUs, which the GPUs drive (pinning
    would only starve their threads)."""
    if os.environ.get("SYNK_AFFINITY") == "0":
        return None
    if backend_name == "gpu" and not gpu.on_cpu_devices():
        return None
    return rank_cores(n_ranks)


def on_cpu_cores(backend: str) -> bool:
    """Whether ranks of ``backend`` compute on CPU cores (every backend but GPU ranks on
    GPUs): each gets its share of the cores, and XLA, wherever such a rank runs it (JAX
    mode, a routine's program, the compiled NUTS of :mod:`synkhronos.extensions.pymc`),
    runs on the CPU with the rank's share too; on one core no thread pool (two processes'
    pools spinning on the same cores made a 2-rank MLP step 1 s instead of tens of ms)."""
    return backend != "gpu" or gpu.on_cpu_devices()


def rank_threads(threads: int, env=os.environ) -> int:
    """``threads``, or fewer where the environment ``env`` asks fewer of a math library
    (``OMP_NUM_THREADS=1``): rank 0 keeps the user's limit as the workers do
    (:func:`worker_env` sets only the variables the user left unset).

    Examples
    --------
    >>> rank_threads(2, {"OPENBLAS_NUM_THREADS": "1"}), rank_threads(2, {})
    (1, 2)
    """
    asked = [int(v) for v in map(env.get, THREAD_VARS) if v and v.isdigit() and int(v)]
    return min([threads, *asked])


def worker_env(threads: int, backend: str, gpu: str | None) -> dict:
    import pytensor

    env = dict(os.environ)
    for var in THREAD_VARS:
        env.setdefault(var, str(threads))
    flags = env.get("PYTENSOR_FLAGS", "")
    env["PYTENSOR_FLAGS"] = ",".join(f for f in (flags, f"floatX={pytensor.config.floatX}") if f)
    env["SYNK_SYS_PATH"] = json.dumps(sys.path)
    if on_cpu_cores(backend):
        env["JAX_PLATFORMS"] = "cpu"
        xla_flags = cpu_xla_flags(env.pop("XLA_FLAGS", ""), threads)
        if xla_flags:
            env["XLA_FLAGS"] = xla_flags
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env
