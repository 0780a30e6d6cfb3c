"""PyMC's NUTS on 2 ranks against ``pm.sample`` in one process (issue #52).

A logistic regression (6 coefficients, standard normal priors, ``N`` rows of float64 data).

The log-density-and-gradient evaluation alone (PyMC's own compiled function, the one
``pm.sample``'s NUTS calls, against ``synk_pymc.logp_dlogp_function`` on 2 CPU ranks), beside
what the machine allows, measured in helper processes running PyMC's own function:

- **1 core**: one process pinned to one core, one BLAS thread, all ``N`` rows (what one rank
  and ``pm.sample`` after ``synk.fork`` get: the fork pins rank 0 to one core);
- **1 process, 2 cores**: the same process on both cores with two BLAS threads (PyMC's graph
  runs its elementwise work on one thread: only the matrix products could use a second);
- **2 cores**: two processes, one a core, each evaluating ``N / 2`` rows at once, started
  together: the physical limit of 2 cores, with no synchronization, reduction or Python of
  the split (their shared memory bandwidth and L3 cache included); the ideal, 2x, is
  against the 1-core figure.

Each figure is the best of ``--rounds`` rounds in which every measurement takes its turn
(the machine is shared), each round's figure the median of ``--calls`` calls after a
first. Then the sampling: ``synk_pymc.sample`` on 2 CPU ranks and ``pm.sample`` in one
process, the same seed and settings (one chain, ``cores=1``), taking turns, best of
``--rounds``. Every process uses one BLAS thread unless said.

With ``--samplers``, the samplers instead (issue #60), each sampling in a fresh process
of its own, ``--chains`` chains (``cores=1``), taking turns, ``--rounds`` rounds:
``pm.sample`` with ``nuts_sampler`` numpyro and nutpie in one unrestricted process and
pinned to one core (``taskset -c 0``), ``synk_pymc.sample`` on 2 CPU ranks (nutpie calling
the split function, and numpyro's NUTS compiled whole per rank, summing by a host
callback) and on 2 GPU ranks (numpyro's NUTS compiled whole per rank; on CPU devices where
there is no GPU), always split (``min_rows=0``); with ``--with-pymc`` also
PyMC's own NUTS (far slower at 1M rows): ``pm.sample`` unrestricted and pinned, and on 2
CPU ranks. Each line gives the sampling seconds apart from the setup and compilation
where the sampler tells them apart (see :func:`contender`), and the posterior means'
largest distance to the first contender's in its Monte-Carlo standard errors (ok within
4); a last line, the fastest synk's speed against the fastest ``pm.sample``'s,
unrestricted and pinned. The compiled NUTS's ranks' draws are compared bit for bit by
rank 0 (a difference fails the run); nutpie and PyMC's NUTS run on rank 0.

With ``--callback``, what the compiled NUTS's sum costs on 2 CPU ranks, per evaluation:
a program of a loop of ``--calls`` x 1000 steps, each summing 7 numbers (a log-density
and its gradient of 6 coefficients) over the ranks by the host callback, against the
same loop with no sum and with a callback that sums nothing (JAX's cost of a callback
alone); for one chain and for 4 chains under ``vmap``.

Usage::

    python bench/bench_pymc.py [--rows 100000 1000000] [--draws 30] [--tune 30] [--rounds 3]
    python bench/bench_pymc.py --samplers --rows 100000 1000000 --tune 500 --draws 500 --rounds 1
    python bench/bench_pymc.py --callback
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys

if "--one" not in sys.argv:  # a sampler's own process keeps its threads as a user's would
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time  # noqa: E402 - after the thread counts, which BLAS reads when loaded

import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos.extensions import pymc as synk_pymc  # noqa: E402

COEFFICIENTS = 6
TRUTH = np.linspace(-1, 1, COEFFICIENTS)
POINT = TRUTH
"""Where the evaluation is timed: where NUTS spends its draws. A call's time depends on the
point (the logits' sizes): at 1M rows, one core, a call at 0.1 everywhere took 0.85 of a
call here, at 0 0.55."""


def logistic(rows: int) -> pm.Model:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, COEFFICIENTS))
    p = 1 / (1 + np.exp(-x @ TRUTH))
    y = (rng.random(rows) < p).astype("int64")
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=COEFFICIENTS)
        pm.Bernoulli("y", logit_p=x @ b, observed=y)
    return model


def pymc_function(model: pm.Model):
    """PyMC's compiled log-density and gradient, as ``pm.sample``'s NUTS calls it."""
    return model.logp_dlogp_function(ravel_inputs=True)._pytensor_function


def median_call(f, calls: int) -> float:
    """The median seconds of ``calls`` calls of ``f`` at :data:`POINT`."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        f(POINT)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def helper(rows: int, core: int, keep: bool, orders, answers, barrier) -> None:
    """(Helper process) PyMC's function of ``rows`` and of half of them, on ``core``, with
    glibc's heap kept as every rank keeps it (``keep``) or glibc's own settings; runs each
    order ``(which, cores, threads, together, calls)`` and answers its median call."""
    from threadpoolctl import threadpool_limits

    from synkhronos.rank.heap import keep_freed_memory

    if keep:
        keep_freed_memory()
    functions = {"all": pymc_function(logistic(rows)), "half": pymc_function(logistic(rows // 2))}
    for f in functions.values():
        f(POINT)  # the first call out of the figures
    answers.put(None)
    for which, cores, threads, together, calls in iter(orders.get, None):
        os.sched_setaffinity(0, cores or {core})
        with threadpool_limits(limits=threads):
            if together:
                barrier.wait()
            answers.put(median_call(functions[which], calls))


class Helpers:
    """Helper processes timing PyMC's own function: one with glibc's heap settings, two
    (one a core) with the heap kept as the ranks keep it."""

    def __init__(self, rows: int):
        context = mp.get_context("spawn")
        self.barrier = context.Barrier(2)
        self.queues = [(context.Queue(), context.Queue()) for _ in range(3)]
        self.processes = [
            context.Process(
                target=helper, args=(rows, core, keep, *queues, self.barrier), daemon=True
            )
            for (core, keep), queues in zip(
                [(0, False), (0, True), (1, True)], self.queues, strict=True
            )
        ]
        for p in self.processes:
            p.start()
        for _, answers in self.queues:
            answers.get()

    def limits(self, calls: int) -> dict[str, float]:
        """One round of the helpers' figures (seconds)."""
        (glibcs, glibc_answers), (orders, answers), (orders_1, answers_1) = self.queues
        glibcs.put(("all", None, 1, False, calls))
        glibc = glibc_answers.get()
        orders.put(("all", None, 1, False, calls))
        one_core = answers.get()
        orders.put(("all", {0, 1}, 2, False, calls))
        two_threads = answers.get()
        orders.put(("half", None, 1, True, calls))
        orders_1.put(("half", None, 1, True, calls))
        two_cores = max(answers.get(), answers_1.get())
        return {
            "1 core": one_core,
            "1 core, glibc's heap": glibc,
            "1 process, 2 cores": two_threads,
            "2 cores": two_cores,
        }

    def close(self) -> None:
        for orders, _ in self.queues:
            orders.put(None)
        for p in self.processes:
            p.join()


def evaluations(rows: int, rounds: int, calls: int) -> dict[str, float]:
    """The best of ``rounds`` of each evaluation figure, taking turns."""
    helpers = Helpers(rows)
    synk.fork(2, backend="cpu")
    try:
        model = logistic(rows)
        own = pymc_function(model)
        split = synk_pymc.logp_dlogp_function(model)
        own(POINT), split(POINT)
        best: dict[str, float] = {}
        for _ in range(rounds):
            figures = helpers.limits(calls)
            figures["pm, after the fork"] = median_call(own, calls)
            figures["2 ranks"] = median_call(split, calls)
            for name, seconds in figures.items():
                best[name] = min(best.get(name, np.inf), seconds)
        return best
    finally:
        synk.close()
        helpers.close()


def sampling(sample, model, draws: int, tune: int) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    idata = sample(
        draws=draws, tune=tune, chains=1, cores=1, random_seed=3, progressbar=False, model=model
    )
    seconds = time.perf_counter() - start
    return seconds, idata.posterior["b"].mean(("chain", "draw")).values


def samplings(rows: int, rounds: int, draws: int, tune: int) -> str:
    synk.fork(2, backend="cpu")
    try:
        model = logistic(rows)
        runs: dict = {pm.sample: [], synk_pymc.sample: []}
        for _ in range(rounds):  # taking turns: the best of each
            for sample, times in runs.items():
                times.append(sampling(sample, model, draws, tune))
    finally:
        synk.close()
    t_pm, mean_pm = min(runs[pm.sample], key=lambda r: r[0])
    t_sync, mean_sync = min(runs[synk_pymc.sample], key=lambda r: r[0])
    return (
        f"NUTS {tune}+{draws}: pm.sample {t_pm:7.1f} s, synk_pymc.sample {t_sync:7.1f} s, "
        f"ratio {t_pm / t_sync:.2f}; posterior means differ by at most "
        f"{np.max(np.abs(mean_sync - mean_pm)):.1e}"
    )


#: The samplers, by name: (how, pinned to one core).
CONTENDERS = {
    "pm numpyro": ("numpyro", False),
    "pm nutpie": ("nutpie", False),
    "pm pymc": ("pymc", False),
    "pm numpyro, 1 core": ("numpyro", True),
    "pm nutpie, 1 core": ("nutpie", True),
    "pm pymc, 1 core": ("pymc", True),
    "synk 2 CPU ranks (pymc)": ("synk-cpu", False),
    "synk 2 CPU ranks (nutpie)": ("synk-cpu-nutpie", False),
    "synk 2 CPU ranks (numpyro)": ("synk-cpu-numpyro", False),
    "synk 2 GPU ranks (numpyro)": ("synk-gpu", False),
}
#: The contenders of PyMC's own NUTS, run only with ``--with-pymc``.
PYMC_NUTS = ("pm pymc", "pm pymc, 1 core", "synk 2 CPU ranks (pymc)")


def contender(how: str, rows: int, tune: int, draws: int, chains: int, chain_method: str) -> dict:
    """(A sampler's own process) sample once; the seconds of the whole call, of its
    sampling alone (PyMC's ``sampling_time`` for numpyro and nutpie, which includes JAX's
    compilation for numpyro; the compiled program's run alone for synk on GPU ranks; the
    whole call for PyMC's NUTS, which compiles before it; the compiled program's run alone
    for synk's numpyro on CPU ranks too), the setup before it, and the
    posterior means and their Monte-Carlo standard errors."""
    import arviz as az

    start = time.perf_counter()
    sample, kwargs = pm.sample, {"nuts_sampler": how}
    if how.startswith("synk"):
        _, backend, *sampler = how.split("-")
        synk.fork(2, backend=backend)
        sample = synk_pymc.sample
        kwargs = {"nuts_sampler": (sampler or ["numpyro" if backend == "gpu" else "pymc"])[0]}
        kwargs["min_rows"] = 0  # the split, whatever the rows
    if kwargs["nuts_sampler"] in ("numpyro", "blackjax"):
        kwargs["nuts"] = {"chain_method": chain_method}
    model = logistic(rows)
    setup = time.perf_counter() - start
    try:
        start = time.perf_counter()
        idata = sample(
            draws=draws,
            tune=tune,
            chains=chains,
            cores=1,
            random_seed=3,
            progressbar=False,
            model=model,
            compute_convergence_checks=False,
            **kwargs,
        )
        wall = time.perf_counter() - start
    finally:
        if how.startswith("synk"):
            synk.close()
    attrs = idata.posterior.attrs
    sampling = attrs.get("synk_sampling_s", attrs.get("sampling_time", wall))
    return {
        "setup_s": setup,
        "wall_s": wall,
        "sampling_s": float(sampling),
        "compile_s": float(attrs.get("synk_compile_s", np.nan)),
        "means": idata.posterior["b"].mean(("chain", "draw")).values.tolist(),
        "mcse": az.mcse(idata, var_names=["b"])["b"].values.tolist(),
        # Leapfrog steps of the kept draws (the tuning's are not kept): samplers whose
        # adaptation ended apart take trajectories of other lengths.
        "steps": int(idata.sample_stats["n_steps"].sum()) if "n_steps" in idata.sample_stats else 0,
    }


def run_contender(
    name: str, rows: int, tune: int, draws: int, chains: int = 1, chain_method: str = "parallel"
) -> dict:
    """:func:`contender` in a fresh process (pinned to core 0 where the name says)."""
    how, pinned = CONTENDERS[name]
    command = [sys.executable, __file__, "--one", how, "--rows", str(rows)]
    command += ["--tune", str(tune), "--draws", str(draws), "--chains", str(chains)]
    command += ["--chain-method", chain_method]
    env = dict(os.environ)
    if how == "synk-gpu":
        from synkhronos.rank.backends.gpu import visible_gpus

        if not visible_gpus():
            env["JAX_PLATFORMS"] = "cpu"
        env["PYTENSOR_FLAGS"] = ",".join(
            filter(None, [env.get("PYTENSOR_FLAGS"), "floatX=float64"])
        )
    done = subprocess.run(
        ["taskset", "-c", "0", *command] if pinned else command,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(lines[-1])


def samplers(rows: int, args: argparse.Namespace, names: list[str]) -> None:
    """Every contender ``args.rounds`` times, taking turns; the best round of each printed,
    then the fastest synk's speed against the fastest ``pm.sample``'s."""
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for name in names:
            result = run_contender(
                name, rows, args.tune, args.draws, args.chains, args.chain_method
            )
            kept = best.get(name)
            if (
                kept is None
                or "error" in kept
                or ("error" not in result and result["sampling_s"] < kept["sampling_s"])
            ):
                best[name] = result
    reference = next((r for r in best.values() if "error" not in r), None)
    ok = {n: r["sampling_s"] for n, r in best.items() if "error" not in r}
    fastest = [  # pm.sample's fastest: in one unrestricted process, and on one core
        min(
            (t for n, t in ok.items() if n.startswith("pm") and n.endswith("1 core") == pinned),
            default=np.nan,
        )
        for pinned in (False, True)
    ]
    print(
        f"{rows:>9} rows  NUTS {args.tune}+{args.draws}, {args.chains} chain(s) "
        f"({args.chain_method} for numpyro), best of {args.rounds} "
        f"(load average {os.getloadavg()[0]:.2f}):"
    )
    for name, r in best.items():
        if "error" in r:
            print(f"    {name:<28} failed: {r['error']}")
            continue
        far = np.max(np.abs(np.array(r["means"]) - reference["means"]) / reference["mcse"])
        seconds = r["sampling_s"]
        print(
            f"    {name:<28} sampling {seconds:8.1f} s (x{fastest[0] / seconds:.2f} the fastest "
            f"pm, x{fastest[1] / seconds:.2f} on 1 core)  call {r['wall_s']:8.1f} s  "
            f"compile {r['compile_s']:6.1f} s  setup {r['setup_s']:5.1f} s  "
            f"means within {far:.1f} MCSE ({'ok' if far <= 4 else 'FAR'})  "
            f"{r.get('steps', 0)} leapfrog steps in the draws",
            flush=True,
        )
    synk_best = min((t for n, t in ok.items() if n.startswith("synk")), default=np.nan)
    print(
        f"    fastest synk against the fastest pm.sample: x{fastest[0] / synk_best:.2f} "
        f"unrestricted (goal 1), x{fastest[1] / synk_best:.2f} pinned to one core (goal 1.6)",
        flush=True,
    )


def callback_routine(state, how: np.ndarray) -> list:
    """(Every CPU rank) seconds of a program looping ``how[0]`` steps over ``how[1]``
    chains (``vmap``) of 7 numbers: with no sum, with a callback that sums nothing, and
    summing over the ranks as the compiled NUTS does on CPU ranks."""
    import jax
    from jax import lax

    from synkhronos.extensions.pymc.compiled import _OnHost

    ranks = _OnHost(state.comm)
    steps, chains = int(how[0]), int(how[1])

    def alone(x):
        shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return jax.pure_callback(np.asarray, shape, x, vmap_method="expand_dims")

    seconds = []
    for total in (lambda x: x, alone, ranks.sum):

        def body(arrays: list, total=total) -> list:
            def loop(x):
                return lax.fori_loop(0, steps, lambda _, y: total(y) * 0.5 + 1.0, x)

            return [jax.vmap(loop)(arrays[0])]

        _, (_, run_s) = ranks.compile_and_run(body, [np.ones((chains, 7))])
        seconds.append(run_s)
    return [np.array(seconds)]


def callback_costs(calls: int, rounds: int) -> None:
    """The cost of the compiled NUTS's sum on 2 CPU ranks (see the module docstring)."""
    import bench_pymc  # this module by its name, which the workers import

    from synkhronos.api import routines

    steps = calls * 1000
    synk.fork(2, backend="cpu")
    try:
        for chains in (1, 4):
            rounds_s = [
                routines.run(bench_pymc.callback_routine, np.array([steps, chains]))[0][0]
                for _ in range(rounds)
            ]
            plain, alone, summed = np.min(rounds_s, axis=0) / steps * 1e6
            print(
                f"    {chains} chain(s), {steps} steps, best of {rounds}: a step {plain:.2f} us "
                f"with no sum, {alone:.2f} us with an empty callback, {summed:.2f} us summed "
                f"over 2 ranks: the sum costs {summed - plain:.1f} us an evaluation",
                flush=True,
            )
    finally:
        synk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--draws", type=int, default=30)
    parser.add_argument("--tune", type=int, default=30)
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3, help="of each figure, taking turns")
    parser.add_argument("--no-sampling", action="store_true")
    parser.add_argument("--samplers", action="store_true", help="the samplers (issue #60)")
    parser.add_argument("--only", nargs="+", choices=list(CONTENDERS), help="these samplers")
    parser.add_argument("--with-pymc", action="store_true", help="also PyMC's own NUTS")
    parser.add_argument("--chains", type=int, default=1, help="with --samplers")
    parser.add_argument(
        "--chain-method",
        choices=["parallel", "vectorized"],
        default="parallel",
        help="numpyro's (PyMC's chain_method), with --samplers",
    )
    parser.add_argument(
        "--callback", action="store_true", help="the compiled NUTS's sum on CPU ranks"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a sampler's own process
    args = parser.parse_args()
    if args.one:
        figures = contender(
            args.one, args.rows[0], args.tune, args.draws, args.chains, args.chain_method
        )
        print(json.dumps(figures), flush=True)
        return
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
    if args.callback:
        callback_costs(args.calls, args.rounds)
        return
    if args.samplers:
        for rows in args.rows:
            names = args.only or [n for n in CONTENDERS if args.with_pymc or n not in PYMC_NUTS]
            samplers(rows, args, names)
        print(f"load average at the end: {os.getloadavg()[0]:.2f}", flush=True)
        return
    for rows in args.rows:
        best = evaluations(rows, args.rounds, args.calls)
        one_core = best["1 core"]
        print(f"{rows:>9} rows  logp+grad, best of {args.rounds} rounds (ratio to 1 core):")
        for name, seconds in best.items():
            print(f"    {name:<20} {seconds * 1e3:8.2f} ms  {one_core / seconds:5.2f}")
        print(
            f"    2 ranks against pm after the fork: "
            f"{best['pm, after the fork'] / best['2 ranks']:.2f}, against the 2-core limit: "
            f"{best['2 cores'] / best['2 ranks']:.2f}",
            flush=True,
        )
        if not args.no_sampling:
            line = samplings(rows, args.rounds, args.draws, args.tune)
            print(f"{rows:>9} rows  {line}", flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
