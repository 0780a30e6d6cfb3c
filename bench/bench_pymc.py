"""PyMC's NUTS on 2 ranks against ``pm.sample`` in one process (issue #52).

A logistic regression (6 coefficients, standard normal priors, ``N`` rows of float64 data),
sampled by ``synk_pymc.sample`` on 2 CPU ranks and by ``pm.sample`` in one process, with
the same seed and settings (one chain, ``cores=1``), taking turns (the best of
``--rounds`` each); and the log-density-and-gradient evaluation alone (the median of many
calls at one point, the two taking turns), split and PyMC's own, against the physical
limit of 2 cores (a ratio of 2).
Every process uses one BLAS thread, so that one process uses one core and 2 ranks use two.

Usage::

    python bench/bench_pymc.py [--rows 100000 1000000] [--draws 100] [--tune 100] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time  # noqa: E402 - after the thread counts, which BLAS reads when loaded

import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos.extensions import pymc as synk_pymc  # noqa: E402

COEFFICIENTS = 6


def logistic(rows: int) -> pm.Model:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, COEFFICIENTS))
    p = 1 / (1 + np.exp(-x @ np.linspace(-1, 1, COEFFICIENTS)))
    y = (rng.random(rows) < p).astype("int64")
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=COEFFICIENTS)
        pm.Bernoulli("y", logit_p=x @ b, observed=y)
    return model


def per_call(functions, q, calls: int) -> list[float]:
    """The median seconds of one call of each of ``functions`` at ``q``, over ``calls``
    calls each after a first, the functions taking turns (the machine's load varies)."""
    times: list[list[float]] = [[] for _ in functions]
    for f in functions:
        f(q)
    for _ in range(calls):
        for f, own in zip(functions, times, strict=True):
            start = time.perf_counter()
            f(q)
            own.append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def sampling(sample, model, draws: int, tune: int) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    idata = sample(
        draws=draws, tune=tune, chains=1, cores=1, random_seed=3, progressbar=False, model=model
    )
    seconds = time.perf_counter() - start
    return seconds, idata.posterior["b"].mean(("chain", "draw")).values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--tune", type=int, default=100)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2, help="samplings of each, taking turns")
    args = parser.parse_args()
    synk.fork(2, backend="cpu")
    try:
        for rows in args.rows:
            model = logistic(rows)
            q = np.full(COEFFICIENTS, 0.1)
            split = synk_pymc.logp_dlogp_function(model)
            own = model.logp_dlogp_function(ravel_inputs=True)
            t_own, t_split = per_call(
                [lambda v, own=own: own([v], extra_vars={}), split], q, args.calls
            )
            print(
                f"{rows:>9} rows  logp+grad: one process {t_own * 1e3:8.2f} ms, 2 ranks "
                f"{t_split * 1e3:8.2f} ms, ratio {t_own / t_split:.2f} (limit 2.00)",
                flush=True,
            )
            runs: dict = {pm.sample: [], synk_pymc.sample: []}
            for _ in range(args.rounds):  # taking turns: the best of each
                for sample, times in runs.items():
                    times.append(sampling(sample, model, args.draws, args.tune))
            t_pm, mean_pm = min(runs[pm.sample], key=lambda r: r[0])
            t_sync, mean_sync = min(runs[synk_pymc.sample], key=lambda r: r[0])
            print(
                f"{rows:>9} rows  NUTS {args.tune}+{args.draws}: pm.sample {t_pm:7.1f} s, "
                f"synk_pymc.sample {t_sync:7.1f} s, ratio {t_pm / t_sync:.2f}; posterior "
                f"means differ by at most {np.max(np.abs(mean_sync - mean_pm)):.1e}",
                flush=True,
            )
    finally:
        synk.close()


if __name__ == "__main__":
    main()
