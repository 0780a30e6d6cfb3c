"""Data-parallel training steps: gradient phase, one all-reduce, update phase.

:func:`make_train_function` turns a loss and an update rule of
:mod:`synkhronos.extensions.updates` into a callable training step::

    train = make_train_function(loss, params, [x, y], adam, learning_rate=1e-3)
    for x_batch, y_batch in batches:
        loss_value = train(x_batch, y_batch)

A step runs three things on every rank:

1. the gradient function: each rank computes, on its rows, the gradient of
   ``loss`` times its row count, and adds it with the row count to one flat
   shared vector (see :func:`~synkhronos.extensions.updates.two_phase` with
   ``n_rows``); with ``num_slices > 1`` the slices accumulate into it;
2. one ``synk.all_reduce(flat_grad, op="sum")``, whatever the number of
   parameter tensors;
3. the update function: each rank divides by the total row count, which gives
   the mean gradient over the whole batch, and applies the rule.

``loss`` must be a mean over the rows of the scattered inputs. Because each
rank's gradient is weighted by its rows, the trajectory equals the
single-process one on the whole batch even when the rows split unevenly
(``all_reduce(op="avg")`` of per-rank mean gradients would not). Every rank
applies the same update to the same values, so parameters stay identical on
all ranks without being communicated.

:func:`make_pytensor_train_function` builds the same step as a plain
single-process PyTensor function, for comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytensor
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.tensor.variable import TensorVariable

import synkhronos as synk

from .updates import TwoPhaseUpdates, Updates, two_phase

__all__ = ["TrainFunction", "PytensorTrainFunction", "make_train_function",
           "make_pytensor_train_function"]

Batch = int | slice | np.ndarray | Sequence[int] | None


class TrainFunction:
    """A data-parallel training step; build it with :func:`make_train_function`.

    Attributes
    ----------
    grad_function : synkhronos.Function
        Phase one: returns the loss and accumulates the weighted gradient.
    update_function : synkhronos.Function
        Phase two: applies the rule and clears the flat vector.
    phases : TwoPhaseUpdates
        The updates both functions were built from; ``phases.flat_grad`` is
        the vector all-reduced between them.
    """

    def __init__(self, grad_function: synk.Function, update_function: synk.Function,
                 phases: TwoPhaseUpdates):
        self.grad_function = grad_function
        self.update_function = update_function
        self.phases = phases

    def __call__(self, *data: Any, batch: Batch = None, batch_s: Any = None,
                 num_slices: int = 1) -> np.ndarray:
        """Run one training step on every rank; return the loss averaged over the batch.

        Parameters
        ----------
        *data : numpy.ndarray or synkhronos.Data
            One array per input, scattered along axis 0 over the ranks.
        batch : int, slice or array of int, optional
            Rows to use, as for a :class:`synkhronos.Function` call.
        batch_s : slice, array of int, or a list of them (one per rank), optional
            Rows of the sliceable shared variables each rank uses, as for a call.
        num_slices : int
            Sequential chunks per rank (bounds memory; same result).

        Returns
        -------
        numpy.ndarray
            The loss, averaged over all selected rows.
        """
        loss = self.grad_function(*data, batch=batch, batch_s=batch_s, num_slices=num_slices)
        synk.all_reduce(self.phases.flat_grad, op="sum")
        self.update_function()
        return loss


def make_train_function(loss: TensorVariable, params: Sequence[SharedVariable],
                        inputs: Sequence[TensorVariable], update_rule: Callable[..., Updates],
                        *args: Any, mode: Any = None, name: str | None = None,
                        sliceable_shareds: Sequence[SharedVariable] = (),
                        **kwargs: Any) -> TrainFunction:
    """Build a data-parallel training step for ``update_rule``.

    Call it after :func:`synkhronos.fork`.

    Parameters
    ----------
    loss : TensorVariable
        Scalar loss: a mean over the rows of ``inputs``.
    params : list of SharedVariable
        Parameters to train, all of one dtype.
    inputs : list of TensorVariable
        Inputs scattered over the ranks along axis 0; rows are counted on the first
        (or, with no inputs, on the first sliceable shared variable).
    update_rule : callable
        A rule of :mod:`synkhronos.extensions.updates`, e.g. ``adam``.
    *args, **kwargs
        The rule's hyperparameters, e.g. ``learning_rate=0.01``.
    mode : str or pytensor Mode, optional
        Compile mode of both functions (default: the backend's).
    name : str, optional
        Prefix of the functions' names.
    sliceable_shareds : list of SharedVariable, optional
        Data held in shared variables, each rank its own part (see
        :func:`synkhronos.scatter`), whose rows a step selects with ``batch_s``.

    Returns
    -------
    TrainFunction
        ``train(*data, batch=None, batch_s=None, num_slices=1)`` returning the batch's
        mean loss.

    Raises
    ------
    ValueError
        If there are neither ``inputs`` nor ``sliceable_shareds``.
    TypeError
        If the parameters' dtypes differ.

    Examples
    --------
    >>> n_ranks = synk.fork(2)                                         # doctest: +SKIP
    >>> x, y = pt.matrix("x"), pt.vector("y")                          # doctest: +SKIP
    >>> w = pytensor.shared(np.zeros(3), name="w")                     # doctest: +SKIP
    >>> loss = pt.mean((x @ w - y) ** 2)                               # doctest: +SKIP
    >>> train = make_train_function(loss, [w], [x, y], sgd, learning_rate=0.1)  # doctest: +SKIP
    >>> loss_value = train(x_data, y_data)                             # doctest: +SKIP
    """
    inputs, sliceable = list(inputs), list(sliceable_shareds)
    if not inputs and not sliceable:
        raise ValueError("make_train_function needs at least one scattered input or sliceable "
                         "shared variable (the rows behind the loss are counted on the first)")
    rows = (inputs or sliceable)[0].shape[0]
    phases = two_phase(update_rule, loss, params, *args, n_rows=rows, **kwargs)
    # "sum" over num_slices: every slice adds its rows' share to the cleared vector.
    grad_function = synk.function(inputs=inputs, outputs=loss,
                                  updates=[(*u, "sum") for u in phases.grad_updates],
                                  sliceable_shareds=sliceable,
                                  name=f"{name}_grad" if name else None, mode=mode)
    update_function = synk.function(updates=phases.param_updates,
                                    name=f"{name}_update" if name else None, mode=mode)
    return TrainFunction(grad_function, update_function, phases)


class PytensorTrainFunction:
    """A single-process training step; build it with :func:`make_pytensor_train_function`.

    Attributes
    ----------
    function : pytensor.compile.function.types.Function
        The compiled step, taking whole arrays and returning the loss.
    """

    def __init__(self, function: Any):
        self.function = function

    def __call__(self, *data: np.ndarray, batch: Batch = None) -> np.ndarray:
        """Run one step on the selected rows of ``data``; return the loss.

        ``batch`` selects rows as for :class:`TrainFunction`: the first ``batch``
        rows for an int, else a slice, index array or boolean mask.
        """
        rows = slice(0, batch) if isinstance(batch, int | np.integer) else batch
        if rows is not None:
            data = tuple(np.asarray(d)[rows] for d in data)
        return self.function(*data)


def make_pytensor_train_function(loss: TensorVariable, params: Sequence[SharedVariable],
                                 inputs: Sequence[TensorVariable],
                                 update_rule: Callable[..., Updates], *args: Any,
                                 mode: Any = None, **kwargs: Any) -> PytensorTrainFunction:
    """The same step as :func:`make_train_function`, as one plain PyTensor function.

    The rule is applied in its one-phase (Lasagne) form to the gradient of
    ``loss`` on the whole batch. Arguments are those of :func:`make_train_function`.

    Returns
    -------
    PytensorTrainFunction
        ``train(*data, batch=None)`` returning the loss.
    """
    updates = update_rule(loss, list(params), *args, **kwargs)
    return PytensorTrainFunction(pytensor.function(list(inputs), loss, updates=updates,
                                                   mode=mode))
