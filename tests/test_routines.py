"""A routine's name, checked on rank 0 before any command is sent (nothing forked; the
routine run on every rank is tested in test_asynchronous.py)."""

import functools
import types

import numpy as np
import pytest

from synkhronos.api import routines


def scaled_sum(state, values, scale):
    """A module-level routine: found again by its name."""
    return [np.array([values.sum() * scale[0]])]


class Holder:
    @staticmethod
    def routine(state):
        return []


def test_a_module_level_function_travels_by_its_name():
    assert routines._name(scaled_sum) == f"{__name__}:scaled_sum"
    assert routines._name(Holder.routine) == f"{__name__}:Holder.routine"


def _nested(state):
    return []


@pytest.mark.parametrize(
    "refused",
    [
        lambda state: [],
        functools.partial(scaled_sum, scale=[1.0]),
        Holder().__init__,  # a bound method
        types.FunctionType(_nested.__code__, {}, "_nested"),  # a twin, not the function
    ],
    ids=["lambda", "partial", "bound", "twin"],
)
def test_what_no_rank_could_import_is_refused_on_rank_0(refused):
    with pytest.raises(ValueError, match="module-level function of an importable module"):
        routines._name(refused)


def test_a_function_of_main_is_refused():
    def main_function(state):
        return []

    main_function.__module__, main_function.__qualname__ = "__main__", "main_function"
    with pytest.raises(ValueError, match="module-level"):
        routines._name(main_function)


def test_no_session_is_a_clear_error():
    with pytest.raises(RuntimeError, match="call synk.fork"):
        routines.run(scaled_sum, np.ones(3), np.array([2.0]))
