"""The local step: one rank's update of its own parameters on its own rows.

:class:`LocalStep` is built in rank 0 like any training step, as ``synk.function`` s (so
every rank has them compiled). In a phase each rank wraps its own compiled copies in a
:class:`RankStep` and calls them directly on its own minibatches, without a command per
step and without any all-reduce: the gradient is the rank's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.tensor.variable import TensorVariable

import synkhronos as synk
from synkhronos.rank.state import RankState
from synkhronos.transport.partition import split_bounds

__all__ = ["LocalStep", "RankStep", "rank_rows", "minibatch"]


class LocalStep:
    """A training step that each rank runs alone on its rows.

    Parameters
    ----------
    loss : TensorVariable
        Scalar loss: a mean over the rows of ``inputs``.
    params : list of SharedVariable
        Parameters to train, all of one dtype.
    inputs : list of TensorVariable
        The inputs; each rank feeds them its own rows.
    update_rule : callable
        A one-phase rule of :mod:`synkhronos.extensions.lasagne.updates` (returns the
        updates) or a three-part rule of :mod:`synkhronos.extensions.updates` (its phase
        two then reads the rank's own gradient: nothing is all-reduced).
    *args, **kwargs
        The rule's hyperparameters, e.g. ``learning_rate=0.1``.
    mode : str or pytensor Mode, optional
        Compile mode of the functions.

    Examples
    --------
    >>> step = LocalStep(loss, [w], [x, y], lasagne.updates.sgd,   # doctest: +SKIP
    ...                  learning_rate=0.1)
    """

    def __init__(
        self,
        loss: TensorVariable,
        params: Sequence[SharedVariable],
        inputs: Sequence[TensorVariable],
        update_rule: Callable[..., Any],
        *args: Any,
        mode: Any = None,
        **kwargs: Any,
    ):
        self.params = list(params)
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise TypeError(f"the parameters must share one dtype, got {sorted(dtypes)}")
        self.dtype = dtypes.pop()
        rule = update_rule(loss, self.params, *args, **kwargs)
        if isinstance(rule, tuple) and len(rule) == 3:  # three-part: gradient, then update
            grad_updates, param_updates, _ = rule
            self.functions = [
                synk.function(list(inputs), loss, updates=grad_updates, mode=mode),
                synk.function([], updates=param_updates, mode=mode),
            ]
        else:
            self.functions = [
                synk.function(list(inputs), loss, updates=rule, mode=mode, local_updates=True)
            ]
        self.n_inputs = len(inputs)

    def ids(self, state: RankState) -> tuple[np.ndarray, np.ndarray]:
        """The functions' ids and the parameters' registry indices (after distribution),
        which name them on every rank."""
        fids = np.array([f._spec.fid for f in self.functions], np.int64)
        indices = np.array([state.registry.index(p) for p in self.params], np.int64)
        return fids, indices

    def flat_params(self) -> np.ndarray:
        """Rank 0's parameters, concatenated."""
        return flatten([p.get_value(borrow=True) for p in self.params])


def flatten(values: Sequence[np.ndarray]) -> np.ndarray:
    """Arrays raveled and concatenated (a copy)."""
    return np.concatenate([np.ravel(v) for v in values])


class RankStep:
    """One rank's compiled local step and parameters (inside a phase).

    Parameters
    ----------
    state : RankState
        The rank's state.
    fids, param_indices : numpy.ndarray
        From :meth:`LocalStep.ids`.
    """

    def __init__(self, state: RankState, fids: np.ndarray, param_indices: np.ndarray):
        self.functions = [state.functions[int(f)] for f in fids]
        self.params = state.shared(param_indices)
        self.shapes = [np.shape(p.get_value(borrow=True)) for p in self.params]
        self.dtype = self.params[0].dtype

    def __call__(self, data: Sequence[np.ndarray], rows: slice) -> float:
        """Run the step on ``rows`` of ``data``; return the loss."""
        by_row = [0] * len(data)
        _, outputs = self.functions[0].run(list(data), rows, rows, by_row, [], None, 1, [0])
        for function in self.functions[1:]:
            function.run([], None, None, [], [], None, 1, [])
        return float(outputs[0])

    def get(self) -> np.ndarray:
        """The parameters, concatenated (a copy)."""
        return flatten([p.get_value(borrow=True) for p in self.params])

    def set(self, flat: np.ndarray) -> None:
        """Set the parameters from a concatenated vector."""
        start = 0
        for param, shape in zip(self.params, self.shapes, strict=True):
            size = int(np.prod(shape))
            param.set_value(np.array(flat[start : start + size], self.dtype).reshape(shape))
            start += size


def rank_rows(n_rows: int, rank: int, n_ranks: int) -> slice:
    """The contiguous share of ``n_rows`` rows that ``rank`` trains on (as evenly as
    possible, the first ranks one row more).

    Examples
    --------
    >>> [rank_rows(11, r, 3) for r in range(3)]
    [slice(0, 4, None), slice(4, 8, None), slice(8, 11, None)]
    """
    bounds = split_bounds(n_rows, n_ranks)
    return slice(bounds[rank], bounds[rank + 1])


def minibatch(share: slice, batch_size: int, step: int) -> slice:
    """The rows of local step ``step``: minibatches of ``batch_size`` rows cycling through
    ``share`` (its last partial minibatch skipped; a share shorter than one minibatch is
    used whole).

    Examples
    --------
    >>> [minibatch(slice(4, 11), 3, k) for k in range(3)]
    [slice(4, 7, None), slice(7, 10, None), slice(4, 7, None)]
    """
    n = share.stop - share.start
    n_batches = max(1, n // batch_size)
    start = share.start + (step % n_batches) * batch_size
    return slice(start, min(start + batch_size, share.stop))
