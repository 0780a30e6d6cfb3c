"""A rank's part of a checkpoint with a fake rank state (a registry, a rank, a backend):
digests, generator states, values set from every rank's (no fork)."""

import json
import types

import numpy as np
import pytensor
import pytest

from synkhronos.rank import checkpoint_part as part
from synkhronos.rank.backends.base import Backend
from synkhronos.rank.graphs import SharedRegistry
from synkhronos.rank.routine_part import from_text, text


def _state(rank, variables):
    registry = SharedRegistry()
    for var in variables:
        registry.add(var)
    return types.SimpleNamespace(
        rank=rank,
        registry=registry,
        backend=Backend("cpu", None),
        shared=lambda indices: [registry[int(i)] for i in indices],
    )


@pytest.mark.parametrize("kind", ["PCG64", "MT19937", "Philox", "SFC64"])
def test_generator_state_round_trip(kind):
    g = np.random.Generator(getattr(np.random, kind)(7))
    g.standard_normal(5)  # not at its seed's start
    h = part.make_generator(part.generator_state(g))
    np.testing.assert_array_equal(g.standard_normal(9), h.standard_normal(9))
    json.loads(part.generator_state(g))  # plain JSON text


def test_digest_by_dtype_shape_and_bits():
    a = np.array([1.0, np.nan, 3.0])
    assert part.digest(a) == part.digest(a.copy())
    assert part.digest(a) != part.digest(a.astype("float32"))
    assert part.digest(np.zeros((2, 3))) != part.digest(np.zeros((3, 2)))
    assert part.digest(np.arange(6.0).reshape(2, 3).T) == part.digest(
        np.ascontiguousarray(np.arange(6.0).reshape(2, 3).T)
    )
    b = a.copy()
    b[0] = np.nextafter(1.0, 2.0)  # one ulp
    assert part.digest(a) != part.digest(b)


def test_report_skips_generators_and_the_skipped(rng):
    weights = pytensor.shared(rng.standard_normal(4))
    generator = pytensor.shared(np.random.default_rng(3))
    averages = pytensor.shared(rng.standard_normal(2))
    state = _state(0, [weights, generator, averages])
    assert part.is_generator(generator) and not part.is_generator(weights)
    digests, generators = part.report(state, np.array([2]))
    assert digests.tolist() == [part.digest(weights.get_value()), 0, 0]
    (kept,) = json.loads(from_text(generators))
    assert kept == part.generator_state(generator.get_value())


def test_set_local_takes_this_ranks_values(rng):
    weights = pytensor.shared(rng.standard_normal(3).astype("float32"))
    generator = pytensor.shared(np.random.default_rng(0))
    n_ranks = 3
    values = [rng.standard_normal(3) for _ in range(n_ranks)]
    states = [text(part.generator_state(np.random.default_rng(seed))) for seed in range(n_ranks)]
    state = _state(1, [weights, generator])
    assert part.set_local(state, np.array([0, 1]), np.array([n_ranks]), *values, *states) == []
    np.testing.assert_array_equal(weights.get_value(), values[1].astype("float32"))
    assert weights.get_value().dtype == np.float32
    np.testing.assert_array_equal(
        generator.get_value().integers(1 << 30, size=4),
        np.random.default_rng(1).integers(1 << 30, size=4),
    )
    (copy,) = part.local_values(state, np.array([0]))
    copy[0] = 99.0
    assert weights.get_value()[0] != 99.0


def test_kept_per_rank():
    averages = pytensor.shared(np.zeros(2))
    assert not part.kept_per_rank(averages)
    with pytest.warns(DeprecationWarning):
        averages.default_update = averages + 1
    assert part.kept_per_rank(averages)
