"""Theano's ``theano.sandbox``: :mod:`~synkhronos.theano.sandbox.rng_mrg` (Theano 1.0
removed ``sandbox.cuda``; GPUs come from :func:`synkhronos.fork`)."""

from synkhronos.theano.sandbox import rng_mrg

__all__ = ["rng_mrg"]
