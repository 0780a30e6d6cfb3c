"""A training step ported by its function line, against ``make_step_function``.

The 784-512-512-10 MLP of ``run.py`` (``--sizes``: other layers; float32, SGD lr 0.01 and
Adam) on 2 CPU ranks, its step built two ways in one session:

1. ``synk.function([x, y], loss, updates=rule(loss, params))``: the natural port of a
   Theano script (a :class:`~synkhronos.api.training.TrainingFunction`);
2. ``extensions.train.make_step_function(loss, params, [x, y], rule)``.

Both train the same model from the same start; the run checks that their parameters agree
after the warm-up steps. The two step in turns, block by block (``--blocks`` blocks of
``--steps`` steps each), so that load drifts hit both alike; the figure is each form's
median seconds per step, and the ratio one-line / make_step_function.

Then, per rule, the per-call cost of watching rank 0's shared variables for changes a
program made between calls (:mod:`synkhronos.session.agreed`): the one-line step's check
before the call and its record after it, timed alone (no variable changed, as in a step
of a run), against the step.

Usage::

    python bench/bench_one_line.py [--batch 256] [--steps 20] [--blocks 7] [--sizes 784 512 512 10]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from run import SIZES, data, mlp


def timed_blocks(steps: dict, n_steps: int, blocks: int, clock=time.perf_counter) -> dict:
    """Median seconds per step of each callable, blocks taken in turns, by ``clock``
    (wall time; ``time.process_time``: the process's CPU time, all its threads)."""
    times: dict = {name: [] for name in steps}
    for _ in range(blocks):
        for name, step in steps.items():
            start = clock()
            for _ in range(n_steps):
                step()
            times[name].append((clock() - start) / n_steps)
    return {name: float(np.median(t)) for name, t in times.items()}


def watch_seconds(chain, repeats: int = 2000) -> float:
    """Median seconds of a call's watch of ``chain``: its check of the variables it reads
    (nothing changed) and its record of those it writes, in blocks of ``repeats``."""
    from synkhronos.api.collectives import send_changes
    from synkhronos.session import launch

    session = launch.current()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(repeats):
            send_changes(session, chain._reads)
            session.agreed.agree(chain._leaves)
        times.append((time.perf_counter() - start) / repeats)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="MLP layers")
    args = parser.parse_args()

    import synkhronos as synk
    from synkhronos.extensions import lasagne, train

    synk.fork(2, backend="cpu")
    try:
        xs, ys = data(args.batch * 4)
        xd, yd = synk.data(xs), synk.data(ys)
        sizes = tuple(args.sizes)
        print(f"2 CPU ranks, MLP {'-'.join(map(str, sizes))}, global batch {args.batch}")
        print(f"{'rule':<6} {'one-line s/step':>16} {'make_step s/step':>17} {'ratio':>7}")
        for rule, kwargs in (("sgd", {"learning_rate": 0.01}), ("adam", {})):
            x, y, loss, params = mlp(sizes)
            x2, y2, loss2, params2 = mlp(sizes)
            one_line = synk.function(
                [x, y], loss, updates=getattr(lasagne.updates, rule)(loss, params, **kwargs)
            )
            step = train.make_step_function(
                loss2, params2, [x2, y2], getattr(lasagne.updates, rule), **kwargs
            )
            at = iter(range(10**9))

            def rows(at=at) -> slice:
                lo = (next(at) % 4) * args.batch
                return slice(lo, lo + args.batch)

            batches = [rows() for _ in range(3)]
            for b in batches:  # compile, and check both train the same model
                one_line(xd, yd, batch=b)
                step(xd, yd, batch=b)
            gap = max(
                float(np.abs(p.get_value() - q.get_value()).max())
                for p, q in zip(params, params2, strict=True)
            )
            assert gap < 1e-4, f"the two forms disagree by {gap}"
            times = timed_blocks(
                {
                    "one-line": lambda f=one_line, r=rows: f(xd, yd, batch=r()),
                    "make_step": lambda f=step, r=rows: f(xd, yd, batch=r()),
                },
                args.steps,
                args.blocks,
            )
            ratio = times["one-line"] / times["make_step"]
            print(f"{rule:<6} {times['one-line']:>16.5f} {times['make_step']:>17.5f} {ratio:>7.3f}")
            watch = watch_seconds(one_line.chain)
            print(
                f"{rule:<6} watch of rank 0's shared variables: {watch * 1e6:.1f} us/call "
                f"({len(one_line.chain._reads)} read, {len(one_line.chain._leaves)} written), "
                f"{100 * watch / times['one-line']:.2f} % of a step"
            )
    finally:
        synk.close()


if __name__ == "__main__":
    main()
