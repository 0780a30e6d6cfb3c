"""The Theano tutorials' training line on 2 ranks against one process (issue #61).

The MLP tutorial (``mlp.py``: 784-500-10, tanh, L2 penalty, SGD, batch 20) and LeNet
(``convolutional_mlp.py``: two 5x5 convolutions of 20 and 50 kernels with 2x2 max
pooling, a 500-unit tanh layer, batch 500, its input reshaped with the batch size written
in; ``lenet-1``: -1 there, so that the minibatch splits), written in the tutorials'
spelling on synthetic MNIST-shaped data. Their training
line, ``synk.function([index], cost, updates=updates, givens={x: train_set_x[index * B:
(index + 1) * B], ...})``, is timed against ``pytensor.function`` of the same line:

- in rank 0's process after ``synk.fork`` (the thread settings every rank gets), in
  turns with the 2-rank function, block by block (the median seconds per step of each);
- in a process of its own without synkhronos (as the user runs the tutorial), in turns
  too, between the blocks.

Before timing, both train ``--check`` steps from the same start: the largest parameter
difference is printed.

Usage::

    python bench/bench_tutorials.py [--model mlp|lenet|lenet-1] [--ranks 2] [--steps 20]
                                    [--blocks 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from synkhronos import theano
from synkhronos.theano.tensor.nnet import conv2d
from synkhronos.theano.tensor.signal.pool import pool_2d

T = theano.tensor
BATCHES = 8  # minibatches of synthetic data


def _layer(rng, n_in, n_out, activation=None):
    """A dense layer's (W, b) as the tutorials draw them."""
    bound = np.sqrt(6.0 / (n_in + n_out)) * (4 if activation is None else 1)
    W = rng.uniform(-bound, bound, (n_in, n_out)).astype(theano.config.floatX)
    return theano.shared(W, name="W"), theano.shared(np.zeros(n_out, W.dtype), name="b")


def _data(rng, rows, shape):
    X = rng.uniform(0, 1, (rows, *shape)).astype(theano.config.floatX)
    Y = rng.integers(0, 10, rows).astype("int32")
    return theano.shared(X, name="train_set_x"), theano.shared(Y, name="train_set_y")


def _nll(p_y_given_x, y):
    return -T.mean(T.log(p_y_given_x)[T.arange(y.shape[0]), y])


def mlp(batch_size: int):
    """The MLP tutorial's graph: (x, y, cost, params, learning rate, data)."""
    rng = np.random.default_rng(1234)
    x, y = T.matrix("x"), T.ivector("y")
    W1, b1 = _layer(rng, 784, 500, T.tanh)
    W2 = theano.shared(np.zeros((500, 10), theano.config.floatX), name="W")
    b2 = theano.shared(np.zeros(10, theano.config.floatX), name="b")
    hidden = T.tanh(T.dot(x, W1) + b1)
    p_y = T.nnet.softmax(T.dot(hidden, W2) + b2)
    cost = _nll(p_y, y) + 0.0001 * ((W1**2).sum() + (W2**2).sum())
    return x, y, cost, [W1, b1, W2, b2], 0.01, _data(rng, BATCHES * batch_size, (784,))


def lenet(batch_size: int, written_in: bool = True):
    """LeNet's graph as ``convolutional_mlp.py`` builds it (its reshape names the batch
    size; ``written_in=False``: -1 there)."""
    rng = np.random.default_rng(23455)
    x, y = T.matrix("x"), T.ivector("y")
    params, layer = [], x.reshape((batch_size if written_in else -1, 1, 28, 28))
    for n_in, n_out in ((1, 20), (20, 50)):
        fan_in, fan_out = n_in * 25, n_out * 25 / 4
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        W = theano.shared(
            rng.uniform(-bound, bound, (n_out, n_in, 5, 5)).astype(theano.config.floatX)
        )
        b = theano.shared(np.zeros(n_out, theano.config.floatX))
        pooled = pool_2d(conv2d(layer, W), ws=(2, 2), ignore_border=True)
        layer = T.tanh(pooled + b.dimshuffle("x", 0, "x", "x"))
        params += [W, b]
    W2, b2 = _layer(rng, 50 * 4 * 4, 500, T.tanh)
    hidden = T.tanh(T.dot(layer.flatten(2), W2) + b2)
    W3 = theano.shared(np.zeros((500, 10), theano.config.floatX))
    b3 = theano.shared(np.zeros(10, theano.config.floatX))
    cost = _nll(T.nnet.softmax(T.dot(hidden, W3) + b3), y)
    return x, y, cost, [*params, W2, b2, W3, b3], 0.1, _data(rng, BATCHES * batch_size, (784,))


MODELS = {
    "mlp": (mlp, 20),
    "lenet": (lenet, 500),
    "lenet-1": (lambda batch_size: lenet(batch_size, written_in=False), 500),
}


def training_line(model: str, builds: list) -> tuple[list, list]:
    """The tutorial's training line, built by each of ``builds`` (``theano.function``,
    ``synk.function``) on the same graph, and the parameters."""
    make, batch_size = MODELS[model]
    x, y, cost, params, rate, (train_set_x, train_set_y) = make(batch_size)
    index = T.lscalar("index")
    grads = T.grad(cost, params)
    updates = [(p, p - rate * g) for p, g in zip(params, grads, strict=True)]
    givens = {
        x: train_set_x[index * batch_size : (index + 1) * batch_size],
        y: train_set_y[index * batch_size : (index + 1) * batch_size],
    }
    return [build([index], cost, updates=updates, givens=givens) for build in builds], params


def timed(step, steps: int) -> float:
    """Seconds per step of ``steps`` steps through the minibatches."""
    start = time.perf_counter()
    for k in range(steps):
        step(k % BATCHES)
    return (time.perf_counter() - start) / steps


def alone(model: str, steps: int, blocks: int) -> None:
    """(The subprocess) the plain line's seconds per step per block, as JSON."""
    (train,), _ = training_line(model, [theano.function])
    timed(train, 2)  # compiled, warm
    print(json.dumps([timed(train, steps) for _ in range(blocks)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--check", type=int, default=3)
    parser.add_argument("--alone", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.alone:
        alone(args.model, args.steps, 1)
        return
    import synkhronos as synk

    synk.fork(args.ranks)
    (train, plain), params = training_line(args.model, [synk.function, theano.function])
    start = [p.get_value() for p in params]
    for k in range(args.check):
        train(k)
    after = [p.get_value() for p in params]
    for p, value in zip(params, start, strict=True):
        p.set_value(value)
    for k in range(args.check):
        plain(k)
    diff = max(float(np.abs(a - p.get_value()).max()) for a, p in zip(after, params, strict=True))
    synk.broadcast(params)
    print(f"{args.model}: largest parameter difference after {args.check} steps: {diff:.3g}")
    command = [sys.executable, __file__, "--model", args.model, "--steps", str(args.steps)]
    times: dict = {"ranks": [], "rank 0 alone": [], "own process": []}
    for _ in range(args.blocks):
        times["ranks"].append(timed(train, args.steps))
        times["rank 0 alone"].append(timed(plain, args.steps))
        out = subprocess.run([*command, "--alone"], capture_output=True, text=True, check=True)
        times["own process"] += json.loads(out.stdout.splitlines()[-1])
    median = {name: float(np.median(t)) for name, t in times.items()}
    for name, seconds in median.items():
        print(f"{args.model} {name}: {seconds * 1e3:.2f} ms a step")
    for name in ("rank 0 alone", "own process"):
        print(f"{args.model}: {args.ranks} ranks {median[name] / median['ranks']:.2f}x of {name}")
    print(f"(floatX {theano.config.floatX}, {os.cpu_count()} cores)")
    synk.close()


if __name__ == "__main__":
    main()
