"""Helpers used throughout Lasagne (``lasagne.utils``)."""

import numbers
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import graph_inputs
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.layers.base import create_param

__all__ = [
    "as_theano_expression",
    "as_tuple",
    "collect_shared_vars",
    "compute_norms",
    "create_param",
    "floatX",
    "inspect_kwargs",
    "int_types",
    "one_hot",
    "shared_empty",
    "unique",
    "unroll_scan",
]

int_types = (numbers.Integral, np.integer)
"""Types counted as integers (Python and NumPy ints)."""


def floatX(arr) -> np.ndarray:  # noqa: N802 (Lasagne's name)
    """``arr`` as a NumPy array of ``pytensor.config.floatX``.

    Parameters
    ----------
    arr
        Array-like.

    Returns
    -------
    numpy.ndarray
        The converted array.

    Examples
    --------
    >>> floatX([1, 2]).dtype == pytensor.config.floatX
    True
    """
    return np.asarray(arr, dtype=pytensor.config.floatX)


def shared_empty(dim: int = 2, dtype: str | None = None) -> SharedVariable:
    """A shared variable of ``dim`` dimensions, each of size 0.

    Parameters
    ----------
    dim
        Number of dimensions.
    dtype
        Data type; ``floatX`` by default.

    Returns
    -------
    SharedVariable
        The empty shared variable.

    Examples
    --------
    >>> shared_empty(3).get_value().shape
    (0, 0, 0)
    """
    return pytensor.shared(np.zeros((0,) * dim, dtype=dtype or pytensor.config.floatX))


def as_theano_expression(input) -> Variable:
    """``input`` as a symbolic PyTensor expression (constants become tensor constants).

    Parameters
    ----------
    input
        Expression, number or array.

    Returns
    -------
    Variable
        The expression.

    Examples
    --------
    >>> as_theano_expression(np.ones(2)).ndim
    1
    """
    if isinstance(input, Variable):
        return input
    try:
        return pt.as_tensor_variable(input)
    except (TypeError, ValueError, NotImplementedError) as err:
        raise TypeError(
            f"input of type {type(input).__name__} is not a PyTensor expression"
        ) from err


def collect_shared_vars(expressions: Variable | Iterable[Variable]) -> list[SharedVariable]:
    """The shared variables that ``expressions`` depend on, each once, in graph order.

    Parameters
    ----------
    expressions
        One expression or several.

    Returns
    -------
    list of SharedVariable
        The shared variables.

    Examples
    --------
    >>> w = pytensor.shared(1.0, name="w")
    >>> [v.name for v in collect_shared_vars([w * 2, w + 1])]
    ['w']
    """
    if isinstance(expressions, Variable):
        expressions = [expressions]
    return unique(v for v in graph_inputs(list(expressions)) if isinstance(v, SharedVariable))


def one_hot(x, m=None) -> TensorVariable:
    """One-hot rows for the integer labels ``x``.

    Parameters
    ----------
    x
        Integer vector of labels.
    m
        Number of classes; ``max(x) + 1`` by default.

    Returns
    -------
    TensorVariable
        Matrix ``(len(x), m)`` of ``floatX``.

    Examples
    --------
    >>> one_hot(np.array([0, 2])).eval()
    array([[1., 0., 0.],
           [0., 0., 1.]])
    """
    x = pt.as_tensor_variable(x)
    if m is None:
        m = pt.cast(pt.max(x) + 1, "int32")
    return pt.eq(x[:, None], pt.arange(m)[None, :]).astype(pytensor.config.floatX)


def unique(l: Iterable) -> list:  # noqa: E741 (Lasagne's parameter name)
    """The items of ``l`` in order, duplicates dropped.

    Parameters
    ----------
    l
        Iterable of hashable items.

    Returns
    -------
    list
        The unique items.

    Examples
    --------
    >>> unique([3, 1, 3, 2, 1])
    [3, 1, 2]
    """
    return list(dict.fromkeys(l))


def as_tuple(x, N: int, t: type | tuple[type, ...] | None = None) -> tuple:  # noqa: N803
    """``x`` repeated ``N`` times, or ``tuple(x)`` when ``x`` is already iterable.

    Parameters
    ----------
    x
        A value or an iterable of ``N`` values.
    N
        Length of the result.
    t
        Type (or types) every element must have; not checked when None.

    Returns
    -------
    tuple
        ``N`` values.

    Examples
    --------
    >>> as_tuple(3, 2)
    (3, 3)
    >>> as_tuple([1, 2], 2, int)
    (1, 2)
    """
    try:
        values = tuple(x)
    except TypeError:
        values = (x,) * N
    if len(values) != N or (t is not None and not all(isinstance(v, t) for v in values)):
        kind = "" if t is None else f" of {t}"
        raise TypeError(f"expected a single value or an iterable of {N} values{kind}, got {x!r}")
    return values


def inspect_kwargs(func: Callable) -> list[str]:
    """Names of the parameters of ``func`` that have default values.

    Parameters
    ----------
    func
        A function.

    Returns
    -------
    list of str
        The names, in order.

    Examples
    --------
    >>> inspect_kwargs(lambda a, b=1, *, c=2: None)
    ['b', 'c']
    """
    import inspect

    return [
        name
        for name, p in inspect.signature(func).parameters.items()
        if p.default is not inspect.Parameter.empty
    ]


def compute_norms(array: np.ndarray | Variable, norm_axes: Sequence[int] | None = None):
    """Euclidean norms of ``array`` over ``norm_axes`` (NumPy or symbolic).

    Parameters
    ----------
    array
        Weights: a NumPy array or a PyTensor expression.
    norm_axes
        Axes summed over; by default none for a vector, 0 for a matrix (one norm per
        output unit), all but the first for 3-5 dimensions (one per output channel).

    Returns
    -------
    numpy.ndarray or TensorVariable
        The norms.

    Examples
    --------
    >>> compute_norms(np.array([[3.0, 1.0], [4.0, 1.0]]))
    array([5.        , 1.41421356])
    """
    ndim = array.ndim
    if norm_axes is None:
        if ndim == 1:
            norm_axes = ()  # biases: each element is its own norm
        elif ndim == 2:
            norm_axes = (0,)
        elif ndim in (3, 4, 5):
            norm_axes = tuple(range(1, ndim))
        else:
            raise ValueError(f"no default norm_axes for {ndim} dimensions; pass norm_axes")
    norm_axes = tuple(norm_axes)
    if isinstance(array, np.ndarray):
        return np.sqrt(np.sum(array**2, axis=norm_axes))
    return pt.sqrt(pt.sum(pt.sqr(array), axis=norm_axes))


def unroll_scan(
    fn: Callable,
    sequences: Sequence,
    outputs_info: Sequence,
    non_sequences: Sequence,
    n_steps: int,
    go_backwards: bool = False,
) -> list[TensorVariable]:
    """A Python loop that builds the graph ``pytensor.scan`` would, step by step.

    Parameters
    ----------
    fn
        Step function called as ``fn(*sequence_steps, *previous_outputs, *non_sequences)``.
    sequences
        Tensors iterated over their first axis.
    outputs_info
        Initial values of the outputs.
    non_sequences
        Extra arguments passed to every step.
    n_steps
        Number of steps (an int: the loop is unrolled when the graph is built).
    go_backwards
        Iterate from the last step to the first; outputs are stacked in iteration
        order, as ``pytensor.scan(go_backwards=True)`` stacks them.

    Returns
    -------
    list of TensorVariable
        Each output stacked over the steps.

    Examples
    --------
    >>> x = pt.vector("x")
    >>> (sums,) = unroll_scan(lambda s, acc: [acc + s], [x], [pt.constant(0.0)], [], 3)
    >>> sums.eval({x: np.array([1.0, 2.0, 3.0])})
    array([1., 3., 6.])
    """
    steps = range(n_steps - 1, -1, -1) if go_backwards else range(n_steps)
    previous = list(outputs_info)
    history: list[list] = [[] for _ in previous]
    for step in steps:
        outputs = fn(*(s[step] for s in sequences), *previous, *non_sequences)
        if not isinstance(outputs, list | tuple):
            outputs = [outputs]
        for kept, out in zip(history, outputs, strict=True):
            kept.append(out)
        previous = list(outputs)
    return [pt.stack(kept) for kept in history]
