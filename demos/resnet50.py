"""ResNet-50 training throughput on synthetic ImageNet-shaped data.

Random 224x224 RGB images with random labels out of 1000 classes: what is
measured is the speed of data-parallel training steps (gradient on each rank,
one all-reduce of the flat gradient vector, SGD-momentum update on each rank),
reported as images per second in total and per rank. After training it checks
that every BatchNormLayer's running mean and inverse standard deviation, which
each rank moves with its own images, are identical on all ranks (the training
step averages them over the ranks). Run:
``python demos/resnet50.py --ranks 2 --batch-size 8 --steps 5``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
from resnet import resnet50

import synkhronos as synk
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne import objectives, updates
from synkhronos.extensions.train import make_step_function

N_CLASSES = 1000
IMAGE_SHAPE = (3, 224, 224)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=None, help="default: one per CPU core/GPU")
    parser.add_argument("--batch-size", type=int, default=8, help="images per rank per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--backend", choices=("auto", "cpu", "jax-cpu", "gpu"), default="auto")
    parser.add_argument(
        "--mode",
        default=None,
        help="PyTensor compile mode (default: the library's; on cpu ranks a graph this "
        "large compiles op by op, in CVM)",
    )
    return parser.parse_args(argv)


def running_state_report(state: list, initial: list[np.ndarray]) -> str:
    """Gather the running state from every rank; say how far the ranks' values are apart
    (0: identical) and how far they moved from ``initial`` (a check that training moved them)."""
    per_rank = synk.gather(state, nd_up=1)  # each variable: one row per rank
    spread = max(float(np.abs(values - values[0]).max()) for values in per_rank)
    moved = max(float(np.abs(values[0] - start).max())
                for values, start in zip(per_rank, initial, strict=True))  # fmt: skip
    return (f"batch-norm running state: {len(state)} variables, largest difference between "
            f"ranks {spread:.3g}, largest change since initialisation {moved:.3g}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # float32, as networks are trained in practice; set before fork, the workers follow.
    pytensor.config.floatX = "float32"
    n_ranks = synk.fork(args.ranks, backend=args.backend)

    x, y = pt.tensor4("x", dtype="float32"), pt.ivector("y")
    net = resnet50(L.InputLayer((None, *IMAGE_SHAPE), input_var=x), num_classes=N_CLASSES)
    loss = objectives.categorical_crossentropy(L.get_output(net), y).mean()
    params = L.get_all_params(net, trainable=True)
    n_params = sum(p.get_value(borrow=True).size for p in params)
    train = make_step_function(
        loss, params, [x, y], updates.momentum, learning_rate=0.01, momentum=0.9, mode=args.mode
    )
    print(
        f"ResNet-50: {len(params)} parameter tensors, {n_params / 1e6:.1f}M parameters; "
        f"{n_ranks} ranks (backend {args.backend}, mode {args.mode or 'the default'})"
    )

    initial_state = [v.get_value() for v in train.state]
    rng = np.random.default_rng(0)
    total_batch = args.batch_size * n_ranks
    images = synk.data(rng.random((total_batch, *IMAGE_SHAPE), dtype=np.float32))
    labels = synk.data(rng.integers(0, N_CLASSES, total_batch, dtype=np.int32))

    start = time.perf_counter()
    for _ in range(args.warmup):
        train(images, labels)
    if args.warmup:  # the first step compiles the step on every rank
        print(
            f"{args.warmup} untimed step(s), compiling included: "
            f"{time.perf_counter() - start:.1f} s"
        )
    times = []
    for i in range(args.steps):
        start = time.perf_counter()
        loss_value = train(images, labels)
        times.append(time.perf_counter() - start)
        print(f"step {i + 1}/{args.steps}: loss {float(loss_value):.3f}, {times[-1]:.2f} s")
    per_step = float(np.median(times))
    total = total_batch / per_step
    print(
        f"{total:.1f} images/s in total, {total / n_ranks:.1f} images/s per rank "
        f"(median step {per_step:.2f} s, {args.batch_size} images per rank)"
    )
    print(running_state_report(train.state, initial_state))
    synk.close()


if __name__ == "__main__":
    main()
