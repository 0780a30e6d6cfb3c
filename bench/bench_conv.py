"""Benchmark synkhronos' conv2d and max-pool Ops (forward + gradients) against references.

Default (CPU, PyTensor's default Numba mode): compared with PyTorch's CPU ops, measured
side by side in one run (needs ``torch``; skips with a message without it).
``--mode JAX``: the same PyTensor graphs compiled in JAX mode, compared with
hand-written ``jax.jit`` functions of ``jax.lax`` ops and ``jax.vjp``, on JAX's default
device (a GPU when ``jax[cuda]`` is installed, else the CPU).

Layers (float32 by default):

- conv: ResNet-style 3x3, 64->64 channels, 56x56, batch 32, padding 1;
- pool: ResNet's stem max pool, 3x3 stride 2 padding 1, on 64 channels of 112x112.

Timings are the minimum over ``--repeats`` runs, with the two implementations
interleaved so that load from other processes hits both alike.

Usage::

    python bench/bench_conv.py [--mode {NUMBA,JAX}] [--batch 32] [--channels 64]
                               [--size 56] [--repeats 5] [--dtype float32] [--threads N]
"""

import argparse
import time
from collections.abc import Callable

import numpy as np
import pytensor
import pytensor.tensor as pt

from synkhronos.ops.conv import conv2d, pool2d


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["NUMBA", "JAX"], default="NUMBA")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--size", type=int, default=56, help="conv size; the pool input is 2x")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU: BLAS and torch threads (default: theirs); 1 is steadier on a busy box",
    )
    return parser.parse_args()


def make_data(args: argparse.Namespace) -> dict[str, list[np.ndarray]]:
    """Inputs and output gradients of both layers."""
    rng = np.random.default_rng(0)
    n, c, s = args.batch, args.channels, args.size

    def normal(*shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(args.dtype)

    return {
        "conv": [
            normal(n, c, s, s),
            normal(c, c, 3, 3, scale=1 / np.sqrt(9 * c)),
            normal(n, c, s, s),
        ],
        "pool": [normal(n, c, 2 * s, 2 * s), normal(n, c, s, s)],
    }


def pytensor_steps(args: argparse.Namespace, mode: str | None) -> dict[str, Callable]:
    """Compiled ``conv(x, w, gy) -> (y, dx, dw)`` and ``pool(x, gy) -> (y, dx)``."""
    x, w, gy = (pt.tensor4(name, dtype=args.dtype) for name in ("x", "w", "gy"))
    y = conv2d(x, w, padding=1)
    conv = pytensor.function(
        [x, w, gy], [y, *pytensor.grad(None, [x, w], known_grads={y: gy})], mode=mode
    )
    pooled = pool2d(x, 3, 2, 1)
    pool = pytensor.function(
        [x, gy], [pooled, *pytensor.grad(None, [x], known_grads={pooled: gy})], mode=mode
    )
    for fn in (conv, pool):
        # Inputs are passed ready-made (device arrays under JAX), as to the references.
        fn.trust_input = True
    return {"conv": conv, "pool": pool}


def check_close(name: str, ours, reference) -> None:
    """Fail unless each output matches the reference to float32 accuracy of its scale."""
    for a, b in zip(ours, reference, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        error = np.abs(a - b).max() / np.abs(b).max()
        if error > 1e-4:
            raise AssertionError(f"{name} differs from the reference: relative error {error:.1e}")


def interleaved_min(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Minimum wall time of each zero-argument callable, run alternately after a warm-up."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, np.inf)
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def bench_cpu(args: argparse.Namespace) -> None:
    """PyTensor default (Numba) mode against PyTorch on the CPU."""
    try:
        import torch
    except ImportError:
        print("bench_conv: torch is not installed; skipping the CPU comparison.")
        return
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    data = make_data(args)
    ours = pytensor_steps(args, mode=None)
    tensors = {k: [torch.from_numpy(a) for a in v] for k, v in data.items()}
    for k in tensors:
        tensors[k][0].requires_grad_()
    tensors["conv"][1].requires_grad_()

    def torch_conv():
        x, w, gy = tensors["conv"]
        y = torch.nn.functional.conv2d(x, w, padding=1)
        return y, *torch.autograd.grad(y, (x, w), gy)

    def torch_pool():
        x, gy = tensors["pool"]
        y = torch.nn.functional.max_pool2d(x, 3, 2, 1)
        return y, *torch.autograd.grad(y, (x,), gy)

    reference = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    for name, torch_step in (("conv", torch_conv), ("pool", torch_pool)):
        check_close(name, ours[name](*data[name]), [t.detach().numpy() for t in torch_step()])
        times = interleaved_min(
            {"synkhronos": lambda name=name: ours[name](*data[name]), "torch": torch_step},
            args.repeats,
        )
        report(args, name, times, reference)


def bench_jax(args: argparse.Namespace) -> None:
    """PyTensor JAX mode against hand-written ``jax.lax`` ops + ``jax.vjp``."""
    import jax
    from jax import lax

    data = {k: [jax.device_put(a) for a in v] for k, v in make_data(args).items()}
    ours = pytensor_steps(args, mode="JAX")

    @jax.jit
    def jax_conv(x, w, gy):
        def conv(x_, w_):
            return lax.conv_general_dilated(
                x_, w_, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW")
            )

        y, pullback = jax.vjp(conv, x, w)
        return y, *pullback(gy)

    @jax.jit
    def jax_pool(x, gy):
        def pool(x_):
            padding = ((0, 0), (0, 0), (1, 1), (1, 1))
            return lax.reduce_window(x_, -np.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2), padding)

        y, pullback = jax.vjp(pool, x)
        return y, *pullback(gy)

    reference = f"jax {jax.__version__} on {jax.devices()[0]}"
    for name, jax_step in (("conv", jax_conv), ("pool", jax_pool)):
        check_close(name, ours[name](*data[name]), jax_step(*data[name]))
        times = interleaved_min(
            {
                "synkhronos": lambda name=name: jax.block_until_ready(ours[name](*data[name])),
                "jax": lambda name=name, step=jax_step: jax.block_until_ready(step(*data[name])),
            },
            args.repeats,
        )
        report(args, name, times, reference)


def report(args: argparse.Namespace, name: str, times: dict[str, float], reference: str) -> None:
    """Print the timings and the ratio ours / reference."""
    (ours_name, ours), (ref_name, ref) = times.items()
    c, s = args.channels, args.size
    layer = {
        "conv": f"conv2d 3x3 {c}->{c} ch {s}x{s}",
        "pool": f"max pool 3x3/2 pad 1, {c} ch {2 * s}x{2 * s}",
    }[name]
    print(f"{layer}, batch {args.batch}, {args.dtype}, fwd+bwd, mode {args.mode} vs {reference}")
    print(f"  {ours_name:>10}: {ours * 1e3:8.1f} ms")
    print(f"  {ref_name:>10}: {ref * 1e3:8.1f} ms")
    print(f"  ratio {ours_name}/{ref_name}: {ours / ref:.2f}")


def main() -> None:
    """Run the benchmark selected on the command line."""
    args = parse_args()
    if args.mode == "JAX":
        bench_jax(args)
        return
    if args.threads is None:
        bench_cpu(args)
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise SystemExit("bench_conv: --threads needs threadpoolctl") from None
    with threadpool_limits(args.threads):
        bench_cpu(args)


if __name__ == "__main__":
    main()
