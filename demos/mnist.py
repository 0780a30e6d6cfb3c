"""Data-parallel MNIST training with synkhronos: an MLP, or a small CNN.

Every rank computes the gradient on its share of each minibatch; one
all-reduce of a single flat gradient vector combines them and every rank
applies the same Adam update, so the parameters stay identical everywhere.

Two data layouts, the paper's two variants (``--data-mode``):

``data``
    The dataset sits in ``synk.data`` arrays in shared memory; each step
    passes the minibatch's row indices (``batch=``) and every rank reads its
    rows in place.
``shared``
    The dataset is scattered once into sliceable shared variables, each rank
    holding its own part (in device memory on GPUs); each step passes every
    rank its row indices into its own part (``batch_s=``).

Run ``python demos/mnist.py --help`` for the options. Without MNIST files and
network access, scikit-learn's 8x8 digits stand in (see ``mnist_data.py``).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
from matplotlib.figure import Figure  # pyplot-free: renders with Agg, needs no display
from mnist_data import load_mnist
from tqdm import tqdm

import synkhronos as synk
from synkhronos.extensions import updates
from synkhronos.extensions.lasagne import init, objectives
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne import updates as lasagne_updates
from synkhronos.extensions.lasagne.nonlinearities import rectify, softmax
from synkhronos.extensions.train import make_step_function, make_train_function

EVAL_ROWS_PER_SLICE = 500  # bounds each rank's activation memory during evaluation


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="global, over all ranks")
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="Adam step size")
    parser.add_argument("--ranks", type=int, default=None, help="default: one per CPU core/GPU")
    parser.add_argument("--backend", choices=("auto", "cpu", "jax-cpu", "gpu"), default="auto")
    parser.add_argument("--data-dir", default="data/mnist")
    parser.add_argument(
        "--no-download", action="store_true", help="never use the network for MNIST"
    )
    parser.add_argument("--data-mode", choices=("data", "shared"), default="data")
    parser.add_argument("--train-size", type=int, default=None, help="use only this many")
    parser.add_argument("--out", default="demos/out", help="directory for the plot")
    parser.add_argument("--seed", type=int, default=0, help="for weights and batch order")
    return parser.parse_args(argv)


def build_network(model: str, input_var: pt.TensorVariable) -> L.Layer:
    """The classifier, Lasagne style: returns its softmax output layer."""
    net = L.InputLayer((None, 1, 28, 28), input_var=input_var)
    if model == "cnn":
        net = L.Conv2DLayer(net, num_filters=16, filter_size=5, nonlinearity=rectify)
        net = L.MaxPool2DLayer(net, pool_size=2)
        net = L.Conv2DLayer(net, num_filters=32, filter_size=5, nonlinearity=rectify)
        net = L.MaxPool2DLayer(net, pool_size=2)
        net = L.DenseLayer(net, num_units=128, nonlinearity=rectify)
    else:
        net = L.DenseLayer(net, num_units=256, nonlinearity=rectify)
        net = L.DenseLayer(net, num_units=256, nonlinearity=rectify)
    return L.DenseLayer(net, num_units=10, nonlinearity=softmax)


def loss_and_accuracy(
    prob: pt.TensorVariable, y: pt.TensorVariable
) -> tuple[pt.TensorVariable, pt.TensorVariable]:
    """Mean cross-entropy and mean accuracy over the rows: "avg" outputs."""
    loss = objectives.categorical_crossentropy(prob, y).mean()
    accuracy = objectives.categorical_accuracy(prob, y).mean()
    return loss, accuracy


Step = Callable[[object], tuple[float, int]]  # batch spec -> (loss, rows used)
Batches = Callable[[np.random.Generator], list]  # one epoch's batch specs


def data_mode(
    net: L.Layer,
    x: pt.TensorVariable,
    y: pt.TensorVariable,
    x_train: np.ndarray,
    y_train: np.ndarray,
    args: argparse.Namespace,
) -> tuple[Step, Batches]:
    """``--data-mode data``: minibatches are row indices into shared-memory ``Data``."""
    loss, _ = loss_and_accuracy(L.get_output(net), y)
    params = L.get_all_params(net, trainable=True)
    # The original Synkhronos' helper: x, y and a three-part rule; train(x, y, batch=rows).
    train = make_train_function(loss, params, x, y, updates.adam, learning_rate=args.learning_rate)
    x_data, y_data = synk.data(x_train, name="x_train"), synk.data(y_train, name="y_train")

    def batches(rng: np.random.Generator) -> list[np.ndarray]:
        order = rng.permutation(len(x_train))
        return [order[i : i + args.batch_size] for i in range(0, len(order), args.batch_size)]

    def step(rows: np.ndarray) -> tuple[float, int]:
        return float(train(x_data, y_data, batch=rows)), len(rows)

    return step, batches


def shared_mode(
    net: L.Layer,
    x_train: np.ndarray,
    y_train: np.ndarray,
    args: argparse.Namespace,
    n_ranks: int,
) -> tuple[Step, Batches]:
    """``--data-mode shared``: each rank indexes its own part, held in shared variables."""
    x_s = pytensor.shared(np.zeros((0, 1, 28, 28), x_train.dtype), name="x_s")
    y_s = pytensor.shared(np.zeros(0, y_train.dtype), name="y_s")
    # The graph reads the shared variables; a call with batch_s substitutes the
    # selected rows of each rank's own copy.
    loss, _ = loss_and_accuracy(L.get_output(net, x_s), y_s)
    params = L.get_all_params(net, trainable=True)
    train = make_step_function(
        loss,
        params,
        [],
        lasagne_updates.adam,
        sliceable_shareds=[x_s, y_s],
        learning_rate=args.learning_rate,
    )
    synk.scatter([x_s, y_s], [x_train, y_train])
    part_lengths = synk.get_lengths(x_s)
    # Each rank contributes its share of the global batch size, drawn from its own part.
    per_rank_batch = [len(p) for p in np.array_split(np.arange(args.batch_size), n_ranks)]
    n_steps = math.ceil(len(x_train) / args.batch_size)

    def batches(rng: np.random.Generator) -> list[list[np.ndarray]]:
        orders = [rng.permutation(n) for n in part_lengths]
        return [
            [order[i * b : (i + 1) * b] for order, b in zip(orders, per_rank_batch, strict=True)]
            for i in range(n_steps)
        ]

    def step(per_rank: list[np.ndarray]) -> tuple[float, int]:
        return float(train(batch_s=per_rank)), sum(len(rows) for rows in per_rank)

    return step, batches


def evaluate(
    function: synk.Function, x_data: synk.Data, y_data: synk.Data, n_ranks: int
) -> tuple[float, float]:
    """Mean loss and accuracy over a whole set, in slices of bounded size on each rank."""
    num_slices = max(1, math.ceil(len(x_data) / n_ranks / EVAL_ROWS_PER_SLICE))
    loss, accuracy = function(x_data, y_data, num_slices=num_slices)
    return float(loss), float(accuracy)


def save_plot(history: dict[str, list], path: Path, title: str) -> None:
    fig = Figure(figsize=(10, 4))
    ax_loss, ax_acc = fig.subplots(1, 2)
    steps = np.arange(1, len(history["step_loss"]) + 1)
    ax_loss.plot(steps, history["step_loss"], lw=0.8, label="train (minibatch)")
    ax_loss.plot(history["epoch_step"], history["val_loss"], "o-", label="validation")
    ax_loss.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="loss")
    ax_loss.legend()
    ax_acc.plot(history["epoch_step"], np.array(history["val_acc"]) * 100, "o-")
    ax_acc.set(xlabel="step", ylabel="%", title="validation accuracy")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # float32, as networks are trained in practice; set before fork, the workers follow.
    pytensor.config.floatX = "float32"
    x_train, y_train, x_val, y_val, x_test, y_test = load_mnist(
        args.data_dir, download=not args.no_download
    )
    if args.train_size is not None:
        x_train, y_train = x_train[: args.train_size], y_train[: args.train_size]

    n_ranks = synk.fork(args.ranks, backend=args.backend)
    print(
        f"{args.model.upper()} on {n_ranks} ranks (backend {synk.backend()}), data mode "
        f"{args.data_mode!r}; {len(x_train)} training, {len(x_val)} validation, "
        f"{len(x_test)} test images"
    )
    x, y = pt.tensor4("x", dtype=x_train.dtype), pt.ivector("y")
    init.set_rng(args.seed)  # reproducible initial weights
    net = build_network(args.model, x)
    if args.data_mode == "data":
        step, batches = data_mode(net, x, y, x_train, y_train, args)
    else:
        step, batches = shared_mode(net, x_train, y_train, args, n_ranks)
    # Evaluation uses the deterministic output, averaged over all rows of a set.
    eval_fn = synk.function(
        [x, y], list(loss_and_accuracy(L.get_output(net, deterministic=True), y)), name="evaluate"
    )
    start = time.perf_counter()
    synk.distribute()  # ships everything built above to every rank and compiles it
    print(f"distributed in {time.perf_counter() - start:.1f} s")
    val = synk.data(x_val), synk.data(y_val)
    test = synk.data(x_test), synk.data(y_test)

    rng = np.random.default_rng(args.seed)
    history: dict[str, list] = {k: [] for k in ("step_loss", "epoch_step", "val_loss", "val_acc")}
    for epoch in range(1, args.epochs + 1):
        epoch_batches = batches(rng)
        samples, busy = 0, 0.0
        bar = tqdm(epoch_batches, desc=f"epoch {epoch}/{args.epochs}", unit="batch")
        for spec in bar:
            start = time.perf_counter()
            loss, rows = step(spec)
            elapsed = time.perf_counter() - start
            history["step_loss"].append(loss)
            if len(history["step_loss"]) == 1:
                # Numba compiles the kernels on each rank's first call: not throughput.
                tqdm.write(f"first step (JIT compilation on every rank) {elapsed:.1f} s")
                continue
            busy += elapsed
            samples += rows
            bar.set_postfix(loss=f"{loss:.3f}", samples_s=f"{samples / busy:.0f}")
        rate = f"{samples / busy:.0f} samples/s" if busy else "no timed steps"
        val_loss, val_acc = evaluate(eval_fn, *val, n_ranks)
        history["epoch_step"].append(len(history["step_loss"]))
        history["val_loss"].append(val_loss)
        history["val_acc"].append(val_acc)
        print(
            f"epoch {epoch}: validation loss {val_loss:.4f}, accuracy {val_acc:.2%}; "
            f"{rate} on {n_ranks} ranks"
        )
    _, test_acc = evaluate(eval_fn, *test, n_ranks)
    print(f"test accuracy {test_acc:.2%}")

    path = Path(args.out) / f"mnist_{args.model}_{args.data_mode}.png"
    title = f"{args.model.upper()}, {n_ranks} ranks, data mode {args.data_mode!r}"
    save_plot(history, path, title)
    print(f"plot saved to {path}")
    synk.close()


if __name__ == "__main__":
    main()
