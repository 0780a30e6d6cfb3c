"""GPU ranks' XLA communicator on CPU devices (``JAX_PLATFORMS=cpu``, gloo between them):
a diagnostic, not a target (CPU ranks keep the shared-memory communicator).

1. Seconds per collective of a float32 vector on the XLA communicator (device arrays)
   against the shared-memory methods it extends (host arrays), same processes.
2. An MLP training step (784-512-512-10, SGD, float32) fused into one XLA program per rank
   against the same chain run step by step; rounds alternate, medians.

Run: ``JAX_PLATFORMS=cpu .venv/bin/python bench/bench_xla.py [--ranks 2]``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import xla_timing
from run import mlp_step_chains


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 670_000, 4_000_000])
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[128, 1024], help="MLP rows per rank"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import pytensor

    pytensor.config.floatX = "float32"
    import synkhronos as synk
    from synkhronos.api import routines

    synk.fork(args.ranks, backend="gpu")
    try:
        print(f"{'collective':12s} {'floats':>10s} {'XLA (ms)':>10s} {'shm (ms)':>10s}")
        for size in args.sizes:
            times = routines.run(
                xla_timing.collective_seconds, np.array([size]), np.array([args.rounds])
            )[0][0]
            for kind, (xla, shm) in zip(xla_timing.KINDS, times, strict=True):
                print(f"{kind:12s} {size:10d} {xla * 1e3:10.3f} {shm * 1e3:10.3f}")
        for rows in args.rows:
            fused, unfused = _steps(synk, args.ranks * rows, args.steps, args.rounds)
            print(
                f"MLP step, {rows} rows per rank: fused {fused * 1e3:.2f} ms, step by step "
                f"{unfused * 1e3:.2f} ms (medians of {args.rounds} rounds of "
                f"{args.steps} steps)"
            )
    finally:
        synk.close()


def _steps(synk, total: int, steps: int, rounds: int) -> tuple[float, float]:
    _, fused, unfused = mlp_step_chains(synk)
    rng = np.random.default_rng(0)
    xd = synk.data(rng.random((total, 784)).astype("float32"))
    yd = synk.data(rng.integers(0, 10, total).astype("int32"))
    chains = {"fused": fused, "unfused": unfused}
    seconds = {name: [] for name in chains}
    for chain in chains.values():
        chain(xd, yd)  # compiled
    for _ in range(rounds):
        for name, chain in chains.items():
            start = time.perf_counter()
            for _ in range(steps):
                chain(xd, yd)
            seconds[name].append((time.perf_counter() - start) / steps)
    return float(np.median(seconds["fused"])), float(np.median(seconds["unfused"]))


if __name__ == "__main__":
    main()
