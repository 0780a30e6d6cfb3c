"""Step time of a 50-tensor model: one flat all-reduce against per-tensor all-reduces.

A training step is: gradient function, all-reduce of the gradients, update function
(see :mod:`synkhronos.extensions.updates`). Three ways to reduce the gradients:

* ``flat``: one ``synk.all_reduce`` of the flat gradient vector (``updates.sgd``);
* ``per_tensor_calls``: one ``synk.all_reduce`` call per parameter tensor (``sgd_nonflat``);
* ``per_tensor_list``: one ``synk.all_reduce`` call given the list of all tensors.

Also timed: ``train``, the step of ``make_step_function`` (flat, row-weighted, SGD).
Prints a table and writes ``bench/out/flat_allreduce.json``.

Usage: ``python bench/bench_flat_allreduce.py [--ranks 2] [--layers 25] [--width 32]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from statistics import median

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.extensions import updates as U
from synkhronos.extensions.lasagne import updates as lasagne_updates
from synkhronos.extensions.train import make_step_function


def build_mlp(layers: int, width: int, seed: int = 0):
    """``layers`` tanh layers (a weight and a bias each); returns params, [x, y], loss."""
    rng = np.random.default_rng(seed)
    params = []
    x, y = pt.matrix("x"), pt.matrix("y")
    h = x
    for i in range(layers):
        w = pytensor.shared(rng.normal(scale=width**-0.5, size=(width, width)), name=f"W{i}")
        b = pytensor.shared(np.zeros(width), name=f"b{i}")
        params += [w, b]
        h = pt.tanh(h @ w + b)
    return params, [x, y], pt.mean(pt.sum(pt.square(h - y), axis=1))


def time_interleaved(cases: dict, steps: int) -> dict[str, list[float]]:
    """Seconds per call of each case, the cases taking turns so that load drifts hit all."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(steps):
        for name, run in cases.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=25, help="2 tensors per layer")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "out" / "flat_allreduce.json"
    )
    args = parser.parse_args()

    n_ranks = synk.fork(args.ranks, backend="cpu")
    rng = np.random.default_rng(1)
    x_data = synk.data(rng.normal(size=(args.batch, args.width)))
    y_data = synk.data(rng.normal(size=(args.batch, args.width)))

    def two_phase_step(rule):
        params, inputs, loss = build_mlp(args.layers, args.width)
        grad_updates, param_updates, grad_shared = rule(loss, params, learning_rate=0.01)
        grad_fn = synk.function(inputs, loss, updates=grad_updates)
        update_fn = synk.function(updates=param_updates)
        return params, grad_shared, grad_fn, update_fn

    params, flat_grad, flat_grad_fn, flat_update_fn = two_phase_step(U.sgd)
    n_tensors = len(params)
    _, per_grads, per_grad_fn, per_update_fn = two_phase_step(U.sgd_nonflat)
    params, inputs, loss = build_mlp(args.layers, args.width)
    train = make_step_function(loss, params, inputs, lasagne_updates.sgd, learning_rate=0.01)

    def reduce_flat():
        synk.all_reduce(flat_grad, op="avg")

    def reduce_calls():
        for g in per_grads:
            synk.all_reduce(g, op="avg")

    def reduce_list():
        synk.all_reduce(per_grads, op="avg")

    def step(grad_fn, reduce, update_fn):
        def run():
            grad_fn(x_data, y_data)
            reduce()
            update_fn()

        return run

    steps = {
        "flat": step(flat_grad_fn, reduce_flat, flat_update_fn),
        "per_tensor_calls": step(per_grad_fn, reduce_calls, per_update_fn),
        "per_tensor_list": step(per_grad_fn, reduce_list, per_update_fn),
        "train": lambda: train(x_data, y_data),
    }
    reduces = {
        "flat": reduce_flat,
        "per_tensor_calls": reduce_calls,
        "per_tensor_list": reduce_list,
    }
    t0 = time.perf_counter()
    for run in steps.values():  # distributes, compiles (Numba: on first call) and warms up
        for _ in range(args.warmup):
            run()
    compile_s = time.perf_counter() - t0
    step_times = time_interleaved(steps, args.steps)
    reduce_times = time_interleaved(reduces, args.steps)
    synk.close()
    results = {
        name: {
            "step_ms": 1e3 * median(step_times[name]),
            "all_reduce_ms": (1e3 * median(reduce_times[name]) if name in reduce_times else None),
        }
        for name in steps
    }

    flat_step = results["flat"]["step_ms"]
    flat_reduce = results["flat"]["all_reduce_ms"]
    record = {
        "ranks": n_ranks,
        "tensors": n_tensors,
        "elements": U.vars_flat_size(params),
        "batch": args.batch,
        "steps": args.steps,
        "compile_s": compile_s,
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "date": time.strftime("%Y-%m-%d"),
        "results": results,
        "step_ratio_per_tensor_calls_over_flat": results["per_tensor_calls"]["step_ms"] / flat_step,
        "all_reduce_ratio_per_tensor_calls_over_flat": results["per_tensor_calls"]["all_reduce_ms"]
        / flat_reduce,
    }
    print(
        f"{n_ranks} ranks, {n_tensors} tensors, {record['elements']} elements, "
        f"batch {args.batch}, median of {args.steps} steps "
        f"(compile and warm-up {compile_s:.1f} s)"
    )
    print(f"{'case':<18}{'step ms':>10}{'all_reduce ms':>15}{'step / flat':>13}")
    for name, r in results.items():
        reduce_ms = "" if r["all_reduce_ms"] is None else f"{r['all_reduce_ms']:.3f}"
        print(f"{name:<18}{r['step_ms']:>10.3f}{reduce_ms:>15}{r['step_ms'] / flat_step:>13.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
