"""What bounds a small step on 2 ranks: the MLP tutorial at batch 20 (issue #61).

The MLP tutorial's step (``mlp.py``: 784-500-10, tanh, softmax, L2 penalty, SGD, float64,
batch 20) is split over 2 ranks in one of two ways, and each has a floor no implementation
can go under: the computation each rank must do, plus what the ranks must exchange.

- **all-reduce**: each rank computes the whole gradient (784x500 and the rest) on its 10
  rows, the ranks sum it (392,510 numbers, 3.1 MB), each applies the update. Floor: the
  10-row gradient + the update + ``synk.all_reduce`` of a 392,510-float vector.
- **gathered factors**: at 20 rows the 784x500 gradient is the product of two thin factors
  (the inputs, 20x784, and the hidden layer's deltas, 20x500). Each rank computes the
  forward pass and the deltas on its 10 rows, the ranks gather the factors (26k numbers),
  and each forms the products over all 20 rows and applies the update. Floor: the 10-row
  forward pass and deltas + the 20-row products and update + a training call's fixed cost
  on 2 ranks (a tiny training function's call: its chained command, two functions and an
  all-reduce of a few numbers; the factors' transfer is left out). Also printed: the
  computation alone, and with a plain call's cost (one command, no all-reduce) in place of
  the training call's, and how much time 1.2x leaves for the call and the transfer.

The pieces are compiled as the ranks compile them (no Numba fast-math flags, which keep
fresh and cached code's bits equal) and, for comparison, with them (as
``pytensor.function`` compiles the one-process step). Everything runs in turns, one
thread a process, best of ``--rounds`` blocks; the floors are printed against the
one-process step, whose 1.2x is issue #61's goal.

Usage::

    python bench/bench_small_step.py [--rounds 7] [--calls 200]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402 - after the thread counts, which BLAS reads when loaded
from timing import best_of  # noqa: E402

N_IN, N_HIDDEN, N_OUT, BATCH = 784, 500, 10, 20
LR, L2 = 0.01, 0.0001


def pieces(fast_math: bool) -> dict:
    """The one-process step and each scheme's computation, as functions of no argument."""
    import pytensor
    import pytensor.tensor as pt

    rng = np.random.default_rng(0)
    params = [
        pytensor.shared(rng.uniform(-0.05, 0.05, (N_IN, N_HIDDEN))),
        pytensor.shared(np.zeros(N_HIDDEN)),
        pytensor.shared(rng.uniform(-0.05, 0.05, (N_HIDDEN, N_OUT))),
        pytensor.shared(np.zeros(N_OUT)),
    ]
    w1, b1, w2, b2 = params
    x, y = pt.matrix("x"), pt.ivector("y")
    pre = x @ w1 + b1
    hidden = pt.tanh(pre)
    logits = hidden @ w2 + b2
    nll = -pt.mean(pt.log(pt.special.softmax(logits, axis=-1))[pt.arange(y.shape[0]), y])
    cost = nll + L2 * ((w1**2).sum() + (w2**2).sum())
    grads = pytensor.grad(cost, params)

    def sgd(gs):
        return [(p, p - LR * g) for p, g in zip(params, gs, strict=True)]

    with pytensor.config.change_flags(numba__fastmath=fast_math):
        step = pytensor.function([x, y], cost, updates=sgd(grads))
        factors = pytensor.function([x, y], [hidden, *pytensor.grad(nll, [logits, pre])])
        xs, hs, d2, d1 = pt.matrices("xs", "hs", "d2", "d1")
        products = [xs.T @ d1 + 2 * L2 * w1, d1.sum(0), hs.T @ d2 + 2 * L2 * w2, d2.sum(0)]
        products_and_update = pytensor.function([xs, hs, d2, d1], [], updates=sgd(products))
        local_gradient = pytensor.function([x, y], grads)
        given = [p.type() for p in params]
        update = pytensor.function(given, [], updates=sgd(given))

    xv = rng.standard_normal((BATCH, N_IN))
    yv = rng.integers(0, N_OUT, BATCH).astype("int32")
    half = BATCH // 2
    h, f2, f1 = factors(xv[:half], yv[:half])
    gathered = [xv, np.vstack([h, h]), np.vstack([f2, f2]), np.vstack([f1, f1])]
    local = local_gradient(xv[:half], yv[:half])
    return {
        "step": lambda: step(xv, yv),
        "factors": lambda: factors(xv[:half], yv[:half]),
        "products": lambda: products_and_update(*gathered),
        "local gradient": lambda: local_gradient(xv[:half], yv[:half]),
        "update": lambda: update(*local),
    }


def on_ranks() -> dict:
    """On 2 ranks: a tiny training call, a tiny plain call (one command, no all-reduce),
    and the all-reduce of the MLP's gradient."""
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk

    w = pytensor.shared(np.ones(3))
    x = pt.matrix("x")
    loss = ((x @ w) ** 2).mean()
    tiny = synk.function([x], loss, updates=[(w, w - 0.001 * pytensor.grad(loss, w))])
    n = N_IN * N_HIDDEN + N_HIDDEN + N_HIDDEN * N_OUT + N_OUT
    flat = pytensor.shared(np.ones(n), name="flat_gradient")
    synk.function([x], (x @ w).sum() + flat.sum())  # so that the workers hold ``flat``
    plain = synk.function([x], (x @ w).sum())
    synk.distribute()
    rows = np.random.default_rng(1).standard_normal((BATCH, 3))
    return {
        "tiny training call": lambda: tiny(rows),
        "tiny plain call": lambda: plain(rows),
        "all_reduce 392,510 floats": lambda: synk.all_reduce(flat, op="avg"),
    }


def best_times(cases: dict, rounds: int, calls: int) -> dict:
    """Best seconds a call of each case, the cases taking turns block by block."""
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(rounds):
        for name, call in cases.items():
            best_of(call, 1, calls // 10)  # warm
            best[name] = min(best[name], best_of(call, 1, calls))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()

    import synkhronos as synk

    synk.fork(2)
    try:
        cases = {
            f"{name} ({'fast-math' if fm else 'ranks'})": call
            for fm in (True, False)
            for name, call in pieces(fm).items()
        }
        cases.update(on_ranks())
        t = best_times(cases, args.rounds, args.calls)
    finally:
        synk.close()
    for name, seconds in t.items():
        print(f"{name:40s} {seconds * 1e3:8.3f} ms")
    step = t["step (fast-math)"]
    call = t["tiny training call"]
    for label in ("ranks", "fast-math"):
        gathered = t[f"factors ({label})"] + t[f"products ({label})"] + call
        reduced = t[f"local gradient ({label})"] + t[f"update ({label})"]
        reduced += t["all_reduce 392,510 floats"]
        print(
            f"floor, pieces compiled as {label:9s}: gathered factors {gathered * 1e3:.3f} ms "
            f"({step / gathered:.2f}x the one-process step), all-reduce {reduced * 1e3:.3f} ms "
            f"({step / reduced:.2f}x); goal 1.2x"
        )
    computed = t["factors (fast-math)"] + t["products (fast-math)"]
    print(
        f"gathered factors, computation alone: {computed * 1e3:.3f} ms ({step / computed:.2f}x); "
        f"with a plain call's cost instead of a training call's: "
        f"{step / (computed + t['tiny plain call']):.2f}x; left for the call and the transfer "
        f"at 1.2x: {(step / 1.2 - computed) * 1e6:.0f} us"
    )


if __name__ == "__main__":
    main()
