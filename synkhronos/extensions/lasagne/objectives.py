"""Loss and accuracy expressions, with the names and defaults of ``lasagne.objectives``.

All return elementwise (or per-example) tensors; reduce them with :func:`aggregate`.
The cross-entropies are :mod:`synkhronos.ops.nnet`'s (Theano's, which
Lasagne calls), on aligned targets.
"""

from warnings import warn

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.utils import as_theano_expression
from synkhronos.ops import nnet as theano_nnet

__all__ = [
    "aggregate",
    "binary_accuracy",
    "binary_crossentropy",
    "binary_hinge_loss",
    "categorical_accuracy",
    "categorical_crossentropy",
    "huber_loss",
    "multiclass_hinge_loss",
    "squared_error",
]


def align_targets(predictions, targets) -> tuple:
    """Give a vector of targets the column shape of ``(batch, 1)`` predictions.

    Comparing a column of predictions with a vector of targets would otherwise
    broadcast to a ``(batch, batch)`` matrix; the elementwise losses call this first.

    Parameters
    ----------
    predictions
        Predictions; only a ``(batch, 1)`` (broadcastable column) tensor is special.
    targets
        Targets.

    Returns
    -------
    tuple
        ``(predictions, targets)``, the targets as a column where that applies.

    Examples
    --------
    >>> p, t = align_targets(pt.col("p"), pt.vector("t"))
    >>> t.broadcastable
    (False, True)
    """
    if (
        getattr(predictions, "broadcastable", None) == (False, True)
        and getattr(targets, "ndim", None) == 1
    ):
        targets = as_theano_expression(targets).dimshuffle(0, "x")
    return predictions, targets


def binary_crossentropy(predictions, targets) -> TensorVariable:
    """Elementwise ``-(t * log(p) + (1 - t) * log(1 - p))``.

    Parameters
    ----------
    predictions
        Probabilities in (0, 1), e.g. sigmoid outputs.
    targets
        Targets in [0, 1], same shape.

    Returns
    -------
    TensorVariable
        The elementwise loss.
    """
    predictions, targets = align_targets(pt.as_tensor_variable(predictions), targets)
    return theano_nnet.binary_crossentropy(predictions, targets)


def categorical_crossentropy(predictions, targets) -> TensorVariable:
    """Per-example ``-log(p[target])`` for a ``(batch, classes)`` matrix of probabilities.

    Parameters
    ----------
    predictions
        Class probabilities, rows summing to one (e.g. softmax outputs).
    targets
        Integer class indices ``(batch,)`` or a matrix of target probabilities
        shaped like ``predictions`` (e.g. one-hot).

    Returns
    -------
    TensorVariable
        Loss of shape ``(batch,)``.
    """
    return theano_nnet.categorical_crossentropy(predictions, targets)


def squared_error(a, b) -> TensorVariable:
    """Elementwise ``(a - b) ** 2``.

    Parameters
    ----------
    a, b
        Tensors of matching (broadcastable) shapes.

    Returns
    -------
    TensorVariable
        The elementwise squared difference.
    """
    a, b = align_targets(pt.as_tensor_variable(a), b)
    return pt.sqr(a - b)


def categorical_accuracy(predictions, targets, top_k: int = 1) -> TensorVariable:
    """Per-example 1 if the target is among the ``top_k`` predicted classes, else 0.

    Parameters
    ----------
    predictions
        Class scores or probabilities ``(batch, classes)``.
    targets
        Integer class indices ``(batch,)`` or one-hot / probability rows (their argmax
        is the target).
    top_k
        How many of the highest-scoring classes count as correct.

    Returns
    -------
    TensorVariable
        ``floatX`` vector of shape ``(batch,)``.

    Raises
    ------
    TypeError
        If ``targets`` has neither the rank of ``predictions`` nor one less.
    """
    predictions, targets = pt.as_tensor_variable(predictions), pt.as_tensor_variable(targets)
    if targets.ndim == predictions.ndim:
        targets = pt.argmax(targets, axis=-1)
    elif targets.ndim != predictions.ndim - 1:
        raise TypeError("rank mismatch between targets and predictions")
    if top_k == 1:
        hit = pt.eq(pt.argmax(predictions, axis=-1), targets)
    else:
        top = pt.argsort(predictions, axis=-1)[:, -top_k:]
        hit = pt.any(pt.eq(top, targets[:, None]), axis=-1)
    return pt.cast(hit, pytensor.config.floatX)


def aggregate(loss, weights=None, mode: str = "mean") -> TensorVariable:
    """Reduce an elementwise loss to a scalar.

    Parameters
    ----------
    loss
        Elementwise or per-example loss.
    weights
        Optional weights broadcastable to ``loss``.
    mode
        ``"mean"``, ``"sum"``, or ``"normalized_sum"`` (``sum(loss * weights) /
        sum(weights)``, requires weights).

    Returns
    -------
    TensorVariable
        Scalar loss.
    """
    loss = pt.as_tensor_variable(loss)
    if weights is not None:
        loss = loss * weights
    if mode == "mean":
        return loss.mean()
    if mode == "sum":
        return loss.sum()
    if mode == "normalized_sum":
        if weights is None:
            raise ValueError("require weights for mode='normalized_sum'")
        return loss.sum() / pt.as_tensor_variable(weights).sum()
    raise ValueError(f"mode must be 'mean', 'sum' or 'normalized_sum', got {mode!r}")


def binary_hinge_loss(
    predictions, targets, delta: float = 1, log_odds: bool | None = None, binary: bool = True
) -> TensorVariable:
    """Elementwise hinge loss ``max(0, delta - t * p)`` for two classes.

    Parameters
    ----------
    predictions
        Predicted probabilities, or log-odds if ``log_odds``.
    targets
        Targets in {0, 1} (``binary``) or {-1, 1}.
    delta
        Margin.
    log_odds
        Whether ``predictions`` are log-odds; None means True, with a warning that
        Lasagne planned to change this default (as Lasagne does).
    binary
        Whether ``targets`` are in {0, 1} (mapped to {-1, 1}).

    Returns
    -------
    TensorVariable
        The elementwise loss.

    Examples
    --------
    >>> binary_hinge_loss(pt.as_tensor([2.0, -0.5]), pt.as_tensor([1.0, 1.0]),
    ...                   log_odds=True).eval()
    array([0. , 1.5])
    """
    if log_odds is None:
        warn(
            "The `log_odds` argument to `binary_hinge_loss` will change its default to "
            "`False` in a future version. Explicitly give `log_odds=True` to retain current "
            "behavior in your code, but also check the documentation if this is what you "
            "want.",
            stacklevel=2,
        )
        log_odds = True
    predictions, targets = pt.as_tensor_variable(predictions), pt.as_tensor_variable(targets)
    if not log_odds:
        predictions = pt.log(predictions / (1 - predictions))
    if binary:
        targets = 2 * targets - 1
    predictions, targets = align_targets(predictions, targets)
    return pt.maximum(delta - predictions * targets, 0)


def multiclass_hinge_loss(predictions, targets, delta: float = 1) -> TensorVariable:
    """Per-example ``max(0, max_{j != t} p_j - p_t + delta)``.

    Parameters
    ----------
    predictions
        Scores ``(batch, classes)``.
    targets
        Integer classes ``(batch,)`` or one-hot rows.
    delta
        Margin.

    Returns
    -------
    TensorVariable
        Loss per example.

    Raises
    ------
    TypeError
        If ``targets`` has neither the rank of ``predictions`` nor one less.

    Examples
    --------
    >>> multiclass_hinge_loss(pt.as_tensor([[3.0, 2.5, 0.0]]), pt.as_tensor([0])).eval()
    array([0.5])
    """
    predictions, targets = pt.as_tensor_variable(predictions), pt.as_tensor_variable(targets)
    if targets.ndim == predictions.ndim - 1:
        targets = pt.eq(targets[:, None], pt.arange(predictions.shape[1])[None, :])
    elif targets.ndim != predictions.ndim:
        raise TypeError("rank mismatch between targets and predictions")
    is_target = pt.cast(targets, "bool")
    correct = pt.sum(pt.switch(is_target, predictions, 0), axis=1)
    rest = pt.max(pt.switch(is_target, -np.inf, predictions), axis=1)
    return pt.maximum(rest - correct + delta, 0)


def huber_loss(predictions, targets, delta: float = 1) -> TensorVariable:
    """Elementwise Huber loss: ``d**2 / 2`` if ``|d| <= delta``, else ``delta (|d| - delta/2)``.

    Parameters
    ----------
    predictions, targets
        Tensors of matching shapes.
    delta
        Threshold between the quadratic and the linear part.

    Returns
    -------
    TensorVariable
        The elementwise loss.

    Examples
    --------
    >>> huber_loss(pt.as_tensor([0.5, 3.0]), pt.as_tensor([0.0, 0.0])).eval()
    array([0.125, 2.5  ])
    """
    predictions, targets = align_targets(pt.as_tensor_variable(predictions), targets)
    diff = abs(targets - predictions)
    return pt.switch(diff <= delta, 0.5 * pt.sqr(diff), delta * (diff - delta / 2))


def binary_accuracy(predictions, targets, threshold: float = 0.5) -> TensorVariable:
    """Elementwise 1 where ``predictions >= threshold`` matches the {0, 1} target.

    Parameters
    ----------
    predictions
        Predicted probabilities.
    targets
        Targets in {0, 1}.
    threshold
        Decision threshold.

    Returns
    -------
    TensorVariable
        The elementwise 0/1 accuracy.

    Examples
    --------
    >>> binary_accuracy(pt.as_tensor([0.7, 0.2]), pt.as_tensor([1, 1])).eval()
    array([ True, False])
    """
    predictions, targets = align_targets(pt.as_tensor_variable(predictions), targets)
    return pt.eq(pt.ge(predictions, threshold), targets)
