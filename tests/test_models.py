"""ResNet-50 from demos.resnet, and a small CNN trained with synk.

A ResNet forward runs in PyTensor's default (Numba) mode; the whole ResNet-50 trains on 2
ranks in tests/test_resnet50_demo.py.
"""

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from demos import resnet as models
from demos.resnet import resnet50
from synkhronos.extensions.lasagne import init, objectives, updates
from synkhronos.extensions.lasagne.layers import (
    BatchNormLayer,
    Conv2DLayer,
    DenseLayer,
    InputLayer,
    MaxPool2DLayer,
    count_params,
    get_all_layers,
    get_all_params,
    get_output,
)
from synkhronos.extensions.lasagne.nonlinearities import softmax
from synkhronos.extensions.train import make_pytensor_step_function, make_step_function

RESNET50_PARAMS = 25_557_032  # torchvision / Keras ResNet-50 v1 trainable parameters


@pytest.fixture(scope="module")
def resnet():
    init.set_rng(0)
    return resnet50()


def test_resnet50_structure(resnet):
    assert count_params(resnet, trainable=True) == RESNET50_PARAMS
    layers = get_all_layers(resnet)
    assert sum(isinstance(layer, Conv2DLayer) for layer in layers) == 53
    bns = [layer for layer in layers if isinstance(layer, BatchNormLayer)]
    assert len(bns) == 53
    # The running averages are parameters too, but not trainable ones.
    averages = sum(2 * bn.mean.get_value().size for bn in bns)
    assert count_params(resnet) == RESNET50_PARAMS + averages
    assert resnet.output_shape == (None, 1000)
    assert [layer.output_shape[2:] for layer in layers if layer.name == "pool1"] == [(56, 56)]
    small = resnet50(InputLayer((None, 3, 64, 64)), num_classes=10)
    assert count_params(small, trainable=True) == RESNET50_PARAMS - 2049 * 990


def test_resnet_forward_default_mode(monkeypatch):
    """ResNet-50's layers with one bottleneck block per stage (every kind of block, a
    quarter of the graph: the whole net's compile took 150 s of a cold CI run) compile in
    PyTensor's default mode and give probabilities."""
    monkeypatch.setattr(models, "STAGES", tuple((width, 1) for width, _ in models.STAGES))
    init.set_rng(0)
    net = resnet50()
    assert sum(isinstance(layer, Conv2DLayer) for layer in get_all_layers(net)) == 1 + 4 * 4
    (input_layer,) = [lay for lay in get_all_layers(net) if isinstance(lay, InputLayer)]
    forward = pytensor.function([input_layer.input_var], get_output(net, deterministic=True))
    x = np.random.default_rng(1).standard_normal((2, 3, 224, 224))
    out = forward(x.astype(pytensor.config.floatX))
    assert out.shape == (2, 1000)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out.sum(axis=1), 1, rtol=1e-5)


def small_cnn(seed: int):
    """Conv -> max pool -> conv -> dense softmax, on 1x8x8 images; same weights per seed."""
    init.set_rng(seed)
    net = InputLayer((None, 1, 8, 8))
    net = Conv2DLayer(net, 4, 3, pad="same")
    net = MaxPool2DLayer(net, 2)
    net = Conv2DLayer(net, 6, 3, stride=2, pad=1)
    return DenseLayer(net, 3, nonlinearity=softmax)


def build_training(seed: int):
    """Network, its input layer, the targets variable and the mean loss."""
    net = small_cnn(seed)
    input_layer = get_all_layers(net)[0]
    targets = pytensor.tensor.ivector("targets")
    loss = objectives.categorical_crossentropy(get_output(net), targets).mean()
    return net, input_layer.input_var, targets, loss


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_cnn_trained_with_synk_matches_single_process(ranks):
    net, x, t, loss = build_training(seed=3)
    params = get_all_params(net, trainable=True)
    train = make_step_function(
        loss, params, [x, t], updates.momentum, learning_rate=0.1, mode="FAST_COMPILE"
    )
    ref_net, ref_x, ref_t, ref_loss = build_training(seed=3)
    ref_params = get_all_params(ref_net, trainable=True)
    ref_train = make_pytensor_step_function(
        ref_loss,
        ref_params,
        [ref_x, ref_t],
        updates.momentum,
        learning_rate=0.1,
        mode="FAST_COMPILE",
    )
    rng = np.random.default_rng(4)
    # 7 rows: the ranks get 4 and 3.
    xs = rng.standard_normal((7, 1, 8, 8)).astype(pytensor.config.floatX)
    ts = rng.integers(0, 3, size=7).astype("int32")
    losses = [float(train(xs, ts)) for _ in range(4)]
    ref_losses = [float(ref_train(xs, ts)) for _ in range(4)]
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    assert losses[-1] < losses[0]
    for rank in range(ranks):
        for p, ref in zip(synk.get_value(rank, params), ref_params, strict=True):
            np.testing.assert_allclose(p, ref.get_value(), rtol=1e-6, atol=1e-9)
