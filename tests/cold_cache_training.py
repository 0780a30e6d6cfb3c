"""Two-phase training on 2 ranks from cold compile caches, for tests/test_one_program.py.

Run as ``python cold_cache_training.py BACKEND CACHE_FOLDER``, in a fresh process whose
PyTensor compile folder (and so Numba's cache) is ``CACHE_FOLDER``, empty: rank 0 compiles,
the worker loads, partly or wholly, what rank 0 wrote. Trains a small float64 network with
each update rule of :mod:`synkhronos.extensions.updates`, on uneven shares of the rows, and
prints one line of JSON: per rule, the largest difference between the ranks' values of any
parameter or optimizer state after the steps.
"""

from __future__ import annotations

import json
import os
import sys

RULES = {  # each rule, with the learning rate where it has no default
    "sgd": (0.1,),
    "momentum": (0.1,),
    "nesterov_momentum": (0.1,),
    "adagrad": (),
    "rmsprop": (),
    "adadelta": (),
    "adam": (),
    "adamax": (),
}
STEPS, ROWS = 20, 37


def main(backend: str, folder: str) -> dict[str, float]:
    os.environ["PYTENSOR_FLAGS"] = f"base_compiledir={folder},floatX=float64"
    import numpy as np
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk
    from synkhronos.extensions import updates

    synk.fork(2, backend=backend)
    rng = np.random.default_rng(0)
    x, y = pt.matrix("x"), pt.ivector("y")
    data = rng.normal(size=(ROWS, 20)), rng.integers(0, 5, ROWS).astype("int32")
    grad_updates, param_updates, flat_grads, state = [], [], [], {}
    for rule, args in RULES.items():  # one network per rule, all trained by one step
        # Vectors long enough for LLVM to vectorize the loops (where fast-math showed).
        w = pytensor.shared(rng.normal(size=(20, 16)) / 4, name=f"{rule}_w")
        v = pytensor.shared(rng.normal(size=(16, 5)) / 4, name=f"{rule}_v")
        b = pytensor.shared(np.zeros(5), name=f"{rule}_b")
        log_prob = pt.special.log_softmax(pt.tanh(x @ w) @ v + b, axis=1)
        loss = -log_prob[pt.arange(y.shape[0]), y].mean()
        phase_one, phase_two, flat_grad = getattr(updates, rule)(loss, [w, v, b], *args)
        grad_updates += phase_one
        param_updates += phase_two
        flat_grads.append(flat_grad)
        state[rule] = [var for var, _ in phase_two]
    # Two functions, not two per rule: compiling is what takes the time.
    f_grad = synk.function([x, y], updates=grad_updates)
    f_update = synk.function([], updates=param_updates)
    for _ in range(STEPS):
        f_grad(*data)
        synk.all_reduce(flat_grads)
        f_update()
    worst = {
        rule: max(
            float(np.max(np.abs(synk.get_value(0, var) - synk.get_value(1, var))))
            for var in variables
        )
        for rule, variables in state.items()
    }
    synk.close()
    return worst


if __name__ == "__main__":
    sys.stdout.write(json.dumps(main(sys.argv[1], sys.argv[2])) + "\n")
