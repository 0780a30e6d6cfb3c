"""The split's graph walk: every variable once, after its inputs, without recursion."""

import sys

import pytensor.tensor as pt

from synkhronos.api.split.walk import owner_inputs, walk_up


def _diamond():
    x = pt.vector("x")
    a, b = pt.exp(x), pt.sin(x)
    return x, a, b, a + b


def test_each_variable_once_after_its_inputs():
    x, a, b, out = _diamond()
    order = list(walk_up([out], owner_inputs))
    assert len(order) == len(set(order)) == 4
    assert order[-1] is out
    for v in order:
        for i in owner_inputs(v):
            assert order.index(i) < order.index(v)
    assert owner_inputs(x) == []


def test_done_variables_stop_the_walk():
    x, a, b, out = _diamond()
    order = list(walk_up([out], owner_inputs, done=lambda v: v is a))
    assert a not in order and x in order and b in order  # x reached through b only
    order = list(walk_up([out], owner_inputs, done=lambda v: v in (a, b)))
    assert order == [out]


def test_done_asked_again_when_met():
    # what the caller records for a given variable stops the walk at its next meeting
    x, a, b, out = _diamond()
    memo = set()

    def done(v):
        return v in memo

    given = []
    for v in walk_up([out, a], owner_inputs, done):
        memo.add(v)
        given.append(v)
    assert len(given) == len(set(given)) == 4


def test_deeper_than_the_recursion_limit():
    x = pt.scalar("x")
    y = x
    depth = sys.getrecursionlimit() + 100
    for _ in range(depth):
        y = pt.exp(y)
    order = list(walk_up([y], owner_inputs))
    assert order[0] is x and order[-1] is y and len(order) == depth + 1
