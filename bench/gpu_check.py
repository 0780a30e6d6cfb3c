"""The GPU figures, in one run on a machine with GPUs; a table to compare and record.

1. The test suite's GPU-marked tests (``tests/test_gpu.py``, ``tests/test_gpu_faults.py``).
2. The conv and pool Ops in JAX mode against hand-written ``jax.lax`` (``bench_conv.py``).
3. Per-call overhead of a synk function against the plain PyTensor JAX function.
4. The all-reduce of a ResNet-50-sized flat gradient (25.6 M float32) on the XLA
   communicator (NCCL on GPUs): time and bus bandwidth, ``2 (n - 1) / n * bytes / time``
   (NCCL's tests' measure).
5. An MLP training step (784-1024-1024-10, SGD, synthetic MNIST-shaped data), fused into
   one XLA program per rank and run step by step: samples/s (``--quick``: 784-128-10).
6. ResNet-50 (224 x 224, synthetic data, SGD with momentum): samples/s per GPU of
   synkhronos' step (``extensions.train``, fused) against a data-parallel loop written by
   hand in JAX (``jax_resnet.py``) on the same devices.

Without GPUs, ``JAX_PLATFORMS=cpu`` runs the same on one CPU device per rank (2 ranks);
``--quick`` (what ``make test`` runs) takes small sizes and leaves out 1, 2 and 6.

On a lent GPU machine (device tool): first ``bash bench/gpu_wheels.sh`` here, then run,
carrying ``.whl``::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD &&
    SYNK_DEVICE_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
        python3 bench/gpu_check.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import xla_timing
from run import mlp_step_chains
from timing import best_of


def _args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="small sizes; no test suite, conv bench or ResNet-50"
    )
    parser.add_argument(
        "--ranks", type=int, default=None, help="default: one per GPU, or 2 on CPU devices"
    )
    parser.add_argument(
        "--size", type=int, default=None, help="floats all-reduced (default 25.6M, quick 256k)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="MLP rows per rank (default 512, quick 32)"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--resnet-batch", type=int, default=64, help="images per GPU")
    args = parser.parse_args()
    args.size = args.size or (256_000 if args.quick else 25_600_000)
    args.batch_size = args.batch_size or (32 if args.quick else 512)
    args.steps = args.steps or (3 if args.quick else 20)
    return args


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    print(done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def main() -> None:
    args = _args()
    import pytensor

    pytensor.config.floatX = "float32"
    import synkhronos as synk
    from synkhronos.api import routines
    from synkhronos.rank.backends.gpu import on_cpu_devices

    rows = []
    if not args.quick:
        tests = _run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-m",
                "gpu",
                "tests/test_gpu.py",
                "tests/test_gpu_faults.py",
            ]
        )
        rows.append(("GPU-marked tests", (tests.strip().splitlines() or ["?"])[-1]))
        conv = _run([sys.executable, "bench/bench_conv.py", "--mode", "JAX"]).splitlines()
        rows += [
            (f"{op.split(',')[0]}: JAX mode / hand-written lax", ratio.split(":")[-1])
            for op, ratio in zip(conv, conv[3:], strict=False)
            if "ratio" in ratio
        ]
    n = synk.fork(args.ranks or (2 if on_cpu_devices() else None), backend="gpu")
    try:
        rows += _call_overhead(synk)
        first, best = routines.run(
            xla_timing.all_reduce_seconds, np.array([args.size]), np.array([3])
        )[0][0]
        gigabytes = 4 * args.size / 1e9
        rows += [
            (
                f"first all_reduce, {args.size / 1e6:g}M float32, with compiling (ms)",
                f"{first * 1e3:.1f}",
            ),
            (f"all_reduce {args.size / 1e6:g}M float32 (ms)", f"{best * 1e3:.2f}"),
            (
                "all_reduce bus bandwidth (GB/s)",
                f"{2 * (n - 1) / n * gigabytes / best:.2f}" if n > 1 else "one rank",
            ),
        ]
        sizes = (784, 128, 10) if args.quick else (784, 1024, 1024, 10)
        rows += _mlp_steps(synk, n, sizes, args.batch_size, args.steps)
        if not args.quick:
            rows += _resnet(synk, routines, n, args)
    finally:
        synk.close()
    device = os.environ.get("SYNK_DEVICE_NAME", "CPU devices" if on_cpu_devices() else "GPU")
    print(f"\nsynkhronos GPU check on {device}, {n} ranks, {time.strftime('%Y-%m-%d')}")
    for name, value in rows:
        print(f"{name:60s} {value}")


def _call_overhead(synk) -> list[tuple[str, str]]:
    import pytensor
    import pytensor.tensor as pt

    v = pt.vector("v")
    plain = pytensor.function([v], v.sum(), mode="JAX")
    f = synk.function([v], (v.sum(), "sum"))
    d = synk.data(np.ones(8, dtype=v.dtype))
    f(d)
    plain(d.data)
    t_synk, t_plain = best_of(lambda: f(d), 5, 200), best_of(lambda: plain(d.data), 5, 200)
    return [("call: synk / plain PyTensor JAX (us)", f"{t_synk * 1e6:.1f} / {t_plain * 1e6:.1f}")]


def _mlp_steps(synk, n: int, sizes: tuple, batch: int, steps: int) -> list[tuple[str, str]]:
    """Samples/s of the MLP step, fused and step by step (same model, same data)."""
    x, fused, unfused = mlp_step_chains(synk, sizes)
    rng = np.random.default_rng(0)
    total = batch * n
    xd = synk.data(rng.random((4 * total, 784)).astype(x.dtype))
    yd = synk.data(rng.integers(0, 10, 4 * total).astype("int32"))
    batches = iter(range(10**9))

    def run(chain):
        lo = (next(batches) % 4) * total
        chain(xd, yd, batch=slice(lo, lo + total))

    rows = []
    for label, chain in (("fused", fused), ("step by step", unfused)):
        run(chain)  # compiled
        seconds = best_of(lambda chain=chain: run(chain), 3, steps)
        rows.append(
            (
                f"MLP step {'-'.join(map(str, sizes))}, {label}, {batch} rows per rank (samples/s)",
                f"{total / seconds:,.0f}",
            )
        )
    return rows


def _resnet(synk, routines, n: int, args) -> list[tuple[str, str]]:
    """Samples/s per rank of ResNet-50: synkhronos' fused step, and the JAX loop."""
    import pytensor.tensor as pt

    from synkhronos.extensions.lasagne import layers as L
    from synkhronos.extensions.lasagne import objectives, updates
    from synkhronos.extensions.models import resnet50
    from synkhronos.extensions.train import make_step_function

    size, batch, classes = args.image_size, args.resnet_batch, 1000
    x, y = pt.tensor4("x", dtype="float32"), pt.ivector("y")
    net = resnet50(L.InputLayer((None, 3, size, size), input_var=x), num_classes=classes)
    loss = objectives.categorical_crossentropy(L.get_output(net), y).mean()
    params = L.get_all_params(net, trainable=True)
    step = make_step_function(
        loss, params, [x, y], updates.momentum, learning_rate=0.01, momentum=0.9
    )
    rng = np.random.default_rng(0)
    images = synk.data(rng.random((batch * n, 3, size, size), dtype=np.float32))
    labels = synk.data(rng.integers(0, classes, batch * n, dtype=np.int32))
    start = time.perf_counter()
    step(images, labels)
    first = time.perf_counter() - start
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step(images, labels)
        times.append(time.perf_counter() - start)
    ours = float(np.median(times))
    jax_first, theirs = routines.run(
        xla_timing.jax_resnet_seconds, np.array([batch, size, classes]), np.array([args.steps])
    )[0][0]
    return [
        (
            f"ResNet-50 {size}px, {batch} per rank: first step, synk / JAX (s)",
            f"{first:.1f} / {jax_first:.1f}",
        ),
        ("ResNet-50 samples/s per rank: synkhronos (fused step)", f"{batch / ours:.1f}"),
        ("ResNet-50 samples/s per rank: hand-written JAX loop", f"{batch / theirs:.1f}"),
        ("ResNet-50 synkhronos / JAX", f"{theirs / ours:.2f}"),
    ]


if __name__ == "__main__":
    main()
