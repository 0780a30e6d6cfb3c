"""The port's module tree is Lasagne master's, file for file.

Every ``from lasagne.X.Y import Z`` of a Lasagne script must resolve under
``synkhronos.extensions.lasagne``: below, each Lasagne module (``lasagne/*.py``,
``lasagne/layers/*.py``, ``lasagne/theano_extensions/*.py`` at Lasagne/Lasagne 5d3c63c)
with the names a script imports from it, including the helpers outside ``__all__``
(``conv_output_length``, ``pool_2d``, ...). A name living in several modules is one
object (re-exported, never copied).
"""

import importlib

import pytest

PACKAGE = "synkhronos.extensions.lasagne"

LASAGNE_MODULES = {
    "": [
        "init",
        "layers",
        "nonlinearities",
        "objectives",
        "random",
        "regularization",
        "updates",
        "utils",
        "__version__",
    ],
    "layers.base": ["Layer", "MergeLayer"],
    "layers.input": ["InputLayer"],
    "layers.helper": [
        "get_all_layers",
        "get_output",
        "get_output_shape",
        "get_all_params",
        "count_params",
        "get_all_param_values",
        "set_all_param_values",
    ],
    "layers.dense": ["DenseLayer", "NINLayer"],
    "layers.conv": [
        "Conv1DLayer",
        "Conv2DLayer",
        "Conv3DLayer",
        "TransposedConv2DLayer",
        "Deconv2DLayer",
        "DilatedConv2DLayer",
        "TransposedConv3DLayer",
        "Deconv3DLayer",
        "BaseConvLayer",
        "conv_output_length",
        "conv_input_length",
    ],
    "layers.local": ["LocallyConnected2DLayer"],
    "layers.pool": [
        "MaxPool1DLayer",
        "MaxPool2DLayer",
        "MaxPool3DLayer",
        "Pool1DLayer",
        "Pool2DLayer",
        "Pool3DLayer",
        "Upscale1DLayer",
        "Upscale2DLayer",
        "Upscale3DLayer",
        "FeaturePoolLayer",
        "FeatureWTALayer",
        "GlobalPoolLayer",
        "SpatialPyramidPoolingLayer",
        "pool_output_length",
        "pool_2d",
        "pool_3d",
        "pool_2d_nxn_regions",
    ],
    "layers.shape": [
        "FlattenLayer",
        "flatten",
        "ReshapeLayer",
        "reshape",
        "DimshuffleLayer",
        "dimshuffle",
        "PadLayer",
        "pad",
        "SliceLayer",
    ],
    "layers.merge": [
        "autocrop",
        "autocrop_array_shapes",
        "ConcatLayer",
        "concat",
        "ElemwiseMergeLayer",
        "ElemwiseSumLayer",
    ],
    "layers.noise": [
        "DropoutLayer",
        "dropout",
        "dropout_channels",
        "spatial_dropout",
        "dropout_locations",
        "GaussianNoiseLayer",
    ],
    "layers.normalization": [
        "LocalResponseNormalization2DLayer",
        "BatchNormLayer",
        "batch_norm",
        "StandardizationLayer",
        "instance_norm",
        "layer_norm",
    ],
    "layers.embedding": ["EmbeddingLayer"],
    "layers.recurrent": ["CustomRecurrentLayer", "RecurrentLayer", "Gate", "LSTMLayer", "GRULayer"],
    "layers.special": [
        "NonlinearityLayer",
        "BiasLayer",
        "ScaleLayer",
        "standardize",
        "ExpressionLayer",
        "InverseLayer",
        "TransformerLayer",
        "TPSTransformerLayer",
        "ParametricRectifierLayer",
        "prelu",
        "RandomizedRectifierLayer",
        "rrelu",
    ],
    "layers.dnn": [
        "Conv2DDNNLayer",
        "Conv3DDNNLayer",
        "MaxPool2DDNNLayer",
        "Pool2DDNNLayer",
        "MaxPool3DDNNLayer",
        "Pool3DDNNLayer",
        "SpatialPyramidPoolingDNNLayer",
        "BatchNormDNNLayer",
        "batch_norm_dnn",
    ],
    "layers.corrmm": ["Conv2DMMLayer"],
    "layers.cuda_convnet": [
        "Conv2DCCLayer",
        "MaxPool2DCCLayer",
        "ShuffleBC01ToC01BLayer",
        "bc01_to_c01b",
        "ShuffleC01BToBC01Layer",
        "c01b_to_bc01",
        "NINLayer_c01b",
    ],
    "init": [
        "Initializer",
        "Normal",
        "Uniform",
        "Glorot",
        "GlorotNormal",
        "GlorotUniform",
        "He",
        "HeNormal",
        "HeUniform",
        "Constant",
        "Sparse",
        "Orthogonal",
    ],
    "nonlinearities": [
        "sigmoid",
        "softmax",
        "tanh",
        "ScaledTanH",
        "ScaledTanh",
        "rectify",
        "LeakyRectify",
        "leaky_rectify",
        "very_leaky_rectify",
        "elu",
        "SELU",
        "selu",
        "softplus",
        "linear",
        "identity",
    ],
    "objectives": [
        "align_targets",
        "binary_crossentropy",
        "categorical_crossentropy",
        "squared_error",
        "aggregate",
        "binary_hinge_loss",
        "multiclass_hinge_loss",
        "huber_loss",
        "binary_accuracy",
        "categorical_accuracy",
    ],
    "random": ["get_rng", "set_rng"],
    "regularization": [
        "l1",
        "l2",
        "apply_penalty",
        "regularize_layer_params",
        "regularize_layer_params_weighted",
        "regularize_network_params",
    ],
    "updates": [
        "get_or_compute_grads",
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
    ],
    "utils": [
        "int_types",
        "floatX",
        "shared_empty",
        "as_theano_expression",
        "collect_shared_vars",
        "one_hot",
        "unique",
        "as_tuple",
        "inspect_kwargs",
        "compute_norms",
        "create_param",
        "unroll_scan",
    ],
    "theano_extensions": [],
    "theano_extensions.conv": [
        "conv1d_sc",
        "conv1d_mc0",
        "conv1d_mc1",
        "conv1d_unstrided",
        "conv1d_sd",
        "conv1d_md",
    ],
    "theano_extensions.padding": ["pad"],
}


@pytest.mark.parametrize("module", sorted(LASAGNE_MODULES))
def test_every_lasagne_module_path_imports_its_names(module):
    path = f"{PACKAGE}.{module}" if module else PACKAGE
    imported = importlib.import_module(path)
    missing = [name for name in LASAGNE_MODULES[module] if not hasattr(imported, name)]
    assert not missing, f"from lasagne.{module} import {missing} would fail"


def test_a_name_in_several_modules_is_one_object():
    from synkhronos.extensions.lasagne import layers, utils
    from synkhronos.extensions.lasagne.layers import base, input, special, transformer

    assert layers.InputLayer is input.InputLayer
    assert layers.NonlinearityLayer is special.NonlinearityLayer
    assert special.TransformerLayer is transformer.TransformerLayer is layers.TransformerLayer
    assert base.create_param is utils.create_param
    assert not hasattr(base, "InputLayer")  # Lasagne's base holds Layer and MergeLayer only
