"""GPU ranks' XLA communicator on CPU devices (``JAX_PLATFORMS=cpu``, gloo between them):
a diagnostic, not a target (CPU ranks keep the shared-memory communicator).

1. Seconds per collective of a float32 vector on the XLA communicator (device arrays)
   against the shared-memory methods it extends (host arrays), same processes.
2. An MLP training step (784-512-512-10, SGD, float32) fused into one XLA program per rank
   against the same chain run step by step; rounds alternate, medians.
3. With ``--buckets MB ...``: the fused step of a larger MLP (``--bucket-sizes``, Adam)
   whose gradient is all-reduced in buckets of each size (0: one all-reduce), same
   processes, rounds alternate, medians
   (``synkhronos.transport.comm.xla_settings.BUCKET_VAR``).

Run: ``JAX_PLATFORMS=cpu .venv/bin/python bench/bench_xla.py [--ranks 2]``, or
``... bench/bench_xla.py --sizes --rows --buckets 0 25 4`` for the buckets alone.
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
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000, 670_000, 4_000_000])
    parser.add_argument(
        "--rows", type=int, nargs="*", default=[128, 1024], help="MLP rows per rank"
    )
    parser.add_argument("--buckets", type=float, nargs="*", default=[], help="MB; 0: none")
    parser.add_argument("--bucket-sizes", type=int, nargs="+", default=[784, 2048, 2048, 2048, 10])
    parser.add_argument("--bucket-rows", type=int, default=64, help="rows per rank")
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
        if args.buckets:
            times = _bucketed(synk, args)
            print(f"fused Adam step, MLP {'-'.join(map(str, args.bucket_sizes))}, ", end="")
            print(f"{args.bucket_rows} rows per rank, ms (medians of {args.rounds} rounds):")
            for mb, seconds in times.items():
                print(f"  buckets of {mb:g} MB: {seconds * 1e3:.1f}")
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


def _bucketed(synk, args) -> dict[float, float]:
    """Seconds per fused Adam step with each bucket size of ``args.buckets`` (one program
    each, built while the ranks' bucket size is that)."""
    from run import mlp

    from synkhronos.api import routines
    from synkhronos.extensions import train
    from synkhronos.extensions.lasagne import updates

    total = args.ranks * args.bucket_rows
    rng = np.random.default_rng(0)
    xd = synk.data(rng.random((total, args.bucket_sizes[0])).astype("float32"))
    yd = synk.data(rng.integers(0, args.bucket_sizes[-1], total).astype("int32"))
    steps = {}
    for mb in args.buckets:
        routines.run(xla_timing.set_bucket_bytes, np.array([int(mb * 1e6)]))
        x, y, loss, params = mlp(sizes=tuple(args.bucket_sizes))
        steps[mb] = train.make_step_function(loss, params, [x, y], updates.adam)
        steps[mb](xd, yd)  # built and compiled with this size
    seconds: dict[float, list[float]] = {mb: [] for mb in steps}
    for _ in range(args.rounds):
        for mb, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step(xd, yd)
            seconds[mb].append((time.perf_counter() - start) / args.steps)
    return {mb: float(np.median(s)) for mb, s in seconds.items()}


if __name__ == "__main__":
    main()
