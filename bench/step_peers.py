"""The columns of ``bench_step.py``: one training-step loop per column, in its own processes.

Every column trains the same model from the same initial values on the same data: the
784-512-512-10 MLP (ReLU, softmax cross-entropy, float32), SGD with learning rate 0.01,
step ``i`` of global batch size ``B`` on rows ``[lo, lo + B)`` of one synthetic data set,
``lo`` cycling over it. Ranks of a multi-process column each take an equal share of
those rows.

``bench_step.py`` starts each column as ``python step_peers.py COLUMN ADDRESS [RANK WORLD
PORT]``; every process connects back to ``ADDRESS`` (a Unix socket, key in the environment
variable ``SYNK_BENCH_KEY``) and serves its commands until told to stop:

* ``("check", B, n)``: the global losses of the first ``n`` steps of batch ``B``;
* ``("time", B, n)``: the seconds that the next ``n`` steps of batch ``B`` take;
* ``("stop",)``.

Columns: ``pytensor`` (plain ``pytensor.function``, default mode, 1 BLAS thread, pinned),
``jax`` (the same in PyTensor's JAX mode; the XLA thread flags come from the environment),
``synk`` and ``synk_jax`` (``make_step_function`` on 2 ranks of the "cpu" and
"jax-cpu" backends, data in ``synk.data``), ``mpi`` (PyTensor
gradient and update functions with an mpi4py ``Allreduce`` between, under ``mpiexec``),
``ddp`` (torch DistributedDataParallel, gloo, 1 thread per process, pinned), ``torch2``
(torch, one process, 2 threads), and two diagnostic columns of ``pytensor``'s step in
every process at once: ``pair`` (no communication) and ``floor`` (with
:func:`least_all_reduce` after each step).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Client

import numpy as np

SIZES = (784, 512, 512, 10)
GRADIENT_SIZE = sum(n_in * n_out + n_out for n_in, n_out in zip(SIZES[:-1], SIZES[1:], strict=True))
"""The number of parameters: the length of the flat gradient."""
LEARNING_RATE = 0.01
DATA_ROWS = 8192
KEY_VAR = "SYNK_BENCH_KEY"

# step(rows, want_loss): one training step on this process's share of the global rows;
# returns the global batch's mean loss when ``want_loss`` (else anything).
Step = Callable[[slice, bool], object]


def init_params(seed: int = 0) -> list[np.ndarray]:
    """Initial weights and biases, ``[W0, b0, W1, b1, ...]``, W of shape (in, out)."""
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:], strict=True):
        params.append((rng.normal(size=(n_in, n_out)) / np.sqrt(n_in)).astype("float32"))
        params.append(np.zeros(n_out, dtype="float32"))
    return params


def dataset(rows: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic MNIST-shaped inputs in [0, 1) and int32 labels."""
    rng = np.random.default_rng(seed)
    return (
        rng.random((rows, SIZES[0]), dtype="float32"),
        rng.integers(0, SIZES[-1], rows).astype("int32"),
    )


def global_rows(step_index: int, batch: int, data_rows: int = DATA_ROWS) -> slice:
    """The rows of step ``step_index`` at global batch ``batch``, cycling over the data."""
    lo = (step_index % (data_rows // batch)) * batch
    return slice(lo, lo + batch)


def rank_rows(rows: slice, rank: int, world: int) -> slice:
    """Rank ``rank``'s equal share of ``rows`` (the batch divides by ``world``)."""
    share = (rows.stop - rows.start) // world
    return slice(rows.start + rank * share, rows.start + (rank + 1) * share)


def pin(rank: int) -> None:
    """Run this process on one core only: the ``rank``-th of those it may use."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})


def pytensor_mlp(params: list[np.ndarray]):
    """Symbolic MLP from initial ``params``: returns (x, y, mean loss, shared params)."""
    import pytensor
    import pytensor.tensor as pt

    x, y = pt.matrix("x", dtype="float32"), pt.ivector("y")
    shared = [pytensor.shared(p.copy()) for p in params]
    h = x
    n_layers = len(shared) // 2
    for i in range(n_layers):
        h = h @ shared[2 * i] + shared[2 * i + 1]
        h = pt.maximum(h, 0) if i < n_layers - 1 else pt.special.log_softmax(h, axis=1)
    loss = -h[pt.arange(y.shape[0]), y].mean()
    return x, y, loss, shared


def torch_mlp(params: list[np.ndarray]):
    """The same MLP in torch (``Linear`` keeps W transposed)."""
    import torch

    layers = []
    for i in range(len(params) // 2):
        linear = torch.nn.Linear(*params[2 * i].shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(params[2 * i].T.copy()))
            linear.bias.copy_(torch.from_numpy(params[2 * i + 1]))
        layers += [linear, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def pytensor_column(
    mode: str | None, rank: int = 0, world: int = 1, exchange: str | None = None
) -> tuple[Step, Callable[[], None]]:
    """Plain single-process step: one ``pytensor.function`` with the SGD updates, on rank
    ``rank``'s share of each batch (``world`` such processes, independent of each other).

    The process is set up as a synkhronos rank is: pinned, one thread, and keeping the
    memory it frees (:mod:`synkhronos.rank.heap`), so that the limits are what the ranks'
    own compute could reach. With ``exchange`` (a file in ``/dev/shm`` that every process
    maps) each step also runs :func:`least_all_reduce` of a gradient-sized vector."""
    import pytensor
    import pytensor.tensor as pt
    from threadpoolctl import threadpool_limits

    from synkhronos.rank.heap import keep_freed_memory

    if mode == "JAX":  # synkhronos' fix to PyTensor's JAX arange, which overflows at 128 rows
        import synkhronos.rank.backends.jax_compat  # noqa: F401
    pin(rank)
    threadpool_limits(limits=1)  # stays in force: only leaving a with-block would undo it
    keep_freed_memory()
    x, y, loss, params = pytensor_mlp(init_params())
    grads = pt.grad(loss, params)
    updates = [(p, p - LEARNING_RATE * g) for p, g in zip(params, grads, strict=True)]
    fn = pytensor.function([x, y], loss, updates=updates, mode=mode)
    xs, ys = dataset(DATA_ROWS)

    all_reduce = (
        least_all_reduce(exchange, rank, world, GRADIENT_SIZE) if exchange else lambda: None
    )

    def step(rows: slice, want_loss: bool):
        mine = rank_rows(rows, rank, world)
        loss_value = fn(xs[mine], ys[mine])
        all_reduce()
        return loss_value

    def finish() -> None:
        if mode == "JAX":  # XLA runs asynchronously: wait for the last step's results
            import jax

            jax.block_until_ready([p.get_value(borrow=True) for p in params])

    return step, finish


def exchange_bytes(world: int, size: int) -> int:
    """The size of :func:`least_all_reduce`'s file: ``world`` vectors of ``size`` float32
    and their sum, then one int64 counter per process."""
    return (world + 1) * size * 4 + world * 8


def least_all_reduce(path: str, rank: int, world: int, size: int) -> Callable[[], None]:
    """Close to the least an all-reduce of a ``size``-float32 gradient through shared memory
    does.

    Each rank writes into the mapped file ``path`` only the chunks that other ranks sum,
    and sums its own chunk of every rank's vector (its own read where it lies) into the
    file. The sum stays there, as if the update read it in place, so no rank copies it:
    after the second barrier each rank reads the other ranks' chunks of it once, the read
    such an update would do. Every chunk thus crosses between cores twice, to the rank
    that sums it and back, which no all-reduce through memory avoids. The barriers spin on
    counters in the file (each process has a core of its own). No control, no checks, no
    Python beyond these calls. (Counters are written after the data and read before it:
    x86's store order suffices.)
    """
    posted = np.memmap(path, mode="r+", dtype=np.float32, shape=(world + 1, size))
    result = posted[world]
    counters = np.memmap(path, mode="r+", dtype=np.int64, shape=(world,), offset=posted.nbytes)
    bounds = [size * r // world for r in range(world + 1)]
    chunk = [slice(bounds[r], bounds[r + 1]) for r in range(world)]
    others = [r for r in range(world) if r != rank]
    mine = chunk[rank]
    grad = np.random.default_rng(rank).random(size, dtype=np.float32)
    calls = [0]

    def barrier() -> None:
        calls[0] += 1
        counters[rank] = calls[0]
        while any(counters[r] < calls[0] for r in others):
            pass

    def all_reduce() -> None:
        for r in others:
            posted[rank, chunk[r]] = grad[chunk[r]]
        barrier()
        np.add(grad[mine], posted[others[0], mine], out=result[mine])
        for r in others[1:]:
            result[mine] += posted[r, mine]
        barrier()
        for r in others:
            result[chunk[r]].max()  # one pass reading the other chunks of the sum

    return all_reduce


def synk_column(backend: str) -> Step:
    """``make_step_function`` on 2 CPU ranks of ``backend``, the data in ``synk.data``
    (no copy per call)."""
    import synkhronos as synk
    from synkhronos.extensions import train
    from synkhronos.extensions.lasagne import updates

    synk.fork(2, backend=backend)
    x, y, loss, params = pytensor_mlp(init_params())
    train_step = train.make_step_function(
        loss, params, [x, y], updates.sgd, learning_rate=LEARNING_RATE
    )
    xs, ys = dataset(DATA_ROWS)
    xd, yd = synk.data(xs), synk.data(ys)

    def step(rows: slice, want_loss: bool):
        return train_step(xd, yd, batch=rows)

    return step


def mpi_column() -> Step:
    """By hand: a PyTensor gradient function with one flat output, an in-place mpi4py
    ``Allreduce`` of it, and a PyTensor update function; run under ``mpiexec -n 2``."""
    import pytensor
    import pytensor.tensor as pt
    from mpi4py import MPI
    from threadpoolctl import threadpool_limits

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    pin(rank)
    threadpool_limits(limits=1)
    x, y, loss, params = pytensor_mlp(init_params())
    flat_grad = pt.concatenate([g.ravel() for g in pt.grad(loss, params)])
    f_grad = pytensor.function([x, y], [loss, flat_grad])
    g = pt.vector("g", dtype="float32")
    updates, offset = [], 0
    for p in params:
        shape = p.get_value(borrow=True).shape
        size = int(np.prod(shape))
        # The sum over ranks of per-rank mean gradients, divided by world: the global mean.
        updates.append((p, p - (LEARNING_RATE / world) * g[offset : offset + size].reshape(shape)))
        offset += size
    f_update = pytensor.function([pytensor.In(g, borrow=True)], [], updates=updates)
    xs, ys = dataset(DATA_ROWS)

    def step(rows: slice, want_loss: bool):
        mine = rank_rows(rows, rank, world)
        loss_value, grad = f_grad(xs[mine], ys[mine])
        comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
        f_update(grad)
        return comm.allreduce(float(loss_value)) / world if want_loss else None

    return step


def ddp_column(rank: int, world: int, port: int) -> Step:
    """torch DistributedDataParallel with the gloo backend, one thread per process."""
    import torch
    import torch.distributed as dist

    pin(rank)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    model = torch.nn.parallel.DistributedDataParallel(torch_mlp(init_params()))
    return torch_step(model, rank, world)


def torch_step(model, rank: int, world: int) -> Step:
    """SGD on ``model`` over this process's rows; the global loss all-reduced on request."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    xs, ys = dataset(DATA_ROWS)
    xt, yt = torch.from_numpy(xs), torch.from_numpy(ys.astype("int64"))

    def step(rows: slice, want_loss: bool):
        mine = rank_rows(rows, rank, world)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xt[mine]), yt[mine])
        loss.backward()
        optimizer.step()
        if not want_loss:
            return None
        if world > 1:
            import torch.distributed as dist

            loss = loss.detach()
            dist.all_reduce(loss)
        return loss.item() / world

    return step


def torch2_column() -> Step:
    """Plain torch, one process with 2 intra-op threads."""
    import torch

    torch.set_num_threads(2)
    return torch_step(torch_mlp(init_params()), 0, 1)


def serve(conn, step: Step, finish: Callable[[], None] = lambda: None) -> None:
    """Answer ``bench_step.py``'s commands (see the module docstring) until "stop"."""
    next_step: dict[int, int] = {}
    while True:
        command, *args = conn.recv()
        if command == "stop":
            return
        batch, steps = args
        if command == "check":
            conn.send([float(step(global_rows(i, batch), True)) for i in range(steps)])
            next_step[batch] = steps
            continue
        first = next_step.get(batch, 0)
        next_step[batch] = first + steps
        start = time.perf_counter()
        for i in range(first, first + steps):
            step(global_rows(i, batch), False)
        finish()
        conn.send(time.perf_counter() - start)


def main(argv: list[str]) -> None:
    column, address, *rest = argv
    finish: Callable[[], None] = lambda: None  # noqa: E731
    rank = 0
    if column in ("pytensor", "jax"):
        step, finish = pytensor_column("JAX" if column == "jax" else None)
    elif column == "pair":
        rank, world = map(int, rest)
        step, finish = pytensor_column(None, rank, world)
    elif column == "floor":
        rank, world, path = int(rest[0]), int(rest[1]), rest[2]
        step, finish = pytensor_column(None, rank, world, path)
    elif column in ("synk", "synk_jax"):
        step = synk_column("cpu" if column == "synk" else "jax-cpu")
    elif column == "mpi":
        step = mpi_column()
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
    elif column == "ddp":
        rank, world, port = map(int, rest)
        step = ddp_column(rank, world, port)
    elif column == "torch2":
        step = torch2_column()
    else:
        raise SystemExit(f"unknown column {column!r}")
    conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(os.environ[KEY_VAR]))
    conn.send(("ready", column, rank))
    try:
        serve(conn, step, finish)
    finally:
        if column in ("synk", "synk_jax"):
            import synkhronos as synk

            synk.close()


if __name__ == "__main__":
    main(sys.argv[1:])
