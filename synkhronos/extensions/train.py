"""Data-parallel training steps: gradient phase, one all-reduce, update phase.

:func:`make_train_function` is the original Synkhronos' helper: from a loss and
a three-part rule of :mod:`synkhronos.extensions.updates` it builds
``train(x_data, y_data, batch=None)``::

    train = make_train_function(loss, params, x, y, updates.adam, learning_rate=1e-3)
    for batch in batches:                   # index lists, slices or ints
        loss_value = train(x_data, y_data, batch=batch)

:func:`make_step_function` is the richer form: any number of inputs, data in
sliceable shared variables (``batch_s``), ``num_slices``, and a one-phase rule of
:mod:`synkhronos.extensions.lasagne.updates`::

    step = make_step_function(loss, params, [x, y], lasagne.updates.adam, learning_rate=1e-3)
    loss_value = step(x_data, y_data, batch=batch, num_slices=2)

A step runs three things on every rank, chained (:func:`synkhronos.chain`): rank 0
sends one command per step, and every rank runs them back to back:

1. the gradient function: each rank computes, on its rows, the gradient of
   ``loss`` times its row count, and writes it with the row count into one flat
   shared vector (with ``num_slices > 1`` the slices' values are summed into it);
2. one all-reduce of that vector, whatever the number of parameter tensors;
3. the update function: each rank divides by the total row count, which gives
   the mean gradient over the whole batch, and applies the rule.

On GPU ranks the three run as one XLA program per rank, dispatched once per step
(:mod:`synkhronos.rank.fused_chain`), whenever every rank gets the same number of
rows and ``num_slices`` is 1; otherwise one after the other, with the same results.

Every rank needs at least one row of the batch: a rank without rows would skip
phase one and all-reduce its previous step's gradient, so both forms refuse such
a batch.

``loss`` must be a mean over the rows of the scattered inputs. Because each
rank's gradient is weighted by its rows, the trajectory equals the
single-process one on the whole batch even when the rows split unevenly. Every
rank applies the same update to the same values, so parameters stay identical
on all ranks without being communicated.

Running state: shared variables that the loss graph updates by itself (a
``default_update``, e.g. the running mean and inverse standard deviation of
:class:`~synkhronos.extensions.lasagne.layers.BatchNormLayer` in a training
output) move on each rank with its own rows. After the gradient phase both
forms average them over the ranks with a second, small all-reduce (in the same
chained command), so
they too stay identical on all ranks. (An average of the ranks' running means
equals the single-process one when the ranks have equal rows; the running
inverse standard deviation is an average of the ranks' values, close to but not
exactly the whole batch's.) Random-number states are left per rank.

:func:`make_train_function_theano` and :func:`make_pytensor_step_function` build
the same steps as plain single-process PyTensor functions, for comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pytensor
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.traversal import graph_inputs
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorVariable

import synkhronos as synk
from synkhronos.api.functions import BaseFunction

from .updates import TwoPhaseUpdates, two_phase

__all__ = [
    "make_train_function",
    "make_train_function_theano",
    "running_state",
    "StepFunction",
    "PytensorStepFunction",
    "make_step_function",
    "make_pytensor_step_function",
]

Batch = int | slice | np.ndarray | Sequence[int] | None


def running_state(loss: TensorVariable) -> list[SharedVariable]:
    """The float shared variables that ``loss``'s graph updates by itself (``default_update``).

    These are what a training step averages over the ranks besides the gradient
    (e.g. batch-norm running averages); random-number states are not included.

    Examples
    --------
    >>> from synkhronos.ops.random_streams import add_default_update
    >>> acc = pytensor.shared(np.zeros(2), name="acc")
    >>> add_default_update(acc, acc + 1)
    >>> [v.name for v in running_state(acc.sum() * 2)]
    ['acc']
    """
    return [
        v
        for v in graph_inputs([loss])
        if isinstance(v, SharedVariable)
        and isinstance(v.type, TensorType)
        and v.type.dtype.startswith("float")
        and getattr(v, "default_update", None) is not None
    ]


def _chain(
    grad_function: BaseFunction,
    flat_grad: SharedVariable,
    op: str,
    state: list[SharedVariable],
    update_function: BaseFunction,
) -> synk.Chain:
    """Phase one, the all-reduce of ``flat_grad`` with ``op``, the running state's average
    (if any), and phase two: one command per step."""
    averaged = [("all_reduce", state, "avg")] if state else []
    # A rank without rows would skip phase one and all-reduce its previous gradient.
    return synk.chain(
        grad_function,
        ("all_reduce", flat_grad, op),
        *averaged,
        update_function,
        every_rank_rows=True,
    )


def make_train_function(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    x: TensorVariable,
    y: TensorVariable,
    update_rule: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> Callable[..., np.ndarray]:
    """Build ``train(x_data, y_data, batch=None)``: one data-parallel step (the original's form).

    Call it after :func:`synkhronos.fork`.

    Parameters
    ----------
    loss : TensorVariable
        Scalar loss: a mean over the rows of ``x`` and ``y``.
    params : iterable of SharedVariable
        Parameters to train, all of one dtype.
    x, y : TensorVariable
        The two inputs, scattered over the ranks along axis 0.
    update_rule : callable
        A three-part rule of :mod:`synkhronos.extensions.updates`, e.g. ``nesterov_momentum``.
    *args, **kwargs
        The rule's hyperparameters, e.g. ``learning_rate=0.01``.

    Returns
    -------
    callable
        ``train(x_data, y_data, batch=None)``: runs phase one on ``batch`` of the rows,
        the all-reduce of ``grad_shared`` (op "avg": exact with the row count), the
        average of the running state (see the module docstring) and phase two, with one
        command (:func:`synkhronos.chain`); returns the loss averaged over the batch.

    Examples
    --------
    >>> n_ranks = synk.fork(2)                                         # doctest: +SKIP
    >>> x, y = pt.matrix("x"), pt.vector("y")                          # doctest: +SKIP
    >>> w = pytensor.shared(np.zeros(3), name="w")                     # doctest: +SKIP
    >>> loss = pt.mean((x @ w - y) ** 2)                               # doctest: +SKIP
    >>> train = make_train_function(loss, [w], x, y, updates.sgd,     # doctest: +SKIP
    ...                             learning_rate=0.1)
    >>> loss_value = train(x_data, y_data, batch=[0, 3, 4])            # doctest: +SKIP
    """
    grad_updates, param_updates, grad_shared = update_rule(loss, list(params), *args, **kwargs)
    # Named as the original's were, for the timeline's spans.
    f_grad_shared = synk.function(
        inputs=[x, y], outputs=loss, updates=grad_updates, name="f_grad_shared"
    )
    f_param_update = synk.function(inputs=[], updates=param_updates, name="f_param_update")
    step = _chain(f_grad_shared, grad_shared, "avg", running_state(loss), f_param_update)

    def train_minibatch(x_data: Any, y_data: Any, batch: Batch = None) -> np.ndarray:
        return step(x_data, y_data, batch=batch)[0]

    return train_minibatch


def make_train_function_theano(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    x: TensorVariable,
    y: TensorVariable,
    update_rule: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> Callable[..., np.ndarray]:
    """The single-process twin of :func:`make_train_function`, with ``pytensor.function``.

    Arguments as for :func:`make_train_function`; returns ``train(x_data, y_data)``,
    which runs both phases on the whole arrays and returns the loss.

    Examples
    --------
    >>> import pytensor.tensor as pt
    >>> from synkhronos.extensions import updates
    >>> x, y = pt.matrix("x"), pt.vector("y")
    >>> w = pytensor.shared(np.zeros(2), name="w")
    >>> train = make_train_function_theano(pt.mean((x @ w - y) ** 2), [w], x, y,
    ...                                    updates.sgd, learning_rate=0.25)
    >>> float(train(np.eye(2), np.ones(2))), w.get_value()
    (1.0, array([0.25, 0.25]))
    """
    grad_updates, param_updates, _ = update_rule(loss, list(params), *args, **kwargs)
    f_grad_shared = pytensor.function(inputs=[x, y], outputs=loss, updates=grad_updates)
    f_param_update = pytensor.function(inputs=[], updates=param_updates)

    def train_minibatch(x_data: Any, y_data: Any) -> np.ndarray:
        train_loss = f_grad_shared(x_data, y_data)
        f_param_update()
        return train_loss

    return train_minibatch


class StepFunction:
    """A data-parallel training step; build it with :func:`make_step_function`.

    Attributes
    ----------
    grad_function : synkhronos.Function
        Phase one: returns the loss and writes the weighted gradient into the flat vector.
    update_function : synkhronos.Function
        Phase two: applies the rule.
    phases : TwoPhaseUpdates
        The updates both functions were built from; ``phases.flat_grad`` is
        the vector all-reduced between them.
    state : list of SharedVariable
        The running state averaged over the ranks after each gradient phase
        (see :func:`running_state`).
    chain : synkhronos.Chain
        The whole step, one command: phase one, the all-reduces, phase two.
    """

    def __init__(
        self,
        grad_function: BaseFunction,
        update_function: BaseFunction,
        phases: TwoPhaseUpdates,
        state: list[SharedVariable],
    ):
        self.grad_function = grad_function
        self.update_function = update_function
        self.phases = phases
        self.state = state
        self.chain = _chain(grad_function, phases.flat_grad, "sum", state, update_function)

    def __call__(
        self, *data: Any, batch: Batch = None, batch_s: Any = None, num_slices: int = 1
    ) -> np.ndarray:
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
        return self.chain(*data, batch=batch, batch_s=batch_s, num_slices=num_slices)[0]


def make_step_function(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    inputs: Iterable[TensorVariable],
    update_rule: Callable[..., Any],
    *args: Any,
    mode: Any = None,
    name: str | None = None,
    sliceable_shareds: Iterable[SharedVariable] = (),
    allow_input_downcast: bool | None = None,
    on_unused_input: str | None = None,
    **kwargs: Any,
) -> StepFunction:
    """Build a data-parallel training step for ``update_rule``.

    Call it after :func:`synkhronos.fork`.

    Parameters
    ----------
    loss : TensorVariable
        Scalar loss: a mean over the rows of ``inputs``.
    params : iterable of SharedVariable
        Parameters to train, all of one dtype.
    inputs : iterable of TensorVariable
        Inputs scattered over the ranks along axis 0; rows are counted on the first
        (or, with no inputs, on the first sliceable shared variable).
    update_rule : callable
        A one-phase rule of :mod:`synkhronos.extensions.lasagne.updates`, e.g. ``adam``
        (made two-phase by :func:`~synkhronos.extensions.updates.two_phase`).
    *args, **kwargs
        The rule's hyperparameters, e.g. ``learning_rate=0.01``.
    mode : str or pytensor Mode, optional
        Compile mode of both functions (default: the one
        :mod:`synkhronos.api.mode_choice` chooses for the gradient's graph, or the
        backend's).
    name : str, optional
        Prefix of the functions' names.
    sliceable_shareds : iterable of SharedVariable, optional
        Data held in shared variables, each rank its own part (see
        :func:`synkhronos.scatter`), whose rows a step selects with ``batch_s``.
    allow_input_downcast, on_unused_input : optional
        As for :func:`pytensor.function` (the gradient function takes the inputs).

    Returns
    -------
    StepFunction
        ``step(*data, batch=None, batch_s=None, num_slices=1)`` returning the batch's
        mean loss.

    Raises
    ------
    ValueError
        If there are neither ``inputs`` nor ``sliceable_shareds``.
    TypeError
        If the parameters' dtypes differ.

    Examples
    --------
    With ``x``, ``y``, ``w`` and ``loss`` as for :func:`make_train_function`:

    >>> step = make_step_function(loss, [w], [x, y], lasagne.updates.sgd,  # doctest: +SKIP
    ...                           learning_rate=0.1)
    >>> loss_value = step(x_data, y_data, num_slices=2)                # doctest: +SKIP
    """
    inputs, sliceable = list(inputs), list(sliceable_shareds)
    if not inputs and not sliceable:
        raise ValueError(
            "make_step_function needs at least one scattered input or sliceable "
            "shared variable (the rows behind the loss are counted on the first)"
        )
    rows = (inputs or sliceable)[0].shape[0]
    # Phase one overwrites the flat vector, so phase two need not clear it.
    phases = two_phase(update_rule, loss, params, *args, n_rows=rows, accumulate=False, **kwargs)
    # "sum" over num_slices: the vector gets the sum of the slices' row-weighted values.
    grad_function = synk.function(
        inputs=inputs,
        outputs=loss,
        updates=[(*u, "sum") for u in phases.grad_updates],
        sliceable_shareds=sliceable,
        name=f"{name}_grad" if name else None,
        mode=mode,
        **{
            k: v
            for k, v in (
                ("allow_input_downcast", allow_input_downcast),
                ("on_unused_input", on_unused_input),
            )
            if v is not None
        },
    )
    # The gradient's mode (CVM for a large graph): a cold start then waits for one compiler.
    update_function = synk.function(
        updates=phases.param_updates,
        name=f"{name}_update" if name else None,
        mode=grad_function.mode,
    )
    return StepFunction(grad_function, update_function, phases, running_state(loss))


class PytensorStepFunction:
    """A single-process training step; build it with :func:`make_pytensor_step_function`.

    Attributes
    ----------
    function : pytensor.compile.function.types.Function
        The compiled step, taking whole arrays and returning the loss.
    """

    def __init__(self, function: Any):
        self.function = function

    def __call__(self, *data: np.ndarray, batch: Batch = None) -> np.ndarray:
        """Run one step on the selected rows of ``data``; return the loss.

        ``batch`` selects rows as for :class:`StepFunction`: the first ``batch``
        rows for an int, else a slice, index array or boolean mask.
        """
        rows = slice(0, batch) if isinstance(batch, int | np.integer) else batch
        if rows is not None:
            data = tuple(np.asarray(d)[rows] for d in data)
        return self.function(*data)


def make_pytensor_step_function(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    inputs: Iterable[TensorVariable],
    update_rule: Callable[..., Any],
    *args: Any,
    mode: Any = None,
    **kwargs: Any,
) -> PytensorStepFunction:
    """The same step as :func:`make_step_function`, as one plain PyTensor function.

    The one-phase rule is applied to the gradient of ``loss`` on the whole batch.
    Arguments are those of :func:`make_step_function`.

    Returns
    -------
    PytensorStepFunction
        ``train(*data, batch=None)`` returning the loss.
    """
    updates = update_rule(loss, list(params), *args, **kwargs)
    return PytensorStepFunction(pytensor.function(list(inputs), loss, updates=updates, mode=mode))
