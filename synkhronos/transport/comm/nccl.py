"""Collectives for GPU ranks: NCCL through CuPy's bindings, on JAX device arrays.

Reductions and broadcasts run in NCCL on the devices; JAX arrays and CuPy arrays share
device memory through DLPack, so nothing goes through the host. Gather and scatter, whose
pieces may differ in shape between ranks, go through the host with the shared-memory
communicator this class extends. NCCL starts on the first collective: rank 0 makes the
unique id and every rank receives it through shared memory.

Across several nodes (:mod:`synkhronos.transport.comm.node`) the NCCL communicator spans every GPU
of every node (:attr:`NcclCommunicator.span`): NCCL ranks are global ranks, and the unique
id and the shapes a broadcast needs travel by the nodes' host broadcast (MPI between the
nodes), so a reduction stays one NCCL call.

Not yet run on GPU hardware (see docs/limitations.rst); ``bench/gpu_check.py`` is what to
run on the first machine with one.
"""

from __future__ import annotations

import numpy as np

from synkhronos.transport.comm.shm import ShmCommunicator
from synkhronos.transport.reduction import IN_PLACE_DTYPES
from synkhronos.transport.shm import DTYPES, dtype_code

# NCCL's names for the dtypes it reduces: NCCL_FLOAT32 for float32, and so on.
_NCCL_DTYPES = {name: f"NCCL_{name.upper()}" for name in IN_PLACE_DTYPES}
_NCCL_OPS = {"sum": "NCCL_SUM", "avg": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX",
             "min": "NCCL_MIN"}


class NcclCommunicator(ShmCommunicator):
    """NCCL collectives over one GPU per rank (arguments as for ShmCommunicator).

    Attributes
    ----------
    span : tuple or None
        Set before the first collective to span several nodes: ``(rank, n_ranks,
        host_broadcast)``, this rank's NCCL rank, the NCCL size, and a function
        ``host_broadcast(arrays, root)`` giving host arrays from that NCCL rank to every
        NCCL rank. None (default): NCCL ranks are this node's ranks, and the host
        broadcast is this class's shared-memory one.
    """

    _comm = None
    span = None

    def _nccl_span(self):
        """(NCCL rank, NCCL size, host broadcast), as :attr:`span` says."""
        return self.span or (self.rank, self.n_ranks, super().broadcast)

    def _nccl(self):
        """The NCCL communicator, created collectively on first use."""
        if self._comm is None:
            from cupy.cuda import nccl

            # Without the library CuPy's module has no functions, only ``available``.
            if not getattr(nccl, "available", False):
                raise ImportError("CuPy cannot load NCCL; install it (for cupy-cuda13x: "
                                  "pip install nvidia-nccl-cu13)")
            rank, size, host_broadcast = self._nccl_span()
            uid = [np.array(nccl.get_unique_id(), np.int64)] if rank == 0 else None
            uid = tuple(int(c) for c in host_broadcast(uid, 0)[0])
            self._comm = nccl.NcclCommunicator(size, uid, rank)
        return self._comm

    @staticmethod
    def _on_device(arrays) -> list:
        """JAX arrays for ``arrays``: ``set_value`` hands broadcast host arrays, which
        CuPy's ``from_dlpack`` refuses."""
        import jax

        return [a if isinstance(a, jax.Array) else jax.device_put(a) for a in arrays]

    @staticmethod
    def _codes(array, op: str | None = None):
        from cupy.cuda import nccl

        name = np.dtype(array.dtype).name
        if name not in _NCCL_DTYPES:
            raise TypeError(f"NCCL cannot move arrays of dtype {name}")
        dtype = getattr(nccl, _NCCL_DTYPES[name])
        return dtype if op is None else (dtype, getattr(nccl, _NCCL_OPS[op]))

    @staticmethod
    def _run(comm, arrays, outputs, codes, call) -> list:
        """Run ``call(comm, src, dst, code, stream)`` for each array as one NCCL group.

        ``codes`` are worked out beforehand so that nothing raises inside the group.
        """
        import cupy
        import jax
        from cupy.cuda import nccl

        for a in arrays:
            a.block_until_ready()  # JAX computes on its own stream
        sources = [cupy.from_dlpack(a) for a in arrays]
        stream = cupy.cuda.get_current_stream()
        nccl.groupStart()
        for src, dst, code in zip(sources, outputs, codes, strict=True):
            call(comm, src, dst, code, stream.ptr)
        nccl.groupEnd()
        stream.synchronize()
        return [jax.dlpack.from_dlpack(o) for o in outputs]

    def _reduction(self, arrays, op, root: int | None) -> list:
        """NCCL allReduce (``root`` None) or reduce to ``root``; "avg" is a sum, scaled."""
        import cupy
        import jax

        comm = self._nccl()
        rank, size, _ = self._nccl_span()
        arrays = self._on_device(arrays)
        codes = [self._codes(a, op) for a in arrays]
        outputs = [cupy.empty(a.shape, a.dtype) for a in arrays]

        def call(comm, src, dst, code, stream):
            dtype, nccl_op = code
            if root is None:
                comm.allReduce(src.data.ptr, dst.data.ptr, src.size, dtype, nccl_op, stream)
            else:
                comm.reduce(src.data.ptr, dst.data.ptr, src.size, dtype, nccl_op, root, stream)

        result = self._run(comm, arrays, outputs, codes, call)
        if op != "avg" or root not in (None, rank):
            return result
        # Same dtype out as in, as on CPU ranks: integers divide exactly, toward zero.
        return [r / size if np.dtype(r.dtype).kind == "f"
                else jax.lax.div(r, np.asarray(size, r.dtype)) for r in result]

    def all_reduce(self, arrays, op, out=None):
        return self._reduction(arrays, op, None)

    def reduce(self, arrays, op, root=0):
        result = self._reduction(arrays, op, root)
        return result if self._nccl_span()[0] == root else None

    def broadcast(self, arrays, root=0):
        import cupy
        import jax.numpy as jnp
        from cupy.cuda import nccl

        comm = self._nccl()
        rank, _, host_broadcast = self._nccl_span()
        # Non-roots learn shapes and dtypes through the host, then NCCL moves the data.
        meta = None
        if rank == root:
            arrays = self._on_device(arrays)
            meta = [np.array([dtype_code(a.dtype), *a.shape], np.int64) for a in arrays]
        meta = host_broadcast(meta, root)
        if rank != root:
            arrays = [jnp.empty(tuple(int(s) for s in m[1:]), DTYPES[int(m[0])]) for m in meta]
        outputs = [cupy.empty(a.shape, a.dtype) for a in arrays]

        # As bytes, so that every dtype moves (NCCL has no bool, int16 or complex type).
        def call(comm, src, dst, code, stream):
            comm.broadcast(src.data.ptr, dst.data.ptr, src.nbytes, code, root, stream)

        return self._run(comm, arrays, outputs, [nccl.NCCL_UINT8] * len(arrays), call)

    def gather(self, arrays, root=0):
        return super().gather([np.asarray(a) for a in arrays], root)

    def all_gather(self, arrays):
        return super().all_gather([np.asarray(a) for a in arrays])

    def scatter(self, parts, root=0):
        host = None if parts is None else [[np.asarray(a) for a in p] for p in parts]
        return super().scatter(host, root)

    def close(self) -> None:
        if self._comm is not None:
            self._comm.destroy()
            self._comm = None
