"""Core speed, measured side by side in one run and printed as ratios.

1. Per-call overhead: a synk function on 1 rank vs ``pytensor.function`` on a tiny graph
   (goal: at most 50 us more per call), and the same on 2 ranks.
2. ``all_reduce`` of a 25M-element float32 vector on 2 ranks vs one numpy copy of the same
   bytes (goal: within 3x).
3. Zero-copy scatter: a call's time does not grow with rows the call does not select.
4. A tiny call that updates shared variables vs the same call without updates (the cost
   of applying updates only once every rank has computed), and a large update
   (``w - lr * g`` on ``--size`` float32) called alone, which writes a new array, vs the
   same function as a chain's step, which PyTensor updates in place.
5. A function, an ``all_reduce`` and a second function (a training step's shape) chained
   into one command (``synk.chain``) vs sent as three commands, on a tiny graph.

Run: ``.venv/bin/python bench/bench_core.py [--ranks 2] [--size 25000000]``.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytensor
import pytensor.tensor as pt
from timing import best_of

import synkhronos as synk


def call_overhead(n_ranks: int) -> tuple[float, float]:
    x = pt.vector("x")
    plain = pytensor.function([x], x.sum())
    synk.fork(n_ranks, backend="cpu")
    try:
        f = synk.function([x], (x.sum(), "sum"))
        data = synk.data(np.ones(8, dtype=x.dtype))
        f(data)
        t_synk = best_of(lambda: f(data), 5, 2000)
    finally:
        synk.close()
    t_plain = best_of(lambda: plain(data.data), 5, 2000)
    return t_plain, t_synk


def call_with_updates(n_ranks: int) -> tuple[float, float]:
    """A tiny call that updates two shared variables, and the same call without updates."""
    x = pt.vector("x")
    synk.fork(n_ranks, backend="cpu")
    try:
        v = pytensor.shared(np.zeros(4, dtype=x.dtype), name="v")
        n = pytensor.shared(np.int64(0), name="n")
        f = synk.function([x], (x.sum(), "sum"), updates=[(v, v + x.sum()), (n, n + 1)])
        g = synk.function([x], (x.sum(), "sum"))
        data = synk.data(np.ones(8, dtype=x.dtype))
        f(data)
        g(data)
        t_updates = best_of(lambda: f(data), 5, 2000)
        t_plain = best_of(lambda: g(data), 5, 2000)
    finally:
        synk.close()
    return t_updates, t_plain


def large_update_call_vs_chain(n_ranks: int, size: int) -> tuple[float, float]:
    """Seconds per call of a ``size``-float32 SGD update: called alone, and chained."""
    synk.fork(n_ranks, backend="cpu")
    try:
        w = pytensor.shared(np.zeros(size, dtype="float32"), name="w")
        g = pytensor.shared(np.ones(size, dtype="float32"), name="g")
        f = synk.function([], updates=[(w, w - np.float32(0.01) * g)])
        step = synk.chain(f)
        f()
        step()
        t_call = best_of(f, 5, 10)
        t_chain = best_of(step, 5, 10)
    finally:
        synk.close()
    return t_call, t_chain


def all_reduce_vs_copy(n_ranks: int, size: int) -> tuple[float, float]:
    value = np.random.default_rng(0).normal(size=size).astype("float32")
    target = np.empty_like(value)
    t_copy = best_of(lambda: np.copyto(target, value), 5, 3)
    synk.fork(n_ranks, backend="cpu")
    try:
        flat = pytensor.shared(value, name="flat")
        synk.function([], flat.sum())
        synk.distribute()
        synk.broadcast(flat)
        synk.all_reduce(flat, op="avg")
        t_reduce = best_of(lambda: synk.all_reduce(flat, op="avg"), 5, 3)
    finally:
        synk.close()
    return t_copy, t_reduce


def scatter_zero_copy(n_ranks: int) -> tuple[float, float]:
    x = pt.matrix("x")
    synk.fork(n_ranks, backend="cpu")
    try:
        f = synk.function([x], (x.sum(), "sum"))
        small = synk.data(np.ones((1000, 100), dtype=x.dtype))
        large = synk.data(np.ones((200_000, 100), dtype=x.dtype))
        f(small)
        f(large, batch=1000)
        t_small = best_of(lambda: f(small), 5, 200)
        t_large = best_of(lambda: f(large, batch=slice(50_000, 51_000)), 5, 200)
    finally:
        synk.close()
    return t_small, t_large


def chained_vs_separate(n_ranks: int) -> tuple[float, float]:
    x = pt.vector("x")
    synk.fork(n_ranks, backend="cpu")
    try:
        v = pytensor.shared(np.zeros(4, dtype=x.dtype), name="v")
        f = synk.function([x], x.sum(), updates=[(v, v + x.sum())])
        g = synk.function([], updates=[(v, v * 0.5)])
        step = synk.chain(f, ("all_reduce", v, "sum"), g)
        data = synk.data(np.ones(8, dtype=x.dtype))

        def separate():
            f(data)
            synk.all_reduce(v, op="sum")
            g()

        step(data)
        separate()
        t_chain = best_of(lambda: step(data), 5, 500)
        t_separate = best_of(separate, 5, 500)
    finally:
        synk.close()
    return t_chain, t_separate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--size", type=int, default=25_000_000)
    args = parser.parse_args()
    rows = []
    t_plain, t_one = call_overhead(1)
    rows.append(
        (
            "call overhead, 1 rank (us over pytensor)",
            (t_one - t_plain) * 1e6,
            f"{t_one * 1e6:.1f} us vs {t_plain * 1e6:.1f} us",
        )
    )
    _, t_many = call_overhead(args.ranks)
    rows.append(
        (
            f"call, {args.ranks} ranks (us over pytensor)",
            (t_many - t_plain) * 1e6,
            f"{t_many * 1e6:.1f} us",
        )
    )
    t_updates, t_no_updates = call_with_updates(args.ranks)
    rows.append(
        (
            f"call updating 2 shared variables, {args.ranks} ranks (us over none)",
            (t_updates - t_no_updates) * 1e6,
            f"{t_updates * 1e6:.1f} us vs {t_no_updates * 1e6:.1f} us",
        )
    )
    t_call, t_chain = large_update_call_vs_chain(args.ranks, args.size)
    rows.append(
        (
            f"update of {args.size / 1e6:g}M float32: call / chain (in place)",
            t_call / t_chain,
            f"{t_call * 1e3:.1f} ms vs {t_chain * 1e3:.1f} ms",
        )
    )
    t_copy, t_reduce = all_reduce_vs_copy(args.ranks, args.size)
    rows.append(
        (
            f"all_reduce {args.size / 1e6:g}M float32 / numpy copy",
            t_reduce / t_copy,
            f"{t_reduce * 1e3:.1f} ms vs {t_copy * 1e3:.1f} ms",
        )
    )
    t_small, t_large = scatter_zero_copy(args.ranks)
    rows.append(
        (
            "1000-row call: in 200k-row Data / in 1000-row Data",
            t_large / t_small,
            f"{t_large * 1e6:.0f} us vs {t_small * 1e6:.0f} us",
        )
    )
    t_chain, t_separate = chained_vs_separate(args.ranks)
    rows.append(
        (
            "function, all_reduce, function: chained / 3 commands",
            t_chain / t_separate,
            f"{t_chain * 1e6:.0f} us vs {t_separate * 1e6:.0f} us",
        )
    )
    print(f"{'measure':58s} {'value':>9s}  detail")
    for name, value, detail in rows:
        print(f"{name:58s} {value:9.2f}  {detail}")


if __name__ == "__main__":
    main()
