"""CPU ranks: PyTensor's default mode, or its JAX mode on the CPU ("jax-cpu")."""

from __future__ import annotations

from synkhronos.rank.backends.base import Backend

# XLA on one core: no Eigen thread pool (its threads would contend with the rank's own).
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
FORCED_DEVICES = "--xla_force_host_platform_device_count"


def xla_flags(flags: str, threads: int) -> str:
    """``XLA_FLAGS`` (the user's ``flags`` kept) for a rank with ``threads`` cores: XLA
    sizes its pool to the affinity set, and on one core it gets no pool at all. A forced
    count of host devices is dropped: a rank is one device (importing
    ``pymc.sampling.jax`` forces 100 into the environment the workers inherit).

    Examples
    --------
    >>> xla_flags("--xla_dump_to=/tmp/x", 1).split()[1:]
    ['--xla_cpu_multi_thread_eigen=false', 'intra_op_parallelism_threads=1']
    >>> xla_flags("", 4)
    ''
    >>> xla_flags("--xla_force_host_platform_device_count=100 --xla_dump_to=/tmp/x", 4)
    '--xla_dump_to=/tmp/x'
    """
    flags = " ".join(f for f in flags.split() if not f.startswith(FORCED_DEVICES))
    if threads != 1 or "xla_cpu_multi_thread_eigen" in flags:
        return flags
    return f"{flags} {XLA_ONE_THREAD}".strip()


def cpu_backend() -> Backend:
    """PyTensor's default mode; outputs come to rank 0 as host arrays."""
    return Backend("cpu", None)


def jax_cpu_backend() -> Backend:
    """PyTensor's JAX mode on CPU ranks; outputs come to rank 0 as host arrays."""
    # Not through the communicator as on GPU ranks: on CPU ranks that path costs two
    # collectives per call (0.5 ms of a 3.5 ms training step, measured); the GPU tests
    # run it in CI, on CPU devices.
    return Backend("jax-cpu", "JAX")
