"""The flat-gradient all-reduce over 2 MPI "nodes" against mpi4py's Allreduce alone.

``synk.all_reduce`` of one float32 vector (670k elements, a flat gradient's size) across
every global rank, timed against ``MPI.COMM_WORLD.Allreduce`` of the same bytes between
the nodes' rank 0 processes alone (what synkhronos adds: the node's own reduce and
broadcast through shared memory, the copies, the command to the workers). The two take
turns, each after an MPI barrier, so that load drifts hit both; node 0 prints medians.

Usage: ``python bench/bench_nodes.py [--local 1 2] [--steps 200]`` launches
``mpiexec -n 2`` (found next to this interpreter) once per local rank count and prints
one line each; ``--node`` is what each node runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def run_node(local: int, size: int, steps: int, warmup: int) -> None:
    """One node's part (under mpiexec): time both, print medians on node 0."""
    import pytensor
    from mpi4py import MPI

    import synkhronos as synk
    from synkhronos.transport import nodes

    synk.fork(local, backend="cpu")
    world = nodes.current()
    comm = MPI.COMM_WORLD
    flat = pytensor.shared(np.ones(size, np.float32), name="flat_grad")
    synk.function([], flat.sum())  # the variable must belong to a function to be shared
    plain = np.ones(size, np.float32)
    cases = {
        "synk.all_reduce": lambda: synk.all_reduce(flat, op="sum"),
        "mpi4py Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, plain, op=MPI.SUM),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for step in range(warmup + steps):
        for name, run in cases.items():
            comm.Barrier()
            start = time.perf_counter()
            run()
            if step >= warmup:
                times[name].append(time.perf_counter() - start)
    if world.node == 0:
        ms = {name: 1e3 * median(t) for name, t in times.items()}
        mine, theirs = ms["synk.all_reduce"], ms["mpi4py Allreduce"]
        print(
            f"RESULT 2 nodes x {local} local ranks, {size * 4 / 2**20:.2f} MiB: "
            f"synk.all_reduce {mine:.3f} ms, mpi4py Allreduce {theirs:.3f} ms, "
            f"ratio {mine / theirs:.2f}x (medians of {steps})",
            flush=True,
        )
    synk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--local", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--size", type=int, default=670_000, help="float32 elements")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--node", action="store_true", help="run one node's part")
    args = parser.parse_args()
    if args.node:
        run_node(args.local[0], args.size, args.steps, args.warmup)
        return
    mpiexec = Path(sys.executable).parent / "mpiexec"
    for local in args.local:
        out = subprocess.run(
            [
                str(mpiexec),
                "-n",
                "2",
                sys.executable,
                __file__,
                "--node",
                "--local",
                str(local),
                "--size",
                str(args.size),
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout
        print(
            *(line[len("RESULT ") :] for line in out.splitlines() if line.startswith("RESULT ")),
            sep="\n",
            flush=True,
        )


if __name__ == "__main__":
    main()
