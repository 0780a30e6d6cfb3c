"""Lasagne-style layers on PyTensor.

A Lasagne model definition ports by replacing ``lasagne.layers`` with
``synkhronos.extensions.layers``, ``lasagne.init`` with ``synkhronos.extensions.init``,
``lasagne.nonlinearities`` with ``synkhronos.extensions.nonlinearities`` and
``lasagne.objectives`` with ``synkhronos.extensions.objectives``.
"""

from synkhronos.extensions.layers.base import InputLayer, Layer, MergeLayer
from synkhronos.extensions.layers.conv import Conv2DLayer
from synkhronos.extensions.layers.dense import DenseLayer, NonlinearityLayer
from synkhronos.extensions.layers.helper import (
    count_params,
    get_all_layers,
    get_all_param_values,
    get_all_params,
    get_output,
    set_all_param_values,
)
from synkhronos.extensions.layers.merge import (
    ConcatLayer,
    ElemwiseSumLayer,
    autocrop,
    autocrop_array_shapes,
)
from synkhronos.extensions.layers.noise import DropoutLayer
from synkhronos.extensions.layers.normalization import BatchNormLayer, batch_norm
from synkhronos.extensions.layers.pool import GlobalPoolLayer, MaxPool2DLayer, Pool2DLayer
from synkhronos.extensions.layers.shape import FlattenLayer, ReshapeLayer

__all__ = [
    "BatchNormLayer",
    "ConcatLayer",
    "Conv2DLayer",
    "DenseLayer",
    "DropoutLayer",
    "ElemwiseSumLayer",
    "FlattenLayer",
    "GlobalPoolLayer",
    "InputLayer",
    "Layer",
    "MaxPool2DLayer",
    "MergeLayer",
    "NonlinearityLayer",
    "Pool2DLayer",
    "ReshapeLayer",
    "autocrop",
    "autocrop_array_shapes",
    "batch_norm",
    "count_params",
    "get_all_layers",
    "get_all_param_values",
    "get_all_params",
    "get_output",
    "set_all_param_values",
]
