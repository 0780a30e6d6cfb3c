"""The benchmark suite: one run, figures side by side, printed as a table of ratios.

* per-call overhead vs plain PyTensor, all_reduce vs a numpy copy, zero-copy scatter
  (from ``bench_core.py``);
* MNIST-MLP training throughput (784-512-512-10, float32, SGD, global batch 256, synthetic
  MNIST-shaped data) with 1..N ranks vs plain single-process PyTensor and vs PyTorch on
  the same cores (PyTorch only if installed: it is not a dependency); scaling efficiency;
* a scaling plot, ``bench/out/scaling.png``.

Run: ``make bench`` or ``.venv/bin/python bench/run.py [--max-ranks N] [--steps S]``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import bench_core
import numpy as np
from timing import best_of

SIZES = (784, 512, 512, 10)


def mlp(sizes: tuple[int, ...] = SIZES, seed: int = 0):
    """Symbolic MLP of layer ``sizes``: returns (x, y, loss, params) in floatX."""
    import pytensor
    import pytensor.tensor as pt

    x, y = pt.matrix("x"), pt.ivector("y")
    rng = np.random.default_rng(seed)
    params, h = [], x
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        w = pytensor.shared((rng.normal(size=(n_in, n_out)) / np.sqrt(n_in)).astype(x.dtype))
        b = pytensor.shared(np.zeros(n_out, dtype=x.dtype))
        params += [w, b]
        h = h @ w + b
        h = pt.maximum(h, 0) if i < len(sizes) - 2 else pt.special.log_softmax(h, axis=1)
    loss = -h[pt.arange(y.shape[0]), y].mean()
    return x, y, loss, params


def mlp_step_chains(synk, sizes: tuple[int, ...] = SIZES):
    """The MLP's SGD step (``extensions.train``) twice: as ``train`` runs it (one XLA
    program per rank on JAX backends) and as the same chain step by step. Returns
    ``(x, fused, step_by_step)``."""
    from synkhronos.extensions import train
    from synkhronos.extensions.lasagne import updates

    x, y, loss, params = mlp(sizes=sizes)
    step = train.make_step_function(loss, params, [x, y], updates.sgd, learning_rate=0.01)
    step_by_step = synk.chain(
        step.grad_function,
        ("all_reduce", step.phases.flat_grad, "sum"),
        step.update_function,
        every_rank_rows=True,
        fuse=False,
    )
    return x, step.chain, step_by_step


def data(n: int, seed: int = 0):
    import pytensor

    rng = np.random.default_rng(seed)
    return (
        rng.random((n, SIZES[0])).astype(pytensor.config.floatX),
        rng.integers(0, SIZES[-1], n).astype("int32"),
    )


def synk_throughput(n_ranks: int, batch: int, steps: int) -> float:
    import synkhronos as synk
    from synkhronos.extensions import train
    from synkhronos.extensions.lasagne import updates

    synk.fork(n_ranks, backend="cpu")
    try:
        x, y, loss, params = mlp()
        step = train.make_step_function(loss, params, [x, y], updates.sgd, learning_rate=0.01)
        xs, ys = data(batch * 8)
        xd, yd = synk.data(xs), synk.data(ys)
        batches = iter(range(10**9))

        def one_step():
            lo = (next(batches) % 8) * batch
            step(xd, yd, batch=slice(lo, lo + batch))

        one_step()
        return batch / best_of(one_step, 3, steps)
    finally:
        synk.close()


def pytensor_throughput(batch: int, steps: int, threads: int) -> float:
    """Plain single-process PyTensor, its BLAS limited to ``threads`` threads."""
    from threadpoolctl import threadpool_limits

    from synkhronos.extensions import train
    from synkhronos.extensions.lasagne import updates

    x, y, loss, params = mlp()
    step = train.make_pytensor_step_function(loss, params, [x, y], updates.sgd, learning_rate=0.01)
    xs, ys = data(batch)
    with threadpool_limits(limits=threads):
        step(xs, ys)
        return batch / best_of(lambda: step(xs, ys), 3, steps)


def torch_throughput(batch: int, steps: int, threads: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(SIZES[:-1], SIZES[1:], strict=True)):
        layers.append(torch.nn.Linear(n_in, n_out))
        if i < len(SIZES) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    xs, ys = data(batch)
    xt, yt = torch.from_numpy(xs), torch.from_numpy(ys.astype("int64"))

    def one_step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        optimizer.step()

    one_step()
    return batch / best_of(one_step, 3, steps)


def plot(ranks: list[int], rates: list[float], single: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ranks, rates, "o-", label="synkhronos")
    ax.plot(
        ranks,
        [single * r for r in ranks],
        "--",
        color="gray",
        label="linear from 1-thread PyTensor",
    )
    ax.set_xlabel("ranks (CPU cores)")
    ax.set_ylabel("samples / s")
    ax.set_title("MNIST MLP training throughput")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-ranks", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=25_000_000)
    args = parser.parse_args()
    import pytensor

    pytensor.config.floatX = "float32"  # as PyTorch below; the workers inherit it

    rows = []
    t_plain, t_one = bench_core.call_overhead(1)
    rows.append(("call overhead, 1 rank, over pytensor (us)", (t_one - t_plain) * 1e6))
    t_copy, t_reduce = bench_core.all_reduce_vs_copy(min(2, args.max_ranks), args.size)
    rows.append((f"all_reduce {args.size / 1e6:g}M float32 / numpy copy", t_reduce / t_copy))
    t_small, t_large = bench_core.scatter_zero_copy(min(2, args.max_ranks))
    rows.append(("1000-row call in 200k-row Data / in 1000-row Data", t_large / t_small))

    # Scaling is measured against one core: plain PyTensor with one BLAS thread. The same
    # process with every core's BLAS threads is the serial program a user starts from.
    single = pytensor_throughput(args.batch, args.steps, threads=1)
    threaded = pytensor_throughput(args.batch, args.steps, threads=args.max_ranks)
    rows.append(("MLP samples/s, plain PyTensor, 1 BLAS thread", single))
    rows.append((f"MLP samples/s, plain PyTensor, {args.max_ranks} BLAS threads", threaded))
    ranks = list(range(1, args.max_ranks + 1))
    rates = [synk_throughput(n, args.batch, args.steps) for n in ranks]
    for n, rate in zip(ranks, rates, strict=True):
        rows.append(
            (f"MLP samples/s, synkhronos {n} rank(s), {args.max_ranks // n} thread(s) each", rate)
        )
        rows.append(
            (f"  / plain 1 thread (scaling efficiency {rate / (single * n):.2f})", rate / single)
        )
        rows.append((f"  / plain {args.max_ranks} BLAS threads", rate / threaded))
    torch_rate = torch_throughput(args.batch, args.steps, args.max_ranks)
    if torch_rate is None:
        rows.append(("PyTorch: not installed (pip install torch==2.13.0)", float("nan")))
    else:
        rows.append((f"MLP samples/s, PyTorch CPU, {args.max_ranks} threads", torch_rate))
        rows.append((f"  synkhronos {args.max_ranks} ranks / PyTorch", rates[-1] / torch_rate))
    plot(ranks, rates, single, Path(__file__).parent / "out" / "scaling.png")

    print(f"{'measure':64s} {'value':>12s}")
    for name, value in rows:
        print(f"{name:64s} {value:12.2f}")
    print("scaling plot: bench/out/scaling.png")


if __name__ == "__main__":
    main()
