"""Routines that time GPU ranks' collectives and a hand-written JAX training loop, on every
rank at once (:func:`synkhronos.api.routines.run`; the workers import this module from the
bench folder, which is on rank 0's ``sys.path``). Each returns rank 0's view: seconds per
operation, best of a few rounds.
"""

from __future__ import annotations

import time

import numpy as np
from timing import best_of

from synkhronos.transport.comm.shm import ShmCommunicator

KINDS = ("all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter")


def _calls(comm, arrays, parts, shm: bool) -> dict:
    """Each collective once, on the XLA communicator (device arrays) or its shared-memory
    methods (host arrays)."""
    call = (
        (lambda name: lambda *a: getattr(ShmCommunicator, name)(comm, *a))
        if shm
        else (lambda name: getattr(comm, name))
    )
    root = comm.rank == 0
    return {
        "all_reduce": lambda: call("all_reduce")(arrays, "sum"),
        "reduce": lambda: call("reduce")(arrays, "sum"),
        "broadcast": lambda: call("broadcast")(arrays if root else None),
        "all_gather": lambda: call("all_gather")(arrays),
        "gather": lambda: call("gather")(arrays),
        "scatter": lambda: call("scatter")(parts if root else None),
    }


def collective_seconds(state, size, repeat) -> list[np.ndarray]:
    """Seconds per collective of ``size`` float32 on the XLA communicator and through
    shared memory: ``[[xla, shm] per kind of KINDS]``. Each rank waits for its results."""
    import jax

    comm, size, repeat = state.comm, int(size[0]), int(repeat[0])
    host = [np.ones(size, np.float32)]
    device = comm.to_device(host)
    rows = [[np.ones(size, np.float32)] for _ in range(comm.n_ranks)]
    times = []
    for shm, arrays, parts in (
        (False, device, [comm.to_device(p) for p in rows]),
        (True, host, rows),
    ):
        calls = _calls(comm, arrays, parts, shm)
        for kind in KINDS:

            def once(fn=calls[kind]):
                jax.block_until_ready(fn())

            once()  # compiled, and every rank here
            times.append(best_of(once, repeat, 5))
    return [np.array(times).reshape(2, len(KINDS)).T]


def all_reduce_seconds(state, size, repeat) -> list[np.ndarray]:
    """Seconds per XLA all-reduce (op "sum") of ``size`` float32, the first (with its
    compilation) then the best of ``repeat`` rounds: ``[first, best]``."""
    comm, size = state.comm, int(size[0])
    arrays = comm.to_device([np.ones(size, np.float32)])
    start = time.perf_counter()
    comm.all_reduce(arrays, "sum")
    first = time.perf_counter() - start
    return [np.array([first, best_of(lambda: comm.all_reduce(arrays, "sum"), int(repeat[0]), 5)])]


def jax_resnet_step(comm, rows: int, size: int, classes: int):
    """One step of the hand-written JAX ResNet-50 (``jax_resnet``), trained data-parallel
    over the ranks' devices of ``comm`` (an XLA communicator): a function that runs it on
    this rank's ``rows`` images and waits for it. Each step is fed from host memory (its
    rows, numpy arrays, put on the device in the step's time), as the synkhronos steps of
    ``gpu_check.resnet_figures`` are."""
    import jax
    import jax_resnet
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh, axis = comm.mesh, comm.mesh.axis_names[0]

    def whole(local, spec):  # this rank's part of a global array
        shape = (local.shape[0] * comm.n_ranks, *local.shape[1:]) if spec != P() else local.shape
        return jax.make_array_from_single_device_arrays(shape, NamedSharding(mesh, spec), [local])

    params = jax.device_put(jax_resnet.init(jax.random.key(0), classes), comm.device)
    state = [jax.tree.map(lambda a: whole(a, P()), params)]
    state.append(jax.tree.map(lambda a: a * 0, state[0]))
    rng = np.random.default_rng(comm.rank)
    host = [rng.random((rows, 3, size, size), np.float32), rng.integers(0, classes, rows)]
    host[1] = host[1].astype(np.int32)
    program = jax_resnet.data_parallel_step(mesh, axis)

    def step() -> None:
        put = [whole(jax.device_put(a, comm.device), P(axis)) for a in host]
        state[0], state[1], loss = program(state[0], state[1], *put)
        jax.block_until_ready(loss)

    return step


def jax_resnet_seconds(state, shape, steps) -> list[np.ndarray]:
    """(A routine) Seconds per step of :func:`jax_resnet_step`: ``shape`` is ``(rows per
    rank, image size, classes)``; ``[first step with compilation, median of steps]``."""
    step = jax_resnet_step(state.comm, *(int(v) for v in shape))
    start = time.perf_counter()
    step()
    first, times = time.perf_counter() - start, []
    for _ in range(int(steps[0])):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return [np.array([first, float(np.median(times))])]


def set_bucket_bytes(state, size) -> list[np.ndarray]:
    """Fused programs built from now on all-reduce their gradient in buckets of ``size``
    bytes (0: whole); returns the size before."""
    before = state.comm.bucket_bytes
    state.comm.bucket_bytes = int(size[0])
    return [np.array([before])]
