"""synkhronos: data-parallel execution of PyTensor functions on every device at once.

Write a serial PyTensor script, replace ``pytensor.function`` with
:func:`synkhronos.function`, and call it on :func:`synkhronos.data` arrays: every rank
computes on its share of the rows and the results come back reduced.

>>> import synkhronos as synk
>>> n_ranks = synk.fork()          # doctest: +SKIP

The package's map (modules by audience, one call's path, where state lives, the wire
formats) is ``docs/internals.rst``.
"""

from synkhronos.api.builders import function
from synkhronos.api.chains import Chain, chain
from synkhronos.api.checkpoints import load, save
from synkhronos.api.collectives import (
    all_gather,
    all_reduce,
    broadcast,
    gather,
    get_lengths,
    get_shapes,
    get_value,
    reduce,
    scatter,
    set_value,
)
from synkhronos.api.functions import BaseFunction, Function
from synkhronos.api.verification import RanksDisagree, verify
from synkhronos.session.launch import backend, close, distribute, fork, get_n_gpu, timeline
from synkhronos.transport.channel import RemoteError, WorkerDied, WorkerHung
from synkhronos.transport.shared_arrays import Data

__version__ = "0.1.0"


def data(
    value=None,
    var=None,
    dtype=None,
    ndim: int | None = None,
    shape=None,
    minibatch: bool = False,
    force_cast: bool = False,
    oversize: float = 1.0,
    name: str | None = None,
) -> Data:
    """An array in OS shared memory that every rank reads without copying.

    Parameters
    ----------
    value : array_like, optional
        Initial contents.
    var : pytensor Variable, optional
        Take ``dtype`` and ``ndim`` from this variable (the input the data is for).
    dtype : dtype, optional
        Default: ``value``'s dtype, or ``pytensor.config.floatX``.
    ndim : int, optional
        Fix the number of dimensions (else ``value``'s or ``shape``'s fixes it); a later
        value with another number raises ``TypeError``.
    shape : tuple of int, optional
        Allocate zeros of this shape when no ``value`` is given.
    minibatch : bool
        The array holds a minibatch: a call reads it by position within ``batch`` (its
        row k pairs with the k-th selected row of the full inputs).
    force_cast : bool
        Allow an unsafe cast of ``value`` to ``dtype``.
    oversize : float
        In [1, 2]: allocate this multiple of the needed size, so later larger values fit.
    name : str, optional

    Examples
    --------
    >>> import numpy as np, synkhronos as synk
    >>> x = synk.data(np.zeros((4, 3), dtype="float32"))
    >>> x[1:3] = 1.0
    >>> float(x.data.sum())
    6.0
    """
    return Data(value, var, dtype, ndim, shape, minibatch, force_cast, oversize, name)


__all__ = [
    "BaseFunction",
    "Chain",
    "Data",
    "Function",
    "RanksDisagree",
    "RemoteError",
    "WorkerDied",
    "WorkerHung",
    "all_gather",
    "all_reduce",
    "backend",
    "broadcast",
    "chain",
    "close",
    "data",
    "distribute",
    "fork",
    "function",
    "gather",
    "get_lengths",
    "get_n_gpu",
    "get_shapes",
    "get_value",
    "load",
    "reduce",
    "save",
    "scatter",
    "set_value",
    "timeline",
    "verify",
]
