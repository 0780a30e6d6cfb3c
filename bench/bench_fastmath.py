"""The cost of compiling ranks' Numba code without fast-math flags (issue #34 item 1).

Synkhronos compiles every rank's functions with ``numba__fastmath=False`` so that fresh
and cache-loaded code give the same bits (``synkhronos/rank/compiled.py``). This times a
training step (float32, SGD) compiled both ways, in one process pinned to one core with one
BLAS thread, the two taking turns, and prints the ratio side by side:

- MLP: 784-512-512-10, ReLU, softmax cross-entropy, 128 rows (bench_step.py's model);
- CNN: 1x28x28 -> conv 3x3 32 -> max-pool 2 -> conv 3x3 32 -> max-pool 2 -> dense 10,
  softmax cross-entropy, 64 rows (layers of synkhronos.extensions.lasagne).

Usage::

    python bench/bench_fastmath.py [--rounds 7] [--steps 20]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time  # noqa: E402 - after the thread counts, which BLAS reads when loaded

import numpy as np  # noqa: E402
import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

from synkhronos.extensions import lasagne  # noqa: E402

L = lasagne.layers


def mlp(x):
    net = L.InputLayer((None, 784), input_var=x)
    for _ in range(2):
        net = L.DenseLayer(net, 512, nonlinearity=lasagne.nonlinearities.rectify)
    return L.DenseLayer(net, 10, nonlinearity=lasagne.nonlinearities.softmax)


def cnn(x):
    net = L.InputLayer((None, 1, 28, 28), input_var=x)
    for _ in range(2):
        net = L.MaxPool2DLayer(L.Conv2DLayer(net, 32, 3), 2)
    return L.DenseLayer(net, 10, nonlinearity=lasagne.nonlinearities.softmax)


MODELS = {"MLP": (mlp, (128, 784), 2), "CNN": (cnn, (64, 1, 28, 28), 4)}


def step(model, shape, ndim, fastmath: bool):
    """A compiled SGD step of ``model`` with fast-math flags on or off, and its data."""
    rng = np.random.default_rng(0)
    lasagne.random.set_rng(np.random.RandomState(0))
    x, y = pt.tensor("x", dtype="float32", shape=(None,) * ndim), pt.ivector("y")
    net = model(x)
    params = L.get_all_params(net, trainable=True)
    loss = lasagne.objectives.categorical_crossentropy(L.get_output(net), y).mean()
    updates = lasagne.updates.sgd(loss, params, learning_rate=0.01)
    with pytensor.config.change_flags(numba__fastmath=fastmath):
        fn = pytensor.function([x, y], loss, updates=updates)
    data = rng.random(shape, dtype=np.float32), rng.integers(0, 10, shape[0]).astype("int32")
    fn(*data)  # compiled (Numba compiles at the first call)
    return fn, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(f"{'model':6} {'fast-math on ms':>16} {'off ms':>10} {'off/on':>8}")
    for name, (model, shape, ndim) in MODELS.items():
        steps = {on: step(model, shape, ndim, on) for on in (True, False)}
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):  # the two take turns, so that load drifts hit both
            for on, (fn, data) in steps.items():
                start = time.perf_counter()
                for _ in range(args.steps):
                    fn(*data)
                times[on].append((time.perf_counter() - start) / args.steps)
        on, off = (float(np.median(times[k])) for k in (True, False))
        print(f"{name:6} {1e3 * on:16.3f} {1e3 * off:10.3f} {off / on:8.3f}")


if __name__ == "__main__":
    main()
