"""Three kinds of training script, for the save / train / load / train tests.

Each builds a tiny model on 2 ranks and trains it one step per call of ``step(i)``, on
step ``i``'s own rows (9 of them: 5 and 4 per rank). Run by the test in its own process
(:func:`first`) and, to resume, in a fresh one (``python checkpoint_runs.py ...``), both
with PyTensor's mode FAST_COMPILE (tiny graphs: compiling, not computing, would take the
time).
"""

from __future__ import annotations

import sys

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.extensions import lasagne, updates
from synkhronos.extensions.train import make_step_function, make_train_function

KINDS = ("extensions_train", "two_phase", "lasagne")
ROWS, STEPS = 9, 10


def _data(i: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + i)
    return rng.normal(size=(ROWS, 3)).astype(dtype), rng.integers(0, 2, ROWS).astype("int32")


def _network(x, dropout: bool):
    """Dense, batch normalization (running averages), [dropout], dense softmax."""
    lasagne.random.set_rng(np.random.RandomState(7))
    net = lasagne.layers.InputLayer((None, 3), input_var=x)
    net = lasagne.layers.batch_norm(lasagne.layers.DenseLayer(net, 4))
    if dropout:
        net = lasagne.layers.DropoutLayer(net, p=0.3)
    return lasagne.layers.DenseLayer(net, 2, nonlinearity=lasagne.nonlinearities.softmax)


def build(kind: str):
    """The kind's training step, ``step(i) -> loss`` (forked already)."""
    dtype = pytensor.config.floatX
    x, y = pt.matrix("x", dtype=dtype), pt.ivector("y")
    if kind == "extensions_train":  # make_step_function with Adam (its step count too)
        rng = np.random.default_rng(3)
        w = pytensor.shared(rng.normal(size=(3, 2)).astype(dtype), name="w")
        b = pytensor.shared(np.zeros(2, dtype), name="b")
        loss = pt.mean(pt.sqr(pt.tanh(x @ w) + b - pt.cast(y, dtype)[:, None]))
        train = make_step_function(loss, [w, b], [x, y], lasagne.updates.adam, learning_rate=0.05)
        return lambda i: train(*_data(i, dtype))
    network = _network(x, dropout=kind == "lasagne")
    prediction = lasagne.layers.get_output(network)
    loss = lasagne.objectives.categorical_crossentropy(prediction, y).mean()
    params = lasagne.layers.get_all_params(network, trainable=True)
    if kind == "lasagne":  # the original's helper: running averages averaged over ranks
        train = make_train_function(loss, params, x, y, updates.adam, learning_rate=0.05)
        return lambda i: train(*_data(i, dtype))
    # The original's two phases by hand; the running averages stay per rank.
    grad_updates, param_updates, grad_shared = updates.nesterov_momentum(
        loss, params, learning_rate=0.1, momentum=0.9
    )
    f_grad = synk.function([x, y], loss, updates=grad_updates)
    f_update = synk.function([], updates=param_updates)

    def step(i):
        loss_value = f_grad(*_data(i, dtype))
        synk.all_reduce(grad_shared)
        f_update()
        return loss_value

    return step


def _state() -> list[np.ndarray]:
    """Every rank's value of every shared tensor of the session, rank 0's first."""
    from synkhronos.session import launch

    variables = [
        v
        for v in launch.current().state.registry.variables
        if not isinstance(v.get_value(borrow=True), np.random.Generator)
    ]
    return [np.asarray(value) for value in synk.gather(variables, nd_up=1)]


def first(kind: str, path: str, backend: str = "cpu") -> tuple[list[float], list[np.ndarray]]:
    """Train ``STEPS`` steps, save to ``path``, train ``STEPS`` more: the later steps'
    losses and the state after them."""
    synk.fork(2, backend=backend)
    try:
        step = build(kind)
        for i in range(STEPS):
            step(i)
        synk.save(path, extra={"step": STEPS})
        losses = [float(step(i)) for i in range(STEPS, 2 * STEPS)]
        return losses, _state()
    finally:
        synk.close()


def resume(kind: str, path: str, backend: str = "cpu") -> tuple[list[float], list[np.ndarray]]:
    """Load ``path`` and train the later steps: their losses and the state after them."""
    synk.fork(2, backend=backend)
    try:
        step = build(kind)
        start = int(synk.load(path)["step"])
        losses = [float(step(i)) for i in range(start, start + STEPS)]
        return losses, _state()
    finally:
        synk.close()


if __name__ == "__main__":  # backend out, then kind path ...: resume each, save in out
    backend, out, *runs = sys.argv[1:]
    results = {}
    for kind, path in zip(runs[::2], runs[1::2], strict=True):
        losses, state = resume(kind, path, backend)
        results[f"{kind}_losses"] = np.array(losses)
        results.update({f"{kind}_state_{i}": value for i, value in enumerate(state)})
    np.savez(out, **results)
