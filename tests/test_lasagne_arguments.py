"""Lasagne's argument handling and error texts, where Lasagne scripts and tests rely on them.

Each check builds layers or calls helpers without compiling anything (except
``create_param``'s values): the exception type and the words of Lasagne's message are
what a script's ``except`` or a test's ``match`` looks for.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos.extensions.lasagne import init, nonlinearities, objectives, updates, utils
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne.layers import conv, pool


def raises(kind, words, build):
    with pytest.raises(kind) as caught:
        build()
    assert words in str(caught.value), str(caught.value)


def test_convolution_arguments():
    raises(ValueError, "Expected 4 input dimensions", lambda: L.BaseConvLayer((2, 3, 4), 1, 3, n=2))
    assert [L.BaseConvLayer((2, 3) + (5,) * n, 1, 3).n for n in (1, 2, 3)] == [1, 2, 3]
    raises(ValueError, "evenly divide", lambda: L.Conv1DLayer((2, 3, 9), 2, 3, num_groups=2))
    raises(ValueError, "must be positive", lambda: L.Conv1DLayer((2, 3, 9), 3, 3, num_groups=-3))
    raises(TypeError, "iterable of int", lambda: L.Conv2DLayer((1, 2, 5, 5), 1, 3, pad="wide"))
    raises(
        NotImplementedError,
        "odd filter size",
        lambda: L.Conv2DLayer((1, 2, 5, 5), 1, 2, pad="same"),
    )
    raises(
        NotImplementedError,
        "not implement the convolve",
        lambda: L.BaseConvLayer((2, 3, 9), 1, 3).convolve(pt.tensor3()),
    )
    layer = L.Conv2DLayer((1, 2, 9, 9), 4, np.int64(3), stride=np.empty((2, 2)).shape, pad="same")
    assert layer.pad == "same" and layer.output_shape == (1, 4, 5, 5)  # the mode is kept
    assert L.Conv2DLayer((1, 2, 9, 9), 4, 3, pad="valid").pad == (0, 0)
    assert L.Conv1DLayer((1, 2, 9), 4, 3, nonlinearity=None).nonlinearity is nonlinearities.identity


def test_conv_length_helpers():
    # output: ceil((in + 2 pad - filter + 1) / stride); input: the smallest such in
    assert [conv.conv_output_length(13, 5, 3, p) for p in ("valid", 0, "full", "same", 2)] == [
        3,
        3,
        6,
        5,
        5,
    ]
    assert conv.conv_output_length(None, 5, 3) is None
    assert [conv.conv_input_length(3, 3, 2, p) for p in (0, 1, "full", "same")] == [7, 5, 3, 5]
    assert conv.conv_input_length(None, 3, 2) is None
    raises(ValueError, "Invalid pad: ", lambda: conv.conv_output_length(9, 3, 1, "wide"))
    raises(ValueError, "Invalid pad: ", lambda: conv.conv_input_length(9, 3, 1, "wide"))


def test_special_convolutions_refuse_what_lasagne_refuses():
    for pad in ("same", "full", 1):
        raises(
            NotImplementedError,
            "requires pad=0",
            lambda pad=pad: L.DilatedConv2DLayer((1, 2, 9, 9), 2, 3, pad=pad),
        )
    raises(
        NotImplementedError,
        "requires flip_filters=False",
        lambda: L.DilatedConv2DLayer((1, 2, 9, 9), 2, 3, flip_filters=True),
    )
    local = (None, 2, 5, 5)
    raises(
        NotImplementedError,
        "requires pad='same'",
        lambda: L.LocallyConnected2DLayer(local, 2, 3, pad="valid"),
    )
    raises(
        NotImplementedError,
        "requires stride=1 / (1, 1)",
        lambda: L.LocallyConnected2DLayer(local, 2, 3, stride=2),
    )
    raises(
        ValueError, "should match", lambda: L.LocallyConnected2DLayer(local, 3, 3, channelwise=True)
    )
    raises(
        ValueError,
        "(except for the batch size)",
        lambda: L.LocallyConnected2DLayer((None, 2, None, 5), 2, 3),
    )
    transposed = L.TransposedConv2DLayer((None, 2, 4, 4), 3, 3, crop="same")
    assert transposed.crop == "same" and not hasattr(transposed, "pad")
    symbolic = L.TransposedConv2DLayer((None, 2, 4, 4), 3, 3, output_size=pt.ivector())
    assert symbolic.output_shape == (None, 3, None, None)


def test_pooling_arguments():
    raises(ValueError, "Expected 3 input dimensions", lambda: L.MaxPool1DLayer((10, 20), 2))
    raises(ValueError, "Expected 4 input dimensions", lambda: L.Pool2DLayer((10, 20, 30), 2))
    raises(ValueError, "Expected 5 input dimensions", lambda: L.MaxPool3DLayer((1, 2, 3, 4), 2))
    raises(
        ValueError,
        "Expected 4 input dimensions",
        lambda: L.SpatialPyramidPoolingLayer((10, 20, 30)),
    )
    spp = L.SpatialPyramidPoolingLayer(
        (None, None, None, None), [1, 2], mode="other", implementation="kaiming"
    )
    assert spp.output_shape == (None, None, 5)  # any size may be unknown
    raises(
        ValueError,
        "Mode must be either 'max', 'average_inc_pad' or 'average_exc_pad'",
        lambda: spp.get_output_for(pt.tensor4()),
    )
    raises(ValueError, "Scale factor must be >= 1", lambda: L.Upscale2DLayer((1, 2, 3, 4), 0))
    raises(
        ValueError,
        "Mode must be either 'repeat' or 'dilate'",
        lambda: L.Upscale1DLayer((1, 2, 3), 2, mode="nearest"),
    )
    raises(ValueError, "not a multiple of the pool size", lambda: L.FeaturePoolLayer((1, 5), 2))
    assert L.GlobalPoolLayer((None,)).get_output_shape_for((2, 3, 4, 5)) == (2, 3)
    assert pool.pool_output_length(None, 2, 2, 0, True) is None
    assert pool.pool_output_length(7, 3, 2, 0, False) == 3


def test_shape_layers_arguments():
    five = (16, 3, None, None, 10)
    raises(ValueError, "total size mismatches", lambda: L.ReshapeLayer(five, (17, 3, [2], [3], -1)))
    for spec in [
        (-16, 3, 5, 7, 10),
        (-1, 3, 5, 7, -1),
        ([-1], 3),
        ([0, 1], 3),
        (None, 3),
        (16, 3, 5, 7, [5]),
        (16, 3, pt.vector(), 7, 10),
    ]:
        with pytest.raises(ValueError):
            L.ReshapeLayer(five, spec)
    assert L.ReshapeLayer(five, ([0], [1], -1, [4])).output_shape == (16, 3, None, 10)
    assert L.ReshapeLayer(five, (-1, [2], [2])).output_shape == (None, None, None)
    size = pt.iscalar()
    assert L.ReshapeLayer((None, 4), (size, -1)).output_shape == (None, None)
    assert L.ReshapeLayer((None, 4), ([0], 2, 2)).get_output_shape_for((size, 4)) == (None, 2, 2)
    for pattern in (["q"], [0, 0, 1], [0, 1, 7]):
        with pytest.raises(ValueError):
            L.DimshuffleLayer((2, 3, 1), pattern)
    raises(ValueError, "cannot be collapsed", lambda: L.DimshuffleLayer((2, 3, 4), (0, 1)))
    assert L.DimshuffleLayer((2, 3, None), (1, 0)).output_shape == (3, 2)
    # widths: one entry per padded axis from batch_ndim on, checked when shapes are known
    padded = L.PadLayer((None,), width=((1, 2),))
    assert padded.get_output_shape_for((2, 3, 4, 5)) == (2, 3, 7, 5)
    assert padded.get_output_shape_for((2, 3, None, 5)) == (2, 3, None, 5)
    assert L.PadLayer((None,), 3, batch_ndim=1).get_output_shape_for((2, 3, 4)) == (2, 9, 10)


def test_dense_and_parameter_layers_arguments():
    raises(
        ValueError,
        "leaving no trailing axes",
        lambda: L.DenseLayer((2, 3, 4), 5, num_leading_axes=3),
    )
    raises(
        ValueError,
        "requesting more trailing axes",
        lambda: L.DenseLayer((2, 3, 4), 5, num_leading_axes=-4),
    )
    raises(ValueError, "requires a fixed input shape", lambda: L.DenseLayer((10, None, 4), 5))
    assert L.DenseLayer((10, None, 4), 5, num_leading_axes=-1).output_shape == (10, None, 5)
    for build in (L.BiasLayer, L.ScaleLayer, L.ParametricRectifierLayer):
        raises(ValueError, "needs specified input sizes", lambda b=build: b((None, None, 3)))
    raises(ValueError, "needs specified input sizes", lambda: L.BatchNormLayer((None, None, 3)))
    raises(
        ValueError,
        "higher than lower bound",
        lambda: L.RandomizedRectifierLayer((None, 3), lower=0.8, upper=0.3),
    )
    raises(
        NotImplementedError,
        "odd n",
        lambda: L.LocalResponseNormalization2DLayer((None, 8, 4, 4), n=4),
    )
    bn = L.BatchNormLayer((20, 30, 40))
    assert bn.get_params(batch_norm_stat=True) == [bn.mean, bn.inv_std]
    assert bn.get_params(regularizable=True) == [bn.gamma]


class Bare:
    """A protocol-only layer: the normalization macros must not need ``name`` or ``b``."""

    output_shape = (2, 3)

    def __init__(self):
        self.nonlinearity = np.tanh


@pytest.mark.parametrize("macro", [L.batch_norm, L.layer_norm, L.instance_norm])
def test_normalization_macros_take_protocol_only_layers(macro):
    layer = Bare()
    if macro is L.instance_norm:
        layer.output_shape = (2, 3, 4, 4)
    stack = macro(layer)
    assert isinstance(stack, L.NonlinearityLayer) and stack.nonlinearity is np.tanh
    assert layer.nonlinearity is nonlinearities.identity


def test_initializer_arguments():
    raises(NotImplementedError, "", lambda: init.Initializer().sample((2, 2)))
    assert {init.Glorot, init.He} <= set(init.Initializer.__subclasses__())
    for make in (
        init.GlorotNormal,
        init.GlorotUniform,
        init.HeNormal,
        init.HeUniform,
        init.Orthogonal,
    ):
        raises(RuntimeError, "length", lambda make=make: make()((100,)))
    for make in (init.GlorotNormal, init.HeUniform):
        raises(
            RuntimeError, "only shapes of length 4", lambda make=make: make(c01b=True)((10, 10, 10))
        )
    raises(RuntimeError, "shapes of length 2", lambda: init.Sparse()((4, 4, 4)))


def test_objectives_arguments():
    matrix, vector = pt.matrix(), pt.vector()
    raises(ValueError, "mode must be", lambda: objectives.aggregate(matrix, mode="median"))
    raises(
        ValueError, "require weights", lambda: objectives.aggregate(matrix, mode="normalized_sum")
    )
    raises(TypeError, "rank mismatch", lambda: objectives.categorical_accuracy(vector, matrix))
    raises(TypeError, "rank mismatch", lambda: objectives.multiclass_hinge_loss(vector, matrix))
    column, targets = pt.col(), pt.vector()
    _, aligned = objectives.align_targets(column, targets)
    assert aligned.broadcastable == (False, True)  # no (batch, batch) broadcast
    assert objectives.squared_error(column, targets).broadcastable == (False, True)
    assert objectives.align_targets(vector, targets)[1] is targets


def test_utils_arguments():
    raises(ValueError, "length 4", lambda: utils.as_tuple([1, 2, 3], 4))
    raises(TypeError, "of int,", lambda: utils.as_tuple("ab", 2, utils.int_types))
    raises(TypeError, "of int or float,", lambda: utils.as_tuple("ab", 2, (int, float)))
    raises(RuntimeError, "Unsupported type", lambda: utils.compute_norms([[1.0]]))
    raises(
        ValueError,
        "Unsupported tensor dimensionality",
        lambda: utils.compute_norms(np.ones((1,) * 6)),
    )
    np.testing.assert_array_equal(utils.compute_norms(np.array([-2.0, 3.0])), [2.0, 3.0])
    raises(TypeError, "", lambda: utils.as_theano_expression({}))
    assert utils.shared_empty(3).get_value().shape == (1, 1, 1)
    x, y, z = (pytensor.shared(0.0, name=n) for n in "xyz")
    assert utils.collect_shared_vars(x + (y + z)) == [x, y, z]
    assert utils.collect_shared_vars([z * 2, pt.log(y), z + pt.matrix()]) == [z, y]
    assert utils.inspect_kwargs(lambda a, *args, b=1, **kwargs: 0) == ["b"]


def test_create_param_specs():
    assert utils.create_param(2, ()).get_value() == 2  # numbers become arrays
    assert utils.create_param(np.int16(3), ()).get_value().dtype == np.int16
    ints = utils.create_param(np.arange(6, dtype="int16").reshape(2, 3), (2, 3))
    assert ints.dtype == "int16"  # an array keeps its dtype
    assert utils.create_param(np.zeros, iter([3, 1])).broadcastable == (False, True)
    shared = pytensor.shared(np.ones((2, 3)))
    assert utils.create_param(shared, (2, 3)) is shared
    expression = shared * 2
    assert utils.create_param(lambda shape: expression, [2, 3], "e") is expression
    assert expression.name == "e"  # named only if it had no name
    raises(ValueError, "should be (2, 3)", lambda: utils.create_param(np.ones((3, 2)), (2, 3)))
    raises(
        ValueError, "has 2 dimensions, should be 3", lambda: utils.create_param(shared, (2, 3, 4))
    )
    raises(ValueError, "non-positive", lambda: utils.create_param(np.empty, (0, 2)))
    raises(
        TypeError,
        "returned by the provided callable",
        lambda: utils.create_param(lambda shape: "text", (1, 2)),
    )
    raises(TypeError, "or a callable", lambda: utils.create_param({}, (1, 2)))


def test_gradients_given_as_a_list_are_returned_as_they_are():
    a, b = pytensor.shared(1.0), pytensor.shared(2.0)
    grads = updates.get_or_compute_grads(a * b, [a, b])
    assert updates.get_or_compute_grads(grads, [a, b]) is grads
    raises(
        ValueError,
        "2 gradient expressions for 1 parameters",
        lambda: updates.get_or_compute_grads(grads, [a]),
    )
