"""A GPU rank's overhead over JAX written by hand, side by side in one run (#51).

Each part runs in a fresh process (``--part``), with ``JAX_PLATFORMS=cpu`` unless a GPU
is visible:

call N
    a tiny function (``v.sum()`` of 8 floats) on N GPU ranks, given a ``Data`` and a numpy
    array, against the same graph as a plain ``pytensor.function(mode="JAX")``:
    microseconds per call, best of rounds taken in turns, and the ratios. On 2 ranks
    also with ``SYNK_HOST_REDUCE_BYTES=0``: the scalar output reduced by an XLA program,
    as before small outputs went through the host replies.
reduce
    on 2 GPU ranks, an output of ``2**k`` float32 (``x.sum() * c``, op "sum", ``c`` a
    shared vector) reduced through the host replies and through XLA (the same call, in
    two processes with ``SYNK_HOST_REDUCE_BYTES`` at its largest and at 0): the
    microseconds per call at each size, to choose the threshold between the paths.
mlp
    the one-line MLP step (784-1024-1024-10, Adam, batch 256) on one GPU rank,
    ``synk.function([x, y], loss, updates=adam(loss, params))``, against a hand-written
    ``jax.jit`` step (Adam by hand, its buffers donated), both fed host numpy arrays each
    step; and each fed what stays put (the synkhronos step a ``Data``, the JAX step
    device arrays). Both start from the same parameters; the run checks that they agree
    after the warm-up steps. Milliseconds per step, median of blocks taken in turns (wall
    time; for the host-fed steps also the process's CPU time, all its threads); and
    the device memory each takes at its first step (the buffers alive on the device: CPU
    devices have no allocator figures).
resnet
    (``--resnet``) ResNet-50 at a reduced size (``--image-size``, ``--resnet-batch``) on
    one GPU rank: ``make_step_function``'s fused step, the one-line training function and
    the same step as a plain ``pytensor.function(mode="JAX")``, timed in turns, against
    the JAX loop of ``jax_resnet.py`` (``gpu_check.py``'s resnet check).

Usage::

    python bench/bench_gpu_overhead.py [--resnet | --calls-only] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULT = "OVERHEAD_RESULT "


def _args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--resnet", action="store_true", help="also ResNet-50 (minutes)")
    parser.add_argument(
        "--calls-only", action="store_true", help="only the tiny calls (1 and 2 ranks)"
    )
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--resnet-batch", type=int, default=4)
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=1, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def part_call(args) -> dict:
    import pytensor
    import pytensor.tensor as pt
    from timing import best_of

    import synkhronos as synk

    synk.fork(args.ranks, backend="gpu")
    try:
        v = pt.vector("v")
        plain = pytensor.function([v], v.sum(), mode="JAX")
        f = synk.function([v], (v.sum(), "sum"))
        d = synk.data(np.ones(8, dtype=v.dtype))
        assert float(f(d)) == float(plain(d.data)) == 8.0
        a = np.ones(8, dtype=v.dtype)
        calls = {"synk": lambda: f(d), "synk numpy": lambda: f(a), "plain": lambda: plain(a)}
        times: dict = {name: [] for name in calls}
        for _ in range(20 * args.rounds):  # short rounds: the best finds a quiet moment
            for name, call in calls.items():
                times[name].append(best_of(call, 1, 100))
    finally:
        synk.close()
    return {name: 1e6 * min(t) for name, t in times.items()}


REDUCE_SIZES = (16, 1024, 16384, 262144, 1048576)  # float32 elements


def part_reduce(args) -> dict:
    import pytensor
    import pytensor.tensor as pt
    from timing import best_of

    import synkhronos as synk

    synk.fork(2, backend="gpu")
    try:
        x = pt.vector("x")
        c = pytensor.shared(np.zeros(1, dtype=x.dtype), name="c")
        f = synk.function([x], (x.sum() * c, "sum"))
        d = synk.data(np.ones(27, dtype=x.dtype))
        times = {}
        for n in REDUCE_SIZES:
            c.set_value(np.arange(n, dtype=x.dtype))
            np.testing.assert_allclose(f(d), 27 * np.arange(n), rtol=1e-6)
            times[n] = 1e6 * min(best_of(lambda: f(d), 1, 10) for _ in range(args.rounds))
    finally:
        synk.close()
    return times


SIZES = (784, 1024, 1024, 10)
BATCH = 256


def _jax_adam_step():
    """A hand-written ``jax.jit`` step of :func:`run.mlp`'s network with Lasagne's Adam
    (learning rate 1e-3, its buffers donated)."""
    import jax
    import jax.numpy as jnp

    b1, b2, lr, eps = 0.9, 0.999, 1e-3, 1e-8

    def loss_of(params, x, y):
        h = x
        for i in range(0, len(params), 2):
            h = h @ params[i] + params[i + 1]
            h = jnp.maximum(h, 0) if i < len(params) - 2 else jax.nn.log_softmax(h, axis=1)
        return -jnp.take_along_axis(h, y[:, None], axis=1).mean()

    def step(params, m, v, t, x, y):
        loss, grads = jax.value_and_grad(loss_of)(params, x, y)
        t = t + 1
        a = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        m = [b1 * mi + (1 - b1) * g for mi, g in zip(m, grads, strict=True)]
        v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, grads, strict=True)]
        params = [p - a * mi / (jnp.sqrt(vi) + eps) for p, mi, vi in zip(params, m, v, strict=True)]
        return params, m, v, t, loss

    return jax.jit(step, donate_argnums=(0, 1, 2))


def part_mlp(args) -> dict:
    import jax
    from bench_one_line import timed_blocks
    from gpu_check import _in_use
    from run import mlp

    import synkhronos as synk
    from synkhronos.extensions.lasagne import updates

    synk.fork(1, backend="gpu")
    try:
        x, y, loss, params = mlp(sizes=SIZES)
        start = [p.get_value() for p in params]
        f = synk.function([x, y], loss, updates=updates.adam(loss, params))
        rng = np.random.default_rng(0)
        xs = rng.random((8 * BATCH, SIZES[0])).astype(x.dtype)
        ys = rng.integers(0, SIZES[-1], 8 * BATCH).astype("int32")
        xd, yd = synk.data(xs), synk.data(ys)
        step = _jax_adam_step()
        device = jax.devices()[0]
        at = iter(range(10**9))

        def rows() -> slice:
            lo = (next(at) % 8) * BATCH
            return slice(lo, lo + BATCH)

        def jax_step(x_in, y_in, r: slice) -> None:
            *kept, loss_j = step(*state, x_in[r], y_in[r])
            state[:] = kept
            loss_j.block_until_ready()

        # Compile, and check that both train the same model; the device memory each takes
        # by its first step (its state and what it keeps).
        before = _in_use(device)
        r = rows()
        f(xs[r], ys[r])
        memory = {"synk memory": _in_use(device) - before}
        before = _in_use(device)
        state = [
            [jax.device_put(p) for p in start],
            [jax.device_put(np.zeros_like(p)) for p in start],
            [jax.device_put(np.zeros_like(p)) for p in start],
            jax.device_put(np.float32(0)),
        ]
        jax_step(xs, ys, r)
        memory["jax memory"] = _in_use(device) - before
        for _ in range(2):
            r = rows()
            f(xs[r], ys[r])
            jax_step(xs, ys, r)
        xj, yj = jax.device_put(xs), jax.device_put(ys)
        gap = max(
            float(np.abs(p.get_value() - np.asarray(q)).max())
            for p, q in zip(params, state[0], strict=True)
        )
        assert gap < 1e-4, f"the synkhronos and the JAX step disagree by {gap}"
        f(xd, yd, batch=rows())  # the Data form compiles nothing new; warm it
        host = {
            "synk host": lambda: f(*(a[r] for r in [rows()] for a in (xs, ys))),
            "jax host": lambda: jax_step(xs, ys, rows()),
        }
        steps = {
            **host,
            "synk data": lambda: f(xd, yd, batch=rows()),
            "jax device": lambda: jax_step(xj, yj, rows()),
        }
        times = timed_blocks(steps, 10, args.rounds)
        # CPU time, which other processes on the machine disturb less than wall time
        cpu = timed_blocks(host, 10, args.rounds, time.process_time)
    finally:
        synk.close()
    return {
        **{name: 1e3 * s for name, s in times.items()},
        **{f"{name} cpu": 1e3 * s for name, s in cpu.items()},
        **memory,
    }


def part_resnet(args) -> dict:
    sys.argv = [sys.argv[0]]
    import gpu_check

    return gpu_check.resnet_figures(
        1, args.image_size, args.resnet_batch, classes=10, steps=max(5, args.rounds), more=True
    )


def _child(part: str, args, extra: tuple = (), host_bytes: int | None = None) -> dict:
    env = dict(os.environ)
    if host_bytes is not None:
        env["SYNK_HOST_REDUCE_BYTES"] = str(host_bytes)
    command = [sys.executable, str(Path(__file__).resolve()), "--part", part, *extra]
    command += ["--rounds", str(args.rounds), "--image-size", str(args.image_size)]
    command += ["--resnet-batch", str(args.resnet_batch)]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=HERE.parent, env=env, check=False
    )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    raise RuntimeError(f"part {part} failed:\n{done.stderr[-3000:]}")


def main(argv=None) -> None:
    args = _args(argv)
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    from synkhronos.rank.backends.gpu import visible_gpus

    if not visible_gpus():
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.part:
        parts = {"call": part_call, "reduce": part_reduce, "mlp": part_mlp, "resnet": part_resnet}
        print(RESULT + json.dumps(parts[args.part](args)), flush=True)
        return
    device = "CPU devices" if os.environ.get("JAX_PLATFORMS") == "cpu" else "GPU"
    print(f"GPU ranks' overhead, {device}, {time.strftime('%Y-%m-%d %H:%M')}")
    for n, host_bytes, how in ((1, None, ""), (2, 0, ", by XLA"), (2, None, ", by the host")):
        c = _child("call", args, ("--ranks", str(n)), host_bytes)
        print(
            f"tiny call, {n} rank(s){how}: synk {c['synk']:.1f} us (a numpy argument "
            f"{c['synk numpy']:.1f}), plain JAX mode {c['plain']:.1f} us, ratio "
            f"{c['synk'] / c['plain']:.2f} ({c['synk numpy'] / c['plain']:.2f})"
        )
    if args.calls_only:
        return
    by_host = _child("reduce", args, (), 2**62)
    by_xla = _child("reduce", args, (), 0)
    print("an output of 2 ranks reduced, us per call: bytes, by the host, by XLA")
    for n in REDUCE_SIZES:
        print(f"  {4 * n}: {by_host[str(n)]:.0f}, {by_xla[str(n)]:.0f}")
    m = _child("mlp", args)
    print(f"MLP {'-'.join(map(str, SIZES))} Adam, batch {BATCH}, 1 rank, ms per step:")
    print(
        f"  host numpy: synk {m['synk host']:.2f}, jax.jit {m['jax host']:.2f}, "
        f"speed ratio {m['jax host'] / m['synk host']:.3f}"
    )
    print(
        f"  host numpy, CPU time (process): synk {m['synk host cpu']:.2f}, jax.jit "
        f"{m['jax host cpu']:.2f}, ratio {m['jax host cpu'] / m['synk host cpu']:.3f}"
    )
    print(
        f"  kept data: synk (Data) {m['synk data']:.2f}, jax.jit (device arrays) "
        f"{m['jax device']:.2f}; host / kept: synk {m['synk host'] / m['synk data']:.2f}, "
        f"jax {m['jax host'] / m['jax device']:.2f}"
    )
    print(
        f"  device memory after the first step: synk {m['synk memory'] / 1e6:.1f} MB, "
        f"jax.jit {m['jax memory'] / 1e6:.1f} MB, ratio {m['synk memory'] / m['jax memory']:.2f}"
    )
    if args.resnet:
        r = _child("resnet", args)
        print(
            f"ResNet-50 {args.image_size} px, {args.resnet_batch} images, 1 rank, samples/s "
            f"(ratio to the JAX loop): JAX loop {r['jax']:.2f}, make_step_function "
            f"{r['synk']:.2f} ({r['synk'] / r['jax']:.2f}), one-line synk.function "
            f"{r['one-line']:.2f} ({r['one-line'] / r['jax']:.2f}), plain JAX-mode "
            f"pytensor.function {r['pytensor']:.2f} ({r['pytensor'] / r['jax']:.2f})"
        )


if __name__ == "__main__":
    main()
