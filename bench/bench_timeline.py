"""The timeline's cost: bench_core's call-overhead rows with the timeline off, on, and in a
tree without the timeline's code, side by side, in alternating rounds.

Each measurement runs ``bench_core.call_overhead`` (a tiny graph, best of 5 x 2000 calls)
in a fresh interpreter: this tree with no timeline, this tree with ``SYNK_TIMELINE`` set,
and with ``--baseline TREE`` that tree (``git archive <commit> | tar -x -C TREE``), whose
``synkhronos`` and ``bench_core`` go first on ``PYTHONPATH``. Printed: the microseconds a
call takes over ``pytensor.function``, per rank count, median and range over the rounds,
and the ratios off / without and on / off.

Run: ``.venv/bin/python bench/bench_timeline.py [--ranks 2] [--rounds 3] [--baseline TREE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MEASURE = """
import json, sys
sys.path.insert(0, {bench!r})
import bench_core, synkhronos
t_plain, t_synk = bench_core.call_overhead({n_ranks})
print(json.dumps([t_plain, t_synk, synkhronos.__file__]))
"""


def overhead(n_ranks: int, tree: Path | None, timeline: str | None) -> float:
    """Microseconds a tiny call takes over ``pytensor.function``, in a fresh interpreter."""
    env = dict(os.environ)
    env.pop("SYNK_TIMELINE", None)
    if timeline is not None:
        env["SYNK_TIMELINE"] = timeline
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    bench = (tree / "bench") if tree is not None else HERE
    result = subprocess.run(
        [sys.executable, "-c", MEASURE.format(bench=str(bench), n_ranks=n_ranks)],
        env=env,
        cwd=tree or HERE.parent,  # "-c" puts the working folder first on sys.path
        capture_output=True,
        text=True,
        check=True,
    )
    t_plain, t_synk, where = json.loads(result.stdout.strip().splitlines()[-1])
    expected = (tree or HERE.parent).resolve()
    if not Path(where).resolve().is_relative_to(expected):
        raise RuntimeError(f"measured the synkhronos of {where}, not of {expected}")
    return (t_synk - t_plain) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="a tree without the timeline's code")
    args = parser.parse_args()
    configs = {"timeline off": (None, False), "timeline on": (None, True)}
    if args.baseline is not None:
        configs["without the code"] = (args.baseline.resolve(), False)
    counts = [1, args.ranks]
    times: dict[tuple[str, int], list[float]] = {(c, n): [] for c in configs for n in counts}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):  # alternating: a busy spell hits every configuration
            for n in counts:
                for name, (tree, on) in configs.items():
                    path = os.path.join(folder, "t.json") if on else None
                    times[(name, n)].append(overhead(n, tree, path))
    print(
        f"| us over pytensor.function, {args.rounds} rounds | "
        + " | ".join(f"{n} rank{'s' if n > 1 else ''}" for n in counts)
        + " |"
    )
    print("|---" * (len(counts) + 1) + "|")
    for name in configs:
        cells = []
        for n in counts:
            t = times[(name, n)]
            cells.append(f"{statistics.median(t):.1f} ({min(t):.1f}-{max(t):.1f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    pairs = [("timeline on", "timeline off")]
    if args.baseline is not None:
        pairs.insert(0, ("timeline off", "without the code"))
    for a, b in pairs:
        ratios = [
            statistics.median(times[(a, n)]) / statistics.median(times[(b, n)]) for n in counts
        ]
        print(f"| {a} / {b} | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |")


if __name__ == "__main__":
    main()
