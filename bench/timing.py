"""Timing helper shared by the benchmark scripts."""

from __future__ import annotations

import json
import os
import subprocess
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


def child_result(cmd: list[str], env: dict, limit: float | None = None) -> dict | None:
    """The JSON line a benchmark's child process (``cmd`` run with ``env``) printed last;
    None past ``limit`` seconds; ``{"failed": ...}`` (its last error line) where it failed."""
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        errors = [line for line in done.stderr.splitlines() if "Error" in line]
        return {"failed": errors[-1] if errors else f"exit status {done.returncode}"}
    return json.loads(lines[-1])
