"""ResNet-110 trained on ranks: exact (batch statistics in rounds) vs inexact vs one process.

The pre-activation ResNet-110 of ``tests/test_deep_resnet.py`` (109 batch normalizations,
CIFAR's 32x32x3 input, float32, ``--batch`` rows a step), trained by momentum:

* ``exact``: ``synk.function`` on ``--ranks`` ranks of ``--backend`` ("cpu"; "gpu": GPU
  ranks, on CPU devices without a GPU), the whole batch's statistics in rounds (3 per
  batch normalization);
* ``inexact``: the same with ``MAX_ROUNDS`` lowered below the rounds it needs, so that each
  rank normalizes by its own rows' statistics (and synkhronos warns);
* ``one``: ``pytensor.function`` of the same line in one process, in the mode named, else
  (``--backend gpu``: in JAX mode, as GPU ranks compile) in the one synkhronos chooses for
  the line (:mod:`synkhronos.api.mode_choice`), with
  PyTensor's in-place and protection passes in synkhronos' faster form, as the ranks build
  theirs (:mod:`synkhronos.rank.inplace_rewrite`, :mod:`synkhronos.rank.protection_check`):
  the same graph, built sooner.

Each runs in a fresh process, twice with the same cache folder: "cold" into an empty one
(``PYTENSOR_FLAGS=base_compiledir=<empty>``), then "warm". Printed per run: seconds to build
the function, to the end of the first step (from the start of the build), and the median of
the next steps; for the ranks, the compile mode and the number of round functions.

Run: ``python bench/bench_deep_resnet.py`` (all), or e.g.
``python bench/bench_deep_resnet.py --cases exact --blocks 4 --runs warm --cache <folder>``
(a "warm" run alone is warm only in a ``--cache`` folder that an earlier run filled).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from timing import child_result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from synkhronos.rank.backends.gpu import visible_gpus  # noqa: E402

CASES = ("one", "inexact", "exact")
NEXT_STEPS = 3


def child(case: str, backend: str, ranks: int, blocks: int, batch: int, mode: str | None) -> None:
    """(In a fresh process) build the case's training function, time it; print JSON."""
    import numpy as np
    import pytensor
    from pytensor.compile.mode import get_mode

    pytensor.config.floatX = "float32"
    import synkhronos as synk
    from synkhronos.api import mode_choice
    from synkhronos.api.split import phases
    from synkhronos.rank.inplace_rewrite import with_fast_inplace
    from synkhronos.rank.protection_check import with_fast_protection_check
    from tests.test_deep_resnet import training

    if case != "one":
        if case == "inexact":
            phases.MAX_ROUNDS = 1
        synk.fork(ranks, backend=backend)
    x, t, loss, updates = training(blocks, 32)
    rng = np.random.default_rng(0)
    data = (
        rng.standard_normal((batch, 3, 32, 32), dtype=np.float32),
        rng.integers(0, 10, batch).astype(np.int32),
    )
    start = time.perf_counter()
    if case == "one":
        roots = [loss, *(value for _, value in updates)]
        if backend == "gpu":
            mode = mode or "JAX"
        mode = mode_choice.choose(mode, None, [x, t], roots, "the line")
        fast = with_fast_protection_check(with_fast_inplace(get_mode(mode)))
        step = pytensor.function([x, t], loss, updates=updates, mode=fast)
        info = {"mode": mode, "rounds": 0}
    else:
        step = synk.function([x, t], loss, updates=updates, mode=mode)
        info = {"mode": step.mode, "rounds": len(getattr(step, "round_functions", []))}
    built = time.perf_counter()
    np.asarray(step(*data))  # JAX mode returns before it computes
    first = time.perf_counter()
    times = []
    for _ in range(NEXT_STEPS):
        begin = time.perf_counter()
        np.asarray(step(*data))
        times.append(time.perf_counter() - begin)
    if case != "one":
        synk.close()
    result = {"build_s": built - start, "first_s": first - start}
    result["next_s"] = sorted(times)[NEXT_STEPS // 2]
    print(json.dumps({**result, **info}), flush=True)


def run(args, case: str, cache: str) -> dict:
    """One run of ``case`` in a fresh process with ``cache`` as the compile folder."""
    env = dict(os.environ, PYTENSOR_FLAGS=f"base_compiledir={cache}")
    if args.backend == "gpu" and not visible_gpus():
        env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, __file__, "--child", case, args.backend, str(args.ranks)]
    cmd += [str(args.blocks)]
    cmd += [str(args.batch), args.mode or "default"]
    result = child_result(cmd, env, args.limit)
    return {"failed": f">{args.limit:.0f} s"} if result is None else result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=18, help="blocks a stage (18: ResNet-110)")
    parser.add_argument("--batch", type=int, default=4, help="rows a step, all ranks")
    parser.add_argument("--mode", default=None, help="a mode to name (default: none)")
    parser.add_argument("--runs", nargs="+", choices=("cold", "warm"), default=["cold", "warm"])
    parser.add_argument("--limit", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--cache", help="a compile folder to keep (default: a new one per case)")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, backend, ranks, blocks, batch, mode = args.child
        mode = None if mode == "default" else mode
        child(case, backend, int(ranks), int(blocks), int(batch), mode)
        return
    ranks = f"{args.ranks} {args.backend.upper()} ranks"
    print(f"ResNet-{6 * args.blocks + 2}, batch {args.batch}, {ranks}", flush=True)
    print(f"{'case':8} {'run':5} {'build s':>8} {'first step s':>12} {'next step ms':>12} "
          f"{'mode':>6} {'rounds':>6}", flush=True)  # fmt: skip
    for case in args.cases:
        with tempfile.TemporaryDirectory(prefix="synk-deep-resnet-") as temporary:
            cache = args.cache or temporary
            for run_name in args.runs:
                res = run(args, case, cache)
                if "failed" in res:
                    print(f"{case:8} {run_name:5} failed: {res['failed'][:200]}", flush=True)
                    break
                print(
                    f"{case:8} {run_name:5} {res['build_s']:8.1f} {res['first_s']:12.1f} "
                    f"{1e3 * res['next_s']:12.1f} {str(res['mode']):>6} {res['rounds']:6d}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
