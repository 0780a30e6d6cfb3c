"""Model builders for the demos and benchmarks: ResNet-50 (demos/resnet50.py trains it)."""

from synkhronos.extensions.lasagne import init
from synkhronos.extensions.lasagne.layers import (
    BatchNormLayer,
    Conv2DLayer,
    DenseLayer,
    ElemwiseSumLayer,
    GlobalPoolLayer,
    InputLayer,
    Layer,
    MaxPool2DLayer,
    NonlinearityLayer,
)
from synkhronos.extensions.lasagne.nonlinearities import rectify, softmax

__all__ = ["resnet50"]

STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))
"""(bottleneck width, number of blocks) of ResNet-50's four stages."""


def _conv_bn(
    incoming: Layer,
    num_filters: int,
    filter_size: int,
    stride: int = 1,
    relu: bool = True,
    name: str = "",
) -> Layer:
    """Bias-free convolution, batch normalization and optionally ReLU."""
    layer = Conv2DLayer(
        incoming,
        num_filters,
        filter_size,
        stride=stride,
        pad="same",
        W=init.HeNormal(gain="relu"),
        b=None,
        nonlinearity=None,
        flip_filters=False,
        name=name,
    )
    layer = BatchNormLayer(layer, name=f"{name}_bn")
    return NonlinearityLayer(layer, rectify, name=f"{name}_relu") if relu else layer


def _bottleneck(incoming: Layer, width: int, stride: int, name: str) -> Layer:
    """1x1 (stride) -> 3x3 -> 1x1 (4 * width) branch plus an identity or projection."""
    out_channels = 4 * width
    branch = _conv_bn(incoming, width, 1, stride, name=f"{name}_branch2a")
    branch = _conv_bn(branch, width, 3, name=f"{name}_branch2b")
    branch = _conv_bn(branch, out_channels, 1, relu=False, name=f"{name}_branch2c")
    shortcut = incoming
    if stride != 1 or incoming.output_shape[1] != out_channels:
        shortcut = _conv_bn(incoming, out_channels, 1, stride, relu=False, name=f"{name}_branch1")
    merged = ElemwiseSumLayer([branch, shortcut], name=f"{name}_sum")
    return NonlinearityLayer(merged, rectify, name=f"{name}_relu")


def resnet50(
    incoming: Layer | tuple[int | None, ...] = (None, 3, 224, 224),
    num_classes: int = 1000,
) -> Layer:
    """ResNet-50 v1 (He et al. 2015) with batch normalization.

    Stride 2 sits in the first 1x1 convolution of each downsampling block, as in the
    original model; convolutions have no biases (batch normalization shifts).  With
    1000 classes it has the standard 25,557,032 trainable parameters.

    Parameters
    ----------
    incoming
        Input layer, or the input shape ``(batch, 3, rows, cols)`` for a new
        :class:`InputLayer`.
    num_classes
        Size of the softmax output.

    Returns
    -------
    Layer
        The softmax output layer.
    """
    if isinstance(incoming, tuple):
        incoming = InputLayer(incoming, name="input")
    net = _conv_bn(incoming, 64, 7, stride=2, name="conv1")
    net = MaxPool2DLayer(net, 3, stride=2, pad=1, name="pool1")
    for stage, (width, blocks) in enumerate(STAGES, start=2):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 2 else 1
            net = _bottleneck(net, width, stride, name=f"res{stage}{chr(ord('a') + block)}")
    net = GlobalPoolLayer(net, name="pool5")
    return DenseLayer(net, num_classes, nonlinearity=softmax, name="fc1000")
