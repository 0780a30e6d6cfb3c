"""Data-parallel training step against the compute limit, hand-written MPI and torch DDP.

The 784-512-512-10 MLP (ReLU, softmax cross-entropy, float32, SGD lr 0.01) trained in five
ways, side by side in one run, samples/s at each global batch size:

1. ``PyTensor 1 thread``: a plain ``pytensor.function`` step (default mode), one BLAS
   thread, pinned to one core, keeping the memory it frees as synkhronos' ranks do
   (``synkhronos.rank.heap``);
2. ``synk 2 ranks``: ``extensions.train.make_step_function`` after
   ``synk.fork(2, backend="cpu")``, the data in ``synk.data``; and the same with
   ``backend="jax-cpu"`` (PyTensor's JAX mode, which ``backend="auto"`` takes where it
   measures JAX mode faster);
3. ``mpi4py 2 procs``: PyTensor gradient (one flat output) and update functions with an
   in-place ``Allreduce`` between, under ``mpiexec -n 2``, each process pinned, 1 thread;
4. ``DDP gloo 2 procs``: torch DistributedDataParallel, each process pinned, 1 thread;
5. ``torch 2 threads``: torch, one process.

The compute limit of 2 ranks at global batch B is twice column 1's samples/s at B/2 (each
rank computing its half, nothing else); the JAX limit is the same for column 1's step in
JAX mode (XLA on one thread), the bound of the "jax-cpu" column. A diagnostic column,
``2 x PyTensor concurrent``, runs column 1's step in two processes at once, each pinned
to its own core on its half of the batch, with no communication at all: what both cores
deliver together when they compete for memory bandwidth and cache, the limit this
machine can reach (it trains two independent models, so it is left out of the loss
check). A second one, ``2 x PyTensor + least all-reduce``, adds to each of those steps
close to the least an all-reduce of a gradient-sized vector through shared memory does
(each chunk crosses to the process that sums it and back, between two spinning barriers,
with no commands or checks: ``step_peers.least_all_reduce``): near the floor of any
design that all-reduces the whole gradient every step on this machine. Also
measured: column 1's step in PyTensor's JAX mode with XLA on one thread, against the
default mode, at each half batch.

Each column runs in its own processes (``step_peers.py``), all compiled before timing. At
each batch size every point is warmed up, then the points take turns, block by block
(each block at least ``--block-s`` seconds and 5 steps), so that load drifts hit all
alike; a point's figure is the median over ``--repeats`` blocks. Before timing, every
column runs the same first steps from the same initial values and their losses are
compared (the run fails if they disagree beyond float32 rounding).

torch, mpi4py (with ``mpiexec`` next to the Python executable) and JAX are optional: a
column whose package is missing is skipped with a line saying so.

The default mode's matrix products run in SciPy's OpenBLAS, whose kernels the run prints:
an ``OPENBLAS_CORETYPE`` in the environment (set on some machines for old OpenBLAS
builds) reaches every column, and on the Zen 5 VM of RESULTS.md its "Haswell" made the
default mode 1.65x slower than the kernels OpenBLAS picks itself.

Usage::

    python bench/bench_step.py                 # the full run (a few minutes on 2 cores)
    python bench/bench_step.py --quick         # smoke run: batches 256 and 2048, short blocks
    python bench/bench_step.py --batches 256 2048 --json out.json --plot out.png
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import queue
import secrets
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Listener
from pathlib import Path
from statistics import median

import numpy as np
from step_peers import DATA_ROWS, GRADIENT_SIZE, KEY_VAR, exchange_bytes
from timing import blas_kernels

from synkhronos.rank.backends.cpu import XLA_ONE_THREAD

HERE = Path(__file__).resolve().parent
BATCHES = (64, 128, 256, 512, 1024, 2048, 4096)
CHECK_BATCH, CHECK_STEPS = 256, 3
MIN_STEPS = 5
START_TIMEOUT_S = 600
LABELS = {
    "pytensor": "PyTensor 1 thread",
    "synk": "synk 2 ranks",
    "synk_jax": "synk 2 ranks jax-cpu",
    "mpi": "mpi4py + PyTensor 2 procs",
    "ddp": "torch DDP gloo 2 procs",
    "torch2": "torch 1 proc 2 threads",
    "pair": "2 x PyTensor concurrent",
    "floor": "2 x PyTensor + least all-reduce",
    "jax": "PyTensor 1 thread JAX mode",
}
WORLD = 2


@dataclass
class Column:
    """The connections to one column's processes; a command goes to all, time is the max."""

    name: str
    procs: list[subprocess.Popen]
    conns: list = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # removed when the column stops

    def ask(self, *command) -> list:
        for conn in self.conns:
            conn.send(command)
        return [conn.recv() for conn in self.conns]

    def seconds(self, batch: int, steps: int) -> float:
        return max(self.ask("time", batch, steps))


def missing(column: str) -> str | None:
    """Why ``column`` cannot run here, or None."""
    need = {
        "ddp": "torch",
        "torch2": "torch",
        "mpi": "mpi4py",
        "jax": "jax",
        "synk_jax": "jax",
    }.get(column)
    if need and importlib.util.find_spec(need) is None:
        return (
            f"{need} is not installed (pip install "
            + {"torch": "torch==2.13.0", "mpi4py": "mpi4py mpich", "jax": "jax"}[need]
            + ")"
        )
    if column == "mpi" and mpiexec() is None:
        return "no mpiexec next to the Python executable (pip install mpich)"
    return None


def mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(column: str, key: str) -> dict:
    """The environment of a column's processes: this tree importable, float32, thread caps."""
    env = dict(os.environ, **{KEY_VAR: key})
    root = str(HERE.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTENSOR_FLAGS"] = ",".join(p for p in (env.get("PYTENSOR_FLAGS"), "floatX=float32") if p)
    if column in ("pytensor", "jax", "mpi", "ddp", "pair", "floor"):  # 1 thread a process
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = "1"
    if column == "jax":
        env["XLA_FLAGS"] = XLA_ONE_THREAD
    return env


def exchange_file(key: str) -> Path:
    """The file in shared memory of the ``floor`` column (``step_peers.least_all_reduce``),
    zeroed."""
    path = Path("/dev/shm") / f"synk_bench_floor_{key}"
    path.write_bytes(bytes(exchange_bytes(WORLD, GRADIENT_SIZE)))
    return path


def start(column: str, address: str, key: str) -> Column:
    script = [sys.executable, str(HERE / "step_peers.py"), column, address]
    env = child_env(column, key)
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "env": env}
    files = []
    if column == "mpi":
        procs = [subprocess.Popen([mpiexec(), "-n", str(WORLD), *script], **quiet)]
    elif column in ("ddp", "pair", "floor"):
        if column == "floor":
            files.append(exchange_file(key))
        extra = [str(free_port())] if column == "ddp" else [str(path) for path in files]
        procs = [
            subprocess.Popen([*script, str(rank), str(WORLD), *extra], **quiet)
            for rank in range(WORLD)
        ]
    else:
        procs = [subprocess.Popen(script, **quiet)]
    return Column(column, procs, files=files)


def connect(listener: Listener, columns: dict[str, Column]) -> None:
    """Wait until every process of every column has connected (each compiles first)."""
    expected = {"mpi": WORLD, "ddp": WORLD, "pair": WORLD, "floor": WORLD}
    pending = sum(expected.get(name, 1) for name in columns)
    arrivals: queue.Queue = queue.Queue()

    def accept() -> None:  # in a thread, so that a column dying while starting is noticed
        for _ in range(pending):
            conn = listener.accept()
            arrivals.put((conn, conn.recv()))

    threading.Thread(target=accept, daemon=True).start()
    ranked: dict[str, dict[int, object]] = {name: {} for name in columns}
    deadline = time.monotonic() + START_TIMEOUT_S
    while pending:
        try:
            conn, (_, name, rank) = arrivals.get(timeout=1)
        except queue.Empty:
            for column in columns.values():
                if any(p.poll() is not None for p in column.procs):
                    raise SystemExit(f"column {column.name!r} exited while starting") from None
            if time.monotonic() > deadline:
                raise SystemExit("columns did not start in time") from None
            continue
        ranked[name][rank] = conn
        pending -= 1
    for name, column in columns.items():
        column.conns = [ranked[name][r] for r in sorted(ranked[name])]


def stop(columns: dict[str, Column]) -> None:
    for column in columns.values():
        for conn in column.conns:
            try:
                conn.send(("stop",))
            except OSError:
                pass
    for column in columns.values():
        for proc in column.procs:
            if not column.conns:  # never connected (a start failed): nothing tells it to stop
                proc.kill()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for path in column.files:
            path.unlink(missing_ok=True)


def check(columns: dict[str, Column]) -> dict[str, list[float]]:
    """Each column's losses over the same first steps from the same initial values."""
    return {
        name: column.ask("check", CHECK_BATCH, CHECK_STEPS)[0]
        for name, column in columns.items()
        if name not in ("pair", "floor")
    }


def measure(
    points: list[tuple[str, int]], columns: dict[str, Column], repeats: int, block_s: float
) -> dict[tuple[str, int], list[float]]:
    """Samples/s in each block of each (column, rows) point, the points taking turns."""
    steps = {}
    for name, rows in points:
        columns[name].seconds(rows, 1)  # compiles in JAX mode, warms caches elsewhere
        per_step = columns[name].seconds(rows, 2) / 2
        steps[name, rows] = max(MIN_STEPS, math.ceil(block_s / per_step))
    rates: dict[tuple[str, int], list[float]] = {point: [] for point in points}
    for _ in range(repeats):
        for name, rows in points:
            n = steps[name, rows]
            rates[name, rows].append(rows * n / columns[name].seconds(rows, n))
    return rates


def run(args: argparse.Namespace) -> dict:
    wanted = ["pytensor", "synk", "synk_jax", "mpi", "ddp", "torch2", "pair", "floor", "jax"]
    skipped = {name: why for name in wanted if (why := missing(name))}
    for name, why in skipped.items():
        print(f"skipped: {LABELS[name]}: {why}")
    key = secrets.token_hex(16)
    listener = Listener(family="AF_UNIX", authkey=bytes.fromhex(key))
    columns: dict[str, Column] = {}
    try:  # a column that fails to start stops those started before it
        for name in wanted:
            if name not in skipped:
                columns[name] = start(name, listener.address, key)
        t0 = time.perf_counter()
        connect(listener, columns)
        print(f"columns compiled and connected in {time.perf_counter() - t0:.0f} s")
        losses = check(columns)
        by_batch = {}
        timed = [name for name in columns if name != "jax"]
        for batch in args.batches:
            points = [(name, batch) for name in timed] + [("pytensor", batch // 2)]
            if "jax" in columns:
                points.append(("jax", batch // 2))
            by_batch[batch] = measure(points, columns, args.repeats, args.block_s)
            print(f"  batch {batch} measured", flush=True)
    finally:
        stop(columns)
        listener.close()
    return results(args, by_batch, losses, skipped)


def results(args, by_batch: dict, losses: dict, skipped: dict) -> dict:
    """Figures by column and batch, the limits, the ratios, the loss check, as plain data.

    ``by_batch[B]`` is :func:`measure`'s result for the points measured together: every
    column at global batch B, and column 1 and its JAX mode at B/2.
    """

    def rate(group: dict, name: str, rows: int) -> float | None:
        return median(group[name, rows]) if (name, rows) in group else None

    table = {
        name: {b: rate(by_batch[b], name, b) for b in args.batches}
        for name in LABELS
        if name != "jax"
    }
    table["limit"] = {b: 2 * rate(by_batch[b], "pytensor", b // 2) for b in args.batches}
    table["limit_jax"] = {
        b: 2 * j if (j := rate(by_batch[b], "jax", b // 2)) else None for b in args.batches
    }
    synk, synk_jax, limit, limit_jax, mpi, ddp, pair, floor = (
        table[k] for k in ("synk", "synk_jax", "limit", "limit_jax", "mpi", "ddp", "pair", "floor")
    )

    def ratio(a, b):
        return a / b if a and b else None

    ratios = {}
    for label, column in (("synk", synk), ("synk jax-cpu", synk_jax)):
        ratios |= {
            f"{label}/limit": {b: ratio(column[b], limit[b]) for b in args.batches},
            f"{label}/mpi4py": {b: ratio(column[b], mpi[b]) for b in args.batches},
            f"{label}/DDP": {b: ratio(column[b], ddp[b]) for b in args.batches},
        }
    ratios["synk/concurrent"] = {b: ratio(synk[b], pair[b]) for b in args.batches}
    ratios["floor/limit"] = {b: ratio(floor[b], limit[b]) for b in args.batches}
    ratios["synk/floor"] = {b: ratio(synk[b], floor[b]) for b in args.batches}
    ratios["synk jax-cpu/JAX limit"] = {b: ratio(synk_jax[b], limit_jax[b]) for b in args.batches}
    jax = {
        b // 2: {
            "default_ms": 1e3 * (b // 2) / rate(group, "pytensor", b // 2),
            "jax_ms": 1e3 * (b // 2) / rate(group, "jax", b // 2),
        }
        for b, group in sorted(by_batch.items())
        if ("jax", b // 2) in group
    }
    blocks = {
        f"batch {b}: {name} at {rows} rows": values
        for b, group in by_batch.items()
        for (name, rows), values in group.items()
    }
    reference = np.array(losses["pytensor"])
    check_dev = {
        name: float(np.max(np.abs(np.array(v) - reference) / np.abs(reference)))
        for name, v in losses.items()
    }
    return {
        "batches": list(args.batches),
        "samples_per_s": table,
        "ratios": ratios,
        "jax_vs_default": jax,
        "check_losses": losses,
        "check_max_rel_dev": check_dev,
        "samples_per_s_of_each_block": blocks,
        "skipped": skipped,
        "repeats": args.repeats,
        "block_s": args.block_s,
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "openblas": blas_kernels(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


# The goals; "jax-cpu" is held to the limit of its own (JAX-mode) compute.
GOALS = tuple(
    (f"{synk}/{peer}", batch, goal)
    for synk, limit in (("synk", "limit"), ("synk jax-cpu", "JAX limit"))
    for peer, batch, goal in (
        (limit, 256, 0.90),
        ("mpi4py", 256, 1.15),
        ("DDP", 2048, 1.0),
        (limit, 2048, 0.90),
    )
)


def report(res: dict, tolerance: float) -> bool:
    """Print the tables; return whether the columns' losses agree."""

    def fmt(v, spec=",.0f"):
        return "—" if v is None else format(v, spec)

    names = ["pytensor", "synk", "synk_jax", "mpi", "ddp", "torch2", "pair", "floor"]
    shown = (
        "synk/limit",
        "synk/mpi4py",
        "synk/DDP",
        "synk/concurrent",
        "floor/limit",
        "synk/floor",
        "synk jax-cpu/limit",
        "synk jax-cpu/JAX limit",
        "synk jax-cpu/mpi4py",
        "synk jax-cpu/DDP",
    )
    print(
        f"\nLoss after each of the first {CHECK_STEPS} steps at batch {CHECK_BATCH}, "
        "same init and data (max relative deviation from PyTensor 1 thread):"
    )
    agree = True
    for name, values in res["check_losses"].items():
        dev = res["check_max_rel_dev"][name]
        agree &= dev <= tolerance
        print(
            f"  {LABELS[name]:28s} "
            + " ".join(f"{v:.6f}" for v in values)
            + f"   {dev:.1e}"
            + ("" if dev <= tolerance else "  MISMATCH")
        )
    table, ratios = res["samples_per_s"], res["ratios"]
    print(f"\nOpenBLAS kernels: {res['machine']['openblas']}")
    print(
        "samples/s (median of blocks); limit = 2 x PyTensor 1 thread at batch/2, "
        "JAX limit = the same in JAX mode\n"
    )
    print("| global batch | " + " | ".join(LABELS[n] for n in names) + " | limit | JAX limit |")
    print("|---" * (len(names) + 3) + "|")
    for b in res["batches"]:
        print(
            f"| {b} | "
            + " | ".join(fmt(table[n][b]) for n in names)
            + f" | {fmt(table['limit'][b])} | {fmt(table['limit_jax'][b])} |"
        )
    print("\n| global batch | " + " | ".join(shown) + " |")
    print("|---" * (len(shown) + 1) + "|")
    for b in res["batches"]:
        print(f"| {b} | " + " | ".join(fmt(ratios[r][b], ".2f") for r in shown) + " |")
    print()
    for name, batch, goal in GOALS:
        value = ratios[name].get(batch)
        if value is not None:
            print(
                f"goal {name} at batch {batch} >= {goal:.2f}: {value:.3f} "
                + ("met" if value >= goal else "NOT met")
            )
    for b in sorted({batch for _, batch, _ in GOALS} & set(res["batches"])):
        if (floor := ratios["floor/limit"].get(b)) is not None:
            print(
                f"at batch {b} the floor (2 x PyTensor + least all-reduce) is {floor:.2f} "
                f"of the limit, and synk reaches {ratios['synk/floor'][b]:.2f} of the floor"
            )
    if res["jax_vs_default"]:
        print("\nPyTensor step, 1 thread: default mode vs JAX mode (XLA on one thread)")
        print("| rows | default ms | JAX ms | default / JAX |\n|---|---|---|---|")
        for rows, t in res["jax_vs_default"].items():
            print(
                f"| {rows} | {t['default_ms']:.2f} | {t['jax_ms']:.2f} | "
                f"{t['default_ms'] / t['jax_ms']:.2f} |"
            )
    return agree


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = res["batches"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, values in res["samples_per_s"].items():
        if all(values[b] is None for b in batches):
            continue
        style = (
            {"linestyle": "--", "color": "gray" if name == "limit" else "black"}
            if name.startswith("limit")
            else {"marker": "o"}
        )
        label = {
            "limit": "limit: 2 x 1 thread at batch/2",
            "limit_jax": "JAX limit: the same in JAX mode",
        }.get(name) or LABELS[name]
        ax.plot(batches, [values[b] for b in batches], label=label, **style)
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("global batch")
    ax.set_ylabel("samples / s")
    ax.set_title("784-512-512-10 MLP, SGD, float32, 2 CPU cores")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batches",
        type=int,
        nargs="+",
        default=list(BATCHES),
        help="global batch sizes (even, at most 8192)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per point")
    parser.add_argument(
        "--block-s",
        type=float,
        default=0.5,
        help="least seconds of a timed block (and at least 5 steps)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: batches 256 and 2048, 2 repeats of 0.1 s blocks",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-4,
        help="largest relative loss deviation between columns",
    )
    parser.add_argument("--json", type=Path, default=HERE / "out" / "step.json")
    parser.add_argument("--plot", type=Path, default=HERE / "out" / "step.png")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.repeats, args.block_s = [256, 2048], 2, 0.1
    if any(b % WORLD or b > DATA_ROWS for b in args.batches):
        parser.error(f"each batch must be a multiple of {WORLD} and at most {DATA_ROWS}")
    started = time.perf_counter()
    res = run(args)
    res["elapsed_s"] = time.perf_counter() - started
    agree = report(res, args.tolerance)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=1, default=str))
    plot(res, args.plot)
    print(f"\n{res['elapsed_s']:.0f} s; JSON: {args.json}; plot: {args.plot}")
    if not agree:
        raise SystemExit("the columns' losses disagree: they do not compute the same step")


if __name__ == "__main__":
    main()
