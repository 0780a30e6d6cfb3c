"""The original Synkhronos' ``extensions.train``, spelled as its programs spell it.

One test per item of the spec's "extensions.train" section
(``../shared/synkhronos-api.md``): the data-parallel step on 2 CPU ranks with uneven
splits and ``batch=`` selections, and its single-process twin, each compared with
Lasagne's one-phase rule through ``pytensor.function`` on the selected rows.
"""

import numpy as np
import pytensor
import pytensor.tensor as T
import pytest

import synkhronos as synk
from synkhronos.extensions import train as synk_train
from synkhronos.extensions import updates
from synkhronos.extensions.lasagne import updates as lasagne_updates

ROWS = 9
# All rows (5/4 on 2 ranks), the first 7 (4/3), an index list (3/2).
BATCHES = [None, 7, [8, 1, 4, 0, 6]]


def model():
    rng = np.random.default_rng(3)
    W = pytensor.shared(rng.normal(size=(3, 2)), name="W")
    b = pytensor.shared(np.zeros(2), name="b")
    x, y = T.matrix("x"), T.matrix("y")
    loss = T.mean(T.sum(T.sqr(T.tanh(T.dot(x, W)) + b - y), axis=1))
    return [W, b], x, y, loss


def data():
    rng = np.random.default_rng(4)
    return rng.normal(size=(len(BATCHES), ROWS, 3)), rng.normal(size=(len(BATCHES), ROWS, 2))


def select(a, batch):
    return a if batch is None else a[:batch] if isinstance(batch, int) else a[batch]


def reference(xs, ys, batches):
    """Nesterov momentum, one phase, on the selected rows of each step."""
    params, x, y, loss = model()
    f = pytensor.function(
        [x, y],
        loss,
        updates=lasagne_updates.nesterov_momentum(loss, params, learning_rate=0.1, momentum=0.8),
    )
    losses = [
        float(f(select(xb, b), select(yb, b))) for xb, yb, b in zip(xs, ys, batches, strict=True)
    ]
    return losses, [p.get_value() for p in params]


def test_make_train_function(ranks):
    """train(x_data, y_data, batch=None) on 2 ranks equals the whole-batch step."""
    params, x, y, loss = model()
    train = synk_train.make_train_function(
        loss, params, x, y, updates.nesterov_momentum, learning_rate=0.1, momentum=0.8
    )
    xs, ys = data()
    x_data, y_data = synk.data(xs[0]), synk.data(ys[0])
    losses = []
    for xb, yb, batch in zip(xs, ys, BATCHES, strict=True):
        x_data.set_value(xb)
        y_data.set_value(yb)
        losses.append(float(train(x_data, y_data, batch=batch)))
    want_losses, want_params = reference(xs, ys, BATCHES)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
    for stacked, want in zip(synk.gather(params, nd_up=1), want_params, strict=True):
        assert np.array_equal(stacked[0], stacked[1])
        np.testing.assert_allclose(stacked[0], want, rtol=1e-10)
    # A batch with fewer rows than ranks would leave a rank's old gradient in the reduce.
    before = [p.get_value() for p in params]
    with pytest.raises(ValueError, match=r"gives 1 row\(s\) to 2 ranks, none to rank"):
        train(x_data, y_data, batch=[3])
    for param, value in zip(params, before, strict=True):
        assert np.array_equal(param.get_value(), value)


def test_make_train_function_theano():
    """The single-process twin: train(x_data, y_data) on whole arrays."""
    params, x, y, loss = model()
    train = synk_train.make_train_function_theano(
        loss, params, x, y, updates.nesterov_momentum, learning_rate=0.1, momentum=0.8
    )
    xs, ys = data()
    losses = [float(train(xb, yb)) for xb, yb in zip(xs, ys, strict=True)]
    want_losses, want_params = reference(xs, ys, [None] * len(xs))
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
    for p, want in zip(params, want_params, strict=True):
        np.testing.assert_allclose(p.get_value(), want, rtol=1e-12)
