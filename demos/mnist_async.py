"""MNIST with synchronous SGD, EASGD (synchronous and asynchronous), Downpour and gossip SGD.

``--algorithm sync`` is the data-parallel step of ``extensions.train``: every step one
command, one all-reduce, one global minibatch of ``ranks x batch-size`` rows. The others
are the trainers of ``synkhronos.extensions.asynchronous``: each rank runs local steps of
``batch-size`` rows on its own share of the training set, exchanging as its algorithm
says, and one command starts a whole phase. All use plain SGD with the same learning
rate and see the same number of samples per (global) step; the asynchronous ones are
evaluated on their centre.

``--all`` runs sync first, then each other algorithm for ``--sample-factor`` times the
samples sync used, and reports how many samples each needed to come within one point of
sync's final validation accuracy. The plot shows validation accuracy against training
wall time (evaluation excluded) and against samples.

Without MNIST files and network access, scikit-learn's 8x8 digits stand in (see
``mnist_data.py``).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
from matplotlib.figure import Figure  # pyplot-free: renders with Agg, needs no display
from mnist_data import load_mnist
from tqdm import tqdm

import synkhronos as synk
from synkhronos.extensions.asynchronous import EASGD, AsyncEASGD, Downpour, Gossip, LocalStep
from synkhronos.extensions.lasagne import init, objectives
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne import updates as lasagne_updates
from synkhronos.extensions.lasagne.nonlinearities import rectify, softmax
from synkhronos.extensions.train import make_step_function

ALGORITHMS = ("sync", "easgd", "easgd-async", "downpour", "gossip")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="easgd-async")
    parser.add_argument("--all", action="store_true", help="run every algorithm and compare")
    parser.add_argument("--epochs", type=float, default=4, help="of sync (the others: x factor)")
    parser.add_argument(
        "--sample-factor",
        type=float,
        default=1.5,
        help="with --all: samples of the others, in multiples of sync's",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="rows per rank per step")
    parser.add_argument("--learning-rate", type=float, default=0.1, help="SGD step size")
    parser.add_argument("--evals", type=int, default=4, help="evaluations per epoch")
    parser.add_argument("--tau", type=int, default=4, help="EASGD: steps between exchanges")
    parser.add_argument("--alpha", type=float, default=0.2, help="EASGD: elastic force")
    parser.add_argument("--n-push", type=int, default=1, help="Downpour: steps between pushes")
    parser.add_argument("--n-pull", type=int, default=2, help="Downpour: steps between pulls")
    parser.add_argument("--p", type=float, default=0.2, help="gossip: send probability")
    parser.add_argument("--hidden", type=int, default=128, help="units per hidden layer")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backend", choices=("auto", "cpu", "jax-cpu", "gpu"), default="cpu")
    parser.add_argument("--data-dir", default="data/mnist")
    parser.add_argument(
        "--no-download", action="store_true", help="never use the network for MNIST"
    )
    parser.add_argument("--train-size", type=int, default=None, help="use only this many")
    parser.add_argument("--out", default="demos/out", help="directory for the plot")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def build_network(input_var: pt.TensorVariable, hidden: int) -> L.Layer:
    net = L.InputLayer((None, 1, 28, 28), input_var=input_var)
    net = L.DenseLayer(net, num_units=hidden, nonlinearity=rectify)
    net = L.DenseLayer(net, num_units=hidden, nonlinearity=rectify)
    return L.DenseLayer(net, num_units=10, nonlinearity=softmax)


class Model:
    """The network, its step functions and a rank-0 evaluation of the parameters."""

    def __init__(self, args: argparse.Namespace, dtype):
        self.x, self.y = pt.tensor4("x", dtype=dtype), pt.ivector("y")
        init.set_rng(args.seed)
        net = build_network(self.x, args.hidden)
        self.params = L.get_all_params(net, trainable=True)
        self.initial = [p.get_value() for p in self.params]
        prob = L.get_output(net)
        loss = objectives.categorical_crossentropy(prob, self.y).mean()
        inputs = [self.x, self.y]
        self.sync_step = make_step_function(
            loss, self.params, inputs, lasagne_updates.sgd, learning_rate=args.learning_rate
        )
        self.local_step = LocalStep(
            loss, self.params, inputs, lasagne_updates.sgd, learning_rate=args.learning_rate
        )
        accuracy = objectives.categorical_accuracy(
            L.get_output(net, deterministic=True), self.y
        ).mean()
        # Rank 0 alone evaluates: the ranks' own parameters are left as they are.
        self.accuracy = pytensor.function(inputs, accuracy)

    def reset(self) -> None:
        """Every rank back to the initial weights."""
        for param, value in zip(self.params, self.initial, strict=True):
            param.set_value(value)
        synk.broadcast(self.params)

    def evaluate(self, values: list[np.ndarray] | None, x: np.ndarray, y: np.ndarray) -> float:
        """Validation accuracy of ``values`` (default: rank 0's parameters)."""
        own = [p.get_value() for p in self.params]
        if values is not None:
            for param, value in zip(self.params, values, strict=True):
                param.set_value(value)
        accuracy = float(self.accuracy(x, y))
        for param, value in zip(self.params, own, strict=True):
            param.set_value(value)
        return accuracy


def make_trainer(name: str, model: Model, args: argparse.Namespace):
    step, b = model.local_step, args.batch_size
    if name == "easgd":
        return EASGD(step, b, tau=args.tau, alpha=args.alpha)
    if name == "easgd-async":
        return AsyncEASGD(step, b, tau=args.tau, alpha=args.alpha)
    if name == "downpour":
        return Downpour(step, b, n_push=args.n_push, n_pull=args.n_pull)
    return Gossip(step, b, p=args.p, seed=args.seed)


def train(
    name: str, model: Model, data: dict, args: argparse.Namespace, n_ranks: int, epochs: float
) -> dict[str, list]:
    """Train one algorithm for ``epochs``; the history of (wall time, samples, accuracy).

    One step first, untimed: Numba compiles the kernels on each rank's first call."""
    x_data, y_data = data["train"]
    global_batch = args.batch_size * n_ranks
    if name == "sync":
        model.sync_step(x_data, y_data, batch=slice(0, global_batch))
    else:
        with make_trainer(name, model, args) as warm_up:
            warm_up.run([x_data, y_data], 1)
    model.reset()
    # A new trainer's centre is rank 0's weights: the initial ones.
    trainer = None if name == "sync" else make_trainer(name, model, args)
    steps_per_eval = max(1, len(x_data) // global_batch // args.evals)
    n_evals = max(1, math.ceil(epochs * args.evals))
    history = {"time": [0.0], "samples": [0], "accuracy": [model.evaluate(None, *data["val"])]}
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(x_data))
    position = 0
    for _ in tqdm(range(n_evals), desc=name, unit="phase"):
        start = time.perf_counter()
        if trainer is None:
            for _ in range(steps_per_eval):
                if position + global_batch > len(order):
                    order, position = rng.permutation(len(x_data)), 0
                model.sync_step(x_data, y_data, batch=order[position : position + global_batch])
                position += global_batch
            samples, centre = steps_per_eval * global_batch, None
        else:
            result = trainer.run([x_data, y_data], steps_per_eval)
            samples, centre = result.samples, result.centre
        history["time"].append(history["time"][-1] + time.perf_counter() - start)
        history["samples"].append(history["samples"][-1] + samples)
        history["accuracy"].append(model.evaluate(centre, *data["val"]))
    if trainer is not None:
        trainer.close()
    tqdm.write(
        f"{name}: validation accuracy {history['accuracy'][-1]:.2%} after "
        f"{history['samples'][-1]} samples, {history['time'][-1]:.1f} s "
        f"({history['samples'][-1] / history['time'][-1]:.0f} samples/s)"
    )
    return history


def samples_to_reach(history: dict[str, list], accuracy: float) -> int | None:
    """The samples of the first evaluation at or above ``accuracy`` (None if never)."""
    for samples, value in zip(history["samples"], history["accuracy"], strict=True):
        if value >= accuracy:
            return samples
    return None


def save_plot(histories: dict[str, dict], path: Path, title: str) -> None:
    fig = Figure(figsize=(10, 4))
    by_time, by_samples = fig.subplots(1, 2)
    for name, history in histories.items():
        accuracy = np.array(history["accuracy"]) * 100
        by_time.plot(history["time"], accuracy, "o-", ms=3, label=name)
        by_samples.plot(history["samples"], accuracy, "o-", ms=3, label=name)
    by_time.set(xlabel="training wall time (s)", ylabel="validation accuracy (%)")
    by_samples.set(xlabel="samples", ylabel="validation accuracy (%)")
    by_time.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    pytensor.config.floatX = "float32"  # set before fork: the workers follow
    x_train, y_train, x_val, y_val, _, _ = load_mnist(args.data_dir, download=not args.no_download)
    if args.train_size is not None:
        x_train, y_train = x_train[: args.train_size], y_train[: args.train_size]
    n_ranks = synk.fork(args.ranks, backend=args.backend)
    print(
        f"{n_ranks} ranks (backend {synk.backend()}); {len(x_train)} training, "
        f"{len(x_val)} validation images; {args.batch_size} rows per rank per step"
    )
    model = Model(args, x_train.dtype)
    start = time.perf_counter()
    synk.distribute()
    print(f"distributed in {time.perf_counter() - start:.1f} s")
    data = {"train": (synk.data(x_train), synk.data(y_train)), "val": (x_val, y_val)}

    names = ALGORITHMS if args.all else (args.algorithm,)
    histories = {}
    for name in names:
        epochs = args.epochs * (args.sample_factor if args.all and name != "sync" else 1)
        histories[name] = train(name, model, data, args, n_ranks, epochs)
    if args.all:
        sync = histories["sync"]
        target = sync["accuracy"][-1] - 0.01
        print(
            f"sync: {sync['accuracy'][-1]:.2%} after {sync['samples'][-1]} samples; "
            f"samples each needed to reach {target:.2%}:"
        )
        for name in names[1:]:
            reached = samples_to_reach(histories[name], target)
            ratio = "never" if reached is None else f"{reached / sync['samples'][-1]:.2f}x sync"
            print(f"  {name}: {reached} ({ratio}); best {max(histories[name]['accuracy']):.2%}")
    path = Path(args.out) / ("mnist_async_all.png" if args.all else f"mnist_{names[0]}.png")
    save_plot(histories, path, f"MLP, {n_ranks} ranks, {args.batch_size} rows per rank per step")
    print(f"plot saved to {path}")
    synk.close()


if __name__ == "__main__":
    main()
