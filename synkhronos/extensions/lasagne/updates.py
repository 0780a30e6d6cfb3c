"""Lasagne's update rules (``lasagne.updates``), one-phase: each returns an ``OrderedDict``.

A Lasagne script uses them unchanged::

    updates = lasagne.updates.nesterov_momentum(loss, params, learning_rate=0.01)
    train = pytensor.function([x, y], loss, updates=updates)

Every rule has Lasagne's name, arguments, defaults and arithmetic, and maps each
shared variable (parameters and optimizer state) to its new value. ``loss_or_grads``
may be a scalar loss (the gradients are then ``pytensor.grad(loss, params)``) or a
list of gradient expressions, one per parameter. Synkhronos' data-parallel rules
(:mod:`synkhronos.extensions.updates`) are built on these.

Hyperparameters given as Python or numpy scalars are made constants of the
parameter's dtype, so that float32 models stay float32 (PyTensor would
otherwise upcast to float64). Symbolic hyperparameters are used as given.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.utils import default_norm_axes

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
    "amsgrad",
    "norm_constraint",
    "total_norm_constraint",
]

Updates = OrderedDict[SharedVariable, TensorVariable]
LossOrGrads = TensorVariable | Sequence[TensorVariable]
Scalar = float | TensorVariable


def _const(value: Scalar, dtype: str) -> TensorVariable:
    """A numeric hyperparameter as a constant of ``dtype``; a symbolic one unchanged."""
    if isinstance(value, int | float | np.number):
        return pt.constant(np.asarray(value, dtype=dtype))
    return pt.as_tensor_variable(value)


def _common_dtype(variables: Sequence[Any], what: str) -> str:
    if not variables:
        raise ValueError(f"{what} must not be empty")
    dtypes = sorted({str(v.dtype) for v in variables})
    if len(dtypes) != 1:
        raise TypeError(
            f"{what} must all have one dtype, got {dtypes}; cast them explicitly "
            "(no implicit casting is done)"
        )
    return dtypes[0]


def _zeros_like(param: SharedVariable, suffix: str) -> SharedVariable:
    """A zero-filled optimizer-state variable with ``param``'s shape, dtype and static shape."""
    value = param.get_value(borrow=True)
    name = f"{param.name}_{suffix}" if param.name else suffix
    return pytensor.shared(
        np.zeros(value.shape, dtype=value.dtype), name=name, shape=param.type.shape
    )


def _check_shared(params: Sequence[SharedVariable]) -> None:
    if any(not isinstance(p, SharedVariable) for p in params):
        raise ValueError("params must contain shared variables only")


def get_or_compute_grads(
    loss_or_grads: LossOrGrads, params: Iterable[SharedVariable]
) -> list[TensorVariable]:
    """The gradients of ``loss_or_grads`` with respect to ``params``.

    Parameters
    ----------
    loss_or_grads : TensorVariable or list of TensorVariable
        A scalar loss, or already one gradient expression per parameter.
    params : iterable of SharedVariable
        The variables to differentiate with respect to.

    Returns
    -------
    list of TensorVariable
        ``pytensor.grad(loss_or_grads, params)`` for a loss; a list of gradients is
        returned itself (a tuple as a list).

    Raises
    ------
    ValueError
        If ``params`` holds anything but shared variables (they could not be updated),
        or the list of gradients does not have one entry per parameter.

    Examples
    --------
    >>> w = pytensor.shared(np.ones(2), name="w")
    >>> [g.eval() for g in get_or_compute_grads((3 * w).sum(), [w])]
    [array([3., 3.])]
    """
    params = list(params)
    _check_shared(params)
    if isinstance(loss_or_grads, list | tuple):
        if len(loss_or_grads) != len(params):
            raise ValueError(
                f"Got {len(loss_or_grads)} gradient expressions for {len(params)} parameters"
            )
        return loss_or_grads if isinstance(loss_or_grads, list) else list(loss_or_grads)
    return pytensor.grad(loss_or_grads, params)


def sgd(
    loss_or_grads: LossOrGrads, params: Iterable[SharedVariable], learning_rate: Scalar
) -> Updates:
    """Stochastic gradient descent: ``param = param - learning_rate * grad``.

    Parameters
    ----------
    loss_or_grads : TensorVariable or list of TensorVariable
        A scalar loss, or one gradient expression per parameter.
    params : iterable of SharedVariable
        The parameters to update.
    learning_rate : float or symbolic scalar
        The step size.

    Returns
    -------
    OrderedDict
        ``{param: new value}``.

    Examples
    --------
    >>> w = pytensor.shared(np.ones(3), name="w")
    >>> loss = (w ** 2).sum()
    >>> step = pytensor.function([], loss, updates=sgd(loss, [w], 0.1))
    >>> _ = step(); w.get_value()
    array([0.8, 0.8, 0.8])
    """
    params = list(params)  # any iterable, read more than once
    grads = get_or_compute_grads(loss_or_grads, params)
    updates: Updates = OrderedDict()
    for param, grad in zip(params, grads, strict=True):
        updates[param] = param - _const(learning_rate, param.dtype) * grad
    return updates


def _apply_momentum(
    updates: Updates, params: Iterable[SharedVariable] | None, momentum: Scalar, nesterov: bool
) -> Updates:
    """Classical (``nesterov=False``) or Nesterov momentum; they differ only in the step."""
    if params is None:
        params = list(updates.keys())
    updates = OrderedDict(updates)
    for param in params:
        velocity = _zeros_like(param, "velocity")
        mom = _const(momentum, param.dtype)
        if nesterov:
            x = mom * velocity + updates[param] - param
            updates[velocity] = x
            updates[param] = mom * x + updates[param]
        else:
            x = mom * velocity + updates[param]
            updates[velocity] = x - param
            updates[param] = x
    return updates


def apply_momentum(
    updates: Updates, params: Iterable[SharedVariable] | None = None, momentum: Scalar = 0.9
) -> Updates:
    """Add classical momentum to existing updates.

    For each parameter, with a new zero-initialised ``velocity``::

        x = momentum * velocity + updates[param]
        velocity = x - param
        param = x

    Parameters
    ----------
    updates : OrderedDict
        Updates to modify, e.g. from :func:`sgd`.
    params : iterable of SharedVariable, optional
        The parameters to add momentum to; default all keys of ``updates``.
    momentum : float or symbolic scalar
        The amount of momentum to apply.

    Returns
    -------
    OrderedDict
        A copy of ``updates`` with momentum added and the velocities' updates.
    """
    return _apply_momentum(updates, params, momentum, nesterov=False)


def momentum(
    loss_or_grads: LossOrGrads,
    params: Iterable[SharedVariable],
    learning_rate: Scalar,
    momentum: Scalar = 0.9,
) -> Updates:
    """Stochastic gradient descent with classical momentum.

    ``apply_momentum(sgd(loss_or_grads, params, learning_rate), momentum=momentum)``;
    see :func:`sgd` and :func:`apply_momentum`.
    """
    return apply_momentum(sgd(loss_or_grads, params, learning_rate), momentum=momentum)


def apply_nesterov_momentum(
    updates: Updates, params: Iterable[SharedVariable] | None = None, momentum: Scalar = 0.9
) -> Updates:
    """Add Nesterov momentum to existing updates.

    For each parameter, with a new zero-initialised ``velocity``::

        x = momentum * velocity + updates[param] - param
        velocity = x
        param = momentum * x + updates[param]

    Parameters and result as for :func:`apply_momentum`.
    """
    return _apply_momentum(updates, params, momentum, nesterov=True)


def nesterov_momentum(
    loss_or_grads: LossOrGrads,
    params: Iterable[SharedVariable],
    learning_rate: Scalar,
    momentum: Scalar = 0.9,
) -> Updates:
    """Stochastic gradient descent with Nesterov momentum.

    ``apply_nesterov_momentum(sgd(loss_or_grads, params, learning_rate), momentum=momentum)``;
    see :func:`sgd` and :func:`apply_nesterov_momentum`.
    """
    return apply_nesterov_momentum(sgd(loss_or_grads, params, learning_rate), momentum=momentum)


def _rms_scaled(
    loss_or_grads: LossOrGrads,
    params: Iterable[SharedVariable],
    learning_rate: Scalar,
    rho: Scalar | None,
    epsilon: Scalar,
    moving_average: bool,
) -> Updates:
    """Adagrad or RMSProp: both step by ``learning_rate * grad / sqrt(accu + epsilon)``.

    ``accu`` is the sum of the squared gradients for Adagrad (``moving_average=False``,
    ``rho`` unused), their moving average with decay ``rho`` for RMSProp (``True``).
    """
    params = list(params)  # any iterable, read more than once
    grads = get_or_compute_grads(loss_or_grads, params)
    updates: Updates = OrderedDict()
    for param, grad in zip(params, grads, strict=True):
        dtype = param.dtype
        accu = _zeros_like(param, "accu")
        if moving_average:
            rho_c = _const(rho, dtype)
            accu_new = rho_c * accu + (_const(1, dtype) - rho_c) * pt.square(grad)
        else:
            accu_new = accu + pt.square(grad)
        updates[accu] = accu_new
        updates[param] = param - (
            _const(learning_rate, dtype) * grad / pt.sqrt(accu_new + _const(epsilon, dtype))
        )
    return updates


def adagrad(
    loss_or_grads: LossOrGrads,
    params: Iterable[SharedVariable],
    learning_rate: Scalar = 1.0,
    epsilon: Scalar = 1e-6,
) -> Updates:
    """Adagrad: per-element step sizes from the sum of squared gradients.

    ::

        accu = accu + grad ** 2
        param = param - learning_rate * grad / sqrt(accu + epsilon)

    Parameters
    ----------
    loss_or_grads, params
        As for :func:`sgd`.
    learning_rate : float or symbolic scalar
        The step size.
    epsilon : float or symbolic scalar
        Small value added for numerical stability.

    Returns
    -------
    OrderedDict
        Updates of the parameters and their accumulators.
    """
    return _rms_scaled(loss_or_grads, params, learning_rate, None, epsilon, moving_average=False)


def rmsprop(
    loss_or_grads: LossOrGrads,
    params: Iterable[SharedVariable],
    learning_rate: Scalar = 1.0,
    rho: Scalar = 0.9,
    epsilon: Scalar = 1e-6,
) -> Updates:
    """RMSProp: steps scaled by a moving average of squared gradients.

    ::

        accu = rho * accu + (1 - rho) * grad ** 2
        param = param - learning_rate * grad / sqrt(accu + epsilon)

    Parameters
    ----------
    loss_or_grads, params, learning_rate, epsilon
        As for :func:`adagrad`.
    rho : float or symbolic scalar
        Decay rate of the moving average.

    Returns
    -------
    OrderedDict
        Updates of the parameters and their accumulators.
    """
    return _rms_scaled(loss_or_grads, params, learning_rate, rho, epsilon, moving_average=True)


def adadelta(
    loss_or_grads: LossOrGrads,
    params: Iterable[SharedVariable],
    learning_rate: Scalar = 1.0,
    rho: Scalar = 0.95,
    epsilon: Scalar = 1e-6,
) -> Updates:
    """Adadelta: steps scaled by the ratio of moving RMS of updates and of gradients.

    ::

        accu = rho * accu + (1 - rho) * grad ** 2
        update = grad * sqrt(delta_accu + epsilon) / sqrt(accu + epsilon)
        param = param - learning_rate * update
        delta_accu = rho * delta_accu + (1 - rho) * update ** 2

    Parameters
    ----------
    loss_or_grads, params, learning_rate, epsilon
        As for :func:`adagrad`.
    rho : float or symbolic scalar
        Decay rate of both moving averages.

    Returns
    -------
    OrderedDict
        Updates of the parameters and both accumulators.
    """
    params = list(params)  # any iterable, read more than once
    grads = get_or_compute_grads(loss_or_grads, params)
    updates: Updates = OrderedDict()
    for param, grad in zip(params, grads, strict=True):
        dtype = param.dtype
        rho_c, eps, one = _const(rho, dtype), _const(epsilon, dtype), _const(1, dtype)
        accu = _zeros_like(param, "accu")
        delta_accu = _zeros_like(param, "delta_accu")
        accu_new = rho_c * accu + (one - rho_c) * pt.square(grad)
        updates[accu] = accu_new
        update = grad * pt.sqrt(delta_accu + eps) / pt.sqrt(accu_new + eps)
        updates[param] = param - _const(learning_rate, dtype) * update
        updates[delta_accu] = rho_c * delta_accu + (one - rho_c) * pt.square(update)
    return updates


def _adam_like(
    loss_or_grads: LossOrGrads,
    params: Iterable[SharedVariable],
    learning_rate: Scalar,
    beta1: Scalar,
    beta2: Scalar,
    epsilon: Scalar,
    variant: str,
) -> Updates:
    """Adam, Adamax or AMSGrad (``variant``); they share ``t`` and the first moment ``m``."""
    infinity_norm = variant == "adamax"
    params = list(params)  # any iterable, read more than once
    grads = get_or_compute_grads(loss_or_grads, params)
    # One step counter serves all parameters, so they must agree on its dtype.
    dtype = _common_dtype(params, "adam/adamax/amsgrad params")
    t_prev = pytensor.shared(np.asarray(0, dtype=dtype), name="t")
    one = _const(1, dtype)
    b1, b2, eps = _const(beta1, dtype), _const(beta2, dtype), _const(epsilon, dtype)
    t = t_prev + one
    if infinity_norm:
        a_t = _const(learning_rate, dtype) / (one - b1**t)
    else:
        a_t = _const(learning_rate, dtype) * pt.sqrt(one - b2**t) / (one - b1**t)
    updates: Updates = OrderedDict()
    for param, grad in zip(params, grads, strict=True):
        m_prev = _zeros_like(param, "m")
        m_t = b1 * m_prev + (one - b1) * grad
        if infinity_norm:
            u_prev = _zeros_like(param, "u")
            u_t = pt.maximum(b2 * u_prev, pt.abs(grad))
            updates[u_prev] = u_t
            step = a_t * m_t / (u_t + eps)
        else:
            v_prev = _zeros_like(param, "v")
            v_t = b2 * v_prev + (one - b2) * pt.square(grad)
            updates[v_prev] = v_t
            if variant == "amsgrad":  # the step uses the largest second moment so far
                v_hat_prev = _zeros_like(param, "v_hat")
                v_t = pt.maximum(v_hat_prev, v_t)
                updates[v_hat_prev] = v_t
            step = a_t * m_t / (pt.sqrt(v_t) + eps)
        updates[m_prev] = m_t
        updates[param] = param - step
    updates[t_prev] = t
    return updates


def adam(
    loss_or_grads: LossOrGrads,
    params: Iterable[SharedVariable],
    learning_rate: Scalar = 0.001,
    beta1: Scalar = 0.9,
    beta2: Scalar = 0.999,
    epsilon: Scalar = 1e-8,
) -> Updates:
    """Adam, with the bias correction folded into the step size.

    ::

        t = t + 1
        a_t = learning_rate * sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad ** 2
        param = param - a_t * m / (sqrt(v) + epsilon)

    Parameters
    ----------
    loss_or_grads, params
        As for :func:`sgd`; all ``params`` must have one dtype (that of ``t``).
    learning_rate : float or symbolic scalar
        The step size.
    beta1, beta2 : float or symbolic scalar
        Decay rates of the first and second moment estimates.
    epsilon : float or symbolic scalar
        Small value added for numerical stability (outside the square root).

    Returns
    -------
    OrderedDict
        Updates of the parameters, their moment estimates and the step count ``t``.
    """
    return _adam_like(loss_or_grads, params, learning_rate, beta1, beta2, epsilon, "adam")


def adamax(
    loss_or_grads: LossOrGrads,
    params: Iterable[SharedVariable],
    learning_rate: Scalar = 0.002,
    beta1: Scalar = 0.9,
    beta2: Scalar = 0.999,
    epsilon: Scalar = 1e-8,
) -> Updates:
    """Adamax: Adam with the infinity norm.

    ::

        t = t + 1
        a_t = learning_rate / (1 - beta1 ** t)
        m = beta1 * m + (1 - beta1) * grad
        u = max(beta2 * u, abs(grad))
        param = param - a_t * m / (u + epsilon)

    Parameters
    ----------
    loss_or_grads, params
        As for :func:`sgd`; all ``params`` must have one dtype (that of ``t``).
    learning_rate : float or symbolic scalar
        The step size.
    beta1, beta2 : float or symbolic scalar
        Decay rates of the first moment and of the infinity-norm estimates.
    epsilon : float or symbolic scalar
        Small value added for numerical stability.

    Returns
    -------
    OrderedDict
        Updates of the parameters, their estimates and the step count ``t``.
    """
    return _adam_like(loss_or_grads, params, learning_rate, beta1, beta2, epsilon, "adamax")


def amsgrad(
    loss_or_grads: LossOrGrads,
    params: Iterable[SharedVariable],
    learning_rate: Scalar = 0.001,
    beta1: Scalar = 0.9,
    beta2: Scalar = 0.999,
    epsilon: Scalar = 1e-8,
) -> Updates:
    """AMSGrad: Adam stepping with the running maximum of the second moment.

    ::

        t = t + 1
        a_t = learning_rate * sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad ** 2
        v_hat = max(v_hat, v)
        param = param - a_t * m / (sqrt(v_hat) + epsilon)

    Parameters
    ----------
    loss_or_grads, params, learning_rate, beta1, beta2, epsilon
        As for :func:`adam`.

    Returns
    -------
    OrderedDict
        Updates of the parameters, ``m``, ``v``, ``v_hat`` and the step count ``t``.
    """
    return _adam_like(loss_or_grads, params, learning_rate, beta1, beta2, epsilon, "amsgrad")


def norm_constraint(
    tensor_var: TensorVariable,
    max_norm: Scalar,
    norm_axes: Sequence[int] | None = None,
    epsilon: Scalar = 1e-7,
) -> TensorVariable:
    """Rescale ``tensor_var`` so that its norms over ``norm_axes`` are at most ``max_norm``.

    ``tensor_var * clip(norms, 0, max_norm) / (epsilon + norms)``, typically
    applied to a parameter's update: ``updates[w] = norm_constraint(updates[w], 10)``.

    Parameters
    ----------
    tensor_var : TensorVariable
        The tensor to constrain.
    max_norm : float or symbolic scalar
        The largest norm allowed.
    norm_axes : sequence of int, optional
        Axes to take the norm over. Default: axis 0 for 2-D tensors (a dense
        layer's weights: one norm per output unit), all but axis 0 for 3-, 4- and
        5-D tensors (convolution filters: one norm per filter).
    epsilon : float or symbolic scalar
        Small value added to the norms for numerical stability.

    Returns
    -------
    TensorVariable
        The constrained tensor.

    Raises
    ------
    ValueError
        If ``norm_axes`` is not given and ``tensor_var`` is not 2- to 5-D.
    """
    sum_over = (
        default_norm_axes(tensor_var.ndim, vectors=False) if norm_axes is None else tuple(norm_axes)
    )
    dtype = tensor_var.dtype
    norms = pt.sqrt(pt.sum(pt.square(tensor_var), axis=sum_over, keepdims=True))
    target_norms = pt.clip(norms, _const(0, dtype), _const(max_norm, dtype))
    return tensor_var * (target_norms / (_const(epsilon, dtype) + norms))


def total_norm_constraint(
    tensor_vars: Iterable[TensorVariable],
    max_norm: Scalar,
    epsilon: Scalar = 1e-7,
    return_norm: bool = False,
) -> list[TensorVariable] | tuple[list[TensorVariable], TensorVariable]:
    """Rescale tensors jointly so that their total (concatenated) L2 norm is at most ``max_norm``.

    Typically used for gradient clipping::

        grads = pytensor.grad(loss, params)
        grads = total_norm_constraint(grads, max_norm=5)
        updates = adam(grads, params)

    Parameters
    ----------
    tensor_vars : iterable of TensorVariable
        Tensors to rescale, all of one dtype.
    max_norm : float or symbolic scalar
        The largest total norm allowed.
    epsilon : float or symbolic scalar
        Small value added to the norm for numerical stability.
    return_norm : bool
        Also return the total norm before rescaling.

    Returns
    -------
    list of TensorVariable, or (list of TensorVariable, TensorVariable)
        The rescaled tensors, and the norm if ``return_norm``.
    """
    tensor_vars = list(tensor_vars)
    dtype = _common_dtype(tensor_vars, "total_norm_constraint tensors")
    norm = pt.sqrt(sum(pt.sum(pt.square(t)) for t in tensor_vars))
    target_norm = pt.clip(norm, _const(0, dtype), _const(max_norm, dtype))
    multiplier = target_norm / (_const(epsilon, dtype) + norm)
    scaled = [t * multiplier for t in tensor_vars]
    if return_norm:
        return scaled, norm
    return scaled
