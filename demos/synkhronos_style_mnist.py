"""An MLP on MNIST written as a user of the original Synkhronos wrote it.

The program follows the original's Lasagne MNIST demo line by line; the only
changes a Theano-era script needs are its imports (``import pytensor as theano``,
``import pytensor.tensor as T``, and the Lasagne port for ``import lasagne``).
It trains with the three-part rule ``updates.nesterov_momentum``: phase one
writes each rank's gradient into ``grad_shared``, ``synk.all_reduce(grad_shared)``
combines them, phase two updates the parameters on every rank. Minibatches are
``batch=`` index lists into shared-memory ``synk.data``; the same steps are then
repeated with ``make_train_function(loss, params, x, y, ...)``.

Without MNIST files (and with ``--no-download``) it trains on scikit-learn's
digits, upsampled to 28x28 (see ``mnist_data.py``).

Usage: ``python demos/synkhronos_style_mnist.py [--ranks 2] [--epochs 5] [--no-download]``
"""

import argparse
import time

import numpy as np
import pytensor as theano
import pytensor.tensor as T
from mnist_data import load_mnist

import synkhronos as synk
from synkhronos.extensions import lasagne, updates
from synkhronos.extensions.train import make_train_function


def build_mlp(input_var):
    network = lasagne.layers.InputLayer(shape=(None, 1, 28, 28), input_var=input_var)
    network = lasagne.layers.DenseLayer(
        network, num_units=128, nonlinearity=lasagne.nonlinearities.rectify
    )
    return lasagne.layers.DenseLayer(
        network, num_units=10, nonlinearity=lasagne.nonlinearities.softmax
    )


def iterate_minibatch_indices(data_len, batchsize, shuffle=False):
    indices = np.arange(data_len)
    if shuffle:
        np.random.shuffle(indices)
    for start_idx in range(0, data_len - batchsize + 1, batchsize):
        yield indices[start_idx : start_idx + batchsize]


def main(n_parallel=None, batch_size=64, num_epochs=5, data_dir="data/mnist", download=True):
    print("Loading data...")
    X_train, y_train, X_val, y_val, X_test, y_test = load_mnist(data_dir, download=download)

    # Fork worker processes before building variables.
    theano.config.floatX = "float32"
    n_ranks = synk.fork(n_parallel)
    np.random.seed(0)

    input_var = T.tensor4("inputs")
    target_var = T.ivector("targets")
    network = build_mlp(input_var)

    prediction = lasagne.layers.get_output(network)
    loss = lasagne.objectives.categorical_crossentropy(prediction, target_var).mean()
    params = lasagne.layers.get_all_params(network, trainable=True)
    grad_updates, param_updates, grad_shared = updates.nesterov_momentum(
        loss, params, learning_rate=0.05, momentum=0.9
    )

    test_prediction = lasagne.layers.get_output(network, deterministic=True)
    test_loss = lasagne.objectives.categorical_crossentropy(test_prediction, target_var).mean()
    test_acc = T.mean(
        T.eq(T.argmax(test_prediction, axis=1), target_var), dtype=theano.config.floatX
    )

    train_grad_fn = synk.function([input_var, target_var], outputs=loss, updates=grad_updates)
    train_update_fn = synk.function([], updates=param_updates)
    val_fn = synk.function([input_var, target_var], outputs=[test_loss, test_acc])
    synk.distribute()

    # Put data into OS shared memory for worker access.
    X_train, y_train = val_fn.build_inputs(X_train, y_train)
    X_val, y_val = val_fn.build_inputs(X_val, y_val)
    X_test, y_test = val_fn.build_inputs(X_test, y_test)

    print(f"Starting training on {n_ranks} ranks...")
    for epoch in range(num_epochs):
        train_err, train_batches, start_time = 0, 0, time.time()
        for batch in iterate_minibatch_indices(len(y_train), batch_size, shuffle=True):
            train_err += train_grad_fn(X_train, y_train, batch=batch)
            synk.all_reduce(grad_shared)  # averages (exact with uneven splits too)
            train_update_fn()
            train_batches += 1
        val_err, val_acc = val_fn(X_val, y_val, num_slices=2)
        print(f"Epoch {epoch + 1} of {num_epochs} took {time.time() - start_time:.3f}s")
        print(f"  training loss:\t\t{train_err / train_batches:.6f}")
        print(f"  validation loss:\t\t{float(val_err):.6f}")
        print(f"  validation accuracy:\t\t{float(val_acc) * 100:.2f} %")

    # One more epoch with the original's helper, which runs the same three steps.
    train = make_train_function(
        loss,
        params,
        input_var,
        target_var,
        updates.nesterov_momentum,
        learning_rate=0.01,
        momentum=0.9,
    )
    train_err = [
        float(train(X_train, y_train, batch=batch))
        for batch in iterate_minibatch_indices(len(y_train), batch_size, shuffle=True)
    ]
    print(f"make_train_function epoch: training loss {np.mean(train_err):.6f}")

    test_err, test_acc = val_fn(X_test, y_test, num_slices=2)
    print("Final results:")
    print(f"  test loss:\t\t\t{float(test_err):.6f}")
    print(f"  test accuracy:\t\t{float(test_acc) * 100:.2f} %")
    synk.close()
    return float(test_acc)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=None, help="default: one per CPU core")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--data-dir", default="data/mnist")
    parser.add_argument("--no-download", action="store_true")
    args = parser.parse_args()
    main(args.ranks, args.batch_size, args.epochs, args.data_dir, not args.no_download)
