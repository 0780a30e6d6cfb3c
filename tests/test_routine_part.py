"""A rank's side of a routine: the message decoded and the named function run (no fork:
a fake rank state and a fake descriptor resolver)."""

import types

import numpy as np

from synkhronos.rank.routine_part import ARRAY, DATA, from_text, resolve_name, run_routine, text


def rank_and_sums(state, values, data):
    """A routine of this module: found by name, as a worker finds it."""
    return (np.array([state.rank, values.sum()]), data * 2)


class Nested:
    class Inner:
        @staticmethod
        def routine(state):
            return []


def test_text_round_trip():
    for value in ["", "centre", "module.sub:Class.méthode"]:
        encoded = text(value)
        assert encoded.dtype == np.uint8 and from_text(encoded) == value


def test_names_resolved_through_modules_and_classes():
    assert resolve_name(f"{__name__}:rank_and_sums") is rank_and_sums
    assert resolve_name(f"{__name__}:Nested.Inner.routine") is Nested.Inner.routine
    assert resolve_name("numpy.linalg:norm") is np.linalg.norm


def test_run_routine_decodes_arrays_and_data(rng):
    values, shared = rng.standard_normal(7), rng.standard_normal((3, 2))
    descriptor = np.array([42], np.int64)
    resolved = []

    def resolve(d):
        resolved.append(d)
        return shared

    message = [
        text(f"{__name__}:rank_and_sums"),
        np.array([ARRAY, DATA], np.int64),
        values,
        descriptor,
    ]
    reply = run_routine(types.SimpleNamespace(rank=3), message, resolve)
    assert isinstance(reply, list) and len(reply) == 2
    np.testing.assert_array_equal(reply[0], [3, values.sum()])
    np.testing.assert_array_equal(reply[1], shared * 2)
    assert resolved == [descriptor]
