"""Every public name of Lasagne 0.2.dev1 (GitHub master) exists here with its signature.

The expected names, parameter names and defaults below were read from Lasagne's source
(``lasagne/*.py`` and ``lasagne/layers/*.py`` at Lasagne/Lasagne master, 5d3c63c).  A
parameter list is ``(name, default)`` with ``"<required>"`` for no default and
``"<default>"`` for a default that is an object (an initializer, a function) rather than
a literal.  Lasagne's parameters must be the first parameters here, in order, with equal
literal defaults; this port may add keyword parameters after them (``num_groups``).
"""

import importlib
import inspect

import pytest

REQUIRED, OBJECT_DEFAULT = "<required>", "<default>"

LASAGNE_API = [
    ("layers", "Layer", ("callable", (("incoming", "<required>"), ("name", None)))),
    ("layers", "MergeLayer", ("callable", (("incomings", "<required>"), ("name", None)))),
    (
        "layers",
        "InputLayer",
        (
            "callable",
            (
                ("shape", "<required>"),
                ("input_var", None),
                ("name", None),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers", "get_all_layers", ("callable", (("layer", "<required>"), ("treat_as_input", None)))),
    (
        "layers",
        "get_output",
        (
            "callable",
            (("layer_or_layers", "<required>"), ("inputs", None), ("**kwargs", "<required>")),
        ),
    ),
    (
        "layers",
        "get_output_shape",
        ("callable", (("layer_or_layers", "<required>"), ("input_shapes", None))),
    ),
    (
        "layers",
        "get_all_params",
        ("callable", (("layer", "<required>"), ("unwrap_shared", True), ("**tags", "<required>"))),
    ),
    ("layers", "count_params", ("callable", (("layer", "<required>"), ("**tags", "<required>")))),
    (
        "layers",
        "get_all_param_values",
        ("callable", (("layer", "<required>"), ("**tags", "<required>"))),
    ),
    (
        "layers",
        "set_all_param_values",
        ("callable", (("layer", "<required>"), ("values", "<required>"), ("**tags", "<required>"))),
    ),
    (
        "layers",
        "DenseLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_units", "<required>"),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("num_leading_axes", 1),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "NINLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_units", "<required>"),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "DropoutLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("p", 0.5),
                ("rescale", True),
                ("shared_axes", ()),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers", "dropout", ("alias", "DropoutLayer")),
    (
        "layers",
        "dropout_channels",
        (
            "callable",
            (("incoming", "<required>"), ("*args", "<required>"), ("**kwargs", "<required>")),
        ),
    ),
    ("layers", "spatial_dropout", ("alias", "dropout_channels")),
    (
        "layers",
        "dropout_locations",
        (
            "callable",
            (("incoming", "<required>"), ("*args", "<required>"), ("**kwargs", "<required>")),
        ),
    ),
    (
        "layers",
        "GaussianNoiseLayer",
        ("callable", (("incoming", "<required>"), ("sigma", 0.1), ("**kwargs", "<required>"))),
    ),
    (
        "layers",
        "Conv1DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_filters", "<required>"),
                ("filter_size", "<required>"),
                ("stride", 1),
                ("pad", 0),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("flip_filters", True),
                ("convolution", "<default>"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "Conv2DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_filters", "<required>"),
                ("filter_size", "<required>"),
                ("stride", (1, 1)),
                ("pad", 0),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("flip_filters", True),
                ("convolution", "<default>"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "Conv3DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_filters", "<required>"),
                ("filter_size", "<required>"),
                ("stride", (1, 1, 1)),
                ("pad", 0),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("flip_filters", True),
                ("convolution", None),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "TransposedConv2DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_filters", "<required>"),
                ("filter_size", "<required>"),
                ("stride", (1, 1)),
                ("crop", 0),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("flip_filters", False),
                ("output_size", None),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers", "Deconv2DLayer", ("alias", "TransposedConv2DLayer")),
    (
        "layers",
        "DilatedConv2DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_filters", "<required>"),
                ("filter_size", "<required>"),
                ("dilation", (1, 1)),
                ("pad", 0),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("flip_filters", False),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "TransposedConv3DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_filters", "<required>"),
                ("filter_size", "<required>"),
                ("stride", (1, 1, 1)),
                ("crop", 0),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("flip_filters", False),
                ("output_size", None),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers", "Deconv3DLayer", ("alias", "TransposedConv3DLayer")),
    (
        "layers",
        "LocallyConnected2DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_filters", "<required>"),
                ("filter_size", "<required>"),
                ("stride", (1, 1)),
                ("pad", "same"),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("flip_filters", True),
                ("channelwise", False),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "MaxPool1DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("stride", None),
                ("pad", 0),
                ("ignore_border", True),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "MaxPool2DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("stride", None),
                ("pad", (0, 0)),
                ("ignore_border", True),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "MaxPool3DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("stride", None),
                ("pad", (0, 0, 0)),
                ("ignore_border", True),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "Pool1DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("stride", None),
                ("pad", 0),
                ("ignore_border", True),
                ("mode", "max"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "Pool2DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("stride", None),
                ("pad", (0, 0)),
                ("ignore_border", True),
                ("mode", "max"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "Pool3DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("stride", None),
                ("pad", (0, 0, 0)),
                ("ignore_border", True),
                ("mode", "max"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "Upscale1DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("scale_factor", "<required>"),
                ("mode", "repeat"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "Upscale2DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("scale_factor", "<required>"),
                ("mode", "repeat"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "Upscale3DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("scale_factor", "<required>"),
                ("mode", "repeat"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "FeaturePoolLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("axis", 1),
                ("pool_function", "<default>"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "FeatureWTALayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("axis", 1),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "GlobalPoolLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_function", "<default>"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "SpatialPyramidPoolingLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_dims", [4, 2, 1]),
                ("mode", "max"),
                ("implementation", "fast"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "FlattenLayer",
        ("callable", (("incoming", "<required>"), ("outdim", 2), ("**kwargs", "<required>"))),
    ),
    ("layers", "flatten", ("alias", "FlattenLayer")),
    (
        "layers",
        "ReshapeLayer",
        (
            "callable",
            (("incoming", "<required>"), ("shape", "<required>"), ("**kwargs", "<required>")),
        ),
    ),
    ("layers", "reshape", ("alias", "ReshapeLayer")),
    (
        "layers",
        "DimshuffleLayer",
        (
            "callable",
            (("incoming", "<required>"), ("pattern", "<required>"), ("**kwargs", "<required>")),
        ),
    ),
    ("layers", "dimshuffle", ("alias", "DimshuffleLayer")),
    (
        "layers",
        "PadLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("width", "<required>"),
                ("val", 0),
                ("batch_ndim", 2),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers", "pad", ("alias", "PadLayer")),
    (
        "layers",
        "SliceLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("indices", "<required>"),
                ("axis", -1),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers", "autocrop", ("callable", (("inputs", "<required>"), ("cropping", "<required>")))),
    (
        "layers",
        "autocrop_array_shapes",
        ("callable", (("input_shapes", "<required>"), ("cropping", "<required>"))),
    ),
    (
        "layers",
        "ConcatLayer",
        (
            "callable",
            (
                ("incomings", "<required>"),
                ("axis", 1),
                ("cropping", None),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers", "concat", ("alias", "ConcatLayer")),
    (
        "layers",
        "ElemwiseMergeLayer",
        (
            "callable",
            (
                ("incomings", "<required>"),
                ("merge_function", "<required>"),
                ("cropping", None),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "ElemwiseSumLayer",
        (
            "callable",
            (
                ("incomings", "<required>"),
                ("coeffs", 1),
                ("cropping", None),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "LocalResponseNormalization2DLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("alpha", 0.0001),
                ("k", 2),
                ("beta", 0.75),
                ("n", 5),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "BatchNormLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("axes", "auto"),
                ("epsilon", 0.0001),
                ("alpha", 0.1),
                ("beta", "<default>"),
                ("gamma", "<default>"),
                ("mean", "<default>"),
                ("inv_std", "<default>"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers", "batch_norm", ("callable", (("layer", "<required>"), ("**kwargs", "<required>")))),
    (
        "layers",
        "StandardizationLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("axes", "auto"),
                ("epsilon", 0.0001),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "instance_norm",
        (
            "callable",
            (
                ("layer", "<required>"),
                ("learn_scale", True),
                ("learn_bias", True),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers", "layer_norm", ("callable", (("layer", "<required>"), ("**kwargs", "<required>")))),
    (
        "layers",
        "EmbeddingLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("input_size", "<required>"),
                ("output_size", "<required>"),
                ("W", "<default>"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "NonlinearityLayer",
        (
            "callable",
            (("incoming", "<required>"), ("nonlinearity", "<default>"), ("**kwargs", "<required>")),
        ),
    ),
    (
        "layers",
        "BiasLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("b", "<default>"),
                ("shared_axes", "auto"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "ScaleLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("scales", "<default>"),
                ("shared_axes", "auto"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "standardize",
        (
            "callable",
            (
                ("layer", "<required>"),
                ("offset", "<required>"),
                ("scale", "<required>"),
                ("shared_axes", "auto"),
            ),
        ),
    ),
    (
        "layers",
        "ExpressionLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("function", "<required>"),
                ("output_shape", None),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "InverseLayer",
        (
            "callable",
            (("incoming", "<required>"), ("layer", "<required>"), ("**kwargs", "<required>")),
        ),
    ),
    (
        "layers",
        "TransformerLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("localization_network", "<required>"),
                ("downsample_factor", 1),
                ("border_mode", "nearest"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "TPSTransformerLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("localization_network", "<required>"),
                ("downsample_factor", 1),
                ("control_points", 16),
                ("precompute_grid", "auto"),
                ("border_mode", "nearest"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "ParametricRectifierLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("alpha", "<default>"),
                ("shared_axes", "auto"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers", "prelu", ("callable", (("layer", "<required>"), ("**kwargs", "<required>")))),
    (
        "layers",
        "RandomizedRectifierLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("lower", 0.3),
                ("upper", 0.8),
                ("shared_axes", "auto"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers", "rrelu", ("callable", (("layer", "<required>"), ("**kwargs", "<required>")))),
    ("init", "Initializer", ("class", None)),
    ("init", "Normal", ("callable", (("std", 0.01), ("mean", 0.0)))),
    ("init", "Uniform", ("callable", (("range", 0.01), ("std", None), ("mean", 0.0)))),
    (
        "init",
        "Glorot",
        ("callable", (("initializer", "<required>"), ("gain", 1.0), ("c01b", False))),
    ),
    ("init", "GlorotNormal", ("callable", (("gain", 1.0), ("c01b", False)))),
    ("init", "GlorotUniform", ("callable", (("gain", 1.0), ("c01b", False)))),
    ("init", "He", ("callable", (("initializer", "<required>"), ("gain", 1.0), ("c01b", False)))),
    ("init", "HeNormal", ("callable", (("gain", 1.0), ("c01b", False)))),
    ("init", "HeUniform", ("callable", (("gain", 1.0), ("c01b", False)))),
    ("init", "Constant", ("callable", (("val", 0.0),))),
    ("init", "Sparse", ("callable", (("sparsity", 0.1), ("std", 0.01)))),
    ("init", "Orthogonal", ("callable", (("gain", 1.0),))),
    ("nonlinearities", "sigmoid", ("callable", (("x", "<required>"),))),
    ("nonlinearities", "softmax", ("callable", (("x", "<required>"),))),
    ("nonlinearities", "tanh", ("callable", (("x", "<required>"),))),
    ("nonlinearities", "ScaledTanH", ("callable", (("scale_in", 1), ("scale_out", 1)))),
    ("nonlinearities", "ScaledTanh", ("alias", "ScaledTanH")),
    ("nonlinearities", "rectify", ("callable", (("x", "<required>"),))),
    ("nonlinearities", "LeakyRectify", ("callable", (("leakiness", 0.01),))),
    ("nonlinearities", "leaky_rectify", ("value", None)),
    ("nonlinearities", "very_leaky_rectify", ("value", None)),
    ("nonlinearities", "elu", ("callable", (("x", "<required>"),))),
    ("nonlinearities", "SELU", ("callable", (("scale", 1), ("scale_neg", 1)))),
    ("nonlinearities", "selu", ("value", None)),
    ("nonlinearities", "softplus", ("callable", (("x", "<required>"),))),
    ("nonlinearities", "linear", ("callable", (("x", "<required>"),))),
    ("nonlinearities", "identity", ("alias", "linear")),
    (
        "objectives",
        "binary_crossentropy",
        ("callable", (("predictions", "<required>"), ("targets", "<required>"))),
    ),
    (
        "objectives",
        "categorical_crossentropy",
        ("callable", (("predictions", "<required>"), ("targets", "<required>"))),
    ),
    ("objectives", "squared_error", ("callable", (("a", "<required>"), ("b", "<required>")))),
    (
        "objectives",
        "aggregate",
        ("callable", (("loss", "<required>"), ("weights", None), ("mode", "mean"))),
    ),
    (
        "objectives",
        "binary_hinge_loss",
        (
            "callable",
            (
                ("predictions", "<required>"),
                ("targets", "<required>"),
                ("delta", 1),
                ("log_odds", None),
                ("binary", True),
            ),
        ),
    ),
    (
        "objectives",
        "multiclass_hinge_loss",
        ("callable", (("predictions", "<required>"), ("targets", "<required>"), ("delta", 1))),
    ),
    (
        "objectives",
        "huber_loss",
        ("callable", (("predictions", "<required>"), ("targets", "<required>"), ("delta", 1))),
    ),
    (
        "objectives",
        "binary_accuracy",
        (
            "callable",
            (("predictions", "<required>"), ("targets", "<required>"), ("threshold", 0.5)),
        ),
    ),
    (
        "objectives",
        "categorical_accuracy",
        ("callable", (("predictions", "<required>"), ("targets", "<required>"), ("top_k", 1))),
    ),
    ("regularization", "l1", ("callable", (("x", "<required>"),))),
    ("regularization", "l2", ("callable", (("x", "<required>"),))),
    (
        "regularization",
        "apply_penalty",
        (
            "callable",
            (
                ("tensor_or_tensors", "<required>"),
                ("penalty", "<required>"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "regularization",
        "regularize_layer_params",
        (
            "callable",
            (
                ("layer", "<required>"),
                ("penalty", "<required>"),
                ("tags", {"regularizable": True}),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "regularization",
        "regularize_layer_params_weighted",
        (
            "callable",
            (
                ("layers", "<required>"),
                ("penalty", "<required>"),
                ("tags", {"regularizable": True}),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "regularization",
        "regularize_network_params",
        (
            "callable",
            (
                ("layer", "<required>"),
                ("penalty", "<required>"),
                ("tags", {"regularizable": True}),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("utils", "int_types", ("value", None)),
    ("utils", "floatX", ("callable", (("arr", "<required>"),))),
    ("utils", "shared_empty", ("callable", (("dim", 2), ("dtype", None)))),
    ("utils", "as_theano_expression", ("callable", (("input", "<required>"),))),
    ("utils", "collect_shared_vars", ("callable", (("expressions", "<required>"),))),
    ("utils", "one_hot", ("callable", (("x", "<required>"), ("m", None)))),
    ("utils", "unique", ("callable", (("l", "<required>"),))),
    ("utils", "as_tuple", ("callable", (("x", "<required>"), ("N", "<required>"), ("t", None)))),
    ("utils", "inspect_kwargs", ("callable", (("func", "<required>"),))),
    ("utils", "compute_norms", ("callable", (("array", "<required>"), ("norm_axes", None)))),
    (
        "utils",
        "create_param",
        ("callable", (("spec", "<required>"), ("shape", "<required>"), ("name", None))),
    ),
    (
        "utils",
        "unroll_scan",
        (
            "callable",
            (
                ("fn", "<required>"),
                ("sequences", "<required>"),
                ("outputs_info", "<required>"),
                ("non_sequences", "<required>"),
                ("n_steps", "<required>"),
                ("go_backwards", False),
            ),
        ),
    ),
    ("random", "get_rng", ("callable", ())),
    ("random", "set_rng", ("callable", (("new_rng", "<required>"),))),
    (
        "layers.dnn",
        "Pool2DDNNLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("stride", None),
                ("pad", (0, 0)),
                ("ignore_border", True),
                ("mode", "max"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers.dnn",
        "MaxPool2DDNNLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("stride", None),
                ("pad", (0, 0)),
                ("ignore_border", True),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers.dnn",
        "Pool3DDNNLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("stride", None),
                ("pad", (0, 0, 0)),
                ("ignore_border", True),
                ("mode", "max"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers.dnn",
        "MaxPool3DDNNLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("stride", None),
                ("pad", (0, 0, 0)),
                ("ignore_border", True),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers.dnn",
        "Conv2DDNNLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_filters", "<required>"),
                ("filter_size", "<required>"),
                ("stride", (1, 1)),
                ("pad", 0),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("flip_filters", False),
                ("num_groups", 1),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers.dnn",
        "Conv3DDNNLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_filters", "<required>"),
                ("filter_size", "<required>"),
                ("stride", (1, 1, 1)),
                ("pad", 0),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("flip_filters", False),
                ("num_groups", 1),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers.dnn",
        "SpatialPyramidPoolingDNNLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_dims", [4, 2, 1]),
                ("mode", "max"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers.dnn",
        "BatchNormDNNLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("axes", "auto"),
                ("epsilon", 0.0001),
                ("alpha", 0.1),
                ("beta", "<default>"),
                ("gamma", "<default>"),
                ("mean", "<default>"),
                ("inv_std", "<default>"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers.dnn",
        "batch_norm_dnn",
        ("callable", (("layer", "<required>"), ("**kwargs", "<required>"))),
    ),
    (
        "layers.corrmm",
        "Conv2DMMLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_filters", "<required>"),
                ("filter_size", "<required>"),
                ("stride", (1, 1)),
                ("pad", 0),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("flip_filters", False),
                ("num_groups", 1),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers.cuda_convnet",
        "Conv2DCCLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_filters", "<required>"),
                ("filter_size", "<required>"),
                ("stride", (1, 1)),
                ("pad", 0),
                ("untie_biases", False),
                ("W", None),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("dimshuffle", True),
                ("flip_filters", False),
                ("partial_sum", 1),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers.cuda_convnet",
        "MaxPool2DCCLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("pool_size", "<required>"),
                ("stride", None),
                ("ignore_border", False),
                ("dimshuffle", True),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    ("layers.cuda_convnet", "ShuffleBC01ToC01BLayer", ("class", None)),
    ("layers.cuda_convnet", "bc01_to_c01b", ("alias", "ShuffleBC01ToC01BLayer")),
    ("layers.cuda_convnet", "ShuffleC01BToBC01Layer", ("class", None)),
    ("layers.cuda_convnet", "c01b_to_bc01", ("alias", "ShuffleC01BToBC01Layer")),
    (
        "layers.cuda_convnet",
        "NINLayer_c01b",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_units", "<required>"),
                ("untie_biases", False),
                ("W", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
]

LASAGNE_UPDATES_API = [
    (
        "updates",
        "sgd",
        (
            "callable",
            (
                ("loss_or_grads", "<required>"),
                ("params", "<required>"),
                ("learning_rate", "<required>"),
            ),
        ),
    ),
    (
        "updates",
        "apply_momentum",
        ("callable", (("updates", "<required>"), ("params", None), ("momentum", 0.9))),
    ),
    (
        "updates",
        "momentum",
        (
            "callable",
            (
                ("loss_or_grads", "<required>"),
                ("params", "<required>"),
                ("learning_rate", "<required>"),
                ("momentum", 0.9),
            ),
        ),
    ),
    (
        "updates",
        "apply_nesterov_momentum",
        ("callable", (("updates", "<required>"), ("params", None), ("momentum", 0.9))),
    ),
    (
        "updates",
        "nesterov_momentum",
        (
            "callable",
            (
                ("loss_or_grads", "<required>"),
                ("params", "<required>"),
                ("learning_rate", "<required>"),
                ("momentum", 0.9),
            ),
        ),
    ),
    (
        "updates",
        "adagrad",
        (
            "callable",
            (
                ("loss_or_grads", "<required>"),
                ("params", "<required>"),
                ("learning_rate", 1.0),
                ("epsilon", 1e-06),
            ),
        ),
    ),
    (
        "updates",
        "rmsprop",
        (
            "callable",
            (
                ("loss_or_grads", "<required>"),
                ("params", "<required>"),
                ("learning_rate", 1.0),
                ("rho", 0.9),
                ("epsilon", 1e-06),
            ),
        ),
    ),
    (
        "updates",
        "adadelta",
        (
            "callable",
            (
                ("loss_or_grads", "<required>"),
                ("params", "<required>"),
                ("learning_rate", 1.0),
                ("rho", 0.95),
                ("epsilon", 1e-06),
            ),
        ),
    ),
    (
        "updates",
        "adam",
        (
            "callable",
            (
                ("loss_or_grads", "<required>"),
                ("params", "<required>"),
                ("learning_rate", 0.001),
                ("beta1", 0.9),
                ("beta2", 0.999),
                ("epsilon", 1e-08),
            ),
        ),
    ),
    (
        "updates",
        "adamax",
        (
            "callable",
            (
                ("loss_or_grads", "<required>"),
                ("params", "<required>"),
                ("learning_rate", 0.002),
                ("beta1", 0.9),
                ("beta2", 0.999),
                ("epsilon", 1e-08),
            ),
        ),
    ),
    (
        "updates",
        "amsgrad",
        (
            "callable",
            (
                ("loss_or_grads", "<required>"),
                ("params", "<required>"),
                ("learning_rate", 0.001),
                ("beta1", 0.9),
                ("beta2", 0.999),
                ("epsilon", 1e-08),
            ),
        ),
    ),
    (
        "updates",
        "norm_constraint",
        (
            "callable",
            (
                ("tensor_var", "<required>"),
                ("max_norm", "<required>"),
                ("norm_axes", None),
                ("epsilon", 1e-07),
            ),
        ),
    ),
    (
        "updates",
        "total_norm_constraint",
        (
            "callable",
            (
                ("tensor_vars", "<required>"),
                ("max_norm", "<required>"),
                ("epsilon", 1e-07),
                ("return_norm", False),
            ),
        ),
    ),
]

LASAGNE_RECURRENT_API = [
    (
        "layers",
        "CustomRecurrentLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("input_to_hidden", "<required>"),
                ("hidden_to_hidden", "<required>"),
                ("nonlinearity", "<default>"),
                ("hid_init", "<default>"),
                ("backwards", False),
                ("learn_init", False),
                ("gradient_steps", -1),
                ("grad_clipping", 0),
                ("unroll_scan", False),
                ("precompute_input", True),
                ("mask_input", None),
                ("only_return_final", False),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "RecurrentLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_units", "<required>"),
                ("W_in_to_hid", "<default>"),
                ("W_hid_to_hid", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
                ("hid_init", "<default>"),
                ("backwards", False),
                ("learn_init", False),
                ("gradient_steps", -1),
                ("grad_clipping", 0),
                ("unroll_scan", False),
                ("precompute_input", True),
                ("mask_input", None),
                ("only_return_final", False),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "Gate",
        (
            "callable",
            (
                ("W_in", "<default>"),
                ("W_hid", "<default>"),
                ("W_cell", "<default>"),
                ("b", "<default>"),
                ("nonlinearity", "<default>"),
            ),
        ),
    ),
    (
        "layers",
        "LSTMLayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_units", "<required>"),
                ("ingate", "<default>"),
                ("forgetgate", "<default>"),
                ("cell", "<default>"),
                ("outgate", "<default>"),
                ("nonlinearity", "<default>"),
                ("cell_init", "<default>"),
                ("hid_init", "<default>"),
                ("backwards", False),
                ("learn_init", False),
                ("peepholes", True),
                ("gradient_steps", -1),
                ("grad_clipping", 0),
                ("unroll_scan", False),
                ("precompute_input", True),
                ("mask_input", None),
                ("only_return_final", False),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
    (
        "layers",
        "GRULayer",
        (
            "callable",
            (
                ("incoming", "<required>"),
                ("num_units", "<required>"),
                ("resetgate", "<default>"),
                ("updategate", "<default>"),
                ("hidden_update", "<default>"),
                ("hid_init", "<default>"),
                ("backwards", False),
                ("learn_init", False),
                ("gradient_steps", -1),
                ("grad_clipping", 0),
                ("unroll_scan", False),
                ("precompute_input", True),
                ("mask_input", None),
                ("only_return_final", False),
                ("**kwargs", "<required>"),
            ),
        ),
    ),
]


def _resolve(module: str, name: str):
    package = importlib.import_module("synkhronos.extensions.lasagne." + module)
    if not hasattr(package, name):
        pytest.fail(f"lasagne.{module}.{name} is missing")
    return getattr(package, name)


def _check_signature(obj, expected) -> None:
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = list(inspect.signature(target).parameters.values())
    if inspect.isclass(obj):
        params = params[1:]  # self
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    kinds = {p.kind for p in params}
    want_named = [(n, d) for n, d in expected if not n.startswith("*")]
    got = [(p.name, p.default) for p in named[: len(want_named)]]
    assert [n for n, _ in got] == [n for n, _ in want_named], (
        f"parameters {[p.name for p in named]} do not start with {[n for n, _ in want_named]}"
    )
    for (name, default), (_, want) in zip(got, want_named, strict=True):
        if want == REQUIRED:
            assert default is inspect.Parameter.empty, f"{name} must be required"
        elif want == OBJECT_DEFAULT:
            assert default is not inspect.Parameter.empty, f"{name} must have a default"
        else:
            assert default == want, f"{name} defaults to {default!r}, Lasagne to {want!r}"
    if any(n.startswith("**") for n, _ in expected):
        assert inspect.Parameter.VAR_KEYWORD in kinds, "must accept **kwargs"
    if any(n.startswith("*") and not n.startswith("**") for n, _ in expected):
        assert inspect.Parameter.VAR_POSITIONAL in kinds, "must accept *args"


def _check(module: str, name: str, entry) -> None:
    obj = _resolve(module, name)
    kind, spec = entry
    if kind == "alias":
        assert obj is _resolve(module, spec), f"{name} must be an alias of {spec}"
    elif kind == "callable":
        _check_signature(obj, spec)
    elif kind == "class":
        assert inspect.isclass(obj)


def _ids(entries):
    return [f"{module}.{name}" for module, name, _ in entries]


@pytest.mark.parametrize(("module", "name", "entry"), LASAGNE_API, ids=_ids(LASAGNE_API))
def test_signatures(module, name, entry):
    _check(module, name, entry)


@pytest.mark.parametrize(
    ("module", "name", "entry"), LASAGNE_UPDATES_API, ids=_ids(LASAGNE_UPDATES_API)
)
def test_updates_signatures(module, name, entry):
    _check(module, name, entry)


@pytest.mark.parametrize(
    ("module", "name", "entry"), LASAGNE_RECURRENT_API, ids=_ids(LASAGNE_RECURRENT_API)
)
def test_recurrent_signatures(module, name, entry):
    _check(module, name, entry)
