"""``python -m synkhronos check``: what this machine offers, what ``fork()`` would do, and
a 2-rank self-test; ``python -m synkhronos sweep``: remove what dead programs left;
``python -m synkhronos sweep --cache``: also remove the compile caches.

The check reports the platform, the packages, the CPU cores, the GPUs and their
visibility, the backend ``backend="auto"`` takes and why, the MPI launcher, ``/dev/shm``'s
size and free space, and the names (and workers) of this user's programs that died; then
it forks 2 CPU ranks and compares a call and an all-reduce with numpy. It exits with 1,
naming the reason, when something cannot work (not Linux, ``/dev/shm`` missing or with less
than :data:`MIN_FREE_BYTES` free, the self-test failing), else 0; what only deserves care
(a small ``/dev/shm``, leftovers) is noted.

The report is the command's output, on stdout; the library's own messages during the
self-test go through ``logging`` as always.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from synkhronos.api.builders import function
from synkhronos.api.collectives import all_reduce, gather
from synkhronos.rank.backends import gpu
from synkhronos.rank.versions import installed_versions
from synkhronos.session import backend_choice, launch
from synkhronos.transport import names, shm
from synkhronos.transport.nodes import LAUNCHER_VARS, under_mpi_launcher

__all__ = [
    "MIN_FREE_BYTES",
    "cache_folders",
    "check",
    "main",
    "self_test",
    "sweep_caches",
    "sweep_leftovers",
]

MIN_FREE_BYTES = 32 << 20
"""Free space in ``/dev/shm`` below which the check fails: the self-test's segments need
a few MiB, and a training step's data and gradients far more."""
SMALL_SHM_BYTES = 1 << 30  # below this, the check notes it (Docker's default is 64 MiB)
PACKAGES = ("numpy", "pytensor", "numba", "scipy", "posix_ipc", "jax", "jaxlib", "mpi4py")
SWEEP_COMMAND = f"{os.path.basename(sys.executable)} -m synkhronos sweep"


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n < 2**30 else f"{n / 2**30:.1f} GiB"


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _versions() -> str:
    return ", ".join(
        f"{package} {version or '-'}" for package, version in installed_versions(PACKAGES).items()
    )


def _gpus() -> tuple[list[str], list]:
    """Lines on the GPUs (nvidia-smi's table, CUDA_VISIBLE_DEVICES, JAX_PLATFORMS), and
    nvidia-smi's table (empty when it failed)."""
    try:
        table = gpu.gpu_table()
    except RuntimeError as error:
        table, lines = [], [f"GPUs: none found ({error})"]
    else:
        lines = [f"GPUs: {len(table)} (nvidia-smi)"] + [
            f"  GPU {index}: {name}, {memory}" for index, name, memory in table
        ]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        lines.append(f"  CUDA_VISIBLE_DEVICES={visible!r}: visible {gpu.visible_gpus(table)}")
    if gpu.on_cpu_devices():
        lines.append("  JAX_PLATFORMS=cpu: GPU ranks would run on CPU devices, one per rank")
    missing = gpu.gpu_packages_missing()
    if table and missing:
        lines.append(f"  missing for GPU ranks: {' and '.join(missing)}; {gpu.EXTRA_HINT}")
    return lines, table


def _fork_plan(table: list) -> list[str]:
    choice, why = backend_choice.auto_backend(deciding=False)
    if choice == "gpu":
        ranks = f"{len(gpu.visible_gpus(table))} ranks (one per visible GPU)"
    else:
        ranks = f"{len(os.sched_getaffinity(0))} ranks (one per usable CPU core)"
    shown = repr(choice) if choice else "'cpu' or 'jax-cpu', once measured"
    return [f"fork() would start: {ranks}, backend {shown}", f"  because: {why}"]


def _mpi() -> str:
    if not under_mpi_launcher():
        return "MPI: not started by an MPI launcher (one machine)"
    found = {var: os.environ[var] for var in LAUNCHER_VARS if var in os.environ}
    size = found.get("PMI_SIZE") or found.get("OMPI_COMM_WORLD_SIZE") or "?"
    return (
        f"MPI: started by an MPI launcher ({', '.join(f'{k}={v}' for k, v in found.items())}"
        f"): fork() would span {size} nodes"
    )


def _leftovers() -> tuple[list[str], bool]:
    """Lines on the names (and workers) this user's dead programs left, and whether any."""
    dead = names.dead_prefixes()
    if not dead:
        return ["leftovers of dead programs: none"], False
    lines = [f"leftovers of dead programs: {len(dead)} (fork() removes them too):"]
    listed = os.listdir(names.SHM_DIR)
    for prefix in dead:
        entries = names.entries_of(prefix, listed)
        size = sum(os.lstat(os.path.join(names.SHM_DIR, e)).st_size for e in entries)
        workers = names.workers_of(prefix)
        alive = f", {len(workers)} worker process(es) {workers}" if workers else ""
        lines.append(f"  {prefix}: {len(entries)} names, {_mib(size)}{alive}")
    lines.append(f"  remove them now with: {SWEEP_COMMAND}")
    return lines, True


def _shm() -> tuple[list[str], str | None]:
    """Lines on /dev/shm, and the reason it cannot work (None if it can)."""
    try:
        stat = os.statvfs(names.SHM_DIR)
    except OSError as error:
        return [], f"{names.SHM_DIR} is not usable ({error}); synkhronos needs POSIX shared memory"
    if not os.access(names.SHM_DIR, os.W_OK):
        return [], f"{names.SHM_DIR} is not writable by this user"
    total, free = stat.f_blocks * stat.f_frsize, shm.free_bytes()
    lines = [f"/dev/shm: {_mib(total)}, {_mib(free)} free"]
    if free < MIN_FREE_BYTES:
        return lines, (
            f"/dev/shm has {_mib(free)} free, less than the {_mib(MIN_FREE_BYTES)} "
            f"synkhronos needs at least; free space there, or enlarge it (e.g. "
            f"docker run --shm-size=8g)"
        )
    if total < SMALL_SHM_BYTES:
        lines.append(
            "  note: small; data and gradients of a large model may not fit "
            "(enlarge it, e.g. docker run --shm-size=8g)"
        )
    return lines, None


def self_test(backend: str = "cpu") -> float:
    """Fork 2 ranks, compare a call and an all-reduce with numpy, close; return the
    seconds it took. ``AssertionError`` if a result differs."""
    import pytensor
    import pytensor.tensor as pt

    start = time.perf_counter()
    launch.fork(2, backend=backend, nodes=False, timeout=120)
    try:
        x = pt.matrix("x", dtype="float64")
        w = pytensor.shared(np.zeros(3), name="self_test_w")
        f = function(
            [x], [(x.sum(axis=1), "gather"), ((x**2).mean(), "avg")], updates=[(w, x.sum(axis=0))]
        )
        data = np.random.default_rng(0).normal(size=(7, 3))  # 4 rows and 3
        rows, mean = f(data)
        np.testing.assert_allclose(rows, data.sum(axis=1), rtol=1e-12)
        np.testing.assert_allclose(mean, (data**2).mean(), rtol=1e-12)
        all_reduce(w, op="sum")  # each rank had its rows' sum: now the whole sum
        for value in gather(w):
            np.testing.assert_allclose(value, data.sum(axis=0), rtol=1e-12)
    finally:
        launch.close()
    return time.perf_counter() - start


def check(backend: str = "cpu", say: Callable[[str], None] = _say) -> int:
    """Report on this machine and run the self-test; return the exit status (0: works)."""
    problems = []
    version = installed_versions(["synkhronos"])["synkhronos"] or "(not installed)"
    say(
        f"synkhronos {version} on Python {platform.python_version()}, {platform.system()} "
        f"{platform.machine()}"
    )
    if not sys.platform.startswith("linux"):
        problems.append(f"synkhronos runs on Linux only, not {sys.platform}")
    say(f"packages: {_versions()}")
    say(f"CPU cores usable: {len(os.sched_getaffinity(0))} of {os.cpu_count()}")
    gpu_lines, table = _gpus()
    for line in gpu_lines + _fork_plan(table) + [_mpi()]:
        say(line)
    lines, problem = _shm()
    for line in lines:
        say(line)
    if problem:
        problems.append(problem)
    else:
        for line in _leftovers()[0]:
            say(line)
    if not problems:
        try:
            seconds = self_test(backend)
        except Exception as error:  # noqa: BLE001 - the reason to report
            problems.append(
                f"the self-test on 2 {backend} ranks failed: {type(error).__name__}: {error}"
            )
        else:
            say(
                f"self-test: 2 {backend} ranks, a call and an all-reduce equal numpy "
                f"({seconds:.1f} s)"
            )
    for problem in problems:
        say(f"CANNOT WORK: {problem}")
    say("ok" if not problems else "failed")
    return 1 if problems else 0


def sweep_leftovers(say: Callable[[str], None] = _say) -> int:
    """End the workers and remove the names of this user's dead programs; return 0."""
    swept = launch.sweep_dead()
    for prefix, workers, removed in swept:
        say(f"{prefix}: removed {len(removed)} names, ended {len(workers)} worker(s)")
    say(f"swept {len(swept)} dead program(s)")
    return 0


def cache_folders() -> list[Path]:
    """The folders of compiled code that a run keeps for the next: PyTensor's compile folder
    (C modules; synkhronos' rewritten graphs and, unless ``JAX_COMPILATION_CACHE_DIR`` says
    otherwise, XLA's programs are inside it) and Numba's cache. Both follow
    ``PYTENSOR_FLAGS=base_compiledir=...``."""
    import pytensor
    from pytensor.link.numba.cache import NUMBA_CACHE_PATH  # imports Numba: only here

    return [Path(pytensor.config.compiledir), Path(NUMBA_CACHE_PATH)]


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def sweep_caches(say: Callable[[str], None] = _say) -> int:
    """Remove the :func:`cache_folders` (the next run compiles from scratch); return 0."""
    for folder in cache_folders():
        if folder.is_dir():
            size = _size(folder)
            shutil.rmtree(folder, ignore_errors=True)
            say(f"removed {folder} ({_mib(size)})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m synkhronos {check,sweep}``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m synkhronos", description="synkhronos' command-line tools"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    checking = commands.add_parser(
        "check", help="what this machine offers, what fork() would do, and a 2-rank self-test"
    )
    checking.add_argument(
        "--backend",
        default="cpu",
        choices=["cpu", "jax-cpu", "gpu"],
        help="the self-test's backend (default: cpu)",
    )
    sweeping = commands.add_parser(
        "sweep",
        help="remove what this user's dead programs left in /dev/shm, and end their workers",
    )
    sweeping.add_argument(
        "--cache",
        action="store_true",
        help="also remove the compile caches (PyTensor's compile folder, Numba's cache, "
        "synkhronos' rewritten graphs and XLA programs); run it with no program running",
    )
    args = parser.parse_args(argv)
    if args.command == "check":
        return check(args.backend)
    return sweep_leftovers() or (sweep_caches() if args.cache else 0)
