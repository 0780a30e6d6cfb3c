"""GPU ranks: one device per rank, PyTensor's JAX mode, values kept on the device,
collectives as XLA programs (:mod:`synkhronos.transport.comm.xla`).

Nothing here initialises CUDA in rank 0 before the workers start: GPUs are counted and
described with ``nvidia-smi`` (or read from ``CUDA_VISIBLE_DEVICES`` where it is set), each
worker is shown only its own GPU through ``CUDA_VISIBLE_DEVICES``, and rank 0's JAX client
takes only its own through JAX's ``jax_cuda_visible_devices``, so ``import jax`` before
the fork is fine; :func:`restore_environment` gives rank 0's process its settings back at
the session's close, and a later fork chooses afresh.

With ``JAX_PLATFORMS=cpu`` (JAX's own switch) the same ranks run on CPU devices, one per
rank, with gloo collectives: the code path of GPUs, run where there is no GPU (the test
suite does so). ``nvidia-smi`` is not needed then.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import subprocess
import sys

import numpy as np

from synkhronos.rank.backends.base import Backend
from synkhronos.transport.comm.xla import check_not_leaving

EXTRA_HINT = "install the GPU extra: pip install 'synkhronos[cuda]'"
logger = logging.getLogger(__name__)


def on_cpu_devices() -> bool:
    """Whether JAX is told to use only CPU devices (``JAX_PLATFORMS=cpu``): GPU ranks then
    run on one CPU device each."""
    return os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu"


def _cuda_plugin_installed() -> bool:
    """Whether a JAX CUDA plugin (``jax[cuda12]``'s ``jax-cuda12-plugin``, or a later CUDA
    version's) is installed, found without importing it."""
    return any(
        re.fullmatch(r"jax[-_]cuda\d+[-_]plugin", d.metadata["Name"] or "")
        for d in importlib.metadata.distributions()
    )


def gpu_packages_missing() -> list[str]:
    """What the GPU extra provides and this environment lacks (found without importing):
    JAX, and for GPUs (not CPU devices) JAX's CUDA plugin."""
    if importlib.util.find_spec("jax") is None:
        return ["jax"]
    return [] if on_cpu_devices() or _cuda_plugin_installed() else ["JAX's CUDA plugin"]


def _require_gpu_packages() -> None:
    missing = gpu_packages_missing()
    if missing:
        raise ImportError(f"the gpu backend needs {' and '.join(missing)}; {EXTRA_HINT}")


def gpu_table() -> list[tuple[str, str, str]]:
    """(index, name, memory) of every GPU nvidia-smi lists; ``RuntimeError`` if it fails."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"no usable GPU: nvidia-smi failed ({e})") from e
    return parse_gpu_table(out)


def parse_gpu_table(text: str) -> list[tuple[str, str, str]]:
    """(index, name, memory) from nvidia-smi's CSV lines (a name may hold a comma).

    Examples
    --------
    >>> parse_gpu_table("0, NVIDIA H100 80GB HBM3, 81559 MiB\\n1, A, B, 8 MiB\\n")
    [('0', 'NVIDIA H100 80GB HBM3', '81559 MiB'), ('1', 'A, B', '8 MiB')]
    """
    table = []
    for line in filter(str.strip, text.splitlines()):
        index, rest = line.split(",", 1)
        name, memory = rest.rsplit(",", 1)
        table.append((index.strip(), name.strip(), memory.strip()))
    return table


def parse_visible_devices(text: str) -> list[str]:
    """The GPU ids a ``CUDA_VISIBLE_DEVICES`` value lists (empty entries and "-1" dropped).

    Examples
    --------
    >>> parse_visible_devices("2, 0,-1")
    ['2', '0']
    >>> parse_visible_devices("")
    []
    """
    return [d.strip() for d in text.split(",") if d.strip() not in ("", "-1")]


def visible_gpus(table: list[tuple[str, str, str]] | None = None) -> list[str]:
    """Ids of the GPUs this process may use, found without initialising CUDA.

    Those ``CUDA_VISIBLE_DEVICES`` lists when it is set, else every GPU of ``table``
    (default: nvidia-smi's list; none when nvidia-smi fails).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return parse_visible_devices(visible)
    if table is None:
        try:
            table = gpu_table()
        except RuntimeError:
            return []
    return sorted((row[0] for row in table), key=int)


DETERMINISTIC_VAR = "SYNK_GPU_DETERMINISTIC"
"""Set to "0" to let XLA pick faster, non-deterministic GPU kernels (see
:data:`DETERMINISTIC_FLAGS`)."""

DETERMINISTIC_FLAGS = ("--xla_gpu_deterministic_ops=true",)
"""``XLA_FLAGS`` every GPU rank gets by default: reductions, scatters and the kernels
autotuning may pick are then deterministic, so ranks computing the same update from the
same values keep bit-identical parameters."""

MEMORY_FRACTION = "0.9"
"""JAX's cap on the memory of a GPU (``XLA_PYTHON_CLIENT_MEM_FRACTION``) unless the user
set one: JAX's default, 0.75, holds with preallocation off too."""

_saved_env: dict[str, str | None] = {}  # rank 0's variables before prepare_gpus set them
_saved_visible: list[str | None] = []  # JAX's jax_cuda_visible_devices before it


def deterministic_flags() -> tuple[str, ...]:
    """The flags of :data:`DETERMINISTIC_FLAGS`, or none when ``SYNK_GPU_DETERMINISTIC=0``."""
    return () if os.environ.get(DETERMINISTIC_VAR, "1").strip() == "0" else DETERMINISTIC_FLAGS


def with_flags(xla_flags: str, flags) -> str:
    """``xla_flags`` with each of ``flags`` added unless it names one set there already.

    Examples
    --------
    >>> with_flags("--a=1", ["--a=2", "--b=true"])
    '--a=1 --b=true'
    """
    names = {f.split("=", 1)[0] for f in xla_flags.split()}
    return " ".join([*xla_flags.split(), *(f for f in flags if f.split("=", 1)[0] not in names)])


def _set_env(name: str, value: str) -> None:
    _saved_env.setdefault(name, os.environ.get(name))
    os.environ[name] = value


def restore_environment() -> None:
    """Give rank 0's process back the variables and JAX setting :func:`prepare_gpus`
    changed (at the session's close, after the other settings are restored)."""
    for name, value in _saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _saved_env.clear()
    if _saved_visible:
        import jax

        jax.config.update("jax_cuda_visible_devices", _saved_visible.pop() or "all")
    import pytensor

    for name, setting in _replaced_settings:
        setattr(pytensor.config, name, setting)
    if _replaced_settings and "jax" in sys.modules:
        from synkhronos.rank.backends.jax_compat import match_precision

        # JAX's precision followed the session's floatX (backend_choice._match_jax_precision); a
        # later CPU-rank session's workers take it from the floatX restored here.
        match_precision()
    _replaced_settings.clear()


def jax_started() -> bool:
    """Whether JAX's backends run in this process (importing jax does not start them)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    # JAX's private API: where a later JAX lacks it, nothing is refused (as before).
    started = getattr(xla_bridge, "backends_are_initialized", None)
    if started is None:
        logger.warning("synkhronos: this JAX cannot tell whether it started before the fork")
        return False
    return bool(started())


def prepare_gpus(
    n_parallel: int | None, gpus: list[int] | None, master_rank: int = 0
) -> list[str] | None:
    """Choose one GPU per rank, log them, and set rank 0's process up for its GPU.

    Without ``gpus``, the visible GPUs from the ``master_rank``-th on (it is rank 0's),
    then those before it. Returns the GPU ids (as strings for ``CUDA_VISIBLE_DEVICES``),
    rank 0's first; None on CPU devices (:func:`on_cpu_devices`), where ``n_parallel``
    ranks run, each on one CPU device, and ``gpus`` and ``master_rank`` mean nothing.
    Sets, until :func:`restore_environment`: ``XLA_FLAGS``' deterministic flags
    (:func:`deterministic_flags`), ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` and
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` unless set, and JAX's ``jax_cuda_visible_devices``
    to rank 0's GPU; rank 0's ``CUDA_VISIBLE_DEVICES`` stays as it was.

    Raises
    ------
    RuntimeError
        If JAX's backends already run in this process on GPUs (started before the fork),
        or this process still leaves an earlier session's JAX runtime.
    """
    _require_gpu_packages()
    check_not_leaving()
    if on_cpu_devices():
        logger.info("synkhronos: JAX_PLATFORMS=cpu: GPU ranks on CPU devices, one per rank")
        _set_xla_flags()
        _gpu_defaults()
        return None
    chosen, visible = _choose_gpus(n_parallel, gpus, master_rank)
    if chosen[0] not in visible:
        raise ValueError(
            f"rank 0's GPU {chosen[0]} is not visible to this process "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    if jax_started():
        raise RuntimeError(
            "synk.fork(): JAX already runs in this process (something computed with JAX "
            "before the fork), on every visible GPU and with its flags fixed, so rank 0 "
            f"cannot keep to GPU {chosen[0]} alone. Fork before computing with JAX "
            "(importing jax is fine)"
        )
    _set_xla_flags()
    # JAX would otherwise take 75% of each GPU's memory at start; keep the user's choice.
    if "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ:
        _set_env("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if not {"XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"} & set(os.environ):
        _set_env("XLA_PYTHON_CLIENT_MEM_FRACTION", MEMORY_FRACTION)
    import jax

    # Rank 0 keeps every GPU visible to CUDA; JAX's client, made at the session's start,
    # takes only its own (by its CUDA ordinal: its place among the visible GPUs).
    _saved_visible.append(jax.config.read("jax_cuda_visible_devices"))
    jax.config.update("jax_cuda_visible_devices", str(visible.index(chosen[0])))
    _gpu_defaults()
    return chosen


def _set_xla_flags() -> None:
    """Add :func:`deterministic_flags` to ``XLA_FLAGS`` (the workers inherit it; XLA reads
    it once per process, so rank 0 gets it only if JAX did not start before)."""
    flags = deterministic_flags()
    current = os.environ.get("XLA_FLAGS", "")
    if flags and with_flags(current, flags) != current:
        _set_env("XLA_FLAGS", with_flags(current, flags))


def _choose_gpus(
    n_parallel: int | None, gpus: list[int] | None, master_rank: int
) -> tuple[list[str], list[str]]:
    """(the GPU of each rank, the GPUs visible in CUDA's order); nvidia-smi names them where
    it runs, and is needed only when ``CUDA_VISIBLE_DEVICES`` is not set."""
    try:
        rows = gpu_table()
    except RuntimeError as error:
        if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
            raise
        logger.info("synkhronos: %s; GPUs from CUDA_VISIBLE_DEVICES", error)
        rows = []
    table = {index: (name, memory) for index, name, memory in rows}
    visible = available = visible_gpus(rows)
    if gpus is None and master_rank:
        if not 0 <= master_rank < len(available):
            raise ValueError(f"master_rank={master_rank}, but {len(available)} GPUs are visible")
        available = [
            available[master_rank],
            *available[:master_rank],
            *available[master_rank + 1 :],
        ]
    chosen = [str(g) for g in gpus] if gpus is not None else available[:n_parallel]
    if not chosen or (n_parallel is not None and len(chosen) != n_parallel):
        raise ValueError(
            f"asked for {n_parallel} GPU ranks with gpus={gpus}, but GPUs {available} are visible"
        )
    for rank, gpu in enumerate(chosen):
        name, memory = table.get(gpu, ("?", "?"))
        logger.info("synkhronos rank %d: GPU %s, %s, %s", rank, gpu, name, memory)
    return chosen, visible


_replaced_settings: list[tuple[str, object]] = []  # PyTensor settings _gpu_defaults changed


def _gpu_defaults() -> None:
    """Rank 0's PyTensor defaults on GPU ranks, where the user set none (until
    :func:`restore_environment`): floatX float32, and JAX as the mode of the program's own
    functions, returning NumPy arrays as PyTensor's default mode does
    (:data:`~synkhronos.rank.backends.jax_compat.HOST_OUTPUTS_JAX`). Rank 0's shared
    variables hold JAX device arrays once a synkhronos function ran
    (:meth:`GpuBackend.set_value`); a function of PyTensor's default mode (Numba) reads
    them as read-only buffers and fails, one in JAX mode reads them where they are, as the
    training step does."""
    import pytensor

    config = pytensor.config
    if "floatX" not in os.environ.get("PYTENSOR_FLAGS", ""):
        _replaced_settings.append(("floatX", config.floatX))
        config.floatX = "float32"
    # The program's own JAX-mode functions get the fixes synkhronos' own compile with, from
    # the start (pt.arange(y.shape[0]) failed for 128 rows or more before any synkhronos
    # function had compiled).
    from synkhronos.rank.backends import jax_compat

    if str(config.mode).upper() == "MODE" and config.linker == "auto":
        _replaced_settings.append(("mode", config.mode))
        config.mode = jax_compat.HOST_OUTPUTS_JAX  # type: ignore[assignment]  # a Mode too


class GpuBackend(Backend):
    """GPU ranks: shared variables hold JAX device arrays and stay on the device (until
    :meth:`to_host`, at the session's close)."""

    def __init__(self):
        super().__init__("gpu", "JAX", device_outputs=True)

    def to_comm(self, array):
        import jax

        return jax.device_put(array) if isinstance(array, (np.ndarray, np.generic)) else array

    def set_value(self, var, value, owned: bool = False) -> None:
        """Give ``var`` ``value`` on this rank's device, committed to it as the values a
        function computes from the device's arrays are: ``jax.jit`` compiles a function
        anew for an argument that is not (issue 62: every function after a checkpoint's
        load)."""
        import jax
        import jax.numpy as jnp

        if isinstance(value, np.ndarray):
            value = value.astype(var.dtype, copy=False)
        elif value.dtype != np.dtype(var.dtype):
            value = jnp.asarray(value, dtype=var.dtype)
        if not getattr(value, "committed", False):
            value = jax.device_put(value, jax.local_devices()[0])  # a rank's only device
        # Bypass the container's filter, which would copy the value to the host.
        var.container.storage[0] = value

    def close(self, variables) -> None:
        """Give ``variables`` their values as host arrays (JAX's runtime, which holds the
        device arrays, goes next); :func:`restore_environment` follows."""
        import jax

        for var in variables:
            value = var.get_value(borrow=True)
            if isinstance(value, jax.Array):
                var.container.storage[0] = np.asarray(value)
