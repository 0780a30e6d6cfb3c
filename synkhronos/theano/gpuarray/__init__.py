"""Theano's ``theano.gpuarray``, the GPU backend: here its device selection does nothing,
since :func:`synkhronos.fork` places one rank on each GPU (through JAX).

``pygpu_activated`` is False and :func:`~synkhronos.theano.gpuarray.dnn.dnn_present`
False, so code probing for Theano's GPU backend (Lasagne's cuDNN layers) finds none.
"""

import logging

from synkhronos.theano.gpuarray import dnn

logger = logging.getLogger(__name__)

pygpu_activated = False


def use(
    device,
    force: bool = False,
    default_to_move_computation_to_gpu: bool = True,
    move_shared_to_gpu: bool = True,
    preallocate=None,
) -> None:
    """Theano's ``theano.gpuarray.use(device)``: does nothing but log that GPU ranks come
    from ``synk.fork`` (``synk.fork(gpus=...)`` chooses the devices)."""
    logger.info(
        "theano.gpuarray.use(%r) does nothing: synk.fork() starts one rank per GPU "
        "(synk.fork(gpus=...) chooses them)",
        device,
    )


__all__ = ["dnn", "pygpu_activated", "use"]
