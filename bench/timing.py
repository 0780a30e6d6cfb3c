"""Timing helper shared by the benchmark scripts."""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def best_of(fn: Callable[[], object], repeat: int, number: int) -> float:
    """Best mean seconds per call of ``fn`` over ``repeat`` rounds of ``number`` calls."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def blas_kernels() -> str:
    """The kernels the OpenBLAS of NumPy and SciPy run, and the environment that chose them.

    Some machines set ``OPENBLAS_CORETYPE`` for old OpenBLAS builds; on the Zen 5 VM of
    RESULTS.md its "Haswell" made PyTensor's default mode 1.65x slower than the kernels
    OpenBLAS picks itself, so every figure taken in the default mode must say which ran.
    """
    import scipy.linalg  # noqa: F401 - loads SciPy's OpenBLAS, the one Numba graphs call
    from threadpoolctl import threadpool_info

    kernels = sorted(
        {
            str(lib.get("architecture"))
            for lib in threadpool_info()
            if lib.get("internal_api") == "openblas"
        }
    ) or ["no OpenBLAS"]
    chosen = (
        ", ".join(
            f"{v}={os.environ[v]}"
            for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
            if v in os.environ
        )
        or "OpenBLAS's own choice"
    )
    return f"{'/'.join(kernels)} ({chosen})"
