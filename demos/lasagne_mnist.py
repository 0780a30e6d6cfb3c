"""A Lasagne MNIST CNN, written as a Lasagne user writes one, run on PyTensor.

This is Lasagne's classic tutorial script (convolution, max pooling, dropout, a dense
layer, softmax, L2 weight decay, Nesterov momentum) ported by its import lines only:
``from synkhronos.extensions import lasagne`` in place of ``import lasagne``, and
``from synkhronos import theano`` in place of ``import theano``.  It trains on one
process, or with ``--ranks N`` on N ranks (CPU ranks, or GPU ranks with ``--backend
gpu``: one GPU each, or one CPU device each under ``JAX_PLATFORMS=cpu``): then the
training function's line says ``synk.function`` where it said ``theano.function``, and
each minibatch is split over the ranks (one all-reduce of the gradients per step; every
rank ends each step with one process's parameters, dropout's masks included). The
validation and weight-decay functions stay ``theano.function``s, run by rank 0 alone.

Run ``python demos/lasagne_mnist.py --help`` for the options.  Without MNIST files and
network access, scikit-learn's 8x8 digits stand in (see ``mnist_data.py``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mnist_data import load_mnist

import synkhronos as synk
from synkhronos import theano
from synkhronos.extensions import lasagne
from synkhronos.theano import tensor as T  # noqa: N812 (Theano's customary alias)


def build_cnn(input_var=None):
    """Lasagne's tutorial CNN, narrower: two conv/pool stages, dropout, dense, softmax."""
    network = lasagne.layers.InputLayer(shape=(None, 1, 28, 28), input_var=input_var)
    network = lasagne.layers.Conv2DLayer(
        network,
        num_filters=8,
        filter_size=(5, 5),
        nonlinearity=lasagne.nonlinearities.rectify,
        W=lasagne.init.GlorotUniform(),
    )
    network = lasagne.layers.MaxPool2DLayer(network, pool_size=(2, 2))
    network = lasagne.layers.Conv2DLayer(network, num_filters=8, filter_size=(5, 5))
    network = lasagne.layers.MaxPool2DLayer(network, pool_size=(2, 2))
    network = lasagne.layers.DenseLayer(
        lasagne.layers.dropout(network, p=0.5),
        num_units=64,
        nonlinearity=lasagne.nonlinearities.rectify,
    )
    return lasagne.layers.DenseLayer(
        lasagne.layers.dropout(network, p=0.5),
        num_units=10,
        nonlinearity=lasagne.nonlinearities.softmax,
    )


def iterate_minibatches(inputs, targets, batchsize, shuffle=False):
    """Yield ``(inputs, targets)`` minibatches, dropping the last partial one."""
    indices = np.arange(len(inputs))
    if shuffle:
        np.random.shuffle(indices)
    for start in range(0, len(inputs) - batchsize + 1, batchsize):
        excerpt = indices[start : start + batchsize]
        yield inputs[excerpt], targets[excerpt]


def compile_train_fn(loss, params, inputs, ranks=1):
    """Lasagne's training function; with ``ranks > 1`` the same line, data-parallel.

    Both take ``(inputs, targets)`` and return the minibatch's mean loss; the
    data-parallel one scatters the rows over the ranks (call it after ``synk.fork``).
    """
    updates = lasagne.updates.nesterov_momentum(loss, params, learning_rate=0.05, momentum=0.9)
    if ranks == 1:
        return theano.function(inputs, loss, updates=updates)
    return synk.function(inputs, loss, updates=updates)


def main(num_epochs=2, num_samples=400, batchsize=50, weight_decay=1e-4, data_dir="data/mnist",
         download=True, ranks=1, backend="cpu"):  # fmt: skip
    """Train, printing Lasagne's per-epoch report; return the final validation accuracy."""
    if ranks > 1:
        synk.fork(ranks, backend=backend)
    x_train, y_train, x_val, y_val, _, _ = load_mnist(data_dir, download=download)
    x_train, y_train = x_train[:num_samples], y_train[:num_samples]
    x_val, y_val = x_val[: num_samples // 2], y_val[: num_samples // 2]
    x_train, x_val = (lasagne.utils.floatX(x) for x in (x_train, x_val))

    input_var = T.tensor4("inputs")
    target_var = T.ivector("targets")
    network = build_cnn(input_var)

    prediction = lasagne.layers.get_output(network)
    loss = lasagne.objectives.categorical_crossentropy(prediction, target_var).mean()
    penalty = weight_decay * lasagne.regularization.regularize_network_params(
        network, lasagne.regularization.l2
    )
    loss = loss + penalty
    params = lasagne.layers.get_all_params(network, trainable=True)

    test_prediction = lasagne.layers.get_output(network, deterministic=True)
    test_loss = lasagne.objectives.categorical_crossentropy(test_prediction, target_var).mean()
    test_acc = T.mean(T.eq(T.argmax(test_prediction, axis=1), target_var),
                      dtype=theano.config.floatX)  # fmt: skip

    train_fn = compile_train_fn(loss, params, [input_var, target_var], ranks)
    # Parameters are identical on all ranks after every step, so rank 0 validates alone.
    val_fn = theano.function([input_var, target_var], [test_loss, test_acc])
    penalty_fn = theano.function([], penalty)

    print(
        f"{lasagne.layers.count_params(network, trainable=True)} trainable parameters, "
        f"{ranks} rank{f's ({backend})' if ranks > 1 else ''}"
    )
    val_acc = 0.0
    for epoch in range(num_epochs):
        train_err, train_batches, start_time = 0.0, 0, time.time()
        for inputs, targets in iterate_minibatches(x_train, y_train, batchsize, shuffle=True):
            train_err += train_fn(inputs, targets)
            train_batches += 1
        val_err, val_acc, val_batches = 0.0, 0.0, 0
        for inputs, targets in iterate_minibatches(x_val, y_val, batchsize):
            err, acc = val_fn(inputs, targets)
            val_err, val_acc, val_batches = val_err + err, val_acc + acc, val_batches + 1
        val_acc /= val_batches
        print(f"Epoch {epoch + 1} of {num_epochs} took {time.time() - start_time:.3f}s")
        print(f"  training loss:\t\t{train_err / train_batches:.6f}")
        print(f"  validation loss:\t\t{val_err / val_batches:.6f}")
        print(f"  validation accuracy:\t\t{val_acc * 100:.2f} %")
        print(f"  weight decay penalty:\t\t{float(penalty_fn()):.6f}")
    if ranks > 1:
        synk.close()
    return val_acc


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=400, help="training rows used")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--data-dir", default="data/mnist")
    parser.add_argument("--no-download", action="store_true", help="never touch the network")
    parser.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="1: one process (theano.function); N > 1: data-parallel on N "
        "ranks, each minibatch split over them",
    )
    parser.add_argument("--backend", choices=["cpu", "gpu"], default="cpu",
                        help="the ranks' backend (gpu: JAX; JAX_PLATFORMS=cpu runs it on "
                             "CPU devices)")  # fmt: skip
    args = parser.parse_args()
    np.random.seed(0)
    lasagne.random.set_rng(np.random.RandomState(0))
    main(args.epochs, args.samples, args.batch_size, data_dir=args.data_dir,
         download=not args.no_download, ranks=args.ranks, backend=args.backend)  # fmt: skip
