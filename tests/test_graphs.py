"""Shipping graphs between registries in one process, as rank 0 and a worker do: the
worker's graph computes what rank 0's does, each shared variable stays one object (no
fork)."""

import gc
import pickle
import weakref

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from synkhronos.rank.graphs import (
    GraphSpec,
    SharedRegistry,
    check_shippable,
    pack,
    unpack,
    with_default_updates,
)

MODE = "FAST_COMPILE"  # nothing to compile: both graphs run the same Python code


def _spec(fid, inputs, outputs, updates=(), **kwargs):
    return GraphSpec(fid, f"f{fid}", inputs, [], outputs, ["avg"] * len(outputs),
                     list(updates), **kwargs)  # fmt: skip


def _ship(specs, sender, receiver, rank=1):
    return unpack(pack(specs, sender), receiver, rank)


def test_the_workers_graph_computes_rank_0s(rng):
    x = pt.matrix("x")
    W = pytensor.shared(rng.standard_normal((3, 2)), name="W")
    out = pt.tanh(pt.dot(x, W)).sum(1)
    sender, receiver = SharedRegistry(), SharedRegistry()
    (spec,) = _ship([_spec(0, [x], [out], [(W, W * 0.5)])], sender, receiver)
    assert len(sender) == len(receiver) == 1 and sender[0] is W and receiver[0] is not W
    X = rng.standard_normal((11, 3))
    theirs = pytensor.function(spec.inputs, spec.outputs, updates=spec.updates, mode=MODE)
    mine = pytensor.function([x], [out], updates=[(W, W * 0.5)], mode=MODE)
    np.testing.assert_array_equal(theirs(X)[0], mine(X)[0])
    np.testing.assert_array_equal(receiver[0].get_value(), W.get_value())


def test_a_later_shipment_reads_the_same_variable_and_clones_share_storage(rng):
    x = pt.vector("x")
    W = pytensor.shared(rng.standard_normal(4), name="W")
    sender, receiver = SharedRegistry(), SharedRegistry()
    (first,) = _ship([_spec(0, [x], [x * W])], sender, receiver)
    clone = W.clone()
    (second,) = _ship([_spec(1, [x], [x + W, x - clone])], sender, receiver)
    assert len(sender) == len(receiver) == 2  # W once, its clone once
    worker_W = receiver[0]
    assert receiver.index(worker_W) == 0 and receiver.holding(worker_W.container) == 0
    assert receiver[1].container is worker_W.container
    worker_W.set_value(np.arange(4.0))
    f = pytensor.function(second.inputs, second.outputs, mode=MODE)
    plus, minus = f(np.ones(4))
    np.testing.assert_array_equal(plus, np.arange(4.0) + 1)
    np.testing.assert_array_equal(minus, 1 - np.arange(4.0))


def test_generators_reseeded_per_rank_unless_kept_alike():
    x = pt.vector("x")
    own = pytensor.shared(np.random.default_rng(1), name="own")
    alike = pytensor.shared(np.random.default_rng(2), name="alike")
    draws = [pt.random.normal(size=3, rng=own), pt.random.normal(size=3, rng=alike)]
    spec = _spec(0, [x], [x.sum() + d.sum() for d in draws], same_on_every_rank=[alike])
    sender = SharedRegistry()
    payload = pack([spec], sender)
    states = {}
    for rank in (1, 2):
        receiver = SharedRegistry()
        unpack(payload, receiver, rank)
        states[rank] = {v.name: v.get_value().bit_generator.state for v in receiver.variables}
    assert states[1]["own"] != states[2]["own"]
    assert states[1]["own"] != own.get_value().bit_generator.state
    assert states[1]["alike"] == states[2]["alike"] == alike.get_value().bit_generator.state


class _Local(Op):
    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = inputs[0]


def test_what_a_worker_could_not_import_is_named():
    x = pt.vector("x")

    class Nested(_Local):
        pass

    registry = SharedRegistry()
    with pytest.raises(TypeError, match=r"f cannot be sent to the workers: Op .*Nested.*<locals>"):
        check_shippable(_spec(0, [x], [Nested()(x)]), registry, "f")
    check_shippable(_spec(0, [x], [_Local()(x)]), registry, "f")
    assert len(registry) == 0  # checking registers nothing


def test_a_default_update_is_checked_once_and_again_once_changed():
    """A running average read by many functions (each round of a training function): its
    default update passes the check once; one set since is checked, the Op named."""
    x = pt.vector("x")
    average = pytensor.shared(np.zeros(3), name="average")
    with pytest.warns(DeprecationWarning):  # PyTensor's, but programs still set it
        average.default_update = 0.9 * average + 0.1 * _Local()(x)
    registry = SharedRegistry()
    check_shippable(_spec(0, [x], [x + average]), registry, "f")
    assert registry.checked[id(average.default_update)] is average.default_update

    class Nested(_Local):
        pass

    # Passed, the update is left out: a function that reads the average checks its own nodes.
    check_shippable(_spec(1, [x], [2 * average]), registry, "g")
    with pytest.raises(TypeError, match=r"g cannot be sent to the workers: Op .*Nested"):
        check_shippable(_spec(1, [x], [Nested()(x) + average]), registry, "g")
    with pytest.warns(DeprecationWarning):
        average.default_update = 0.9 * average + 0.1 * Nested()(x)
    with pytest.raises(TypeError, match=r"h cannot be sent to the workers: Op .*Nested"):
        check_shippable(_spec(2, [x], [2 * average]), registry, "h")
    assert len(registry) == 0  # checking registers nothing


def test_a_checked_graph_is_freed_and_another_object_at_its_id_checked_again():
    """What passed a check is held weakly: a graph built, checked and dropped is freed, its
    entries with it; an entry under a node's id that is another object does not pass it."""
    x = pt.vector("x")
    registry = SharedRegistry()
    y = 2 * _Local()(x)
    check_shippable(_spec(0, [x], [y]), registry, "f")
    node, key, held = weakref.ref(y.owner), id(y.owner), len(registry.checked)
    assert registry.checked[key] is y.owner
    del y
    gc.collect()
    assert node() is None  # freed, though checked
    assert key not in registry.checked and len(registry.checked) < held

    class Nested(_Local):
        pass

    z = Nested()(x)
    registry.checked[id(z.owner)] = x  # as if an object checked before had z's node's id
    with pytest.raises(TypeError, match=r"g cannot be sent to the workers: Op .*Nested"):
        check_shippable(_spec(1, [x], [z]), registry, "g")


def test_default_updates_and_deep_graphs():
    x = pt.vector("x")
    count = pytensor.shared(0.0, name="count")
    with pytest.warns(DeprecationWarning):  # PyTensor's, but programs still set it
        count.default_update = count + 1
    assert len(with_default_updates([x + count])) == 2
    assert len(with_default_updates([x + count], lambda var: False)) == 1
    y = x
    for _ in range(300):  # deeper than pickle's recursion reaches along a graph
        y = y + 1
    with pytest.raises(RecursionError):
        pickle.dumps(y)
    receiver = SharedRegistry()
    (spec,) = _ship([_spec(0, [x], [y + count])], SharedRegistry(), receiver)
    assert receiver[0].default_update is not None  # travels on its own
