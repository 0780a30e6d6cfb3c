"""The collectives as traced functions, for bodies of programs over the mesh of one device
per rank (the mesh axis :data:`AXIS`): the programs of
:class:`~synkhronos.transport.comm.xla.XlaCommunicator` and a fused chain's
(:mod:`synkhronos.rank.fused_chain`), whose gradient all-reduce goes in buckets
(:func:`reduce_buckets_traced`); and, for a program on one rank's own device with no mesh
(CPU ranks), a sum over the ranks by the rank's host communicator
(:func:`sum_by_host_traced`)."""

from __future__ import annotations

import threading

import numpy as np

AXIS = "ranks"  # the mesh axis: one device per rank


def _root_bits(x, root: int):
    """(Traced) ``x`` as unsigned integers of its width on ``root``, zeros elsewhere: their
    sum over the ranks is ``root``'s exact bits (a float sum would turn -0.0 into 0.0)."""
    import jax.numpy as jnp
    from jax import lax

    bits = (
        x
        if x.dtype.kind != "f"
        else lax.bitcast_convert_type(x, np.dtype(f"uint{x.dtype.itemsize * 8}"))
    )
    return jnp.where(lax.axis_index(AXIS) == root, bits, jnp.zeros_like(bits))


def _unbits(bits, dtype):
    from jax import lax

    return bits if bits.dtype == dtype else lax.bitcast_convert_type(bits, dtype)


def reduce_traced(x, op: str, n_ranks: int):
    """(Traced, inside a program over the mesh) ``x`` reduced over the ranks with ``op``.

    "avg" keeps the dtype, as on the host: floats are scaled by ``1 / n_ranks``, integers
    divided toward zero.
    """
    import jax.numpy as jnp
    from jax import lax

    if n_ranks == 1:  # every op's identity (XLA copies a one-device all-reduce's operands)
        return x
    if op == "max":
        return lax.pmax(x, AXIS)
    if op == "min":
        return lax.pmin(x, AXIS)
    if op == "prod":
        return jnp.prod(lax.all_gather(x, AXIS), axis=0, dtype=x.dtype)
    total = lax.psum(x, AXIS)
    if op != "avg":
        return total
    if x.dtype.kind == "f":
        return total * np.asarray(1.0 / n_ranks, x.dtype)
    return lax.div(total, np.asarray(n_ranks, x.dtype))


def reduce_buckets_traced(x, op: str, n_ranks: int, bucket_bytes: int):
    """(Traced) :func:`reduce_traced` of ``x``, a vector longer than ``bucket_bytes`` in
    pieces of that size, each its own all-reduce, concatenated: element by element the
    same reduction. Other arrays, and ``bucket_bytes`` 0, in one all-reduce."""
    import jax.numpy as jnp

    step = bucket_bytes // x.dtype.itemsize
    if x.ndim != 1 or step <= 0 or x.shape[0] <= step:
        return reduce_traced(x, op, n_ranks)
    pieces = [reduce_traced(x[i : i + step], op, n_ranks) for i in range(0, x.shape[0], step)]
    return jnp.concatenate(pieces)


def sum_in_order_traced(x, n_ranks: int):
    """(Traced) ``x`` summed over the ranks in their order, rank 0's first: the same bits
    on every rank, for any number of ranks. Each rank's ``x`` reaches every other by
    ``n_ranks - 1`` collective permutes (at the k-th, rank i sends to rank i + k). For a
    few numbers summed often (the compiled NUTS's log-density and gradient, at every
    leapfrog step): on CPU devices gloo's all-reduce of a few numbers on 2 ranks writes 12
    messages a rank (a ring in segments, each announced), its all-gather 6, a permute 3,
    each a wake-up of a thread on the rank's one core."""
    import jax.numpy as jnp
    from jax import lax

    if n_ranks == 1:
        return x
    received = [x] + [  # the k-th from rank (this rank - k) mod n_ranks
        lax.ppermute(x, AXIS, [(i, (i + k) % n_ranks) for i in range(n_ranks)])
        for k in range(1, n_ranks)
    ]
    sources = (lax.axis_index(AXIS) - jnp.arange(n_ranks)) % n_ranks
    by_rank = jnp.take(jnp.stack(received), sources, axis=0)
    total = by_rank[0]
    for part in by_rank[1:]:
        total = total + part
    return total


_HOST_SUMS = threading.Lock()  # one host sum at a time in a process (XLA may run two at once)


def sum_by_host_traced(x, comm, site: int = 0, errors: list | None = None):
    """(Traced, in a program on this rank's own device) ``x`` summed over the ranks by
    ``comm.all_reduce`` (a :class:`~synkhronos.transport.comm.base.Communicator` of host
    arrays), called back from the program as it runs: every rank's program must reach it
    as often, in the same order (a rank that computes what every other computes does).
    Every rank gets the same bits, whatever the communicator's order of additions. Under
    ``jax.vmap`` one all-reduce takes the whole batch.

    ``site`` numbers this sum among the program's sums, alike on every rank (in the order
    they are traced): it is summed with ``x``, and a rank whose peers were at another
    sum raises rather than take their values for its own. An error of the all-reduce (a
    peer died, or failed and aborted the command) fails the program on this rank, which
    JAX raises as its own runtime error: the error itself is appended to ``errors``, for
    the caller to raise instead."""
    import jax

    if comm.n_ranks == 1:
        return x

    def total(value: np.ndarray) -> np.ndarray:
        flat = np.append(value.reshape(-1), value.dtype.type(site))
        try:
            with _HOST_SUMS:
                summed = comm.all_reduce([flat], "sum")[0]
            if summed[-1] != site * comm.n_ranks:
                raise RuntimeError(
                    f"a sum over the ranks met other sums of the same program on other "
                    f"ranks (sum {site} here, {summed[-1]} over {comm.n_ranks} ranks): "
                    f"the ranks' programs went apart"
                )
        except BaseException as error:
            if errors is not None:
                errors.append(error)
            raise
        return summed[:-1].reshape(value.shape)

    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.pure_callback(total, shape, x, vmap_method="expand_dims")


def broadcast_traced(x, root: int):
    """(Traced) ``root``'s ``x`` on every rank."""
    from jax import lax

    return _unbits(lax.psum(_root_bits(x, root), AXIS), x.dtype)


def sender(root: int, to: int):
    """(A body) each array of ``root`` on rank ``to``; zeros elsewhere."""
    from jax import lax

    return lambda xs: [lax.ppermute(x, AXIS, [(root, to)]) for x in xs]


__all__ = [
    "AXIS",
    "broadcast_traced",
    "reduce_buckets_traced",
    "reduce_traced",
    "sender",
    "sum_by_host_traced",
    "sum_in_order_traced",
]
