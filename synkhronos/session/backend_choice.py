"""Which backend ``fork(backend="auto")`` takes, and how many ranks a fork starts (on
"gpu": the devices they drive)."""

from __future__ import annotations

import logging
import os
from typing import Literal, overload

from synkhronos.rank.backends import get_backend, gpu
from synkhronos.rank.backends.cpu_choice import CHOICE_VAR, faster_cpu_backend, known_choice
from synkhronos.transport.nodes import under_mpi_launcher

logger = logging.getLogger(__name__)


@overload
def auto_backend(deciding: Literal[True] = True) -> tuple[str, str]: ...
@overload
def auto_backend(deciding: bool) -> tuple[str | None, str]: ...


def auto_backend(deciding: bool = True) -> tuple[str | None, str]:
    """The backend ``fork(backend="auto")`` takes, and why.

    "gpu" when GPUs are visible, JAX may use them and the GPU extra is installed, else
    :func:`auto_cpu_backend`'s choice. ``deciding``: as ``fork`` decides, warning when
    GPUs are visible but the extra is missing, and measuring the CPU backends if this
    machine never did; else only describing (the choice is None where ``fork`` would
    measure).
    """
    if gpu.on_cpu_devices():
        where = "JAX_PLATFORMS=cpu (GPU ranks on CPU devices only with backend='gpu')"
    elif not gpu.visible_gpus():
        where = "no GPU visible"
    elif missing := gpu.gpu_packages_missing():
        where = (
            f"GPUs are visible but {' and '.join(missing)} is missing, so CPU ranks; "
            f"{gpu.EXTRA_HINT}"
        )
        if deciding:
            logger.warning("synkhronos: %s", where)
    else:
        return "gpu", "GPUs are visible, and JAX with its CUDA plugin is installed"
    choice, why = auto_cpu_backend(deciding)
    return choice, f"{where}; on CPU ranks: {why}"


@overload
def auto_cpu_backend(deciding: Literal[True] = True) -> tuple[str, str]: ...
@overload
def auto_cpu_backend(deciding: bool) -> tuple[str | None, str]: ...


def auto_cpu_backend(deciding: bool = True) -> tuple[str | None, str]:
    """ "jax-cpu" where PyTensor's JAX mode was measured faster on this machine, else "cpu"
    (:mod:`synkhronos.rank.backends.cpu_choice`); "cpu" under an MPI launcher, where nodes
    measuring apart could choose apart. With the reason; without ``deciding``, None where
    it would measure."""
    if under_mpi_launcher() and not os.environ.get(CHOICE_VAR):
        return "cpu", "under an MPI launcher, where nodes measuring apart could choose apart"
    known = known_choice()
    if known is not None:
        return known
    if not deciding:
        return None, (
            "not measured on this machine yet: the first fork with "
            "backend='auto' times PyTensor's default and JAX modes (seconds, once)"
        )
    return faster_cpu_backend(), "measured now"


def _match_jax_precision() -> None:
    """Make rank 0's JAX precision follow floatX now, as the workers' does from their start.

    PyTensor's JAX backend fixes ``jax_enable_x64`` from floatX when it is first imported;
    if floatX changed since, rank 0 would compute in another precision than the workers.
    """
    try:
        import jax  # noqa: F401 - the extra's message where it is missing
    except ImportError:
        raise ImportError(
            "the jax-cpu and gpu backends need JAX; install the extra: "
            "pip install 'synkhronos[jax]' (or [cuda] for GPUs)"
        ) from None
    from synkhronos.rank.backends.jax_compat import match_precision

    match_precision()


def chosen_backend(use_gpu: bool, backend: str) -> str:
    """The backend that fork's ``use_gpu`` and ``backend`` name ("auto" resolved), checked
    to exist."""
    if not use_gpu:
        if backend == "gpu":
            raise ValueError("use_gpu=False asks for CPU ranks, but backend='gpu'")
        backend = auto_cpu_backend()[0] if backend == "auto" else backend
    if backend == "auto":
        backend = auto_backend()[0]
    get_backend(backend)
    return backend


def ranks_and_gpus(
    backend: str, n_parallel: int | None, gpus: list[int] | None, master_rank: int
) -> tuple[int, list[str] | None]:
    """The number of ranks to start, and on "gpu" the devices they drive; on a backend
    that runs JAX, rank 0's JAX precision set from floatX first."""
    gpu_ids = None
    if backend == "gpu":
        gpu_ids = gpu.prepare_gpus(n_parallel, gpus, master_rank)
        n_parallel = n_parallel if gpu_ids is None else len(gpu_ids)
    if backend != "cpu":
        _match_jax_precision()
    if n_parallel is None:
        n_parallel = len(os.sched_getaffinity(0))
    if not isinstance(n_parallel, int) or n_parallel < 1:
        raise ValueError(f"n_parallel must be a positive int, got {n_parallel!r}")
    return n_parallel, gpu_ids
