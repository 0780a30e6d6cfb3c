"""Time to first step: how long a training script waits for its first step, cold and warm.

For each model, compile mode and number of ranks, a fresh Python process forks the ranks
(``backend="cpu"``; ``backend="jax-cpu"`` for mode JAX), builds the model with
``synkhronos.extensions.lasagne``, builds its training function by the one-line form
(``synk.function([x, y], loss, updates=momentum(loss, params, ...))``) and calls it twice.
Printed per run: seconds from the start of ``synk.function`` to the end of the first call
(graph analysis, rewriting, compiling, the first step), the median seconds of the next
three steps, and the peak resident memory of rank 0 and of the largest worker.

Each case runs twice with the same cache folder: "cold" into an empty one (a new machine,
CI, a new virtual environment: ``PYTENSOR_FLAGS=base_compiledir=<empty>``, which holds
PyTensor's C modules, Numba's cache and synkhronos' JAX cache), then "warm" (the second run
of the same script). Modes: ``default`` (no mode named: what the library chooses), and
``NUMBA``, ``CVM``, ``JAX`` named by the user. A run that passes ``--limit`` seconds is
stopped and shown as ``>limit``; one that fails is shown with its last error line.

Run: ``python bench/first_step.py`` (all), or e.g.
``python bench/first_step.py --models resnet50 --modes default --ranks 2``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

from timing import child_result

MODELS = ("mlp", "cnn", "lstm", "unet", "resnet50")
MODES = ("default", "NUMBA", "CVM", "JAX")
NEXT_STEPS = 3  # steps after the first, of which the median is shown
DEMOS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demos")
BATCH_PER_RANK = {"mlp": 64, "cnn": 32, "lstm": 16, "unet": 4, "resnet50": 2}


def build(model: str):
    """``(input variables, loss, params, input shapes and dtypes)`` of ``model``."""
    import pytensor.tensor as pt

    from synkhronos.extensions.lasagne import layers as L
    from synkhronos.extensions.lasagne import nonlinearities as nl
    from synkhronos.extensions.lasagne import objectives

    y = pt.ivector("y")
    if model == "mlp":
        x = pt.matrix("x")
        net = L.InputLayer((None, 784), input_var=x)
        for _ in range(2):
            net = L.DenseLayer(net, 512)
        net = L.DenseLayer(net, 10, nonlinearity=nl.softmax)
        shape, classes = (784,), 10
    elif model == "cnn":
        x = pt.tensor4("x")
        net = L.InputLayer((None, 1, 28, 28), input_var=x)
        for filters in (32, 64):
            net = L.MaxPool2DLayer(L.Conv2DLayer(net, filters, 3, pad="same"), 2)
        net = L.DenseLayer(L.DenseLayer(net, 256), 10, nonlinearity=nl.softmax)
        shape, classes = (1, 28, 28), 10
    elif model == "lstm":
        x = pt.tensor3("x")
        net = L.LSTMLayer(L.InputLayer((None, 20, 32), input_var=x), 64, only_return_final=True)
        net = L.DenseLayer(net, 10, nonlinearity=nl.softmax)
        shape, classes = (20, 32), 10
    elif model == "unet":
        x, y = pt.tensor4("x"), pt.tensor4("y")
        net, skips = L.InputLayer((None, 1, 64, 64), input_var=x), []
        for filters in (16, 32, 64):
            net = L.Conv2DLayer(L.Conv2DLayer(net, filters, 3, pad="same"), filters, 3, pad="same")
            skips.append(net)
            net = L.MaxPool2DLayer(net, 2)
        net = L.Conv2DLayer(net, 128, 3, pad="same")
        for filters, skip in zip((64, 32, 16), reversed(skips), strict=True):
            net = L.Upscale2DLayer(net, 2)
            net = L.ConcatLayer([L.Conv2DLayer(net, filters, 3, pad="same"), skip])
            net = L.Conv2DLayer(net, filters, 3, pad="same")
        net = L.Conv2DLayer(net, 1, 1, nonlinearity=nl.sigmoid)
        loss = objectives.binary_crossentropy(L.get_output(net), y).mean()
        return [x, y], loss, L.get_all_params(net, trainable=True), ((1, 64, 64), (1, 64, 64))
    else:
        sys.path.insert(0, DEMOS)
        from resnet import resnet50

        x = pt.tensor4("x")
        net = resnet50(L.InputLayer((None, 3, 224, 224), input_var=x), num_classes=1000)
        shape, classes = (3, 224, 224), 1000
    loss = objectives.categorical_crossentropy(L.get_output(net), y).mean()
    return [x, y], loss, L.get_all_params(net, trainable=True), (shape, classes)


def child(model: str, mode: str, ranks: int) -> None:
    """(In a fresh process) fork, build, time the first two steps; print a JSON line."""
    import numpy as np
    import pytensor

    pytensor.config.floatX = "float32"
    import synkhronos as synk
    from synkhronos.extensions.lasagne import updates

    synk.fork(ranks, backend="jax-cpu" if mode == "JAX" else "cpu")
    inputs, loss, params, shapes = build(model)
    rng = np.random.default_rng(0)
    n = BATCH_PER_RANK[model] * ranks
    if model == "unet":
        data = [rng.random((n, *s), dtype=np.float32) for s in shapes]
        data[1] = (data[1] > 0.5).astype(np.float32)
    else:
        shape, classes = shapes
        data = [
            rng.standard_normal((n, *shape), dtype=np.float32),
            rng.integers(0, classes, n).astype(np.int32),
        ]
    start = time.perf_counter()
    step = synk.function(
        inputs,
        loss,
        updates=updates.momentum(loss, params, learning_rate=0.01, momentum=0.9),
        mode=None if mode in ("default", "JAX") else mode,
    )
    built = time.perf_counter()
    step(*data)
    first = time.perf_counter()
    steps = []
    for _ in range(NEXT_STEPS):
        begin = time.perf_counter()
        step(*data)
        steps.append(time.perf_counter() - begin)
    synk.close()
    print(
        json.dumps(
            {
                "build_s": built - start,
                "first_s": first - start,
                "next_s": sorted(steps)[NEXT_STEPS // 2],
                "rank0_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                "worker_gb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6,
            }
        ),
        flush=True,
    )


def run(model: str, mode: str, ranks: int, cache: str, limit: float) -> dict | None:
    """One run in a fresh process with ``cache`` as PyTensor's base compile folder."""
    env = dict(os.environ, PYTENSOR_FLAGS=f"base_compiledir={cache}")
    env.pop("OPENBLAS_CORETYPE", None)
    cmd = [sys.executable, __file__, "--child", model, mode, str(ranks)]
    return child_result(cmd, env, limit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--limit", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, mode, ranks = args.child
        child(model, mode, int(ranks))
        return
    print(
        f"{'model':9} {'mode':8} {'ranks':>5} {'run':5} {'first step s':>12} "
        f"{'next step s':>11} {'rank 0 GB':>9} {'worker GB':>9}",
        flush=True,
    )
    for model in args.models:
        for mode in args.modes:
            for ranks in args.ranks:
                with tempfile.TemporaryDirectory(prefix="synk-first-step-") as cache:
                    for run_name in ("cold", "warm"):
                        res = run(model, mode, ranks, cache, args.limit)
                        if res is None:
                            print(f"{model:9} {mode:8} {ranks:5} {run_name:5} "
                                  f"{'>' + format(args.limit, '.0f'):>12}", flush=True)  # fmt: skip
                            break
                        if "failed" in res:
                            print(f"{model:9} {mode:8} {ranks:5} {run_name:5} failed: "
                                  f"{res['failed'][:200]}", flush=True)  # fmt: skip
                            break
                        worker = f"{res['worker_gb']:9.2f}" if ranks > 1 else f"{'-':>9}"
                        print(
                            f"{model:9} {mode:8} {ranks:5} {run_name:5} {res['first_s']:12.1f} "
                            f"{res['next_s']:11.3f} {res['rank0_gb']:9.2f} {worker}",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
