"""Loss and accuracy expressions, with the names and defaults of ``lasagne.objectives``.

All return elementwise (or per-example) tensors; reduce them with :func:`aggregate`.
"""

import pytensor
import pytensor.tensor as pt
from pytensor.tensor.variable import TensorVariable

__all__ = [
    "aggregate",
    "binary_crossentropy",
    "categorical_accuracy",
    "categorical_crossentropy",
    "squared_error",
]


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
    predictions, targets = pt.as_tensor_variable(predictions), pt.as_tensor_variable(targets)
    return -(targets * pt.log(predictions) + (1 - targets) * pt.log1p(-predictions))


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
    predictions, targets = pt.as_tensor_variable(predictions), pt.as_tensor_variable(targets)
    # log is taken of the whole matrix so PyTensor can rewrite log(softmax) stably.
    log_p = pt.log(predictions)
    if targets.ndim == predictions.ndim:
        return -(targets * log_p).sum(axis=-1)
    return -log_p[pt.arange(targets.shape[0]), targets]


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
    return pt.sqr(pt.as_tensor_variable(a) - b)


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
    """
    predictions, targets = pt.as_tensor_variable(predictions), pt.as_tensor_variable(targets)
    if targets.ndim == predictions.ndim:
        targets = pt.argmax(targets, axis=-1)
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
            raise ValueError("mode='normalized_sum' requires weights")
        return loss.sum() / pt.as_tensor_variable(weights).sum()
    raise ValueError(f"mode must be 'mean', 'sum' or 'normalized_sum', got {mode!r}")
