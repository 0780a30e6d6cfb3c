"""Tutorial programs in the Theano tutorials' spelling, ported by the command and their
training line alone (issue #61): a logistic regression on shared data whose labels are a
cast (``logistic_sgd.py``'s shape), and a denoising autoencoder with a corruption level
``theano.In(..., value=0.2)`` and a mask drawn by ``RandomStreams.binomial`` (``dA.py``'s
shape, pretrained with SdA's batch of 1 too). Each runs ported on 2 and 3 CPU ranks, its
training line changed to ``synk.function``, and as written in one process (the port's
``theano.function`` for every line): the same costs and final parameters (float64, 1e-9),
every rank's state equal."""

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from synkhronos.tools.porting import port_source

PROGRAM = """\
import numpy
import theano
import theano.tensor as T
from theano.tensor.shared_randomstreams import RandomStreams


def shared_dataset(rows, seed):
    rng = numpy.random.RandomState(seed)
    x = theano.shared(rng.uniform(0, 1, (rows, 6)), borrow=True)
    y = theano.shared(rng.randint(0, 3, rows).astype("float64"), borrow=True)
    return x, T.cast(y, "int32")


def logistic(batch_size, steps):
    train_set_x, train_set_y = shared_dataset(23, 1)
    index, x, y = T.lscalar(), T.matrix("x"), T.ivector("y")
    W = theano.shared(numpy.zeros((6, 3)), name="W")
    b = theano.shared(numpy.zeros(3), name="b")
    p_y_given_x = T.nnet.softmax(T.dot(x, W) + b)
    cost = -T.mean(T.log(p_y_given_x)[T.arange(y.shape[0]), y])
    errors = T.mean(T.neq(T.argmax(p_y_given_x, axis=1), y))
    updates = [(W, W - 0.13 * T.grad(cost, W)), (b, b - 0.13 * T.grad(cost, b))]
    givens = {x: train_set_x[index * batch_size:(index + 1) * batch_size],
              y: train_set_y[index * batch_size:(index + 1) * batch_size]}
    train_model = TRAINING(inputs=[index], outputs=cost, updates=updates, givens=givens)
    test_model = theano.function([index], errors, givens=givens)
    costs = [train_model(k % 3) for k in range(steps)]
    return costs + [test_model(1)], [W, b]


def denoising(batch_size, steps):
    train_set_x, _ = shared_dataset(23, 2)
    index, x = T.lscalar("index"), T.matrix("x")
    corruption_level, learning_rate = T.scalar("corruption"), T.scalar("lr")
    theano_rng = RandomStreams(5)
    W = theano.shared(numpy.random.RandomState(3).uniform(-0.5, 0.5, (6, 4)), name="W")
    bhid = theano.shared(numpy.zeros(4), name="bhid")
    bvis = theano.shared(numpy.zeros(6), name="bvis")
    tilde_x = theano_rng.binomial(size=x.shape, n=1, p=1 - corruption_level,
                                  dtype=theano.config.floatX) * x
    y = T.nnet.sigmoid(T.dot(tilde_x, W) + bhid)
    z = T.nnet.sigmoid(T.dot(y, W.T) + bvis)
    cost = T.mean(-T.sum(x * T.log(z) + (1 - x) * T.log(1 - z), axis=1))
    params = [W, bhid, bvis]
    updates = [(p, p - learning_rate * g) for p, g in zip(params, T.grad(cost, params))]
    train_da = TRAINING(
        [index, theano.In(corruption_level, value=0.2), theano.In(learning_rate, value=0.1)],
        cost, updates=updates,
        givens={x: train_set_x[index * batch_size:(index + 1) * batch_size]})
    costs = [train_da(index=k % 4, corruption=0.3) for k in range(0, steps, 2)]
    return costs + [train_da(k % 4) for k in range(1, steps, 2)], params
"""


def _run(source: str, training, entry: str, batch_size: int) -> tuple[list, list]:
    namespace: dict = {}
    exec(compile(source, "<tutorial>", "exec"), namespace)  # noqa: S102 - the test's own text
    namespace["TRAINING"] = training or namespace["theano"].function
    outputs, params = namespace[entry](batch_size, 4)
    return [np.asarray(o) for o in outputs], [p.get_value() for p in params]


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request):
    synk.fork(request.param, backend="cpu")
    yield request.param
    synk.close()


@pytest.mark.parametrize(
    ("entry", "batch_size"), [("logistic", 9), ("denoising", 7), ("denoising", 1)]
)
def test_ported_tutorial_trains_as_one_process(ranks, entry, batch_size):
    ported = port_source(PROGRAM)
    assert "from synkhronos import theano" in ported
    got, got_params = _run(ported, synk.function, entry, batch_size)
    synk.verify()
    want, want_params = _run(ported, None, entry, batch_size)
    tol = 1e-9 if pytensor.config.floatX == "float64" else 1e-5
    for g, w in zip([*got, *got_params], [*want, *want_params], strict=True):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
