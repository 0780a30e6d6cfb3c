"""Which CPU backend ``backend="auto"`` takes: measured once on this machine, remembered.

PyTensor's JAX mode can be faster than its default mode on a CPU, or slower: on the VMs
this project was measured on, a one-core training step of a 784-512-512-10 MLP at 128
rows ran 2.0x faster in JAX mode on one (AMD Zen 5, AVX-512) and 3% slower on another.
No rule fixes the answer in advance, so :func:`faster_cpu_backend` times that step in
both modes, in a child process pinned to one core with one thread (as a rank runs), and
takes "jax-cpu" only when JAX mode is at least :data:`MARGIN` times faster. The answer is
kept in a small JSON file keyed by the CPU, the package versions and floatX (with
float64, PyTensor turns on JAX's 64-bit mode: the same float32 step then ran 2.6x slower
in JAX mode than in the default mode on that Zen 5 VM), so that the measurement (a few
seconds, most of it compiling) runs once per machine and floatX.

The environment variable ``SYNK_CPU_BACKEND`` ("cpu" or "jax-cpu") decides instead of
the measurement; ``SYNK_CACHE_DIR`` moves the file (default ``$XDG_CACHE_HOME/synkhronos``
or ``~/.cache/synkhronos``).

Run as ``python -m synkhronos.rank.backends.cpu_choice`` to print the two step times.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

from synkhronos.rank.backends.cpu import xla_flags
from synkhronos.rank.versions import installed_versions

MARGIN = 1.10
"""How much faster JAX mode must be before "auto" takes it: near a tie the default mode
wins, as it has none of JAX mode's caveats (with floatX float32 JAX computes 64-bit values
in 32 bits, which :func:`synkhronos.function` warns of; some ops do not compile)."""

CHOICE_VAR = "SYNK_CPU_BACKEND"
CACHE_VAR = "SYNK_CACHE_DIR"
PROBE_TIMEOUT_S = 300
CHOICES = ("cpu", "jax-cpu")
logger = logging.getLogger(__name__)
_SIZES, _ROWS, _STEPS, _ROUNDS = (784, 512, 512, 10), 128, 20, 3


def cache_file() -> Path:
    """Where the measured choice is kept."""
    base = os.environ.get(CACHE_VAR) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "synkhronos"
    )
    return Path(base) / "cpu_backend.json"


_CPU_LINES = (
    "model name",
    "flags",
    "Features",
    "CPU implementer",
    "CPU part",
    "CPU architecture",
)  # /proc/cpuinfo lines naming the CPU (x86, then Arm)


def machine_key(float_x: str) -> str:
    """What the answer depends on: the CPU (model and features), the package versions,
    floatX (with float64, PyTensor turns on JAX's 64-bit mode, which is slower) and the
    environment that changes either mode's code: ``PYTENSOR_FLAGS``, ``XLA_FLAGS``, and
    OpenBLAS's kernel choice (``OPENBLAS_CORETYPE``, ``OPENBLAS_L2_SIZE``; SciPy's
    OpenBLAS runs the default mode's matrix products). On the Zen 5 VM of
    ``bench/RESULTS.md`` ``OPENBLAS_CORETYPE=Haswell`` made the default mode's step 1.65x
    slower than with the kernels OpenBLAS picks itself, taking JAX mode's lead from 1.1x
    to 1.9x."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(_CPU_LINES)]
        cpu = "".join(sorted(set(lines))) or cpu
    except OSError:
        pass
    installed = [
        f"{package}={version or 'none'}"
        for package, version in installed_versions(
            ("pytensor", "jax", "jaxlib", "numpy", "scipy", "numba")
        ).items()
    ]
    flags = [
        os.environ.get(v, "")
        for v in ("PYTENSOR_FLAGS", "XLA_FLAGS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    ]
    text = "\n".join([platform.machine(), cpu, *installed, float_x, *flags])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def choose(seconds: dict[str, float]) -> str:
    """The backend for measured step times ``{"cpu": s, "jax-cpu": s}``.

    Examples
    --------
    >>> choose({"cpu": 4.5e-3, "jax-cpu": 2.2e-3})
    'jax-cpu'
    >>> choose({"cpu": 4.5e-3, "jax-cpu": 4.3e-3})   # within MARGIN: the default mode
    'cpu'
    """
    return "jax-cpu" if seconds["cpu"] >= MARGIN * seconds["jax-cpu"] else "cpu"


def faster_cpu_backend() -> str:
    """ "cpu" or "jax-cpu": the environment's choice, else the remembered or new measurement.

    Without JAX installed the answer is "cpu", unmeasured. A measurement that fails
    logs why (a warning) and gives "cpu" (and is not remembered).
    """
    known = known_choice()
    if known is not None:
        return known[0]
    import pytensor

    float_x = pytensor.config.floatX
    path, key = cache_file(), machine_key(float_x)
    logger.info(
        "synkhronos: backend='auto' is timing PyTensor's default and JAX modes on "
        "this CPU, once (the answer is kept in %s)",
        path,
    )
    try:
        seconds = _measure_in_child(float_x)
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as error:
        logger.warning(
            "synkhronos: the measurement of the CPU backends failed (%s); using backend 'cpu'",
            error,
        )
        return "cpu"
    choice = choose(seconds)
    logger.info(
        "synkhronos: backend='auto' takes %r on this CPU (a step took %.3g ms in the "
        "default mode, %.3g ms in JAX mode)",
        choice,
        1e3 * seconds["cpu"],
        1e3 * seconds["jax-cpu"],
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed, so that a program starting meanwhile reads all or none.
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        kept = _kept(path)
        kept[key] = {"choice": choice, "seconds": seconds}
        partial.write_text(json.dumps(kept, indent=1))
        os.replace(partial, path)
    except OSError:
        pass  # not remembered: measured again next time
    return choice


def known_choice() -> tuple[str, str] | None:
    """The choice :func:`faster_cpu_backend` makes without measuring, and why: the
    environment's, JAX missing, or the remembered measurement; None if it would measure."""
    forced = os.environ.get(CHOICE_VAR)
    if forced:
        if forced not in CHOICES:
            raise ValueError(f"{CHOICE_VAR}={forced!r}; use one of {CHOICES}")
        return forced, f"{CHOICE_VAR}={forced}"
    if importlib.util.find_spec("jax") is None:
        return "cpu", "JAX is not installed"
    import pytensor

    path = cache_file()
    entry = _kept(path).get(machine_key(pytensor.config.floatX))
    if isinstance(entry, dict) and entry.get("choice") in CHOICES:
        seconds = entry.get("seconds") or {}
        timed = ", ".join(f"{name} {1e3 * float(s):.3g} ms" for name, s in seconds.items())
        return entry["choice"], f"measured on this machine ({timed}; kept in {path})"
    return None


def _kept(path: Path) -> dict:
    """The measurements kept in ``path``, one per :func:`machine_key` (machines may share
    a home directory)."""
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def _measure_in_child(float_x: str) -> dict[str, float]:
    """Step times from ``python -m synkhronos.rank.backends.cpu_choice`` on one core."""
    flags = ",".join(f for f in (os.environ.get("PYTENSOR_FLAGS"), f"floatX={float_x}") if f)
    # As a one-core rank runs: one BLAS thread, XLA without its pool (the user's flags
    # kept), and this process's sys.path (synkhronos may be importable only through it).
    env = dict(
        os.environ,
        PYTENSOR_FLAGS=flags,
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        XLA_FLAGS=xla_flags(os.environ.get("XLA_FLAGS", ""), 1),
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
    )
    done = subprocess.run(
        [sys.executable, "-m", __name__],
        env=env,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )
    if done.returncode:
        tail = done.stderr.strip().splitlines()[-1:] or ["no message"]
        raise subprocess.SubprocessError(f"exit {done.returncode}: {tail[0]}")
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise subprocess.SubprocessError("the measurement answered nothing")
    seconds = json.loads(lines[-1])  # the child's answer (see _answer_parent)
    return {name: float(seconds[name]) for name in CHOICES}


def _step_seconds() -> dict[str, float]:
    """(Child) Median seconds of an SGD step of the MLP at 128 rows, float32, per mode."""
    import jax
    import numpy as np
    import pytensor
    import pytensor.tensor as pt

    from synkhronos.rank.backends import jax_compat  # noqa: F401 - PyTensor's JAX arange fix

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    rng = np.random.default_rng(0)
    data = rng.random((_ROWS, _SIZES[0]), dtype=np.float32)
    labels = rng.integers(0, _SIZES[-1], _ROWS).astype(np.int32)
    steps = {}
    for name, mode in (("cpu", None), ("jax-cpu", "JAX")):
        x, y = pt.matrix("x", dtype="float32"), pt.vector("y", dtype="int32")
        h, params = x, []
        for i, (n_in, n_out) in enumerate(zip(_SIZES[:-1], _SIZES[1:], strict=True)):
            w = pytensor.shared((rng.normal(size=(n_in, n_out)) / np.sqrt(n_in)).astype(np.float32))
            b = pytensor.shared(np.zeros(n_out, np.float32))
            params += [w, b]
            h = h @ w + b
            h = pt.maximum(h, 0) if i < len(_SIZES) - 2 else pt.special.log_softmax(h, axis=1)
        loss = -h[pt.arange(y.shape[0]), y].mean()
        grads = cast(list, pt.grad(loss, params))  # a list, for a list of parameters
        updates = [(p, p - np.float32(0.01) * g) for p, g in zip(params, grads, strict=True)]
        fn = pytensor.function([x, y], loss, updates=updates, mode=mode)

        def run(n, fn=fn, params=params):
            for _ in range(n):
                fn(data, labels)
            jax.block_until_ready([p.get_value(borrow=True) for p in params])

        run(3)
        steps[name] = run
    rounds: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(_ROUNDS):  # the modes take turns, so that load drifts hit both
        for name, run in steps.items():
            start = time.perf_counter()
            run(_STEPS)
            rounds[name].append((time.perf_counter() - start) / _STEPS)
    return {name: float(np.median(times)) for name, times in rounds.items()}


def _answer_parent(seconds: dict[str, float]) -> None:
    """(Child) Give the parent the step times: one line of JSON on stdout, which the
    parent captures and reads (:func:`_measure_in_child`). This is the child's answer, not
    a message: the library's messages go through ``logging``."""
    sys.stdout.write(json.dumps(seconds) + "\n")


if __name__ == "__main__":
    _answer_parent(_step_seconds())
