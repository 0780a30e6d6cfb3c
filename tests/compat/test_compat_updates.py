"""The original Synkhronos' ``extensions.updates``, spelled as its programs spell it.

One test per item of the spec's "extensions.updates" section
(``../shared/synkhronos-api.md``), each on 2 CPU ranks with uneven splits, compared
with plain PyTensor on the whole batch (Lasagne's one-phase rules) or numpy.
"""

import inspect

import numpy as np
import pytensor
import pytensor.tensor as T
import pytest
from test_updates import RULE_KWARGS

import synkhronos as synk
from synkhronos.extensions import updates
from synkhronos.extensions.lasagne import updates as lasagne_updates

MODE = "FAST_COMPILE"  # passed through **kwargs to pytensor.function, as the original allows
ROWS = 7  # 2 ranks: 4 and 3 rows
HYPER = RULE_KWARGS  # non-default hyperparameters of every rule


def model(seed=1):
    """y_hat = x @ W + b; loss: mean over rows of the squared error."""
    rng = np.random.default_rng(seed)
    W = theano_shared(rng.normal(size=(3, 2)), "W")
    b = theano_shared(rng.normal(size=2), "b")
    x, y = T.matrix("x"), T.matrix("y")
    loss = T.mean(T.sum(T.sqr(T.dot(x, W) + b - y), axis=1))
    return [W, b], x, y, loss


def theano_shared(value, name):
    return pytensor.shared(np.asarray(value), name=name)


@pytest.fixture(scope="module")
def batches():
    rng = np.random.default_rng(2)
    return rng.normal(size=(3, ROWS, 3)), rng.normal(size=(3, ROWS, 2))


def reference(rule, batches, **hyper):
    """Lasagne's one-phase rule through pytensor.function on the whole batch: 3 steps."""
    params, x, y, loss = model()
    f = pytensor.function([x, y], loss, updates=rule(loss, params, **hyper), mode=MODE)
    losses = [float(f(xb, yb)) for xb, yb in zip(*batches, strict=True)]
    return losses, [p.get_value() for p in params]


def check_params_on_ranks(params, want):
    for stacked, w in zip(synk.gather(params, nd_up=1), want, strict=True):
        assert np.array_equal(stacked[0], stacked[1])  # identical on both ranks
        np.testing.assert_allclose(stacked[0], w, rtol=1e-10, atol=1e-12)


# Every rule with the original's all_reduce spelling (op None: the default "avg"); the
# explicit ops on two rules.
@pytest.mark.parametrize(
    ("rule", "op"),
    [(rule, None) for rule in HYPER] + [("sgd", "sum"), ("adam", "sum"), ("adam", "avg")],
)
def test_rules_return_three_parts(ranks, batches, rule, op):
    """grad_updates, param_updates, grad_shared = rule(loss, params, ...); all_reduce between."""
    params, x, y, loss = model()
    grad_updates, param_updates, grad_shared = getattr(updates, rule)(loss, params, **HYPER[rule])
    f_grad = synk.function([x, y], outputs=loss, updates=grad_updates, mode=MODE)
    f_update = synk.function([], updates=param_updates, mode=MODE)
    x_data, y_data = synk.data(batches[0][0]), synk.data(batches[1][0])
    losses = []
    for xb, yb in zip(*batches, strict=True):
        x_data.set_value(xb)
        y_data.set_value(yb)
        losses.append(float(f_grad(x_data, y_data)))
        if op is None:
            synk.all_reduce(grad_shared)  # the original's spelling: op "avg"
        else:
            synk.all_reduce(grad_shared, op=op)
        f_update()
    want_losses, want_params = reference(getattr(lasagne_updates, rule), batches, **HYPER[rule])
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
    check_params_on_ranks(params, want_params)


def test_rule_signatures_as_original():
    """(loss, params, hyperparameters): the original's are Lasagne's, names and defaults
    (tests/test_updates.py pins Lasagne's)."""
    for name in HYPER:
        params = inspect.signature(getattr(updates, name)).parameters
        lasagne_params = inspect.signature(getattr(lasagne_updates, name)).parameters
        assert list(params)[:2] == ["loss", "params"], name
        positional = [(k, p.default) for k, p in params.items() if p.kind != p.KEYWORD_ONLY]
        assert positional[2:] == [(k, p.default) for k, p in lasagne_params.items()][2:], name


def test_grad_shared_is_flat_gradient_with_batch_index_list(ranks, batches):
    """Phase one writes the flat gradient: reduced, it is the gradient of the selected rows."""
    params, x, y, loss = model()
    grad_updates, _, grad_shared = updates.sgd(loss, params, learning_rate=0.1)
    f_grad = synk.function([x, y], outputs=loss, updates=grad_updates, mode=MODE)
    xb, yb = batches[0][0], batches[1][0]
    batch = [6, 0, 2, 5, 3]  # 3 and 2 rows
    f_grad(synk.data(xb), synk.data(yb), batch=batch)
    synk.all_reduce(grad_shared)
    reduced = synk.gather(grad_shared, nd_up=1)
    assert np.array_equal(reduced[0], reduced[1])
    plain = pytensor.function([x, y], T.grad(loss, params), mode=MODE)(xb[batch], yb[batch])
    want = np.concatenate([g.ravel() for g in plain])
    np.testing.assert_allclose(reduced[0][:-1] / reduced[0][-1], want, rtol=1e-12)


@pytest.mark.parametrize(
    ("apply", "one_phase"),
    [
        (updates.apply_momentum, lasagne_updates.momentum),
        (updates.apply_nesterov_momentum, lasagne_updates.nesterov_momentum),
    ],
)
def test_apply_momentum_takes_pairs(ranks, batches, apply, one_phase):
    params, x, y, loss = model()
    grad_updates, param_updates, grad_shared = updates.sgd(loss, params, learning_rate=0.05)
    assert all(isinstance(pair, tuple) and len(pair) == 2 for pair in param_updates)
    param_updates = apply(param_updates, 0.8)
    f_grad = synk.function([x, y], outputs=loss, updates=grad_updates, mode=MODE)
    f_update = synk.function([], updates=param_updates, mode=MODE)
    for xb, yb in zip(*batches, strict=True):
        f_grad(xb, yb)
        synk.all_reduce(grad_shared)
        f_update()
    _, want = reference(one_phase, batches, learning_rate=0.05, momentum=0.8)
    check_params_on_ranks(params, want)


def test_sgd_nonflat(ranks, batches):
    """One gradient variable per parameter, each all-reduced; even split (it carries no rows)."""
    params, x, y, loss = model()
    grad_updates, param_updates, grads_shared = updates.sgd_nonflat(loss, params, 0.05)
    assert isinstance(grads_shared, list) and len(grads_shared) == len(params)
    f_grad = synk.function([x, y], outputs=loss, updates=grad_updates, mode=MODE)
    f_update = synk.function([], updates=param_updates, mode=MODE)
    even = [b[:, :6] for b in batches]  # 3 and 3 rows
    for xb, yb in zip(*even, strict=True):
        f_grad(xb, yb)
        synk.all_reduce(grads_shared)
        f_update()
    _, want = reference(lasagne_updates.sgd, even, learning_rate=0.05)
    check_params_on_ranks(params, want)


def sum_loss_model():
    """A loss summed over rows: an all-reduce "sum" of the ranks' gradients is exact."""
    params, x, y, _ = model()
    W, b = params
    return params, x, y, T.sum(T.sqr(T.dot(x, W) + b - y))


def test_flat_unflat_grads(ranks, batches):
    params, x, y, loss = sum_loss_model()
    grad_shared_flat, flat_grad, unflat_grads = updates.flat_unflat_grads(loss, params)
    assert grad_shared_flat.get_value().shape == (updates.vars_flat_size(params),)
    f_grad = synk.function([x, y], updates=[(grad_shared_flat, flat_grad)], mode=MODE)
    f_unflat = synk.function([], outputs=[(g, "max") for g in unflat_grads], mode=MODE)
    xb, yb = batches[0][0], batches[1][0]
    f_grad(xb, yb)
    synk.all_reduce(grad_shared_flat, op="sum")
    want = pytensor.function([x, y], T.grad(loss, params), mode=MODE)(xb, yb)
    for got, w in zip(f_unflat(), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-12)


def test_nonflat_grads(ranks, batches):
    params, x, y, loss = sum_loss_model()
    grads_shared, grads = updates.nonflat_grads(loss, params)
    f_grad = synk.function([x, y], updates=list(zip(grads_shared, grads, strict=True)), mode=MODE)
    xb, yb = batches[0][0], batches[1][0]
    f_grad(xb, yb)
    synk.all_reduce(grads_shared, op="sum")
    want = pytensor.function([x, y], T.grad(loss, params), mode=MODE)(xb, yb)
    for stacked, w, p in zip(synk.gather(grads_shared, nd_up=1), want, params, strict=True):
        assert stacked[0].shape == p.get_value().shape
        np.testing.assert_array_equal(stacked[0], stacked[1])
        np.testing.assert_allclose(stacked[0], w, rtol=1e-12)


def test_flatten_vars_vars_flat_size_unflatten_vars(ranks, batches):
    params, x, _, _ = model()
    assert updates.vars_flat_size(params) == 8
    # flatten_vars in a data-parallel function: each rank flattens its own rows.
    f = synk.function([x], outputs=(updates.flatten_vars([x, 2 * x]), "gather"), mode=MODE)
    xb = batches[0][0]
    halves = (xb[:4], xb[4:])
    np.testing.assert_allclose(
        f(xb), np.concatenate([np.concatenate([h.ravel(), 2 * h.ravel()]) for h in halves])
    )
    # unflatten_vars: views of an all-reduced flat vector, shaped like the params.
    flat = pytensor.shared(np.zeros(8), name="flat")
    synk.function([], updates=[(flat, updates.flatten_vars(params))], mode=MODE)()
    synk.all_reduce(flat, op="sum")
    views = updates.unflatten_vars(flat, params)
    f_views = synk.function([], outputs=[(v, "max") for v in views], mode=MODE)
    for got, p in zip(f_views(), params, strict=True):
        np.testing.assert_allclose(got, 2 * p.get_value())
