"""Functions over whole networks (``lasagne.layers.helper``).

They walk a network through Lasagne's layer protocol only: a layer's inputs are its
``input_layers`` (several) or its ``input_layer`` (one; None when built from a
shape), and a layer with neither ends the walk. A user's layer class that provides
these attributes needs no base class from here.
"""

from collections.abc import Iterable, Sequence
from difflib import get_close_matches
from warnings import warn

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.tensor.type import TensorType

from synkhronos.extensions.lasagne.layers.base import Layer, Shape
from synkhronos.extensions.lasagne.layers.input import InputLayer
from synkhronos.extensions.lasagne.utils import as_theano_expression, inspect_kwargs, unique

__all__ = [
    "count_params",
    "get_all_layers",
    "get_all_param_values",
    "get_all_params",
    "get_output",
    "get_output_shape",
    "set_all_param_values",
]

Layers = Layer | Iterable[Layer]


def _as_list(layer_or_layers: Layers) -> tuple[list, bool]:
    """The layers asked for, and whether a single layer (not an iterable) was given.

    Any iterable counts as several layers (a list, a tuple, ``dict.values()``, a
    generator); it is read once.
    """
    try:
        return list(layer_or_layers), False
    except TypeError:
        return [layer_or_layers], True


def _incoming(layer) -> list:
    """The layers feeding ``layer``, by the protocol's attributes (None entries kept)."""
    if hasattr(layer, "input_layers"):
        return list(layer.input_layers)
    if hasattr(layer, "input_layer"):
        return [layer.input_layer]
    return []


def get_all_layers(layer: Layers, treat_as_input: Iterable[Layer] | None = None) -> list[Layer]:
    """All layers feeding ``layer`` (itself included), each after its inputs.

    Parameters
    ----------
    layer
        Output layer, or any iterable of them.
    treat_as_input
        Layers whose own inputs are not followed (unless another layer needs them).

    Returns
    -------
    list of Layer
        Layers in topological order: depth-first, each layer's inputs in order, the
        requested layers in the order given.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import DenseLayer
    >>> l_in = InputLayer((None, 3))
    >>> l1, l2 = DenseLayer(l_in, 2), DenseLayer(l_in, 4)
    >>> get_all_layers({"a": l2, "b": l1}.values()) == [l_in, l2, l1]
    True
    """
    roots, _ = _as_list(layer)
    seen = set(treat_as_input or ())
    done: set = set()
    order: list = []
    # Iterative depth-first walk: deep nets (ResNets) would exceed Python's recursion
    # limit. A layer is appended once its inputs are, or when met again (a cycle).
    stack = [(root, False) for root in reversed(roots)]
    while stack:
        node, expanded = stack.pop()
        if node is None:  # a layer built from a shape has input_layer None
            continue
        if expanded or node in seen:
            if node not in done:
                done.add(node)
                order.append(node)
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((p, False) for p in reversed(_incoming(node)))
    return order


def _network_inputs(layers: list, given: dict, inputs, value_of, what: tuple[str, str]) -> dict:
    """Layer -> its value for the walk's start: the input layers' own values, then the
    given mapping (whose None key stands for every missing input) or the one value
    for the only input layer."""
    known = {
        lay: value_of(lay) for lay in layers if isinstance(lay, InputLayer) and lay not in given
    }
    if given:
        known.update(given)
    elif inputs is not None:  # a dict of inputs is never empty here: it is `given`
        function, noun = what
        if len(known) > 1:
            raise ValueError(
                f"{function}() was called with a single input {noun} on a network with "
                f"multiple input layers. Please call it with a dictionary of input {noun}s "
                "instead."
            )
        for lay in known:
            known[lay] = inputs
    return known


def get_output(layer_or_layers: Layers, inputs=None, **kwargs):
    """Symbolic output of a network.

    Parameters
    ----------
    layer_or_layers
        Layer, or any iterable of layers, whose outputs are wanted.
    inputs
        None to use the input layers' variables; one expression or array for the only
        :class:`~synkhronos.extensions.lasagne.layers.InputLayer`; or a dict mapping
        layers to expressions (or arrays) that replace their outputs (the key None
        feeds a layer built from a shape).
    **kwargs
        Passed to every layer's ``get_output_for`` (e.g. ``deterministic=True``).
        Keywords that no layer takes raise a warning that names close matches.

    Returns
    -------
    TensorVariable or list of TensorVariable
        The output(s): a list when ``layer_or_layers`` is an iterable.

    Raises
    ------
    TypeError
        If a key of ``inputs`` is neither a layer nor None.
    ValueError
        If one expression is given for several input layers, or a layer built from a
        shape is given no input.
    """
    if isinstance(inputs, dict):
        for key in inputs:
            if key is not None and not isinstance(key, Layer):
                raise TypeError(
                    f"The inputs dictionary keys must be lasagne layers, not {type(key)}."
                )
        given = {lay: as_theano_expression(expr) for lay, expr in inputs.items()}
        single_input = None
    else:
        given = {}
        single_input = None if inputs is None else as_theano_expression(inputs)
    wanted, single = _as_list(layer_or_layers)
    layers = get_all_layers(wanted, treat_as_input=given)
    outputs = _network_inputs(
        layers, given, single_input, lambda lay: lay.input_var, ("get_output", "expression")
    )
    # The walk reads input layers' own variables with their known sizes; asked for,
    # they are returned as they were (Lasagne's identity). Given values keep theirs: a
    # value of other sizes than declared is Lasagne's to take.
    given_values = dict(outputs)
    for layer, value in given_values.items():
        if layer not in given and single_input is None:  # the layer's own input_var
            outputs[layer] = _with_known_shape(value, layer.output_shape)
    accepted = {"deterministic"}
    for layer in layers:
        if layer in outputs:
            continue
        value = layer.get_output_for(_layer_inputs(layer, outputs), **kwargs)
        outputs[layer] = _with_known_shape(value, getattr(layer, "output_shape", None))
        try:
            accepted.update(inspect_kwargs(layer.get_output_for))
        except TypeError:  # not introspectable (a C function, say)
            pass
        accepted.update(getattr(layer, "get_output_kwargs", ()))
    unused = set(kwargs) - accepted
    if unused:
        names = []
        for kwarg in sorted(unused):
            close = get_close_matches(kwarg, accepted)
            names.append(f"{kwarg} (perhaps you meant {close[0]})" if close else kwarg)
        warn("get_output() was called with unused kwargs:\n\t" + "\n\t".join(names), stacklevel=2)
    outputs.update(given_values)
    return outputs[wanted[0]] if single else [outputs[lay] for lay in wanted]


def _with_known_shape(value, shape):
    """``value`` with the sizes of ``shape`` (a layer's ``output_shape``) in its type.

    PyTensor then infers every later size from constants, not from arithmetic on the
    input's shape: JAX needs a reshape's target, a scan's length and an arange's bounds
    concrete when it traces, and its values are not.  Sizes the type already has, and
    values or shapes of any other form, are left as they are.
    """
    if (
        not isinstance(value, Variable)
        or not isinstance(value.type, TensorType)
        or not isinstance(shape, tuple)
        or len(shape) != value.type.ndim
        or not all(d is None or isinstance(d, int | np.integer) for d in shape)
    ):
        return value
    static = value.type.shape
    if all(d is None or s is not None for d, s in zip(shape, static, strict=True)):
        return value
    return pt.specify_shape(
        value, [s if s is not None else d for s, d in zip(static, shape, strict=True)]
    )


def _layer_inputs(layer, known: dict):
    """What ``layer`` takes from ``known``: a list for a layer with ``input_layers``."""
    try:
        if hasattr(layer, "input_layers"):
            return [known[p] for p in layer.input_layers]
        return known[layer.input_layer]
    except KeyError:  # an input_layer of None, and no None key given
        raise ValueError(
            f"get_output() was called without giving an input expression for the "
            f"free-floating layer {layer!r}. Please call it with a dictionary mapping "
            f"this layer to an input expression."
        ) from None


def get_output_shape(layer_or_layers: Layers, input_shapes: Shape | dict | None = None):
    """Output shape(s) of a network, for its declared or for given input shapes.

    Parameters
    ----------
    layer_or_layers
        Layer, or any iterable of layers.
    input_shapes
        None for the shapes the layers were built with; one shape for the only
        :class:`~synkhronos.extensions.lasagne.layers.InputLayer`; or a dict mapping
        layers to shapes that replace their output shapes.

    Returns
    -------
    tuple or list of tuple
        The shape(s): a list when ``layer_or_layers`` is an iterable.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import DenseLayer
    >>> net = DenseLayer(InputLayer((None, 3)), 2)
    >>> get_output_shape(net), get_output_shape(net, (5, 3))
    ((None, 2), (5, 2))
    """
    wanted, single = _as_list(layer_or_layers)
    if input_shapes is None or input_shapes == {}:
        return wanted[0].output_shape if single else [lay.output_shape for lay in wanted]
    given = input_shapes if isinstance(input_shapes, dict) else {}
    layers = get_all_layers(wanted, treat_as_input=given)
    shapes = _network_inputs(
        layers, given, input_shapes, lambda lay: lay.shape, ("get_output_shape", "shape")
    )
    for layer in layers:
        if layer not in shapes:
            shapes[layer] = layer.get_output_shape_for(_layer_inputs(layer, shapes))
    return shapes[wanted[0]] if single else [shapes[lay] for lay in wanted]


def get_all_params(layer: Layers, unwrap_shared: bool = True, **tags: bool) -> list[Variable]:
    """Parameters of all layers of a network, without duplicates.

    Parameters
    ----------
    layer
        Output layer, or any iterable of layers (``net.values()`` of a dict, say).
    unwrap_shared
        For parameters given as expressions: return the shared variables they depend
        on (True) or the expressions (False).
    **tags
        Filters, e.g. ``trainable=True`` or ``regularizable=True``; see
        :meth:`~synkhronos.extensions.lasagne.layers.Layer.get_params`.

    Returns
    -------
    list of Variable
        Parameters in layer order.
    """
    return unique(
        p
        for lay in get_all_layers(layer)
        for p in lay.get_params(unwrap_shared=unwrap_shared, **tags)
    )


def count_params(layer: Layers, **tags: bool) -> int:
    """Number of scalar parameters in a network.

    Parameters
    ----------
    layer
        Output layer(s).
    **tags
        Filters as in :func:`get_all_params` (``trainable=True`` for the usual count).

    Returns
    -------
    int
        Total number of elements of the selected parameters.
    """
    return sum(int(np.prod(p.get_value(borrow=True).shape)) for p in get_all_params(layer, **tags))


def get_all_param_values(layer: Layers, **tags: bool) -> list[np.ndarray]:
    """Copies of the values of a network's parameters.

    Parameters
    ----------
    layer
        Output layer(s).
    **tags
        Filters as in :func:`get_all_params`.

    Returns
    -------
    list of numpy.ndarray
        Values in :func:`get_all_params` order.
    """
    return [p.get_value() for p in get_all_params(layer, **tags)]


def set_all_param_values(layer: Layers, values: Sequence[np.ndarray], **tags: bool) -> None:
    """Set a network's parameters from a list like :func:`get_all_param_values` returns.

    Parameters
    ----------
    layer
        Output layer(s).
    values
        New values, one per parameter, in :func:`get_all_params` order.
    **tags
        Filters as in :func:`get_all_params`.

    Raises
    ------
    ValueError
        If the number of values or a value's shape does not match.
    """
    params = get_all_params(layer, **tags)
    if len(params) != len(values):
        raise ValueError(f"mismatch: got {len(values)} values to set {len(params)} parameters")
    for p, v in zip(params, values, strict=True):
        if p.get_value(borrow=True).shape != np.shape(v):
            raise ValueError(
                f"mismatch: parameter has shape {p.get_value(borrow=True).shape!r} but value "
                f"to set has shape {np.shape(v)!r}"
            )
        p.set_value(v)
