"""Benchmark synkhronos' conv2d Op (forward + both gradients) against a reference.

Default (CPU, PyTensor's default Numba mode): compared with PyTorch's CPU convolution,
measured side by side in one run (needs ``torch``; skips with a message without it).
``--mode JAX``: the same PyTensor graph compiled in JAX mode, compared with a
hand-written ``jax.jit`` of ``jax.lax.conv_general_dilated`` + ``jax.vjp`` on JAX's
default device (a GPU when ``jax[cuda]`` is installed, else the CPU).

The layer defaults to a ResNet-style 3x3, 64->64 channel, 56x56 convolution with batch
32, padding 1, float32.  Timings are the minimum over ``--repeats`` runs, with the two
implementations interleaved so that load from other processes hits both alike.

Usage::

    python bench/bench_conv.py [--mode {NUMBA,JAX}] [--batch 32] [--channels 64]
                               [--size 56] [--kernel 3] [--repeats 5] [--dtype float32]
"""

import argparse
import time
from collections.abc import Callable

import numpy as np
import pytensor
import pytensor.tensor as pt

from synkhronos.extensions.conv import conv2d


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["NUMBA", "JAX"], default="NUMBA")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--size", type=int, default=56)
    parser.add_argument("--kernel", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    return parser.parse_args()


def make_data(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random input, filters and output gradient for the benchmarked layer."""
    rng = np.random.default_rng(0)
    c, s, k = args.channels, args.size, args.kernel
    x = rng.standard_normal((args.batch, c, s, s)).astype(args.dtype)
    w = (rng.standard_normal((c, c, k, k)) / np.sqrt(c * k * k)).astype(args.dtype)
    gy = rng.standard_normal((args.batch, c, s, s)).astype(args.dtype)
    return x, w, gy


def pytensor_step(args: argparse.Namespace, mode: str) -> Callable:
    """Compiled PyTensor function ``(x, w, gy) -> (y, dx, dw)``."""
    x = pt.tensor4("x", dtype=args.dtype)
    w = pt.tensor4("w", dtype=args.dtype)
    gy = pt.tensor4("gy", dtype=args.dtype)
    y = conv2d(x, w, padding=args.kernel // 2)
    dx, dw = pytensor.grad(None, [x, w], known_grads={y: gy})
    fn = pytensor.function([x, w, gy], [y, dx, dw], mode=mode)
    # Inputs are passed ready-made (device arrays under JAX), as for the reference.
    fn.trust_input = True
    return fn


def check_close(ours, reference) -> None:
    """Fail unless each output matches the reference to float32 accuracy of its scale."""
    for name, a, b in zip(("y", "dx", "dw"), ours, reference, strict=True):
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
    x, w, gy = make_data(args)
    step = pytensor_step(args, mode=None)
    xt, wt = (torch.from_numpy(a).requires_grad_() for a in (x, w))
    gyt = torch.from_numpy(gy)

    def torch_step():
        y = torch.nn.functional.conv2d(xt, wt, padding=args.kernel // 2)
        return y, *torch.autograd.grad(y, (xt, wt), gyt)

    check_close(step(x, w, gy), [t.detach().numpy() for t in torch_step()])
    times = interleaved_min(
        {"synkhronos": lambda: step(x, w, gy), "torch": torch_step}, args.repeats
    )
    report(args, times, f"torch {torch.__version__}, {torch.get_num_threads()} threads")


def bench_jax(args: argparse.Namespace) -> None:
    """PyTensor JAX mode against hand-written ``jax.lax.conv`` + ``jax.vjp``."""
    import jax
    from jax import lax

    pad = args.kernel // 2
    data = [jax.device_put(a) for a in make_data(args)]
    step = pytensor_step(args, mode="JAX")

    @jax.jit
    def jax_step(x, w, gy):
        def conv(x_, w_):
            return lax.conv_general_dilated(
                x_, w_, (1, 1), ((pad, pad), (pad, pad)), dimension_numbers=("NCHW", "OIHW", "NCHW")
            )

        y, pullback = jax.vjp(conv, x, w)
        return y, *pullback(gy)

    def run(fn):
        return lambda: jax.block_until_ready(fn(*data))

    check_close(step(*data), jax_step(*data))
    times = interleaved_min({"synkhronos": run(step), "jax": run(jax_step)}, args.repeats)
    report(args, times, f"jax {jax.__version__} on {jax.devices()[0]}")


def report(args: argparse.Namespace, times: dict[str, float], reference: str) -> None:
    """Print the timings and the ratio ours / reference."""
    (ours_name, ours), (ref_name, ref) = times.items()
    c, s, k = args.channels, args.size, args.kernel
    print(
        f"conv2d fwd+bwd, batch {args.batch}, {c}->{c} ch, {k}x{k}, {s}x{s}, {args.dtype}, "
        f"mode {args.mode} vs {reference}"
    )
    print(f"  {ours_name:>10}: {ours * 1e3:8.1f} ms")
    print(f"  {ref_name:>10}: {ref * 1e3:8.1f} ms")
    print(f"  ratio {ours_name}/{ref_name}: {ours / ref:.2f}")


def main() -> None:
    """Run the benchmark selected on the command line."""
    args = parse_args()
    if args.mode == "JAX":
        bench_jax(args)
    else:
        bench_cpu(args)


if __name__ == "__main__":
    main()
