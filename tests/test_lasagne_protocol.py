"""The network helpers follow Lasagne's layer protocol and take any iterable of layers.

A user's layer class only has to provide the protocol's attributes (``input_layer`` or
``input_layers``, ``output_shape``, ``get_output_for``, ``get_output_kwargs``, ...); the
helpers must not need this port's base classes, and must end their walk where a layer
has no input. Where Lasagne takes "layers" it takes any iterable (``dict.values()`` in
Python 3 scripts, generators).
"""

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.extensions import lasagne
from synkhronos.extensions.lasagne.layers import (
    DenseLayer,
    ElemwiseSumLayer,
    InputLayer,
    Layer,
    MergeLayer,
    count_params,
    get_all_layers,
    get_all_param_values,
    get_all_params,
    get_output,
    get_output_shape,
)

MODE = "FAST_COMPILE"


class Scaled:
    """A user's layer with Lasagne's protocol attributes only (no base class)."""

    def __init__(self, incoming, factor):
        self.input_layer, self.input_shape = incoming, incoming.output_shape
        self.output_shape, self.params, self.factor = self.input_shape, {}, factor
        self.get_output_kwargs = ["factor_override"]  # read from **kwargs below
        self.seen = []

    def get_params(self, unwrap_shared=True, **tags):
        return []

    def get_output_shape_for(self, input_shape):
        return input_shape

    def get_output_for(self, input, **kwargs):
        self.seen.append(kwargs)
        return input * kwargs.get("factor_override", self.factor)


class Summed:
    """A user's merge layer with the protocol attributes only."""

    def __init__(self, incomings):
        self.input_layers = list(incomings)
        self.input_shapes = [lay.output_shape for lay in self.input_layers]
        self.output_shape, self.params, self.get_output_kwargs = self.input_shapes[0], {}, []

    def get_params(self, unwrap_shared=True, **tags):
        return []

    def get_output_shape_for(self, input_shapes):
        return input_shapes[0]

    def get_output_for(self, inputs, **kwargs):
        return inputs[0] + inputs[1]


def value(expr, inputs=(), *values):
    return pytensor.function(list(inputs), expr, mode=MODE)(*values)


def test_protocol_only_layers_in_a_network(rng):
    inp = InputLayer((None, 3))
    scaled = Scaled(inp, 2.0)
    merged = Summed([scaled, inp])
    dense = DenseLayer(merged, 2, nonlinearity=None)
    assert get_all_layers(dense) == [inp, scaled, merged, dense]
    assert get_all_params(dense) == [dense.W, dense.b]
    x = rng.standard_normal((4, 3))
    out = value(get_output(dense), [inp.input_var], x)
    expected = (3 * x) @ dense.W.get_value() + dense.b.get_value()
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    # only the keywords given to get_output reach get_output_for (Lasagne adds none)
    assert scaled.seen == [{}]
    get_output(dense, deterministic=True, factor_override=5.0)
    assert scaled.seen[-1] == {"deterministic": True, "factor_override": 5.0}
    assert get_output_shape(dense, (7, 3)) == (7, 2)


def test_get_all_params_of_a_dict_of_layers(rng):
    # the original Synkhronos' ResNet program: get_all_params(net.values(), trainable=True)
    net = {}
    net["input"] = InputLayer((None, 4))
    net["fc1"] = DenseLayer(net["input"], 5)
    net["out"] = DenseLayer(net["fc1"], 2)
    expected = [net["fc1"].W, net["fc1"].b, net["out"].W, net["out"].b]
    assert lasagne.layers.get_all_params(net.values(), trainable=True) == expected
    assert get_all_params((lay for lay in net.values()), regularizable=True) == expected[::2]
    assert get_all_layers(net.values()) == list(net.values())
    assert count_params(net.values()) == 4 * 5 + 5 + 5 * 2 + 2
    assert len(get_all_param_values(iter([net["out"]]))) == 4
    assert get_output_shape(net.values()) == [(None, 4), (None, 5), (None, 2)]
    assert get_output_shape(tuple(net.values()), (3, 4)) == [(3, 4), (3, 5), (3, 2)]
    outputs = get_output(net.values())
    assert isinstance(outputs, list) and outputs[0] is net["input"].input_var
    summed = ElemwiseSumLayer(lay for lay in (net["fc1"], net["fc1"]))
    assert summed.input_layers == [net["fc1"], net["fc1"]]
    penalty = lasagne.regularization.regularize_layer_params(
        net.values(), lasagne.regularization.l2
    )
    weights = [p.get_value() for p in expected[::2]]
    np.testing.assert_allclose(value(penalty), sum((w**2).sum() for w in weights))


def test_topological_order_treat_as_input_and_cycles():
    a, b = InputLayer((None, 2)), InputLayer((None, 2))
    left, right = DenseLayer(a, 2), DenseLayer(b, 2)
    top = ElemwiseSumLayer([left, right])
    assert get_all_layers([b, top]) == [b, a, left, right, top]
    assert get_all_layers(top, treat_as_input=[left]) == [left, b, right, top]
    assert get_all_layers([top, a], treat_as_input=[top]) == [top, a]
    first, second = Scaled(a, 1.0), Scaled(a, 1.0)
    first.input_layer, second.input_layer = second, first  # a cycle ends the walk
    assert set(get_all_layers(first)) == {first, second}


def test_get_output_inputs_forms(rng):
    inp = InputLayer((2, 3))
    assert get_output(inp) is inp.input_var
    given = pt.matrix("given")
    assert get_output(inp, given) is given  # passed through, not wrapped
    assert get_output(inp, {inp: given}) is given
    np.testing.assert_array_equal(value(get_output(inp, [[1.0, 2.0, 3.0]])), [[1, 2, 3]])
    loose = Layer((None, 3))  # built from a shape: its input is the key None
    loose.get_output_for = lambda x, **kwargs: 2 * x
    np.testing.assert_array_equal(value(get_output(loose, {None: np.ones((1, 3))})), [[2] * 3])
    with pytest.raises(ValueError, match="free-floating"):
        get_output(loose)
    with pytest.raises(TypeError, match="keys must be lasagne layers"):
        get_output(inp, {"input": given})
    two = ElemwiseSumLayer([InputLayer((None, 3)), InputLayer((None, 3))])
    with pytest.raises(ValueError, match="multiple input layers"):
        get_output(two, given)
    with pytest.raises(ValueError, match="multiple input layers"):
        get_output_shape(two, (1, 3))
    assert get_output_shape(two, {}) == (None, 3)
    assert get_output_shape(two, {two.input_layers[0]: (5, 3)}) == (5, 3)


def test_unused_keywords_warn_and_name_close_matches():
    net = DenseLayer(Scaled(InputLayer((None, 3)), 1.0), 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_output(net, deterministc=True)
        get_output(net, factor_overide=2.0)
        get_output(net, deterministic=True, factor_override=2.0)  # both known: silent
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert "perhaps you meant deterministic" in messages[0]
    assert "perhaps you meant factor_override" in messages[1]


def test_parameters_given_as_expressions():
    w1 = pytensor.shared(np.ones((3, 2)), name="w1")
    w2 = pytensor.shared(1.0, name="w2")
    expression = pt.exp(w1) - w2
    dense = DenseLayer(InputLayer((None, 3)), 2, W=expression, b=None)
    assert dense.W is expression
    assert dense.get_params() == [w1, w2]
    assert dense.get_params(unwrap_shared=False) == [expression]
    assert get_all_params(dense, regularizable=True) == [w1, w2]
    assert get_all_params(dense, unwrap_shared=False, trainable=False) == []


def test_output_shapes_are_ints_or_none():
    class Symbolic(Layer):
        def get_output_shape_for(self, input_shape):
            return pt.matrix().shape

    with pytest.raises(ValueError, match="symbolic output shape"):
        _ = Symbolic((None, 3)).output_shape
    abstract = MergeLayer([(None, 3), (None, 3)])
    assert not hasattr(abstract, "output_shape")  # no get_output_shape_for: no shape
    with pytest.raises(NotImplementedError):
        abstract.get_output_shape_for([(1, 3), (1, 3)])


def test_input_layer_is_where_the_walk_ends():
    layer = InputLayer([None, 1, 4], name="x")
    assert layer.shape == (None, 1, 4) and not hasattr(layer, "input_layer")
    assert layer.input_var.name == "x.input" and InputLayer((2,)).input_var.name == "input"
    assert layer.input_var.broadcastable == (False, True, False)
    assert layer.get_params() == []
    with pytest.raises(ValueError, match="non-positive"):
        InputLayer((None, 0))
    with pytest.raises(ValueError, match="dimensions"):
        InputLayer((None, 3), input_var=pt.tensor3())
