"""Everything to run on a lent GPU, in one go; prints a table to paste in bench/RESULTS.md.

1. The test suite's GPU-marked tests (results equal ``pytensor.function``).
2. NCCL start-up and the flat-gradient all_reduce (every collective is in the tests).
3. Per-call overhead of a synk function vs the plain PyTensor JAX function, same GPU.
4. A ResNet-50-sized flat all_reduce (25.6 M float32).
5. MNIST-MLP training throughput (images/s), data in ``synk.data`` vs in sliceable
   shared variables selected with ``batch_s`` (synthetic MNIST-shaped data: no network).
6. The conv and pool Ops in JAX mode vs hand-written ``jax.lax`` (``bench_conv.py``).

``--backend jax-cpu`` runs the same steps on CPU ranks (to check the script itself).

On a lent GPU machine (device tool): first ``bash bench/gpu_wheels.sh`` here, then run,
carrying ``.whl``::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD &&
    SYNK_DEVICE_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader)" \
        python3 bench/gpu_check.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
from run import mlp
from timing import best_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="gpu")
    parser.add_argument("--size", type=int, default=25_600_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    rows = []
    if args.backend == "gpu":
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu",
                                "tests/test_gpu.py"], capture_output=True, text=True)
        print(tests.stdout[-2000:], tests.stderr[-2000:])
        rows.append(("GPU-marked tests", tests.stdout.strip().splitlines()[-1]))
        conv = subprocess.run([sys.executable, "bench/bench_conv.py", "--mode", "JAX"],
                              capture_output=True, text=True)
        print(conv.stdout[-2000:], conv.stderr[-2000:])
        rows += [("conv/pool JAX mode vs hand-written lax (ratio)", line.split(":")[-1].strip())
                 for line in conv.stdout.splitlines() if "ratio" in line]

    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk
    from synkhronos.extensions import updates

    n = synk.fork(1 if args.backend == "gpu" else 2, backend=args.backend)
    try:
        # 3. per-call overhead
        v = pt.vector("v")
        plain = pytensor.function([v], v.sum(), mode="JAX")
        f = synk.function([v], (v.sum(), "sum"))
        d = synk.data(np.ones(8, dtype=v.dtype))
        f(d)
        plain(d.data)
        t_synk, t_plain = best_of(lambda: f(d), 5, 500), best_of(lambda: plain(d.data), 5, 500)
        rows.append(("call: synk / plain PyTensor JAX (us)",
                     f"{t_synk * 1e6:.1f} / {t_plain * 1e6:.1f}"))

        # 2 + 4. NCCL start and the flat all_reduce
        flat = pytensor.shared(np.ones(args.size, dtype="float32"), name="flat")
        synk.function([], flat.sum())
        start = time.perf_counter()
        synk.all_reduce(flat, op="avg")  # the first call starts NCCL
        rows.append(("first all_reduce incl. NCCL start (ms)",
                     f"{(time.perf_counter() - start) * 1e3:.1f}"))
        t_ar = best_of(lambda: synk.all_reduce(flat, op="avg"), 3, 5)
        rows.append((f"all_reduce {args.size / 1e6:g}M float32 (ms)", f"{t_ar * 1e3:.2f}"))

        # 5. MLP training throughput: synk.data vs batch_s on device-resident data
        x, y, loss, params = mlp(sizes=(784, 1024, 1024, 10))
        rng = np.random.default_rng(0)
        n_rows = args.batch_size * 8
        xs = rng.random((n_rows, 784)).astype(x.dtype)
        ys = rng.integers(0, 10, n_rows).astype("int32")
        grad_updates, param_updates, grad_shared = updates.sgd(loss, params, learning_rate=0.01)
        grad_fn = synk.function([x, y], loss, updates=grad_updates)
        apply_fn = synk.function([], updates=param_updates)
        xd, yd = synk.data(xs), synk.data(ys)
        xsh = pytensor.shared(xs, name="x_all")
        ysh = pytensor.shared(ys, name="y_all")
        grad_s = synk.function([], loss, updates=grad_updates,
                               givens=[(x, xsh), (y, ysh)], sliceable_shareds=[xsh, ysh])

        steps = iter(range(10**9))

        def train_data():
            lo = (next(steps) % 8) * args.batch_size
            grad_fn(xd, yd, batch=slice(lo, lo + args.batch_size))
            synk.all_reduce(grad_shared, op="avg")
            apply_fn()

        def train_shared():
            lo = (next(steps) % 8) * (args.batch_size // n)
            grad_s(batch_s=slice(lo, lo + args.batch_size // n))
            synk.all_reduce(grad_shared, op="avg")
            apply_fn()

        synk.scatter([xsh, ysh], [xs, ys])
        for train, label in ((train_data, "synk.data"), (train_shared, "batch_s")):
            train()
            t = best_of(train, 1, args.steps)
            rows.append((f"MLP train, data in {label} (images/s)",
                         f"{args.batch_size / t:,.0f}"))
    finally:
        synk.close()
    device = os.environ.get("SYNK_DEVICE_NAME", args.backend)
    print(f"\nsynkhronos GPU check on {device}, {time.strftime('%Y-%m-%d')}")
    for name, value in rows:
        print(f"{name:48s} {value}")


if __name__ == "__main__":
    main()
