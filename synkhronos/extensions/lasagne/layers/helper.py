"""Functions over whole networks (``lasagne.layers.helper``)."""

from collections.abc import Iterable, Sequence

import numpy as np
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.tensor.variable import TensorVariable

from synkhronos.extensions.lasagne.layers.base import InputLayer, Layer, MergeLayer, Shape

__all__ = [
    "count_params",
    "get_all_layers",
    "get_all_param_values",
    "get_all_params",
    "get_output",
    "get_output_shape",
    "set_all_param_values",
]

Layers = Layer | Sequence[Layer]


def _parents(layer: Layer) -> list[Layer]:
    if isinstance(layer, MergeLayer):
        return [p for p in layer.input_layers if p is not None]
    return [] if layer.input_layer is None else [layer.input_layer]


def get_all_layers(layer: Layers, treat_as_input: Iterable[Layer] | None = None) -> list[Layer]:
    """All layers feeding ``layer`` (itself included), each after its inputs.

    Parameters
    ----------
    layer
        Output layer, or a list of them.
    treat_as_input
        Layers whose own inputs are not followed.

    Returns
    -------
    list of Layer
        Layers in topological order (depth-first, inputs first).
    """
    roots = list(layer) if isinstance(layer, Sequence) else [layer]
    stop = set(treat_as_input or ())
    order: list[Layer] = []
    done: set[Layer] = set()
    # Iterative post-order walk: deep nets (ResNets) would exceed Python's recursion limit.
    stack = [(root, False) for root in reversed(roots)]
    while stack:
        node, expanded = stack.pop()
        if node in done:
            continue
        if expanded:
            done.add(node)
            order.append(node)
            continue
        stack.append((node, True))
        if node not in stop:
            stack.extend((p, False) for p in reversed(_parents(node)) if p not in done)
    return order


def get_output(
    layer_or_layers: Layers,
    inputs: TensorVariable | np.ndarray | dict | None = None,
    deterministic: bool = False,
    **kwargs,
) -> TensorVariable | list[TensorVariable]:
    """Symbolic output of a network.

    Parameters
    ----------
    layer_or_layers
        Layer or list of layers whose outputs are wanted.
    inputs
        None to use the input layers' variables; one expression or array for the only
        :class:`InputLayer`; or a dict mapping layers to expressions that replace their
        outputs.
    deterministic
        Inference mode: no dropout, batch normalization with running averages.
    **kwargs
        Passed to every layer's ``get_output_for`` (e.g. ``batch_norm_use_averages``).

    Returns
    -------
    TensorVariable or list of TensorVariable
        The output(s), matching ``layer_or_layers``.
    """
    given = inputs if isinstance(inputs, dict) else {}
    layers = get_all_layers(layer_or_layers, treat_as_input=given)
    outputs = {layer: pt.as_tensor_variable(expr) for layer, expr in given.items()}
    input_layers = [layer for layer in layers if isinstance(layer, InputLayer)]
    if inputs is not None and not isinstance(inputs, dict):
        if len(input_layers) != 1:
            raise ValueError(
                f"a single input expression needs exactly one InputLayer, found {len(input_layers)}"
            )
        outputs[input_layers[0]] = _with_static_shape(
            pt.as_tensor_variable(inputs), input_layers[0].shape
        )
    for layer in layers:
        if layer in outputs:
            continue
        if isinstance(layer, InputLayer):
            outputs[layer] = _with_static_shape(layer.input_var, layer.shape)
            continue
        if isinstance(layer, MergeLayer):
            parents = layer.input_layers
        else:
            parents = [layer.input_layer]
        if None in parents:
            raise ValueError(f"layer {layer.name or layer} has a shape as input; pass its input")
        layer_inputs = [outputs[p] for p in parents]
        if not isinstance(layer, MergeLayer):
            layer_inputs = layer_inputs[0]
        outputs[layer] = layer.get_output_for(layer_inputs, deterministic=deterministic, **kwargs)
    if isinstance(layer_or_layers, Sequence):
        return [outputs[layer] for layer in layer_or_layers]
    return outputs[layer_or_layers]


def _with_static_shape(var: TensorVariable, shape) -> TensorVariable:
    """``var`` with the sizes the input layer declares made static where ``var`` lacks them.

    Static sizes flow to every layer's output type; JAX needs them to differentiate
    through reshapes (a flatten after a convolution, say).
    """
    static = var.type.shape
    if len(shape) != len(static):
        return var
    pairs = list(zip(static, shape, strict=True))
    if all(s is not None or d is None for s, d in pairs):
        return var
    return pt.specify_shape(var, [s if s is not None else d for s, d in pairs])


def get_output_shape(
    layer_or_layers: Layers, input_shapes: Shape | dict | None = None
) -> Shape | list[Shape]:
    """Output shape(s) of a network, for its declared or for given input shapes.

    Parameters
    ----------
    layer_or_layers
        Layer or list of layers.
    input_shapes
        None for the shapes the layers were built with; one shape for the only
        :class:`InputLayer`; or a dict mapping layers to shapes that replace their
        output shapes.

    Returns
    -------
    tuple or list of tuple
        The shape(s), matching ``layer_or_layers``.

    Examples
    --------
    >>> from synkhronos.extensions.lasagne.layers import DenseLayer
    >>> net = DenseLayer(InputLayer((None, 3)), 2)
    >>> get_output_shape(net), get_output_shape(net, (5, 3))
    ((None, 2), (5, 2))
    """
    if input_shapes is None:
        if isinstance(layer_or_layers, Sequence):
            return [layer.output_shape for layer in layer_or_layers]
        return layer_or_layers.output_shape
    given = input_shapes if isinstance(input_shapes, dict) else {}
    layers = get_all_layers(layer_or_layers, treat_as_input=given)
    shapes = {layer: tuple(shape) for layer, shape in given.items()}
    if not isinstance(input_shapes, dict):
        input_layers = [layer for layer in layers if isinstance(layer, InputLayer)]
        if len(input_layers) != 1:
            raise ValueError(
                f"one input shape needs exactly one InputLayer, found {len(input_layers)}"
            )
        shapes[input_layers[0]] = tuple(input_shapes)
    for layer in layers:
        if layer in shapes:
            continue
        if isinstance(layer, InputLayer):
            shapes[layer] = layer.shape
        elif isinstance(layer, MergeLayer):
            shapes[layer] = layer.get_output_shape_for([shapes[p] for p in layer.input_layers])
        else:
            shapes[layer] = layer.get_output_shape_for(shapes[layer.input_layer])
    if isinstance(layer_or_layers, Sequence):
        return [shapes[layer] for layer in layer_or_layers]
    return shapes[layer_or_layers]


def get_all_params(layer: Layers, unwrap_shared: bool = True, **tags: bool) -> list[SharedVariable]:
    """Parameters of all layers of a network, without duplicates.

    Parameters
    ----------
    layer
        Output layer(s).
    unwrap_shared
        Accepted for Lasagne compatibility: parameters here are always shared
        variables, so there is nothing to unwrap.
    **tags
        Filters, e.g. ``trainable=True`` or ``regularizable=True``; see
        :meth:`Layer.get_params`.

    Returns
    -------
    list of SharedVariable
        Parameters in layer order.
    """
    params = (p for lay in get_all_layers(layer) for p in lay.get_params(**tags))
    return list(dict.fromkeys(params))


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
    """
    params = get_all_params(layer, **tags)
    if len(params) != len(values):
        raise ValueError(f"got {len(values)} values for {len(params)} parameters")
    for p, v in zip(params, values, strict=True):
        if p.get_value(borrow=True).shape != np.shape(v):
            raise ValueError(
                f"value of shape {np.shape(v)} for {p.name} of shape {p.get_value().shape}"
            )
        p.set_value(v)
