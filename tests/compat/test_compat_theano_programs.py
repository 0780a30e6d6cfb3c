"""The original's example programs' patterns, in their spelling (``import theano`` →
``from synkhronos import theano``, ``lasagne`` → ``synkhronos.extensions.lasagne``), on 2
CPU ranks against one-process PyTensor with the same seeds or data:

- "data on the GPU" (``demos/lasagne_mnist/train_mnist_gpu_data.py``): inputs replaced
  through ``givens`` by sliceable shared variables, in graphs with dropout, whose random
  generators' default updates must see the same replacement;
- the ResNet program's loss, ``T.nnet.categorical_crossentropy``.
"""

import numpy as np
import pytest

import synkhronos as synk
from synkhronos import theano
from synkhronos.extensions import updates
from synkhronos.extensions.lasagne import layers as L
from synkhronos.extensions.lasagne import nonlinearities, objectives

T = theano.tensor
MODE = "FAST_COMPILE"  # the same graphs, compiled in milliseconds
KEEP, LR, SEED = 0.5, 0.1, 1234


def dropout_regression(srng):
    """A linear regression on dropped-out inputs: its variables, mask and loss."""
    x, y = T.matrix("x"), T.vector("y")
    w = theano.shared(np.linspace(-1.0, 1.0, 3), name="w")
    mask = srng.binomial(x.shape, p=KEEP, dtype=theano.config.floatX)
    loss = T.mean(((x * mask / KEEP).dot(w) - y) ** 2)
    return x, y, w, mask, loss


def np_loss_grad(x, y, w, mask):
    xm = x * mask / KEEP
    err = xm @ w - y
    return (err**2).mean(), 2 * xm.T @ err / len(y)


def test_givens_onto_sliceable_data_with_dropout(ranks, rng):
    x, y, w, mask, loss = dropout_regression(theano.sandbox.rng_mrg.MRG_RandomStreams(SEED))
    s_x = theano.shared(np.zeros((1, 3)), name="s_x")
    s_y = theano.shared(np.zeros(1), name="s_y")
    with pytest.warns(UserWarning, match="each rank draws for its own rows"):
        f = synk.function(
            inputs=[],
            outputs=[loss, (mask, "gather")],
            givens=[(x, s_x), (y, s_y)],
            sliceable_shareds=[s_x, s_y],
            updates=[(w, w - LR * T.grad(loss, w))],
            mode=MODE,
        )
    # One process, the same seed: rank 0's draws, chunk by chunk.
    rx, ry, _, r_mask, r_loss = dropout_regression(theano.sandbox.rng_mrg.MRG_RandomStreams(SEED))
    reference = theano.function([rx, ry], [r_loss, r_mask], mode=MODE)

    xv, yv = rng.normal(size=(11, 3)), rng.normal(size=11)
    synk.scatter([s_x, s_y], [xv, yv])  # rank 0: rows 0-5, rank 1: rows 6-10
    parts = [(xv[:6], yv[:6]), (xv[6:], yv[6:])]
    for batch_s in (slice(1, 5), [[4, 0, 2, 5], [3, 1, 0, 2]]):  # slice and index variants
        w_before = [synk.get_value(r, w) for r in range(ranks)]
        got_loss, got_masks = f(batch_s=batch_s, num_slices=2)
        rows = (
            [np.arange(6)[batch_s], np.arange(5)[batch_s]]
            if isinstance(batch_s, slice)
            else batch_s
        )
        masks = np.split(got_masks, ranks)
        for chunk in range(2):  # rank 0 drew what one process draws, slice after slice
            idx = rows[0][2 * chunk : 2 * chunk + 2]
            _, want_mask = reference(xv[:6][idx], yv[:6][idx])
            np.testing.assert_array_equal(masks[0][2 * chunk : 2 * chunk + 2], want_mask)
        assert not np.array_equal(masks[0], masks[1])  # the ranks draw different numbers
        losses, grads = [], []
        for r, ((px, py), idx, m) in enumerate(zip(parts, rows, masks, strict=True)):
            rank_loss, grad = np_loss_grad(px[idx], py[idx], w_before[r], m)
            losses.append(rank_loss)
            grads.append(grad)
        # The update trains as one device would on every rank's rows and draws (as many
        # rows each: the ranks' gradients averaged), every rank the same.
        for r in range(ranks):
            np.testing.assert_allclose(
                synk.get_value(r, w), w_before[0] - LR * np.mean(grads, axis=0), rtol=1e-10
            )
        np.testing.assert_allclose(got_loss, np.mean(losses), rtol=1e-10)


def build_mlp(input_var):
    network = L.InputLayer((None, 1, 4, 4), input_var=input_var)
    network = L.DropoutLayer(network, p=0.2)
    network = L.DenseLayer(network, 8, nonlinearity=nonlinearities.rectify)
    network = L.DropoutLayer(network, p=0.5)
    return L.DenseLayer(network, 3, nonlinearity=nonlinearities.softmax)


def test_mnist_data_on_device_program(ranks, rng):
    """``train_mnist_gpu_data.py``'s functions and loop, on a small MLP with dropout."""
    floatX = theano.config.floatX
    X_train, y_train = rng.normal(size=(21, 1, 4, 4)).astype(floatX), rng.integers(0, 3, 21)
    X_val, y_val = rng.normal(size=(9, 1, 4, 4)).astype(floatX), rng.integers(0, 3, 9)
    y_train, y_val = y_train.astype("int32"), y_val.astype("int32")

    input_var = T.tensor4("inputs")
    target_var = T.ivector("targets")
    network = build_mlp(input_var)
    prediction = L.get_output(network)
    loss = objectives.categorical_crossentropy(prediction, target_var).mean()
    params = L.get_all_params(network, trainable=True)
    grad_updates, param_updates, grad_shared = updates.nesterov_momentum(
        loss, params, learning_rate=0.01, momentum=0.9
    )
    test_prediction = L.get_output(network, deterministic=True)
    test_loss = objectives.categorical_crossentropy(test_prediction, target_var).mean()
    test_acc = T.mean(
        T.eq(T.argmax(test_prediction, axis=1), target_var), dtype=theano.config.floatX
    )

    s_input_train = theano.shared(X_train[: len(X_train) // ranks])
    s_target_train = theano.shared(y_train[: len(y_train) // ranks])
    s_input_val = theano.shared(X_val[: len(X_val) // ranks])
    s_target_val = theano.shared(y_val[: len(y_val) // ranks])
    train_grad_fn = synk.function(
        inputs=[],
        outputs=loss,
        givens=[(input_var, s_input_train), (target_var, s_target_train)],
        sliceable_shareds=[s_input_train, s_target_train],
        updates=grad_updates,
        mode=MODE,
    )
    train_update_fn = synk.function([], updates=param_updates, mode=MODE)
    val_fn = synk.function(
        inputs=[],
        givens=[(input_var, s_input_val), (target_var, s_target_val)],
        sliceable_shareds=[s_input_val, s_target_val],
        outputs=[test_loss, test_acc],
        mode=MODE,
    )
    synk.distribute()
    synk.scatter(
        [s_input_train, s_target_train, s_input_val, s_target_val], [X_train, y_train, X_val, y_val]
    )
    train_worker_len = min(synk.get_lengths(s_target_train))

    losses = []
    for batch in (slice(0, 4), rng.permutation(train_worker_len)[:4]):
        losses.append(float(train_grad_fn(batch_s=batch)))
        synk.all_reduce(grad_shared)
        train_update_fn()
    assert np.isfinite(losses).all()
    for p in params:  # the same update on every rank
        np.testing.assert_allclose(synk.get_value(1, p), p.get_value(), rtol=1e-12)
    val_err, val_acc = val_fn(num_slices=2)
    reference = theano.function([input_var, target_var], [test_loss, test_acc], mode=MODE)
    want_err, want_acc = reference(X_val, y_val)
    np.testing.assert_allclose(val_err, want_err, rtol=1e-10)
    np.testing.assert_allclose(val_acc, want_acc, rtol=1e-10)


def test_resnet_program_loss(ranks, rng):
    """``train_resnet.py``'s training and prediction functions (its loss is
    ``T.nnet.categorical_crossentropy``) on a small CNN, against one process."""
    x = T.ftensor4("x")
    y = T.imatrix("y")
    net = {"input": L.InputLayer((None, 1, 5, 5), input_var=x)}
    net["conv"] = L.Conv2DLayer(net["input"], 4, 3, pad=1)
    net["pool"] = L.GlobalPoolLayer(net["conv"])
    net["prob"] = L.DenseLayer(net["pool"], 3, nonlinearity=nonlinearities.softmax)
    params = L.get_all_params(net["prob"], trainable=True)

    prob = L.get_output(net["prob"], x, deterministic=False)
    loss = T.nnet.categorical_crossentropy(prob, y.flatten()).mean()
    grad_updates, param_updates, grad_shared = updates.sgd(loss, params, learning_rate=LR)
    f_grad_shared = synk.function(inputs=[x, y], outputs=loss, updates=grad_updates, mode=MODE)
    f_param_update = synk.function(inputs=[], updates=param_updates, mode=MODE)
    v_prob = L.get_output(net["prob"], x, deterministic=True)
    v_loss = T.nnet.categorical_crossentropy(v_prob, y.flatten()).mean()
    v_mc = T.mean(T.neq(T.argmax(v_prob, axis=1), y.flatten()))
    f_predict = synk.function(inputs=[x, y], outputs=[v_loss, v_mc], mode=MODE)
    synk.distribute()
    synk.broadcast(params)

    xv = rng.normal(size=(13, 1, 5, 5)).astype("float32")
    yv = rng.integers(0, 3, size=(13, 1)).astype("int32")
    x_train, y_train = synk.data(xv), synk.data(yv)
    reference = theano.function([x, y], [loss, *T.grad(loss, params)], mode=MODE)
    batch = [0, 3, 4, 8, 9, 12, 2]
    want_loss, *grads = reference(xv[batch], yv[batch])
    before = [p.get_value() for p in params]
    train_loss = f_grad_shared(x_train, y_train, batch=batch)
    synk.all_reduce(grad_shared, op="avg")
    f_param_update()
    np.testing.assert_allclose(train_loss, want_loss, rtol=1e-5)
    for p, b, g in zip(params, before, grads, strict=True):
        np.testing.assert_allclose(p.get_value(), b - LR * g, rtol=1e-5, atol=1e-7)
    valid_loss, valid_mc = f_predict(x_train, y_train, num_slices=2)
    want = theano.function([x, y], [v_loss, v_mc], mode=MODE)(xv, yv)
    np.testing.assert_allclose([valid_loss, valid_mc], want, rtol=1e-5)
