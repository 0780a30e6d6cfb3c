"""The GPU communicator (:class:`synkhronos.transport.comm.nccl.NcclCommunicator`) on CPU ranks.

With no GPU here, ``tests/fake_cupy`` stands in for CuPy: its NCCL keeps CuPy's module
paths, signatures, constants and argument checks, and does real collectives between
processes on the raw pointers it is given. Each test starts every rank as a subprocess
(JAX on the CPU) that runs every collective on random arrays and checks the results
against numpy; each rank builds every rank's inputs from the same seeds.

Run as a script, this file is one rank: ``python test_nccl_comm.py SESSION RANK N_RANKS``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FAKE_CUPY = ROOT / "tests" / "fake_cupy"
OPS = ("avg", "sum", "prod", "max", "min")
TIMEOUT_S = 60


# ---- one rank ------------------------------------------------------------------------------
def _inputs(seed: int, rank: int, op: str = "sum") -> list[np.ndarray]:
    """Rank ``rank``'s arrays for the check ``seed``: several dtypes and shapes, a 0-d one.

    Values stay small where "prod" multiplies them, so that integers cannot overflow.
    """
    rng = np.random.default_rng([seed, rank])
    lo, hi = (-3, 4) if op == "prod" else (-1000, 1000)
    floats = rng.uniform(0.5, 1.5) if op == "prod" else rng.normal(scale=10)
    return [rng.uniform(0.5, 1.5, (5, 3)).astype(np.float32) if op == "prod"
            else rng.normal(size=(5, 3)).astype(np.float32),
            rng.normal(size=7) * (1 if op == "prod" else 100),
            rng.integers(lo, hi, (4, 2), dtype=np.int32),
            np.array(floats, np.float32)]


def _expected(op: str, per_rank: list[list[np.ndarray]]) -> list[np.ndarray]:
    """numpy's reduction over ranks, in the input dtypes ("avg" of integers: toward zero)."""
    out = []
    for values in zip(*per_rank, strict=True):
        stack = np.stack(values)
        if op == "avg":
            mean = stack.astype(np.float64).sum(axis=0) / len(values)
            out.append(mean.astype(stack.dtype))
        else:
            ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum,
                     "min": np.minimum}[op]
            out.append(ufunc.reduce(stack, axis=0, dtype=stack.dtype))
    return out


def _check(what: str, got, want) -> None:
    """``got`` (JAX or numpy arrays) equals ``want`` in dtype, shape and values."""
    assert len(got) == len(want), f"{what}: {len(got)} arrays, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (
            f"{what}, array {i}: got {g.dtype}{g.shape}, expected {w.dtype}{w.shape}")
        rtol, atol = {np.float32: (1e-5, 1e-5), np.float64: (1e-12, 1e-10)}.get(w.dtype.type,
                                                                                (0, 0))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{what}, array {i}")


def _connect(session: str, rank: int, n_ranks: int):
    """This rank's control block and communicator; workers wait for rank 0 to make the
    shared names, as ``synk.fork`` makes them before it starts the workers."""
    import posix_ipc

    from synkhronos.transport.channel import ControlBlock
    from synkhronos.transport.comm.nccl import NcclCommunicator

    started = time.monotonic()

    def check_alive():
        if time.monotonic() - started > TIMEOUT_S:
            raise TimeoutError(f"rank {rank}: a collective waited over {TIMEOUT_S} s")

    while True:
        try:
            control = ControlBlock(session, n_ranks, create=rank == 0)
            return control, NcclCommunicator(session, rank, n_ranks, control, check_alive)
        except posix_ipc.ExistentialError:
            if rank == 0 or time.monotonic() - started > TIMEOUT_S:
                raise
            time.sleep(0.01)


def _run_rank(session: str, rank: int, n_ranks: int) -> None:
    """Every collective of :class:`NcclCommunicator`, checked against numpy."""
    import jax
    import jax.numpy as jnp

    from synkhronos.transport.names import sweep

    assert jax.config.jax_enable_x64, "the float64 checks need JAX_ENABLE_X64=1"
    control, comm = _connect(session, rank, n_ranks)
    try:
        last = n_ranks - 1
        ranks = range(n_ranks)

        def on_device(arrays):
            return [jnp.asarray(a) for a in arrays]

        # broadcast: from rank 0 and from the last rank; any dtype moves (as bytes).
        for seed, root in ((1, 0), (2, last)):
            sent = _inputs(seed, root) + [np.array([True, False, True]),
                                          np.arange(6, dtype=np.int16).reshape(2, 3) - seed]
            got = comm.broadcast(on_device(sent) if rank == root else None, root)
            assert all(isinstance(g, jax.Array) for g in got), "broadcast returns JAX arrays"
            _check(f"broadcast from {root}", got, sent)
        # set_value hands the root's host (numpy) arrays to broadcast.
        sent = _inputs(3, 0)
        _check("broadcast of host arrays", comm.broadcast(sent if rank == 0 else None), sent)

        # all_reduce and reduce, every op, several arrays of several dtypes in one call.
        for i, op in enumerate(OPS):
            per_rank = [_inputs(10 + i, r, op) for r in ranks]
            want = _expected(op, per_rank)
            got = comm.all_reduce(on_device(per_rank[rank]), op)
            assert all(isinstance(g, jax.Array) for g in got), "all_reduce returns JAX arrays"
            _check(f"all_reduce {op}", got, want)
            for root in (0, last):
                got = comm.reduce(on_device(per_rank[rank]), op, root)
                if rank == root:
                    _check(f"reduce {op} to {root}", got, want)
                else:
                    assert got is None, f"reduce {op} to {root} returned {got} on rank {rank}"

        # A buffer larger than one round of the fake NCCL's slots.
        big = [np.random.default_rng([99, r]).normal(size=300_001) for r in ranks]
        _check("all_reduce of a large array", comm.all_reduce(on_device([big[rank]]), "sum"),
               [np.add.reduce(np.stack(big), axis=0)])

        # A dtype NCCL cannot reduce fails on every rank before any NCCL call, and leaves
        # the communicator usable.
        try:
            comm.all_reduce([jnp.ones(3, jnp.complex64)], "sum")
        except TypeError as e:
            assert "complex64" in str(e), e
        else:
            raise AssertionError("all_reduce of complex64 did not raise")
        _check("all_reduce after an error", comm.all_reduce(on_device([np.ones(2)]), "max"),
               [np.ones(2)])

        # gather, all_gather and scatter go through the host.
        per_rank = [_inputs(30, r) for r in ranks]
        for root in (0, last):
            got = comm.gather(on_device(per_rank[rank]), root)
            if rank == root:
                assert len(got) == n_ranks, f"gather to {root}: {len(got)} ranks' arrays"
                for r in ranks:
                    _check(f"gather to {root}, rank {r}'s", got[r], per_rank[r])
            else:
                assert got is None, f"gather to {root} returned {got} on rank {rank}"
        got = comm.all_gather(on_device(per_rank[rank]))
        assert len(got) == n_ranks, f"all_gather: {len(got)} ranks' arrays"
        for r in ranks:
            _check(f"all_gather, rank {r}'s", got[r], per_rank[r])
        for root in (0, last):
            parts = [_inputs(40 + root, r) for r in ranks]
            sent = [on_device(p) for p in parts] if rank == root else None
            _check(f"scatter from {root}", comm.scatter(sent, root), parts[rank])

        comm.barrier()
    except BaseException:
        control.set_abort(True)  # peers blocked in a shared-memory barrier give up
        raise
    finally:
        comm.close()
    if rank == 0:
        sweep(session)  # as synk.close() does in rank 0
    print(f"rank {rank}: ok")


# ---- the tests -----------------------------------------------------------------------------
def _leftovers(session: str) -> list[str]:
    """Names in /dev/shm of this session: its own, and the fake NCCL's."""
    return sorted(e for e in os.listdir("/dev/shm") if e.startswith((session, "sem." + session)))


def _run_ranks(n_ranks: int) -> None:
    import posix_ipc

    from synkhronos.transport.names import new_session_name, sweep

    session = new_session_name()
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(FAKE_CUPY), str(ROOT),
                                                        os.environ.get("PYTHONPATH")])),
               FAKE_NCCL_PREFIX=f"{session}nccl", FAKE_NCCL_TIMEOUT=str(TIMEOUT_S))
    procs = [subprocess.Popen([sys.executable, __file__, session, str(r), str(n_ranks)],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for r in range(n_ranks)]
    try:
        # As soon as one rank fails, stop the others rather than wait for their timeouts.
        deadline = time.monotonic() + TIMEOUT_S
        while any(p.poll() is None for p in procs):
            if any(p.poll() for p in procs) or time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.02)
        outputs = [p.communicate() for p in procs]
        failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode]
        report = "\n".join(f"--- rank {r} (exit {p.returncode}) ---\n{out}{err}"
                           for r, (p, (out, err)) in enumerate(zip(procs, outputs, strict=True)))
        assert not failed, f"ranks failed {failed}:\n{report}"
        assert _leftovers(session) == [], f"left in /dev/shm: {_leftovers(session)}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        sweep(session)
        for entry in _leftovers(session):  # the fake NCCL's, should a rank have died
            unlink = (posix_ipc.unlink_semaphore if entry.startswith("sem.")
                      else posix_ipc.unlink_shared_memory)
            try:
                unlink("/" + entry.removeprefix("sem."))
            except posix_ipc.ExistentialError:
                pass


def test_two_ranks():
    _run_ranks(2)


def test_three_ranks():
    _run_ranks(3)


if __name__ == "__main__":
    _run_rank(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
