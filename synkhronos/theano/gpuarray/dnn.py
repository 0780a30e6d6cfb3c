"""Theano's ``theano.gpuarray.dnn`` as seen without Theano's GPU backend: cuDNN is not
present (GPU ranks reach cuDNN through JAX instead)."""


def dnn_present() -> bool:
    """False: Theano's cuDNN wrappers are not available."""
    return False


def dnn_available(context_name=None) -> bool:
    """False: Theano's cuDNN wrappers are not available."""
    return False


__all__ = ["dnn_available", "dnn_present"]
