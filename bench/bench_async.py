"""Training throughput of the asynchronous trainers vs the synchronous step, in one run.

An MNIST-shaped MLP (784-256-256-10, float32, plain SGD) on random data. The synchronous
step (``extensions.train.make_step_function``) takes global minibatches of
``ranks x batch`` rows, one command and one all-reduce per step; each other algorithm
runs phases of ``--steps`` local steps of ``batch`` rows per rank, one command per phase.
Samples/s counts the rows trained on, over all ranks; best of ``--repeat`` rounds, after
an untimed warm-up (Numba compiles on each rank's first call).

Run: ``.venv/bin/python bench/bench_async.py [--ranks 2] [--batch 32] [--steps 200]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
from timing import best_of

import synkhronos as synk
from synkhronos.extensions.asynchronous import EASGD, AsyncEASGD, Downpour, Gossip, LocalStep
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne import objectives
from synkhronos.extensions.lasagne import updates as lasagne_updates
from synkhronos.extensions.lasagne.nonlinearities import rectify, softmax
from synkhronos.extensions.train import make_step_function

LEARNING_RATE = 0.05
TRAINERS = {
    "easgd (tau=4)": lambda step, b: EASGD(step, b, tau=4, alpha=0.2),
    "easgd-async (tau=4)": lambda step, b: AsyncEASGD(step, b, tau=4, alpha=0.2),
    "downpour (push 1, pull 2)": lambda step, b: Downpour(step, b, n_push=1, n_pull=2),
    "gossip (p=0.2)": lambda step, b: Gossip(step, b, p=0.2),
}


def build(x, y):
    net = L.InputLayer((None, 784), input_var=x)
    net = L.DenseLayer(net, 256, nonlinearity=rectify)
    net = L.DenseLayer(net, 256, nonlinearity=rectify)
    net = L.DenseLayer(net, 10, nonlinearity=softmax)
    loss = objectives.categorical_crossentropy(L.get_output(net), y).mean()
    return loss, L.get_all_params(net, trainable=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="rows per rank per step")
    parser.add_argument("--steps", type=int, default=200, help="steps per timed round")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pytensor.config.floatX = "float32"
    n_ranks = synk.fork(args.ranks, backend="cpu")
    rng = np.random.default_rng(0)
    n_rows = 8192
    x_data = synk.data(rng.random((n_rows, 784), dtype=np.float32))
    y_data = synk.data(rng.integers(0, 10, n_rows).astype(np.int32))
    x, y = pt.matrix("x"), pt.ivector("y")
    loss, params = build(x, y)
    sync = make_step_function(
        loss, params, [x, y], lasagne_updates.sgd, learning_rate=LEARNING_RATE
    )
    local = LocalStep(loss, params, [x, y], lasagne_updates.sgd, learning_rate=LEARNING_RATE)
    synk.distribute()

    global_batch = args.batch * n_ranks
    starts = iter(range(0, 10**9, global_batch))

    def sync_steps() -> None:
        for _ in range(args.steps):
            start = next(starts) % (n_rows - global_batch)
            sync(x_data, y_data, batch=slice(start, start + global_batch))

    sync_steps()  # warm-up
    sync_rate = args.steps * global_batch / best_of(sync_steps, args.repeat, 1)
    print(
        f"{n_ranks} ranks, {args.batch} rows per rank per step, {args.steps} steps per "
        f"round, best of {args.repeat}"
    )
    print(f"{'algorithm':28s} {'samples/s':>10s} {'vs sync':>8s}")
    print(f"{'sync (make_step_function)':28s} {sync_rate:10.0f} {1.0:8.2f}")
    for name, make in TRAINERS.items():
        with make(local, args.batch) as trainer:
            trainer.run([x_data, y_data], 1)  # warm-up
            best = float("inf")
            for _ in range(args.repeat):
                start = time.perf_counter()
                result = trainer.run([x_data, y_data], args.steps)
                best = min(best, time.perf_counter() - start)
            rate = result.samples / best
        print(f"{name:28s} {rate:10.0f} {rate / sync_rate:8.2f}")
    synk.close()


if __name__ == "__main__":
    main()
