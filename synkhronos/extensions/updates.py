"""Synkhronos' two-phase update rules: a data-parallel step with one all-reduce.

Every rule takes ``(loss, params, ...)`` with the hyperparameters of its
Lasagne namesake (:mod:`synkhronos.extensions.lasagne.updates`, on which it is
built) and returns three things::

    grad_updates, param_updates, grad_shared = nesterov_momentum(
        loss, params, learning_rate=0.01, momentum=0.9)
    f_grad = synk.function([x, y], loss, updates=grad_updates)
    f_update = synk.function([], updates=param_updates)

    loss_value = f_grad(x_data, y_data, batch=rows)
    synk.all_reduce(grad_shared)        # op "avg" (the default) or "sum"
    f_update()

1. ``grad_updates`` (phase one): every rank writes the gradient of its own rows
   into ONE flat shared vector, ``grad_shared`` (all parameters' gradients
   concatenated), so that one collective moves them all;
2. the program all-reduces ``grad_shared``;
3. ``param_updates`` (phase two): every rank applies the rule to its
   parameters and optimizer state, reading the reduced gradient. Every rank
   applies the same update to the same values, so the parameters stay
   identical on all ranks without ever being communicated.

Row weighting: ``loss`` is a mean over a rank's rows, and ranks may hold
different numbers of rows. Phase one therefore writes ``n_rows * gradient``
and, as the last element of ``grad_shared``, ``n_rows``; phase two divides the
reduced gradient part by the reduced row count. With ``op="sum"`` that is
``sum(n_r * g_r) / sum(n_r)``; with ``op="avg"`` both parts are divided by the
same number of ranks, which cancels: the same ratio. Either way phase two uses
the mean gradient over the whole batch, exactly, however unevenly the rows
were split (a plain average of per-rank mean gradients, as in the original
Synkhronos, is exact only for even splits). Other ops (max, min, prod) are
meaningless here. Every rank must have at least one row (a rank with none
would not run phase one and keep its previous value;
:func:`~synkhronos.extensions.train.make_train_function` refuses such a batch).

Phase one *overwrites* ``grad_shared``, as in the original. In a call with
``num_slices > 1`` every slice computes its update from the original values and
the slices' values are combined once, by the update's op (default: the
row-weighted ``"avg"``, which would weight ``n_rows * gradient`` twice). Give
phase one the op ``"sum"`` for sliced calls, which keeps them exact::

    f_grad = synk.function([x, y], loss, updates=[(*u, "sum") for u in grad_updates])

(:func:`synkhronos.extensions.train.make_step_function` does this.)

``n_rows`` (keyword) is the number of rows behind ``loss`` on a rank. By
default it is the length of the first non-shared input of ``loss`` (the rows
:func:`synkhronos.function` scatters); pass it when that input is not a
scattered one, e.g. ``n_rows=x.shape[0]``. With no such input (data held in
sliceable shared variables) or ``n_rows=1``, the ranks' mean gradients are
averaged unweighted, as in the original.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant
from pytensor.graph.traversal import graph_inputs
from pytensor.tensor.variable import TensorVariable

from .lasagne import updates as one_phase

__all__ = [
    "sgd",
    "apply_momentum",
    "momentum",
    "apply_nesterov_momentum",
    "nesterov_momentum",
    "adagrad",
    "rmsprop",
    "adadelta",
    "adam",
    "adamax",
    "sgd_nonflat",
    "flat_unflat_grads",
    "nonflat_grads",
    "flatten_vars",
    "vars_flat_size",
    "unflatten_vars",
    "loss_rows",
    "TwoPhaseUpdates",
    "two_phase",
]

Pairs = list[tuple[SharedVariable, TensorVariable]]
Phases = tuple[Pairs, Pairs, SharedVariable]
Rows = TensorVariable | int | None


# --- flat vectors -------------------------------------------------------------------------


def vars_flat_size(variables: Iterable[SharedVariable | np.ndarray]) -> int:
    """Total number of elements of shared variables (or arrays): the length of their flat vector.

    Examples
    --------
    >>> vars_flat_size([pytensor.shared(np.zeros((2, 3))), pytensor.shared(np.zeros(4))])
    10
    """
    return int(
        sum(
            np.size(v.get_value(borrow=True)) if isinstance(v, SharedVariable) else np.size(v)
            for v in variables
        )
    )


def flatten_vars(variables: Iterable[TensorVariable]) -> TensorVariable:
    """Concatenate variables, each raveled in C order, into one symbolic vector.

    Parameters
    ----------
    variables : iterable of TensorVariable
        Non-empty; all of one dtype.

    Returns
    -------
    TensorVariable
        A vector of length ``sum(v.size for v in variables)``.

    Raises
    ------
    TypeError
        If the variables' dtypes differ (they are never cast implicitly).
    ValueError
        If ``variables`` is empty.

    Examples
    --------
    >>> flatten_vars([pt.as_tensor(np.ones((2, 2))), pt.as_tensor(np.zeros(1))]).eval()
    array([1., 1., 1., 1., 0.])
    """
    variables = list(variables)
    if not variables:
        raise ValueError("flatten_vars needs at least one variable")
    one_phase._common_dtype(variables, "flatten_vars variables")
    return pt.concatenate([pt.as_tensor_variable(v).ravel() for v in variables])


def unflatten_vars(
    flat_var: TensorVariable, variables: Iterable[SharedVariable]
) -> list[TensorVariable]:
    """Split a flat vector into pieces shaped like ``variables`` (undoes :func:`flatten_vars`).

    Parameters
    ----------
    flat_var : TensorVariable
        A vector of length ``vars_flat_size(variables)`` (or longer: the rest is ignored).
    variables : iterable of SharedVariable
        Variables whose current sizes place the pieces in ``flat_var``.

    Returns
    -------
    list of TensorVariable
        ``flat_var[start:stop].reshape(var.shape)`` for each variable, in order: each
        piece has its variable's type, so an update of the variable computed from it
        can overwrite the variable in place.

    Examples
    --------
    >>> a, b = pytensor.shared(np.zeros((2, 2))), pytensor.shared(np.zeros(1))
    >>> [p.eval().tolist() for p in unflatten_vars(pt.as_tensor(np.arange(5.0)), [a, b])]
    [[[0.0, 1.0], [2.0, 3.0]], [4.0]]
    """
    pieces = []
    start = 0
    for var in variables:
        shape = var.get_value(borrow=True).shape
        stop = start + int(np.prod(shape, dtype=np.int64))
        # The variable's symbolic shape, not the constant one: a constant gives the piece
        # a static shape the variable's type lacks, and PyTensor then writes every updated
        # parameter into a new array (SGD's phase two on 25M floats: 43.6 ms, in place 6.0).
        pieces.append(flat_var[start:stop].reshape(var.shape, ndim=len(shape)))
        start = stop
    return pieces


def loss_rows(loss: TensorVariable) -> TensorVariable:
    """The rows behind ``loss`` on a rank: the length of its first non-shared input, else 1.

    This is the default ``n_rows`` of the rules (see the module docstring).

    Examples
    --------
    >>> x = pt.matrix("x")
    >>> loss_rows(pt.mean(x)).eval({x: np.zeros((7, 2))})
    array(7)
    """
    for var in graph_inputs([loss]):
        if (
            not isinstance(var, SharedVariable | Constant)
            and isinstance(var, TensorVariable)
            and var.ndim > 0
        ):
            return var.shape[0]
    return pt.constant(1)


def _row_count(n_rows: Rows, dtype: str) -> TensorVariable:
    return pt.cast(pt.as_tensor_variable(n_rows), dtype)


def flat_unflat_grads(
    loss: TensorVariable, params: Iterable[SharedVariable], n_rows: Rows = None
) -> tuple[SharedVariable, TensorVariable, list[TensorVariable]]:
    """One flat shared vector for the gradients, what phase one writes into it, and its views.

    Parameters
    ----------
    loss : TensorVariable
        The scalar loss.
    params : iterable of SharedVariable
        The parameters, all of one dtype (that of the vector).
    n_rows : symbolic or int scalar, optional
        None (the original layout): the vector holds the gradients. Given: it holds
        ``n_rows * gradients`` and ``n_rows`` as a last element, and the views read
        ``gradients / n_rows`` (see the module docstring).

    Returns
    -------
    grad_shared_flat : SharedVariable
        The zero-initialised flat vector, to all-reduce between the phases.
    flat_grad : TensorVariable
        The value phase one writes into it.
    unflat_grads : list of TensorVariable
        One gradient per parameter, shaped like it, read from ``grad_shared_flat``.

    Examples
    --------
    >>> w = pytensor.shared(np.ones(2), name="w")
    >>> grad_shared, flat_grad, grads = flat_unflat_grads((3 * w).sum(), [w])
    >>> flat_grad.eval()
    array([3., 3.])
    """
    params = list(params)  # any iterable, read more than once
    one_phase._check_shared(params)
    dtype = one_phase._common_dtype(params, "params")
    size = vars_flat_size(params)
    if n_rows is None:
        grad_shared = pytensor.shared(np.zeros(size, dtype=dtype), name="flat_grad_s")
        grads = flatten_vars(pytensor.grad(loss, params))
        return grad_shared, grads, unflatten_vars(grad_shared, params)
    rows = _row_count(n_rows, dtype)
    grad_shared = pytensor.shared(np.zeros(size + 1, dtype=dtype), name="flat_grad_s")
    # The gradient of rows * loss is rows * gradient, by linearity: the weighting costs one
    # scalar product at the top of the backward pass, not a pass over the flat vector, and
    # the gradients and the row count go into the vector in one concatenation.
    weighted = pytensor.grad(loss * rows, params)
    flat_grad = pt.concatenate([*(g.ravel() for g in weighted), rows[None]])
    # Divided after the reshape: the division then fuses with the rule's element-wise
    # update of each parameter, one pass over it (a division of the flat vector first
    # would be a pass, and an allocation, of its own).
    count = grad_shared[-1]
    return grad_shared, flat_grad, [g / count for g in unflatten_vars(grad_shared, params)]


def nonflat_grads(
    loss: TensorVariable, params: Iterable[SharedVariable]
) -> tuple[list[SharedVariable], list[TensorVariable]]:
    """One gradient shared variable per parameter, and the gradients to write into them.

    The per-tensor layout, which needs one collective per tensor (see :func:`sgd_nonflat`).

    Returns
    -------
    grads_shared : list of SharedVariable
        Zero-initialised, shaped like ``params``.
    grads : list of TensorVariable
        ``pytensor.grad(loss, params)``.

    Examples
    --------
    >>> w = pytensor.shared(np.ones(2), name="w")
    >>> grads_shared, grads = nonflat_grads((3 * w).sum(), [w])
    >>> grads_shared[0].get_value(), grads[0].eval()
    (array([0., 0.]), array([3., 3.]))
    """
    params = list(params)
    one_phase._check_shared(params)
    grads_shared = [one_phase._zeros_like(p, "grad") for p in params]
    return grads_shared, pytensor.grad(loss, params)


# --- the rules ----------------------------------------------------------------------------


def _phases(
    rule: Callable[..., OrderedDict],
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    n_rows: Rows,
    *args: Any,
    **kwargs: Any,
) -> Phases:
    """The three parts of ``rule`` (a one-phase rule) with a row-weighted flat vector."""
    params = list(params)
    rows = loss_rows(loss) if n_rows is None else n_rows
    grad_shared, flat_grad, grads = flat_unflat_grads(loss, params, n_rows=rows)
    param_updates = rule(grads, params, *args, **kwargs)
    return [(grad_shared, flat_grad)], list(param_updates.items()), grad_shared


def sgd(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    learning_rate: Any,
    *,
    n_rows: Rows = None,
) -> Phases:
    """Stochastic gradient descent in two phases: ``param = param - learning_rate * grad``.

    Parameters
    ----------
    loss : TensorVariable
        Scalar loss, a mean over a rank's rows.
    params : iterable of SharedVariable
        The parameters, all of one dtype.
    learning_rate : float or symbolic scalar
        The step size.
    n_rows : symbolic or int scalar, optional
        Rows behind ``loss`` (default: see the module docstring).

    Returns
    -------
    grad_updates : list of (SharedVariable, TensorVariable)
        Phase one: ``[(grad_shared, row-weighted flat gradient)]``.
    param_updates : list of (SharedVariable, TensorVariable)
        Phase two: the rule's updates of the parameters (and optimizer state).
    grad_shared : SharedVariable
        The flat vector to all-reduce (op "avg" or "sum") between the phases.

    Examples
    --------
    >>> x = pt.vector("x")
    >>> w = pytensor.shared(np.ones(2), name="w")
    >>> grad_updates, param_updates, grad_shared = sgd(pt.mean((x - w.sum()) ** 2), [w], 0.1)
    >>> f_grad = pytensor.function([x], updates=grad_updates)
    >>> f_update = pytensor.function([], updates=param_updates)
    >>> _ = f_grad(np.zeros(3)); grad_shared.get_value()    # 3 rows: [3 * grad, 3]
    array([12., 12.,  3.])
    >>> _ = f_update(); w.get_value()
    array([0.6, 0.6])
    """
    return _phases(one_phase.sgd, loss, params, n_rows, learning_rate)


def apply_momentum(param_updates: Pairs, momentum: Any = 0.9) -> Pairs:
    """Add classical momentum to the pairs of phase two (see Lasagne's ``apply_momentum``).

    Parameters
    ----------
    param_updates : list of (SharedVariable, TensorVariable)
        E.g. the second part of :func:`sgd`'s result.
    momentum : float or symbolic scalar
        The amount of momentum.

    Returns
    -------
    list of (SharedVariable, TensorVariable)
        The pairs with momentum added, and the velocities' updates.
    """
    return list(one_phase.apply_momentum(OrderedDict(param_updates), momentum=momentum).items())


def apply_nesterov_momentum(param_updates: Pairs, momentum: Any = 0.9) -> Pairs:
    """Add Nesterov momentum to the pairs of phase two (see Lasagne's namesake).

    Parameters and result as for :func:`apply_momentum`.
    """
    return list(
        one_phase.apply_nesterov_momentum(OrderedDict(param_updates), momentum=momentum).items()
    )


def momentum(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    learning_rate: Any,
    momentum: Any = 0.9,
    *,
    n_rows: Rows = None,
) -> Phases:
    """SGD with classical momentum in two phases; arguments and result as for :func:`sgd`."""
    return _phases(one_phase.momentum, loss, params, n_rows, learning_rate, momentum=momentum)


def nesterov_momentum(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    learning_rate: Any,
    momentum: Any = 0.9,
    *,
    n_rows: Rows = None,
) -> Phases:
    """SGD with Nesterov momentum in two phases; arguments and result as for :func:`sgd`."""
    return _phases(
        one_phase.nesterov_momentum, loss, params, n_rows, learning_rate, momentum=momentum
    )


def adagrad(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    learning_rate: Any = 1.0,
    epsilon: Any = 1e-6,
    *,
    n_rows: Rows = None,
) -> Phases:
    """Adagrad in two phases; see Lasagne's ``adagrad`` and :func:`sgd`."""
    return _phases(one_phase.adagrad, loss, params, n_rows, learning_rate, epsilon)


def rmsprop(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    learning_rate: Any = 1.0,
    rho: Any = 0.9,
    epsilon: Any = 1e-6,
    *,
    n_rows: Rows = None,
) -> Phases:
    """RMSProp in two phases; see Lasagne's ``rmsprop`` and :func:`sgd`."""
    return _phases(one_phase.rmsprop, loss, params, n_rows, learning_rate, rho, epsilon)


def adadelta(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    learning_rate: Any = 1.0,
    rho: Any = 0.95,
    epsilon: Any = 1e-6,
    *,
    n_rows: Rows = None,
) -> Phases:
    """Adadelta in two phases; see Lasagne's ``adadelta`` and :func:`sgd`."""
    return _phases(one_phase.adadelta, loss, params, n_rows, learning_rate, rho, epsilon)


def adam(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    learning_rate: Any = 0.001,
    beta1: Any = 0.9,
    beta2: Any = 0.999,
    epsilon: Any = 1e-8,
    *,
    n_rows: Rows = None,
) -> Phases:
    """Adam in two phases; see Lasagne's ``adam`` and :func:`sgd`."""
    return _phases(one_phase.adam, loss, params, n_rows, learning_rate, beta1, beta2, epsilon)


def adamax(
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    learning_rate: Any = 0.002,
    beta1: Any = 0.9,
    beta2: Any = 0.999,
    epsilon: Any = 1e-8,
    *,
    n_rows: Rows = None,
) -> Phases:
    """Adamax in two phases; see Lasagne's ``adamax`` and :func:`sgd`."""
    return _phases(one_phase.adamax, loss, params, n_rows, learning_rate, beta1, beta2, epsilon)


def sgd_nonflat(
    loss: TensorVariable, params: Iterable[SharedVariable], learning_rate: Any
) -> tuple[Pairs, Pairs, list[SharedVariable]]:
    """:func:`sgd` with one gradient shared variable per parameter, to measure what flat saves.

    The third part is the list of gradient variables; all-reduce it with ``op="avg"``
    (one collective per tensor). Unlike the flat rules it carries no row count: it
    averages the ranks' mean gradients, exact when every rank has the same rows.

    Examples
    --------
    >>> w = pytensor.shared(np.ones(2), name="w")
    >>> grad_updates, param_updates, grads_shared = sgd_nonflat((3 * w).sum(), [w], 0.1)
    >>> len(grad_updates), len(param_updates), len(grads_shared)
    (1, 1, 1)
    """
    params = list(params)
    grads_shared, grads = nonflat_grads(loss, params)
    param_updates = one_phase.sgd(grads_shared, params, learning_rate)
    return list(zip(grads_shared, grads, strict=True)), list(param_updates.items()), grads_shared


# --- the accumulating form used by extensions.train.make_step_function ---------------------


class TwoPhaseUpdates(NamedTuple):
    """The phases of :func:`two_phase`.

    Attributes
    ----------
    grad_updates : list of (SharedVariable, TensorVariable)
        Phase one: adds the row-weighted flat gradient and row count to ``flat_grad``.
    param_updates : OrderedDict
        Phase two: the rule's updates, reading the mean gradient, and ``flat_grad``
        cleared for the next step.
    flat_grad : SharedVariable
        The flat vector to all-reduce between the phases (op "sum" or "avg").
    """

    grad_updates: Pairs
    param_updates: OrderedDict
    flat_grad: SharedVariable


def two_phase(
    rule: Callable[..., OrderedDict],
    loss: TensorVariable,
    params: Iterable[SharedVariable],
    *args: Any,
    n_rows: Rows = None,
    accumulate: bool = True,
    **kwargs: Any,
) -> TwoPhaseUpdates:
    """Split a one-phase rule into phases whose phase one accumulates over calls.

    Like the rules above, but phase one *adds* to ``flat_grad``, and phase two
    clears it. Several phase-one calls before one all-reduce then add up to the
    whole batch's gradient (for ``num_slices > 1``, give phase one the op ``"sum"``,
    as :func:`synkhronos.extensions.train.make_step_function` does). The clearing is
    an update of phase two, which is why this form is not returned by the rules
    (``apply_momentum`` on its pairs would treat ``flat_grad`` as a parameter).

    Parameters
    ----------
    rule : callable
        A one-phase rule of :mod:`synkhronos.extensions.lasagne.updates`, e.g. ``adam``.
    loss : TensorVariable
        Scalar loss, a mean over a rank's rows.
    params : iterable of SharedVariable
        The parameters, all of one dtype.
    *args, **kwargs
        The rule's hyperparameters.
    n_rows : symbolic or int scalar, optional
        Rows behind ``loss`` (default: :func:`loss_rows`).
    accumulate : bool
        True (default): as above. False: phase one overwrites ``flat_grad`` and phase
        two leaves it, which saves a pass over the vector in each phase; every rank
        must then run phase one before each all-reduce (with at least one row), or it
        would reduce its previous gradient. A sliced call with the op ``"sum"`` still
        sums its slices (each computes from the same values).

    Returns
    -------
    TwoPhaseUpdates
        ``(grad_updates, param_updates, flat_grad)``.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne import updates as lasagne_updates
    >>> x = pt.vector("x")
    >>> w = pytensor.shared(np.ones(2), name="w")
    >>> tp = two_phase(lasagne_updates.sgd, pt.mean((x - w.sum()) ** 2), [w], 0.1)
    >>> f_grad = pytensor.function([x], updates=tp.grad_updates)
    >>> f_update = pytensor.function([], updates=tp.param_updates)
    >>> _ = f_grad(np.zeros(2)), f_grad(np.zeros(1)); tp.flat_grad.get_value()
    array([12., 12.,  3.])
    >>> _ = f_update(); w.get_value(), tp.flat_grad.get_value()
    (array([0.6, 0.6]), array([0., 0., 0.]))
    """
    (grad_updates, param_updates, flat_grad) = _phases(rule, loss, params, n_rows, *args, **kwargs)
    ((_, flat_value),) = grad_updates
    if not accumulate:
        return TwoPhaseUpdates([(flat_grad, flat_value)], OrderedDict(param_updates), flat_grad)
    cleared = OrderedDict(param_updates)
    cleared[flat_grad] = pt.zeros_like(flat_grad)
    return TwoPhaseUpdates([(flat_grad, flat_grad + flat_value)], cleared, flat_grad)
