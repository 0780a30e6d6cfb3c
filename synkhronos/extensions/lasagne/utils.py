"""Helpers used throughout Lasagne (``lasagne.utils``)."""

import inspect
import numbers
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import walk
from pytensor.tensor.variable import TensorVariable

from synkhronos import theano
from synkhronos.theano import tensor as T  # noqa: N812 - Lasagne's name, in its star set

__all__ = [
    "T",
    "as_theano_expression",
    "as_tuple",
    "collect_shared_vars",
    "compute_norms",
    "create_param",
    "floatX",
    "inspect_kwargs",
    "int_types",
    "np",
    "numbers",
    "one_hot",
    "shared_empty",
    "theano",
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
    (1, 1, 1)
    """
    # size-1 axes, as Lasagne's: code that broadcasts the placeholder keeps working
    return pytensor.shared(np.zeros((1,) * dim, dtype=dtype or pytensor.config.floatX))


def as_theano_expression(input) -> Variable:
    """``input`` as a symbolic PyTensor expression (numbers and arrays become constants).

    Parameters
    ----------
    input
        Expression, number or array.

    Returns
    -------
    Variable
        The expression.

    Raises
    ------
    TypeError
        If ``input`` cannot be wrapped as a constant.

    Examples
    --------
    >>> as_theano_expression(np.ones(2)).ndim
    1
    """
    if isinstance(input, Variable):
        return input
    try:
        return pt.constant(input)
    except Exception as err:  # PyTensor raises several kinds for unconvertible input
        raise TypeError(
            f"Input of type {type(input)} is not a PyTensor expression and cannot be "
            f"wrapped as a constant ({err})"
        ) from err


def collect_shared_vars(expressions: Variable | Iterable[Variable]) -> list[SharedVariable]:
    """The shared variables that ``expressions`` depend on, each once.

    The order is that of a depth-first search from the first expression, each
    operation's inputs left to right (so ``x + (y + z)`` gives ``x, y, z``).

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

    def operands(var):  # popped first to last: Theano's left-recursive order
        return reversed(var.owner.inputs) if var.owner is not None else None

    # walk is iterative (long unrolled graphs would exceed the recursion limit), and starts
    # from its list's last variable
    found = walk(reversed(list(expressions)), operands, bfs=False)
    return [var for var in found if isinstance(var, SharedVariable)]


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
    if m is None:
        m = pt.cast(pt.max(x) + 1, "int32")
    return pt.eye(m)[pt.cast(x, "int32")]


def create_param(spec, shape: Iterable[int], name: str | None = None) -> Variable:
    """A layer parameter: a shared variable made from ``spec``, or ``spec`` itself.

    Parameters
    ----------
    spec
        A number or NumPy array (copied into a new shared variable of its dtype); a
        PyTensor shared variable or expression (returned as is, after a check of its
        number of dimensions); or a callable, such as an
        :class:`~synkhronos.extensions.lasagne.init.Initializer`, called with the shape
        and returning any of the former.
    shape
        Required shape (any iterable of positive ints).
    name
        Name of the parameter; given to an expression only if it has none.

    Returns
    -------
    Variable
        The shared variable or expression.

    Raises
    ------
    ValueError
        If a size is not positive, or the value's shape or dimensions do not match.
    TypeError
        If ``spec`` (or what the callable returns) is none of the above.

    Examples
    --------
    >>> create_param(np.zeros((2, 1)), (2, 1)).broadcastable
    (False, True)
    """
    shape = tuple(shape)
    if any(d <= 0 for d in shape):
        raise ValueError(
            f"Cannot create param with a non-positive shape dimension: "
            f"shape={shape!r}, name={name!r}"
        )
    from_callable = callable(spec)
    what = "the {} returned by the provided callable" if from_callable else "the provided {}"
    if from_callable:
        spec = spec(shape)
    prefix = f"cannot initialize parameter {name}: "
    if isinstance(spec, numbers.Number | np.generic) and np.asarray(spec).dtype.kind in "biufc":
        spec = np.asarray(spec)
    if isinstance(spec, np.ndarray):
        if spec.shape != shape:
            raise ValueError(
                prefix + what.format("numpy array") + f" has shape {spec.shape}, should be {shape}"
            )
        # Parameters keep their shape, so a static one lets PyTensor infer every
        # shape computed from them (and broadcast their size-1 axes).
        spec = pytensor.shared(spec, shape=shape)
    if isinstance(spec, Variable):
        if spec.ndim != len(shape):
            raise ValueError(
                prefix
                + what.format("variable")
                + f" has {spec.ndim} dimensions, should be {len(shape)}"
            )
        if not spec.name:
            spec.name = name
        return spec
    if from_callable:
        raise TypeError(
            prefix + what.format("value") + " is not a numpy array or a PyTensor expression"
        )
    raise TypeError(
        prefix + what.format("spec") + " is not a numpy array, a PyTensor expression, or a callable"
    )


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

    Raises
    ------
    TypeError
        If an element is not of type ``t``.
    ValueError
        If ``x`` is iterable but does not hold ``N`` values.

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
    if t is not None and not all(isinstance(v, t) for v in values):
        raise TypeError(
            f"expected a single value or an iterable of {_type_names(t)}, got {x} instead"
        )
    if len(values) != N:
        raise ValueError(f"expected a single value or an iterable with length {N}, got {x} instead")
    return values


def _type_names(t: type | tuple[type, ...]) -> str:
    """``t`` as an error message names it: ``int_types`` reads "int"."""
    if t == int_types:
        return "int"
    return " or ".join(tt.__name__ for tt in t) if isinstance(t, tuple) else t.__name__


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
    return [
        name
        for name, p in inspect.signature(func).parameters.items()
        if p.default is not inspect.Parameter.empty
    ]


def default_norm_axes(ndim: int, vectors: bool = True) -> tuple[int, ...]:
    """The axes Lasagne takes norms over when none are given: axis 0 of a matrix (a dense
    layer's weights, one norm per unit), every axis but 0 of a 3- to 5-d tensor (one norm
    per filter), none of a vector (with ``vectors``: biases, each element its own norm).

    Raises
    ------
    ValueError
        For other numbers of dimensions.
    """
    if ndim == 2:
        return (0,)
    if ndim in (3, 4, 5):
        return tuple(range(1, ndim))
    if ndim == 1 and vectors:
        return ()
    raise ValueError(f"Unsupported tensor dimensionality {ndim}: pass norm_axes")


def compute_norms(array: np.ndarray | Variable, norm_axes: Sequence[int] | None = None):
    """Euclidean norms of ``array`` over ``norm_axes`` (NumPy or symbolic).

    Parameters
    ----------
    array
        Weights: a NumPy array (or a device array such as JAX's, read as one) or a
        PyTensor expression.
    norm_axes
        Axes summed over; by default none for a vector, 0 for a matrix (one norm per
        output unit), all but the first for 3-5 dimensions (one per output channel).

    Returns
    -------
    numpy.ndarray or TensorVariable
        The norms.

    Raises
    ------
    RuntimeError
        If ``array`` is neither a NumPy array nor a PyTensor variable.
    ValueError
        If ``norm_axes`` is None and ``array`` has more than 5 dimensions.

    Examples
    --------
    >>> compute_norms(np.array([[3.0, 1.0], [4.0, 1.0]]))
    array([5.        , 1.41421356])
    """
    if not isinstance(array, np.ndarray | Variable) and hasattr(array, "__array_namespace__"):
        array = np.asarray(array)  # a device array (a JAX-mode function's output)
    if not isinstance(array, np.ndarray | Variable):
        raise RuntimeError(
            f"Unsupported type {type(array)}: compute_norms takes PyTensor "
            "variables and NumPy arrays"
        )
    norm_axes = default_norm_axes(array.ndim) if norm_axes is None else tuple(norm_axes)
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
        A tensor or a list of tensors, iterated over their first axis.
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
    if not isinstance(sequences, list | tuple):
        sequences = [sequences]
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
