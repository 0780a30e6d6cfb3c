"""Lasagne's ``lasagne.layers`` on PyTensor (a Lasagne script imports
``from synkhronos.extensions import lasagne`` and uses ``lasagne.layers`` as before)."""

from synkhronos.extensions.lasagne.layers.base import InputLayer, Layer, MergeLayer
from synkhronos.extensions.lasagne.layers.conv import Conv2DLayer
from synkhronos.extensions.lasagne.layers.dense import DenseLayer, NonlinearityLayer
from synkhronos.extensions.lasagne.layers.helper import (
    count_params,
    get_all_layers,
    get_all_param_values,
    get_all_params,
    get_output,
    set_all_param_values,
)
from synkhronos.extensions.lasagne.layers.merge import (
    ConcatLayer,
    ElemwiseSumLayer,
    autocrop,
    autocrop_array_shapes,
)
from synkhronos.extensions.lasagne.layers.noise import DropoutLayer
from synkhronos.extensions.lasagne.layers.normalization import BatchNormLayer, batch_norm
from synkhronos.extensions.lasagne.layers.pool import GlobalPoolLayer, MaxPool2DLayer, Pool2DLayer
from synkhronos.extensions.lasagne.layers.shape import FlattenLayer, ReshapeLayer

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
