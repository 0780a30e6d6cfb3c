"""Cost of ``synk.verify()`` against a training step, side by side in one run.

The 784-512-512-10 MLP (ReLU, softmax cross-entropy, float32, about 670k parameters)
trained by ``extensions.train.make_step_function`` with Lasagne-style Adam (parameters and
two moment vectors: three copies of every parameter compared), on ``--ranks`` ranks of
each backend, global batch ``--batch``. Timed, best mean of ``--repeat`` rounds of
``--number`` calls each:

* ``step``: the step alone;
* ``step + verify``: the step, then ``synk.verify()`` (what ``fork(verify_every=1)`` runs
  after each call);
* ``verify``: ``synk.verify()`` alone, with every rank agreeing (digests only travel).

Printed side by side with the ratio ``(step + verify) / step`` and the share of an epoch of
``--epoch-steps`` steps that one verify per epoch costs.

Usage: ``python bench/bench_verify.py [--ranks 2] [--batch 256] [--backends cpu jax-cpu]``
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
from timing import best_of

import synkhronos as synk
from synkhronos.extensions.lasagne import updates as lasagne_updates
from synkhronos.extensions.train import make_step_function


def mlp(fx: str):
    """The MLP's parameters, inputs and mean loss."""
    rng = np.random.default_rng(0)
    sizes = [784, 512, 512, 10]
    params = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        params.append(pytensor.shared((rng.normal(size=(a, b)) / np.sqrt(a)).astype(fx)))
        params.append(pytensor.shared(np.zeros(b, fx)))
    x, y = pt.matrix("x"), pt.ivector("y")
    h = x
    for k in range(0, len(params), 2):
        h = h @ params[k] + params[k + 1]
        if k < len(params) - 2:
            h = pt.maximum(h, 0)
    logp = h - pt.logsumexp(h, axis=1, keepdims=True)
    loss = -pt.mean(logp[pt.arange(y.shape[0]), y])
    return params, [x, y], loss


def measure(backend: str, ranks: int, batch: int, repeat: int, number: int) -> dict:
    synk.fork(ranks, backend=backend)
    try:
        fx = pytensor.config.floatX
        params, inputs, loss = mlp(fx)
        step = make_step_function(loss, params, inputs, lasagne_updates.adam, learning_rate=1e-3)
        rng = np.random.default_rng(1)
        x = synk.data(rng.normal(size=(batch, 784)).astype(fx))
        y = synk.data(rng.integers(0, 10, size=batch).astype("int32"))
        step(x, y)
        synk.verify()

        def both():
            step(x, y)
            synk.verify()

        return {
            "step": best_of(lambda: step(x, y), repeat, number),
            "step + verify": best_of(both, repeat, number),
            "verify": best_of(synk.verify, repeat, number),
        }
    finally:
        synk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--backends", nargs="+", default=["cpu", "jax-cpu"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--number", type=int, default=10)
    parser.add_argument("--epoch-steps", type=int, default=100)
    args = parser.parse_args()
    print(f"# {platform.node()} {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# {args.ranks} ranks, batch {args.batch}, MLP 784-512-512-10, Adam")
    print("| backend | step | step + verify | ratio | verify alone | one verify per epoch |")
    print("|---|---|---|---|---|---|")
    for backend in args.backends:
        t = measure(backend, args.ranks, args.batch, args.repeat, args.number)
        epoch = t["verify"] / (args.epoch_steps * t["step"])
        print(
            f"| {backend} | {t['step'] * 1e3:.2f} ms | {t['step + verify'] * 1e3:.2f} ms | "
            f"{t['step + verify'] / t['step']:.2f}x | {t['verify'] * 1e3:.2f} ms | "
            f"{100 * epoch:.2f}% of {args.epoch_steps} steps |",
            flush=True,
        )


if __name__ == "__main__":
    main()
