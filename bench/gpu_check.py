"""What only a GPU can decide, checked first thing on the first machine with one; a verdict
of one screen (PASS, FAIL or SKIP per check, with its figures).

Each check runs in a subprocess of its own with a time limit, so that one hang cannot eat
the budget (``--budget``, seconds for the whole run; a check that would start with less
than its limit left is skipped). The checks (``docs/limitations.rst`` lists why):

refork
    fork, close, fork in one process: the same number of ranks (every visible GPU) and
    rank 0 on the same device both times; rank 0's environment restored after each close.
jax_first
    ``import jax`` before ``fork()`` works; JAX computing before ``fork()`` is refused.
nvidia_smi
    nvidia-smi's real table parsed; with a PATH without it, ``CUDA_VISIBLE_DEVICES`` decides.
memory
    a fused training step (an MLP, Adam): its buffers donated (the old parameters
    deleted), the device memory in use after its first step against that of the same
    model trained by a ``jax.jit`` Adam step written by hand (at most 1.2x, issue 51) and
    against the bytes of every shared variable (parameters, optimizer state, flat
    gradient), its peak, and JAX's memory cap against the GPU's memory.
determinism
    the same 20 steps (a scatter-add gradient, reductions) in two fresh processes with
    the deterministic flags give bit-identical parameters; two processes without them,
    and one with ``--xla_gpu_exclude_nondeterministic_ops`` alone; the time per step of
    each; whether the update phase alone (what every rank computes from the same
    all-reduced sums) gives the same bits in two processes without the flags; and, with
    2 or more GPUs, whether the ranks' parameters are identical without them.
training_function
    the one-line port of a training function (``synk.function`` with Adam's updates,
    embedding lookups: a scatter-add gradient) against ``pytensor.function`` in JAX mode.
close_after_kill
    a worker (two ranks on GPU 0 where there is one GPU) killed while idle: seconds
    ``close()`` takes.
nccl_dead_peer, stale_communicators
    (2 or more GPUs) ``tests/test_gpu_faults.py`` (a rank killed inside an NCCL
    all-reduce, then a fresh fork); fork, all-reduce, close, fork with another rank 0
    GPU, all-reduce: the right sums.
figures
    call overhead, an all-reduce of a ResNet-50-sized gradient and MLP steps.
pymc
    (``--pymc`` only: at most 3 minutes; SKIP where PyMC or numpyro is missing) a
    1,000,000-row logistic regression, 6 coefficients, one chain, 500+500 (``--quick``:
    2,000 rows, 20+20): ``synk_pymc.sample(nuts_sampler="numpyro")`` on 2 GPU ranks (NUTS
    compiled whole into one program per rank; both on GPU 0 where there is one) against
    ``pm.sample(nuts_sampler="numpyro")`` on one GPU, each in a fresh process
    (``bench/bench_pymc.py``): sampling seconds, compile seconds, and whether the posterior
    means are within 4 Monte-Carlo standard errors of each other (issue 60).
resnet
    (``--resnet`` only: minutes) ResNet-50's fused step against a data-parallel loop
    written by hand in JAX (``jax_resnet.py``), samples/s per rank.

Without GPUs, ``JAX_PLATFORMS=cpu`` runs the same on one CPU device per rank (2 ranks),
donating buffers as on GPUs (``SYNK_DONATE=1``);
``tests/test_gpu_check.py`` runs ``--quick`` so. On a lent GPU machine (device tool): first
``bash bench/gpu_wheels.sh`` here, then run, carrying ``.whl``::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD &&
    python3 bench/gpu_check.py --budget 200 --out $OUT/gpu_check.txt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULT = "GPU_CHECK_RESULT "  # a child's last line: this, then JSON


def _args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models (CPU devices)")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds for every check")
    parser.add_argument("--out", type=Path, help="also write the verdict to this file")
    parser.add_argument(
        "--resnet", action="store_true", help="also ResNet-50 against a JAX loop (minutes)"
    )
    parser.add_argument(
        "--pymc", action="store_true", help="also PyMC's compiled NUTS on 2 ranks (3 minutes)"
    )
    parser.add_argument("--check", help=argparse.SUPPRESS)  # run one check, in a child
    parser.add_argument(
        "--deterministic", default="1", choices=["1", "0", "exclude"], help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


# ---- the children: each check in a process of its own ------------------------------------
def _setup() -> None:
    sys.path[:0] = [str(HERE), str(ROOT)]
    from synkhronos.rank.backends.gpu import visible_gpus

    if not visible_gpus():
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ.setdefault("SYNK_DONATE", "1")  # as on GPUs (the memory check)


def _n_ranks() -> int | None:
    """2 ranks on CPU devices; one per visible GPU (fork's default) on GPUs."""
    from synkhronos.rank.backends.gpu import on_cpu_devices

    return 2 if on_cpu_devices() else None


def _n_gpus() -> int:
    from synkhronos.rank.backends.gpu import on_cpu_devices, visible_gpus

    return 0 if on_cpu_devices() else len(visible_gpus())


def _environment() -> dict:
    import jax
    import pytensor

    names = ("CUDA_VISIBLE_DEVICES", "XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE")
    return {
        **{name: os.environ.get(name) for name in names},
        "XLA_PYTHON_CLIENT_MEM_FRACTION": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
        "jax_cuda_visible_devices": jax.config.read("jax_cuda_visible_devices"),
        "floatX": pytensor.config.floatX,
    }


def check_refork(args) -> tuple[str, str]:
    import synkhronos as synk
    from synkhronos.session import launch

    before, seen = _environment(), []
    for _ in range(2):
        n = synk.fork(_n_ranks(), backend="gpu")
        seen.append((n, str(launch.current().state.comm.device)))
        synk.close()
        if _environment() != before:
            return "FAIL", f"environment not restored: {before} -> {_environment()}"
    want = _n_gpus() or 2
    ok = seen[0] == seen[1] and seen[0][0] == want
    return ("PASS" if ok else "FAIL"), f"(ranks, rank 0's device) {seen}, want {want} ranks"


def check_jax_first(args) -> tuple[str, str]:
    import warnings

    import jax

    import synkhronos as synk
    from synkhronos.rank.backends.gpu import on_cpu_devices

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n = synk.fork(_n_ranks(), backend="gpu")
    synk.close()
    warned = [str(w.message)[:60] for w in caught if "jax" in str(w.message).lower()]
    jax.numpy.ones(3).block_until_ready()  # JAX now runs in this process
    if on_cpu_devices():
        return ("FAIL" if warned else "PASS"), f"{n} ranks after import jax; {warned or ''}"
    try:
        synk.fork(_n_ranks(), backend="gpu")
    except RuntimeError as error:
        refused = "JAX already runs" in str(error)
    else:
        synk.close()
        refused = False
    ok = not warned and refused
    return ("PASS" if ok else "FAIL"), f"{n} ranks after import jax; refused after use: {refused}"


def check_nvidia_smi(args) -> tuple[str, str]:
    from synkhronos.rank.backends import gpu

    try:
        table = gpu.gpu_table()
    except RuntimeError as error:
        return "SKIP", str(error)[:80]
    os.environ["PATH"] = "/nonexistent"
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(row[0] for row in table)
    without = gpu.visible_gpus()
    ok = bool(table) and all(row[2].endswith("MiB") for row in table) and len(without) == len(table)
    return ("PASS" if ok else "FAIL"), f"{table}; without nvidia-smi: {without}"


def _model(sizes: tuple, embed: bool, seed: int = 0):
    """Token ids (rows of 4) -> summed embeddings (``sizes[0]`` by ``sizes[1]``) -> tanh
    layers of ``sizes[2:]`` -> 10 classes; with ``embed=False`` float rows of
    ``sizes[0]`` times the first matrix instead. The lookups' gradient is a scatter-add
    (atomic adds on GPUs); the loss is a mean."""
    import pytensor
    import pytensor.tensor as pt

    rng = np.random.default_rng(seed)
    ids, y = (pt.imatrix("ids") if embed else pt.matrix("x")), pt.ivector("y")
    shapes = list(zip(sizes[:-1], sizes[1:], strict=True)) + [(sizes[-1], 10)]
    params = [
        pytensor.shared((0.1 * rng.normal(size=s)).astype("float32"), name=f"w{i}")
        for i, s in enumerate(shapes)
    ]
    # One 1-d lookup per column: PyTensor's JAX mode cannot trace a 2-d lookup's gradient.
    h = sum(params[0][ids[:, k]] for k in range(4)) if embed else ids @ params[0]
    for w in params[1:]:
        h = pt.tanh(h) @ w
    p = pt.special.softmax(h, axis=-1)
    loss = -pt.mean(pt.log((p * pt.eq(y[:, None], pt.arange(10)[None, :])).sum(axis=1)))
    return [ids, y], params, loss


def _train(sizes: tuple, rows: int, n: int, embed: bool, one_line: bool = False):
    """An Adam step on :func:`_model` (fused): ``train.make_step_function``'s, or with
    ``one_line`` ``synk.function(inputs, loss, updates=adam(...))``; returns ``(step,
    params, data)``."""
    import synkhronos as synk
    from synkhronos.extensions import train
    from synkhronos.extensions.lasagne import updates

    inputs, params, loss = _model(sizes, embed)
    if one_line:
        step = synk.function(inputs, loss, updates=updates.adam(loss, params, learning_rate=1e-3))
    else:
        step = train.make_step_function(loss, params, inputs, updates.adam, learning_rate=1e-3)
    rng = np.random.default_rng(1)
    if embed:  # ids with repeats
        ids = synk.data(rng.integers(0, sizes[0] // 10, (rows * n, 4)).astype("int32"))
    else:
        ids = synk.data(rng.random((rows * n, sizes[0])).astype("float32"))
    y = synk.data(rng.integers(0, 10, rows * n).astype("int32"))
    return step, params, (ids, y)


def _in_use(device) -> int:
    """Bytes in use on ``device``: its allocator's figure (GPUs), else the distinct buffers
    of the arrays alive in this process there (CPU devices have no ``memory_stats``)."""
    import jax

    stats = device.memory_stats() or {}
    if "bytes_in_use" in stats:
        return int(stats["bytes_in_use"])
    return sum(
        {
            s.data.unsafe_buffer_pointer(): s.data.nbytes
            for a in jax.live_arrays()
            for s in a.addressable_shards
            if s.device == device
        }.values()
    )


def _memory_sizes(args) -> tuple:
    return (256, 512, 128) if args.quick else (4096, 4096, 4096)


def check_memory_hand(args) -> tuple[str, str]:
    """(One process) The memory check's model and batch trained by a ``jax.jit`` Adam
    step written by hand, its buffers donated: bytes in use after the first step."""
    import functools

    import jax
    import jax.numpy as jnp

    sizes, rows = _memory_sizes(args), 64
    rng = np.random.default_rng(0)
    shapes = list(zip(sizes[:-1], sizes[1:], strict=True)) + [(sizes[-1], 10)]
    params = [jnp.asarray((0.1 * rng.normal(size=s)).astype("float32")) for s in shapes]
    moments = [jnp.zeros_like(p) for p in params], [jnp.zeros_like(p) for p in params]
    x = jnp.asarray(rng.random((rows, sizes[0]), dtype=np.float32))
    y = jnp.asarray(rng.integers(0, 10, rows).astype("int32"))

    def loss(params, x, y):
        h = x @ params[0]
        for w in params[1:]:
            h = jnp.tanh(h) @ w
        return -jnp.mean(jax.nn.log_softmax(h)[jnp.arange(rows), y])

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def step(params, m, v, t, x, y):
        grads = jax.grad(loss)(params, x, y)
        m = [0.9 * a + 0.1 * g for a, g in zip(m, grads, strict=True)]
        v = [0.999 * a + 0.001 * g * g for a, g in zip(v, grads, strict=True)]
        rate = 1e-3 * jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        params = [p - rate * a / (jnp.sqrt(b) + 1e-8) for p, a, b in zip(params, m, v, strict=True)]
        return params, m, v

    device = jax.devices()[0]
    params, m, v = step(params, *moments, 1.0, x, y)
    jax.block_until_ready(params)
    first = _in_use(device)
    for t in range(2, 5):
        params, m, v = step(params, m, v, float(t), x, y)
    jax.block_until_ready(params)
    return "PASS", json.dumps({"first": first, "steps": _in_use(device)})


def check_memory(args) -> tuple[str, str]:
    import synkhronos as synk
    from synkhronos.session import launch

    status, hand = _child("memory_hand", args, 120)
    if status != "PASS":
        return "FAIL", f"the hand-written loop: {hand}"
    hand_first = json.loads(hand)["first"]
    n = synk.fork(1 if _n_gpus() == 0 else None, backend="gpu")  # as on one GPU
    try:
        step, params, data = _train(_memory_sizes(args), 64, n, embed=False, one_line=True)
        session = launch.current()
        comm = session.state.comm

        def in_use() -> float:  # MB on rank 0's device now
            return _in_use(comm.device) / 1e6

        stages = [f"built {in_use():.0f}"]
        step(*data)  # compiled
        first = _in_use(comm.device)
        stages.append(f"first step {first / 1e6:.0f}")
        old = [p.get_value(borrow=True) for p in params]
        fused = session.state.fused
        for _ in range(3):
            step(*data)
        stages.append(f"4 steps {in_use():.0f}")
        donated = all(o.is_deleted() for o in old)
        variables = session.state.registry.variables
        handed = {id(v) for v in step.row_function.handover}  # never on the device
        shared = sum(np.asarray(v.get_value()).nbytes for v in variables if id(v) not in handed)
        stats = comm.device.memory_stats() or {}
        ran_fused = sum(f.calls for f in fused.values())
    finally:
        synk.close()
    # The goal (issue 51): what a loop written by hand holds, 1.2x at most. The one-line
    # step's gradients stay inside its program (rank.fused_chain); train.make_step_function
    # keeps its flat gradient between steps, a shared variable the hand loop has not.
    ok = donated and ran_fused > 0 and first <= 1.2 * hand_first
    figures = (
        f"fused calls {ran_fused}, old buffers deleted: {donated}; shared {shared / 1e6:.1f} "
        f"MB; in use (MB) {', '.join(stages)}; "
        f"after the first step {first / hand_first:.2f} x the hand loop's "
        f"{hand_first / 1e6:.1f} MB (<=1.2), {first / shared:.2f} x shared"
    )
    if "bytes_limit" not in stats:
        return ("PASS" if ok else "FAIL"), figures + "; no memory_stats on this device"
    peak, limit = stats.get("peak_bytes_in_use", 0), stats["bytes_limit"]
    total = _gpu_memory_bytes()
    # The peak counts the compile too (XLA tries GEMM algorithms in scratch memory): the
    # steps' own footprint is what stays in use after them.
    ok = ok and limit >= 0.85 * total
    return ("PASS" if ok else "FAIL"), (
        f"{figures}; peak {peak / 1e6:.1f} MB = {peak / shared:.2f} x shared; "
        f"JAX's cap {limit / 1e9:.1f} of {total / 1e9:.1f} GB ({limit / max(total, 1):.2f}, >=0.85)"
    )


def _gpu_memory_bytes() -> int:
    from synkhronos.rank.backends.gpu import gpu_table

    try:
        return int(gpu_table()[0][2].split()[0]) * 2**20
    except (RuntimeError, IndexError, ValueError):
        return 0


EXCLUDE_FLAG = "--xla_gpu_exclude_nondeterministic_ops=true"
"""XLA's deterministic scatters and reductions without ``--xla_gpu_deterministic_ops``'
other restrictions (the determinism check's third setting)."""


def _digest(values) -> str:
    return hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in values)).hexdigest()[:16]


def check_determinism_child(args) -> tuple[str, str]:
    """(One process) 20 steps: the digest of the parameters, the median step time, whether
    the ranks' parameters are identical, and the digest of 10 update phases alone run
    from the same seeded values in every process (what the ranks run on the same sums).
    ``--deterministic``: "1" (the default flags), "0" (none), "exclude" (EXCLUDE_FLAG)."""
    from synkhronos.rank.backends import gpu

    os.environ["SYNK_GPU_DETERMINISTIC"] = "1" if args.deterministic == "1" else "0"
    if args.deterministic == "exclude":
        os.environ["XLA_FLAGS"] = gpu.with_flags(os.environ.get("XLA_FLAGS", ""), [EXCLUDE_FLAG])
    import synkhronos as synk

    n = synk.fork(_n_ranks(), backend="gpu")
    try:
        sizes = (1000, 32, 64) if args.quick else (20_000, 256, 1024)
        step, params, data = _train(sizes, 256, n, embed=True)
        times = []
        for _ in range(20):
            start = time.perf_counter()
            step(*data)
            times.append(time.perf_counter() - start)
        digest = _digest(p.get_value() for p in params)
        agree = all(
            _digest(synk.get_value(r, params)) == _digest(synk.get_value(0, params))
            for r in range(1, n)
        )
        # The update phase alone, from values every process sets alike.
        state = [v for v in step.phases.param_updates if v is not step.phases.flat_grad]
        state.append(step.phases.flat_grad)
        rng = np.random.default_rng(7)
        values = [np.asarray(0.1 * rng.random(np.shape(v.get_value())), v.dtype) for v in state]
        values[-1][-1] = 256 * n  # the row count closes the flat gradient
        synk.broadcast(state, values)
        for _ in range(10):
            step.update_function()
        update = _digest(p.get_value() for p in params)
    finally:
        synk.close()
    return "PASS", json.dumps(
        {
            "digest": digest,
            "ms": 1e3 * float(np.median(times[5:])),
            "ranks_agree": agree,
            "update": update,
        }
    )


def check_determinism(args) -> tuple[str, str]:
    runs = []
    for flag in ("1", "1", "0", "0", "exclude"):
        status, figures = _child("determinism_child", args, 150, ["--deterministic", flag])
        if status != "PASS":
            return "FAIL", f"a run with --deterministic {flag}: {figures}"
        runs.append(json.loads(figures))
    on, off = runs[:2], runs[2:4]
    same = on[0]["digest"] == on[1]["digest"]

    def verdict(pair, key):
        return "equal" if pair[0][key] == pair[1][key] else "DIFFER"

    agree = "; ranks identical on, off: " + ", ".join(
        str(all(r["ranks_agree"] for r in pair)) for pair in (on, off)
    )
    best_on = min(r["ms"] for r in on)
    return ("PASS" if same and on[0]["ranks_agree"] else "FAIL"), (
        f"on, on: digests {verdict(on, 'digest')}; off, off: {verdict(off, 'digest')}; "
        f"update phase alone on, on: {verdict(on, 'update')}, off, off: "
        f"{verdict(off, 'update')}{agree if _n_gpus() > 1 else ''}; ms per step on "
        f"{on[0]['ms']:.2f}, {on[1]['ms']:.2f}, off {off[0]['ms']:.2f}, {off[1]['ms']:.2f}, "
        f"exclude-only {runs[4]['ms']:.2f} (on/off {best_on / min(r['ms'] for r in off):.2f}, "
        f"exclude-only/off {runs[4]['ms'] / min(r['ms'] for r in off):.2f})"
    )


def check_training_function(args) -> tuple[str, str]:
    """The one-line port, ``synk.function(inputs, loss, updates=adam(loss, params))``,
    embedding lookups included: 5 steps against ``pytensor.function`` in JAX mode in this
    process on the same device; parameters and Adam's state within float32 rounding."""
    import pytensor

    import synkhronos as synk
    from synkhronos.extensions.lasagne import updates

    n = synk.fork(_n_ranks(), backend="gpu")
    try:
        inputs, params, loss = _model((500, 64, 32), embed=True, seed=3)
        rule = updates.adam(loss, params, learning_rate=1e-2)
        state = list(rule)
        start = [v.get_value() for v in state]
        rng = np.random.default_rng(4)
        ids = rng.integers(0, 50, (64 * n + 3, 4)).astype("int32")
        y = rng.integers(0, 10, 64 * n + 3).astype("int32")
        f = synk.function(inputs, loss, updates=rule)
        kind = type(f).__name__
        losses = [float(f(ids, y)) for _ in range(5)]
        got = [v.get_value() for v in state]
        for v, value in zip(state, start, strict=True):
            v.set_value(value)
        ref = pytensor.function(inputs, loss, updates=rule, mode="JAX")
        ref_losses = [float(ref(ids, y)) for _ in range(5)]
        gap = max(
            float(np.abs(np.asarray(a) - np.asarray(b)).max())
            for a, b in zip(got, [v.get_value() for v in state], strict=True)
        )
        loss_gap = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
    finally:
        synk.close()
    ok = kind == "TrainingFunction" and gap < 1e-4 and loss_gap < 1e-4
    return ("PASS" if ok else "FAIL"), (
        f"{kind} on {n} rank(s): largest gap to one device {gap:.2e} (state), {loss_gap:.2e} (loss)"
    )


def check_close_after_kill(args) -> tuple[str, str]:
    import synkhronos as synk
    from synkhronos.session import launch

    gpus = [0, 0] if _n_gpus() == 1 else None
    try:
        synk.fork(2 if gpus is None else None, backend="gpu", gpus=gpus)
    except Exception as error:  # noqa: BLE001 - reported as the verdict
        return "SKIP", f"two ranks on one GPU refused: {str(error)[:80]}"
    session = launch.current()  # no collective: NCCL refuses two ranks on one GPU
    victim = session.processes[-1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(30)
    start = time.perf_counter()
    synk.close()
    seconds = time.perf_counter() - start
    return (
        "PASS" if seconds < 30 else "FAIL"
    ), f"close() after a worker was killed: {seconds:.2f} s"


def check_nccl_dead_peer(args) -> tuple[str, str]:
    if _n_gpus() < 2:
        return "SKIP", "needs >=2 GPUs"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "tests/test_gpu_faults.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    last = (done.stdout.strip().splitlines() or ["?"])[-1]
    return ("PASS" if done.returncode == 0 else "FAIL"), last


def check_stale_communicators(args) -> tuple[str, str]:
    if _n_gpus() < 2:
        return "SKIP", "needs >=2 GPUs"
    import pytensor

    import synkhronos as synk

    sums = []
    for master in (0, 1):
        n = synk.fork(None, backend="gpu", master_rank=master)
        try:
            v = pytensor.shared(np.arange(4, dtype="float32"), name=f"v{master}")
            synk.function([], v.sum())
            synk.set_value(n - 1, v, np.arange(4, dtype="float32") + 1)
            synk.all_reduce(v, "sum")
            sums.append(synk.get_value(0, v).tolist())
        finally:
            synk.close()
    want = (np.arange(4) * n + 1).tolist()
    return ("PASS" if sums == [want, want] else "FAIL"), f"sums {sums}, want {want} twice"


def check_figures(args) -> tuple[str, str]:
    import pytensor

    pytensor.config.floatX = "float32"
    import xla_timing

    import synkhronos as synk
    from synkhronos.api import routines

    size = 256_000 if args.quick else 25_600_000
    n = synk.fork(_n_ranks(), backend="gpu")
    try:
        rows = _call_overhead(synk)
        first, best = routines.run(xla_timing.all_reduce_seconds, np.array([size]), np.array([3]))[
            0
        ][0]
        rows.append(f"all_reduce {size / 1e6:g}M float32 {best * 1e3:.2f} ms (first {first:.2f} s)")
        sizes = (784, 128, 10) if args.quick else (784, 1024, 1024, 10)
        rows += _mlp_steps(synk, n, sizes, 32 if args.quick else 512, 3 if args.quick else 20)
    finally:
        synk.close()
    return "PASS", "; ".join(rows)


def _call_overhead(synk) -> list[str]:
    import pytensor
    import pytensor.tensor as pt
    from timing import best_of

    v = pt.vector("v")
    plain = pytensor.function([v], v.sum(), mode="JAX")
    f = synk.function([v], (v.sum(), "sum"))
    d = synk.data(np.ones(8, dtype=v.dtype))
    f(d)
    plain(d.data)
    t_synk, t_plain = best_of(lambda: f(d), 5, 200), best_of(lambda: plain(d.data), 5, 200)
    return [f"call synk / plain PyTensor JAX {t_synk * 1e6:.0f} / {t_plain * 1e6:.0f} us"]


def _mlp_steps(synk, n: int, sizes: tuple, batch: int, steps: int) -> list[str]:
    """Samples/s of the MLP step, fused and step by step (same model, same data)."""
    from run import mlp_step_chains
    from timing import best_of

    x, fused, unfused = mlp_step_chains(synk, sizes)
    rng = np.random.default_rng(0)
    total = batch * n
    xd = synk.data(rng.random((4 * total, 784)).astype(x.dtype))
    yd = synk.data(rng.integers(0, 10, 4 * total).astype("int32"))
    batches = iter(range(10**9))

    def run(chain):
        lo = (next(batches) % 4) * total
        chain(xd, yd, batch=slice(lo, lo + total))

    rows = []
    for label, chain in (("fused", fused), ("step by step", unfused)):
        run(chain)  # compiled
        seconds = best_of(lambda chain=chain: run(chain), 3, steps)
        rows.append(f"MLP {'-'.join(map(str, sizes))} {label} {total / seconds:,.0f} samples/s")
    return rows


def check_pymc(args) -> tuple[str, str]:
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("pymc", "numpyro")):
        return "SKIP", "needs pymc and numpyro"
    import bench_pymc

    rows, steps = (2_000, 20) if args.quick else (1_000_000, 500)
    names = ["pm numpyro", "synk 2 GPU ranks (numpyro)"]
    own, split = (bench_pymc.run_contender(n, rows, steps, steps) for n in names)
    for name, result in zip(names, (own, split), strict=True):
        if "error" in result:
            return "FAIL", f"{name}: {result['error']}"
    far = np.max(np.abs(np.subtract(split["means"], own["means"])) / own["mcse"])
    figures = (
        f"{rows} rows {steps}+{steps}: pm.sample numpyro {own['sampling_s']:.1f} s sampling "
        f"({own['wall_s']:.1f} s call); 2 ranks {split['sampling_s']:.1f} s sampling, "
        f"{split['compile_s']:.1f} s compile ({split['wall_s']:.1f} s call), "
        f"x{own['sampling_s'] / split['sampling_s']:.2f}; means within {far:.1f} MCSE"
    )
    return ("PASS" if far <= 4 else "FAIL"), figures


def check_resnet(args) -> tuple[str, str]:
    """Samples/s per rank of ResNet-50: synkhronos' fused steps (on one rank also the
    one-line training function's and plain PyTensor's), and a JAX loop by hand."""
    batch = 64
    got = resnet_figures(_n_ranks(), 224, batch, 1000, 10, more=True)
    forms = [("make_step_function", "synk"), ("one-line", "one-line"), ("pytensor", "pytensor")]
    return "PASS", f"{batch} per rank, samples/s per rank: JAX loop {got['jax']:.1f}; " + ", ".join(
        f"{name} {got[key]:.1f} ({got[key] / got['jax']:.2f})" for name, key in forms if key in got
    )


def resnet_figures(
    n_ranks: int | None, size: int, batch: int, classes: int, steps: int, more: bool = False
) -> dict:
    """Samples/s per rank of ResNet-50 on ``batch`` images of ``size`` pixels per rank
    (``n_ranks`` GPU ranks; None: fork's default): ``{"synk": make_step_function's fused
    step, "jax": the JAX loop by hand}``, each fed from host memory (numpy rows), medians
    of ``steps`` steps. With ``more`` on one rank, also ``"one-line"``: the one-line
    training function (``synk.function`` with the rule's updates), and ``"pytensor"``:
    the same step as a plain ``pytensor.function(mode="JAX")``, all four timed in turns
    (the JAX loop in this process, rank 0 being the only rank)."""
    import jax
    import pytensor
    import pytensor.tensor as pt
    import xla_timing

    import synkhronos as synk
    from demos.resnet import resnet50
    from synkhronos.api import routines
    from synkhronos.extensions.lasagne import layers as L
    from synkhronos.extensions.lasagne import objectives, updates
    from synkhronos.extensions.train import make_step_function
    from synkhronos.session import launch

    def model():
        x, y = pt.tensor4("x", dtype="float32"), pt.ivector("y")
        net = resnet50(L.InputLayer((None, 3, size, size), input_var=x), num_classes=classes)
        loss = objectives.categorical_crossentropy(L.get_output(net), y).mean()
        return [x, y], L.get_all_params(net, trainable=True), loss

    momentum = {"learning_rate": 0.01, "momentum": 0.9}  # as the JAX loop's (jax_resnet.py)

    n = synk.fork(n_ranks, backend="gpu")
    try:
        inputs, params, loss = model()
        step = make_step_function(loss, params, inputs, updates.momentum, **momentum)
        rng = np.random.default_rng(0)
        # Fed from host memory, as the JAX loop is (xla_timing.jax_resnet_seconds).
        images = rng.random((batch * n, 3, size, size), dtype=np.float32)
        labels = rng.integers(0, classes, batch * n, dtype=np.int32)
        runs = {"synk": lambda: step(images, labels)}
        if more and n == 1:
            inputs, params, loss = model()
            one_line = synk.function(
                inputs, loss, updates=updates.momentum(loss, params, **momentum)
            )
            inputs, params, loss = model()
            rule = updates.momentum(loss, params, **momentum)
            plain = pytensor.function(inputs, loss, updates=rule, mode="JAX")

            def run_plain():  # its updates are left running: wait for them
                plain(images, labels)
                jax.block_until_ready([c.storage[0] for c in plain.input_storage])

            runs.update({"one-line": lambda: one_line(images, labels), "pytensor": run_plain})
            comm = launch.current().state.comm
            runs["jax"] = xla_timing.jax_resnet_step(comm, batch, size, classes)
        times: dict = {name: [] for name in runs}
        for run in runs.values():
            run()
        for _ in range(steps):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        if "jax" not in runs:
            _, theirs = routines.run(
                xla_timing.jax_resnet_seconds, np.array([batch, size, classes]), np.array([steps])
            )[0][0]
            times["jax"] = [theirs]
    finally:
        synk.close()
    return {k: batch / float(np.median(t)) for k, t in times.items()}


CHECKS = {  # name: (function, time limit in seconds)
    "refork": (check_refork, 90),
    "jax_first": (check_jax_first, 90),
    "nvidia_smi": (check_nvidia_smi, 30),
    "memory": (check_memory, 240),
    "training_function": (check_training_function, 120),
    "determinism": (check_determinism, 600),
    "close_after_kill": (check_close_after_kill, 90),
    "nccl_dead_peer": (check_nccl_dead_peer, 120),
    "stale_communicators": (check_stale_communicators, 120),
    "figures": (check_figures, 150),
    "resnet": (check_resnet, 540),
    "pymc": (check_pymc, 180),
}
HIDDEN = {
    "determinism_child": (check_determinism_child, 150),
    "memory_hand": (check_memory_hand, 120),
}


def _child(name: str, args, limit: float, extra: tuple | list = ()) -> tuple[str, str]:
    """Run check ``name`` in a fresh process, at most ``limit`` seconds."""
    command = [sys.executable, str(Path(__file__).resolve()), "--check", name, *extra]
    if args.quick:
        command.append("--quick")
    # A check's own children (and synkhronos' workers) share its process group: a check
    # that runs out of time is ended with all of them.
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=not args.check,
    )
    try:
        stdout, stderr = child.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        if not args.check:
            os.killpg(child.pid, signal.SIGKILL)
        child.kill()
        child.communicate()
        return "FAIL", f"timed out after {limit:g} s"
    done = subprocess.CompletedProcess(command, child.returncode, stdout, stderr)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT):
            status, figures = json.loads(line[len(RESULT) :])
            return status, figures
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return "FAIL", f"exit {done.returncode}: {tail[:150]}"


def _run_one(args) -> None:
    _setup()
    function = {**CHECKS, **HIDDEN}[args.check][0]
    status, figures = function(args)
    print(RESULT + json.dumps([status, figures]), flush=True)


def main(argv=None) -> int:
    args = _args(argv)
    if args.check:
        _run_one(args)
        return 0
    _setup()
    from synkhronos.rank.backends.gpu import on_cpu_devices

    deadline = time.monotonic() + args.budget
    lines = []
    for name, (_, limit) in CHECKS.items():
        left = deadline - time.monotonic()
        start = time.monotonic()
        if name == "pymc" and not args.pymc:
            continue  # asked for only (a row of its own then)
        if name == "resnet" and not args.resnet:
            status, figures = "SKIP", "not asked (--resnet)"
        elif left < min(limit, 30):
            status, figures = "SKIP", f"budget: {left:.0f} s left"
        else:
            status, figures = _child(name, args, min(limit, left))
        lines.append(f"{name:20s} {status:4s} {time.monotonic() - start:6.1f} s  {figures}")
        print(lines[-1], flush=True)
    device = "CPU devices" if on_cpu_devices() else (_device_name() or "GPU")
    head = f"synkhronos GPU check, {device}, {time.strftime('%Y-%m-%d %H:%M')}"
    verdict = "\n".join([head, *lines])
    print("\n" + verdict)
    if args.out:
        args.out.write_text(verdict + "\n")
    return 1 if any(" FAIL " in line for line in lines) else 0


def _device_name() -> str:
    from synkhronos.rank.backends.gpu import gpu_table

    try:
        rows = gpu_table()
    except RuntimeError:
        return ""
    return f"{len(rows)} x {rows[0][1]}" if rows else ""


if __name__ == "__main__":
    sys.exit(main())
