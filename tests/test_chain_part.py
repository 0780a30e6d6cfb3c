"""synkhronos.rank.chain_part without forking: a chain's step table as it travels, and
which steps' updates wait for every rank (held_updates)."""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt

from synkhronos.api.function_parts import FunctionParts
from synkhronos.rank.chain_part import CollectiveStep, decode_table, encode_table, held_updates
from synkhronos.transport.protocol import Collective
from synkhronos.transport.reduction import COLLECTIVE_OPS


def test_the_step_table_travels_whole(rng):
    kinds = list(Collective)
    for _ in range(20):
        steps: list = []
        for _ in range(int(rng.integers(1, 6))):
            if rng.random() < 0.5:
                steps.append(int(rng.integers(0, 1000)))
            else:
                indices = rng.integers(0, 50, size=int(rng.integers(0, 4)))
                kind = kinds[int(rng.integers(len(kinds)))]
                op = COLLECTIVE_OPS[int(rng.integers(len(COLLECTIVE_OPS)))]
                steps.append(
                    CollectiveStep(kind, indices.astype(np.int64), op, bool(rng.random() < 0.5))
                )
        fuse = bool(rng.random() < 0.5)
        assert decode_table(encode_table(steps, fuse)) == (steps, fuse)


def test_updates_wait_unless_a_later_step_reads_them():
    """A training step: the gradient function writes g, an all-reduce reads it, the update
    function writes w and v from g: g applies as it runs, w and v wait for every rank."""
    x = pt.vector("x")
    w = pytensor.shared(np.ones(3), name="w")
    v = pytensor.shared(np.zeros(3), name="v")
    g = pytensor.shared(np.zeros(3), name="g")
    grad = FunctionParts.parse(inputs=[x], updates=[(g, x[:3] * w)]).spec(0, None)
    update = FunctionParts.parse(updates=[(v, 0.9 * v + g), (w, w - v)]).spec(1, None)
    held = held_updates([grad, [g], update], None)
    assert held == [set(), set(), {id(v), id(w)}]
    # The update function first: the gradient function reads w after it, not v.
    held = held_updates([update, grad], None)
    assert held == [{id(v)}, {id(g)}]


def test_a_collective_steps_key_tells_long_index_lists_apart():
    """A chain's held-back updates are found once per chain, by its steps' keys: two steps
    whose indices differ only where an array's repr elides them have different keys."""
    indices = np.arange(2000)
    other = indices.copy()
    other[1000] = 5000
    one, two = (CollectiveStep(Collective.ALL_REDUCE, i, "sum", False) for i in (indices, other))
    assert repr(one) == repr(two)  # what the key once was
    assert one.key() != two.key()
    assert one.key() == CollectiveStep(Collective.ALL_REDUCE, indices.copy(), "sum", False).key()
